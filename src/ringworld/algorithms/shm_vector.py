"""The v-variants (allgatherv, gatherv, scatterv, alltoallv, and reduce_scatter with its
per-rank counts) in the shared windows.

Their blocks differ by rank, and only some ranks know all of them (a gatherv's or scatterv's
counts are the root's; an alltoallv rank knows what it sends and what it receives, not what
the others send each other), so no rank can choose a path from sizes alone as the other
collectives do (:mod:`ringworld.algorithms.shm_collectives`). Each call here takes one sync
through the slots: every rank writes a header (its counts, where its blocks lie) and, where
they fit, its blocks into its slot; after the sync every rank reads the same headers, so all
decide alike. If everything fitted, each copies what it needs out of the others' slots and
the call is done (an 8-byte block: 3-4 us at np=2, where the message path took 14-20). If
not, the runner returns False and the caller moves the data on the message path, as before
(for large blocks the extra sync costs nothing that counts). A scatterv where ranks share
cores takes no sync at all: the root puts the header and the blocks into its eager ring, as a
small scatter's root does, and the header says whether they fitted.

Disagreements raise MismatchError on the ranks that see them, at the same sync, so the windows
stay usable: an allgatherv's counts are part of the call's signature (every rank raises); a
gatherv's root and a rank whose block is not the size the root expects both raise (the others'
blocks arrived); a scatterv's receiver, or an alltoallv's, whose block is not the size it
expects raises (as MPI reports a truncation at the receiver).

Every runner is ``run(arena, spec, send, recv, op) -> bool`` (done, or: take the message
path; ``op`` is a reduce_scatter's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ringworld.algorithms.schedule import Spec
from ringworld.algorithms.shm_arena import Arena
from ringworld.algorithms.shm_collectives import _combine_in_rank_order, _combine_slice
from ringworld.algorithms.shm_policy import EAGER_MAX, EAGER_SMALL, SLOT, vector_eager
from ringworld.comm.ops import Op
from ringworld.errors import MismatchError

__all__ = ["RUN", "alltoallv_take", "eager", "eager_gatherv_runner", "eager_scatterv_runner",
           "gatherv_sent", "scatterv_got", "slot_views", "wrong_block"]

Array = np.ndarray[Any, Any]
VRunner = Callable[[Arena, Spec, Array, Array, "Op | None"], bool]
_U8 = np.dtype(np.uint8)
# what shapes a scatterv's view of the root's eager ring entry: all of it, as bytes (a
# read-only broadcast of one byte: it takes no memory)
_WHOLE = np.broadcast_to(np.zeros(1, np.uint8), (EAGER_MAX,))

# kept in the arena's vector_views (so they never keep its windows mapped longer than the
# arena's own views do; a lookup by the arena's id here cost a call and a weak reference's
# check a v-call), per (slot parity, dtype): every rank's slot header (int64 words: a flag, p
# counts, p offsets) and the rest of its slot as that dtype, and how many elements fit there
# (and per eager ring entry and dtype, by the entry's id: the entry, its header and the rest)
_Views = tuple[list[memoryview], list[Array], int]
_KEPT = 4096  # views kept per arena at most (a root of p ranks reads up to 40 (p - 1) entries)


def _entry_views(per: dict[Any, Any], entry: Array, dt: np.dtype[Any], head: int
                 ) -> tuple[memoryview, Array, Array]:
    """An eager ring entry's header (``head`` bytes, as int64 words: a memoryview, whose items
    read as ints, and an array), and the rest of it as ``dt`` (cached in ``per``, the arena's
    :attr:`Arena.vector_views`: making them took 0.5 us a block)."""
    found = per.get((id(entry), dt))
    if found is None or found[0] is not entry:  # (holding the entry: its id stays its own)
        if len(per) > _KEPT:
            per.clear()
        room = (entry.nbytes - head) // max(1, dt.itemsize)
        found = per[(id(entry), dt)] = (entry, entry[:head].data.cast("q"),
                                        entry[head : head + room * dt.itemsize].view(dt),
                                        entry[:head].view(np.int64))
    return found[1], found[2], found[3]


def _span(per: dict[Any, Any], spec: Spec, room: int) -> tuple[Array, int, int] | None:
    """A scatterv root's header words (not large, counts, where each block lies in its entry)
    and the span of its ``send`` (lo, hi elements) that holds every other rank's block, to be
    copied into the entry at once where the span fits its ``room`` elements and holds at most
    as much again as the blocks (the root's own block, gaps); else None (the blocks are
    packed one by one, as they are where they are large). Same job, np=4 on 2 cores, old and
    new runner swapped each round: 16 KiB blocks (48 KiB spans) 23.5 -> 19.9 us, 8 KiB 23.5
    -> 19.7; 64 KiB blocks parity (31.1 -> 30.9). Cached in ``per`` for the spec (a repeat
    passes the same one)."""
    found = per.get(("span", id(spec)))
    if found is None or found[0] is not spec:
        c, d, r = spec.counts, spec.displs, spec.rank
        assert c is not None and d is not None
        blocks = [(d[i], d[i] + n) for i, n in enumerate(c) if n and i != r]
        lo = min((b[0] for b in blocks), default=0)
        hi = max((b[1] for b in blocks), default=lo)
        fits = hi - lo <= min(room, 2 * sum(b[1] - b[0] for b in blocks))
        words = np.array([0, *c, *(di - lo for di in d)], dtype=np.int64)
        found = per[("span", id(spec))] = (spec, (words, lo, hi) if fits else None)
    plan: tuple[Array, int, int] | None = found[1]
    return plan


def _views(a: Arena, dt: np.dtype[Any]) -> _Views:
    """The slots of the next sync as the v-variants use them (cached per arena)."""
    per = a.vector_views
    key = ((a.epoch + 1) & 1, dt)  # (the next sync's parity)
    found = per.get(key)
    if found is None:
        if len(per) > _KEPT:
            per.clear()
        found = per[key] = slot_views(a, key[0], dt)
    return found


def slot_views(a: Arena, parity: int, dt: np.dtype[Any]) -> _Views:
    """Every rank's slot ``parity`` as the v-variants use it: its header (int64 words: a
    flag, p counts, p offsets), the rest as ``dt``, and how many elements fit there."""
    head = _head_bytes(a.chan.size)
    cap = max(0, (int(a.small) - head) // max(1, dt.itemsize))
    raw = a.slots(parity, _U8, SLOT)  # (the whole slot, as bytes)
    return ([s[:head].data.cast("q") for s in raw],
            [s[head : head + cap * dt.itemsize].view(dt) for s in raw], cap)


def _head_bytes(p: int) -> int:
    """Bytes of a header of p ranks' counts and offsets and a flag, in whole cache lines."""
    return -(-8 * (2 * p + 1) // 64) * 64


def _pack(head: memoryview, out: Array, counts: Sequence[int], displs: Sequence[int],
          send: Array, me: int, large: bool) -> None:
    """Write a header (word 0: ``large``; 1 + i: block i's count; 1 + p + i: where it lies)
    and, unless ``large``, every block but this rank's own (``me``) packed into ``out``, the
    room after the header. Where it lies: its offset in ``out``, or where ``large`` (read
    straight from ``send``) its displacement there."""
    p = len(counts)
    head[0] = large
    at = 0
    for i, n in enumerate(counts):
        head[1 + i] = n
        head[1 + p + i] = displs[i] if large else at
        if i != me and not large:
            out[at : at + n] = send[displs[i] : displs[i] + n]
            at += n


def _units(n: object, buf: Array, again: bool = False) -> str:
    """``n`` elements of ``buf``'s dtype, in words: bytes where they are bytes (the MPI
    layer passes its buffers so, whatever their MPI datatype); ``again``: a second amount
    in one sentence, whose elements go without saying."""
    if buf.dtype == np.uint8:
        return f"{n} byte{'' if n == 1 else 's'}"
    return str(n) if again else f"{n} element{'' if n == 1 else 's'}"


def _mismatch(a: Arena, text: str) -> MismatchError:
    """A disagreement seen after a sync every rank passed: the windows stay usable."""
    exc = MismatchError(f"{a.what}: {text}")
    setattr(exc, "in_step", True)  # noqa: B010 (no such field in the class: see Arena.abandon)
    return exc


def allgatherv(a: Arena, spec: Spec, send: Array, recv: Array, op: Op | None = None
               ) -> bool:
    """Every rank's block (``spec.counts[i]`` elements) into ``recv`` at ``spec.displs[i]``;
    the counts, in the signature, agree on every rank (else the sync raises). Blocks too large
    for the slots are read straight out of their owners' ``send`` where ranks may read each
    other's memory (see ``Arena.direct``), else moved on the message path."""
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    _, data, cap = _views(a, recv.dtype)
    r = a.chan.rank
    if max(c) > cap:
        if a.direct:
            a.publish(0, send)
        a.sync()  # (the counts agree: checked there)
        if not a.direct:
            return False
        for i, n in enumerate(c):
            if i != r:
                a.read(i, 0, 0, recv[d[i] : d[i] + n])
        recv[d[r] : d[r] + c[r]] = send
        a.sync()  # no rank changes its send while a peer still reads it
        return True
    data[r][: c[r]] = send
    a.sync()
    for i, n in enumerate(c):
        # (its own block too where that is in place: the same bytes onto themselves)
        recv[d[i] : d[i] + n] = send if i == r else data[i][:n]
    return True


def gatherv(a: Arena, spec: Spec, send: Array, recv: Array, op: Op | None = None
            ) -> bool:
    """Rank i's ``send`` into the root's ``recv`` at ``spec.displs[i]`` (the root's counts and
    displs; other ranks know their own block only): through the slots, or where ranks share
    cores and may read each other's memory through the senders' eager rings (see
    :func:`_gatherv_eager`). Blocks too large for the slots are written by their owners
    straight into the root's ``recv`` where ranks may write each other's memory, else moved
    on the message path."""
    if eager(a, spec, send, True):
        return _gatherv_eager(a, spec, send, recv)
    r, root, p = a.chan.rank, spec.root, a.chan.size
    c, d = spec.counts or (), spec.displs or ()  # (the root's)
    head, data, cap = _views(a, send.dtype)
    mine = head[r]
    if r == root:
        mine[0] = large = any(n > cap for i, n in enumerate(c) if i != r)
        for i, n in enumerate(c):
            mine[1 + i] = n
            mine[1 + p + i] = d[i]
        if large and a.direct:
            a.publish(0, recv)
    else:
        mine[0] = n = send.size
        if n <= cap:
            data[r][:n] = send
    a.sync()
    if r != root:
        return gatherv_sent(a, root, send, head[root])
    if large and not a.direct:
        return False
    # (each wrong count read now: after a second sync a rank's next call may rewrite it)
    bad = [(i, head[i][0]) for i, n in enumerate(c) if i != r and head[i][0] != n]
    for i, n in enumerate(c):
        if i == r:
            recv[d[i] : d[i] + n] = send  # (in place: the same bytes onto themselves)
        elif not large and head[i][0] == n:
            recv[d[i] : d[i] + n] = data[i][:n]
    if large:
        a.sync()  # every block has landed
    if bad:
        raise wrong_block(a, *bad[0], c, recv)
    return True


def gatherv_sent(a: Arena, root: int, send: Array, h: memoryview) -> bool:
    """A gatherv sender's rest of the call after the slots' sync, ``h`` the root's header:
    its block is taken (or, where the root's says large, written straight into the root's
    ``recv``, else: False, the message path)."""
    r, p = a.chan.rank, a.chan.size
    expects = h[1 + r]  # (read before a second sync: the root's next call may rewrite it)
    wrong = expects != send.size
    if h[0]:
        if not a.direct:
            return False  # (the message path finds a wrong size)
        if not wrong:
            a.write(root, 0, h[1 + p + r] * send.itemsize, send)
        a.sync()  # every block has landed
    if wrong:
        raise _mismatch(a, f"the root (rank {root}) expects {_units(expects, send)} from "
                           f"this rank (rank {r}), which sent {_units(send.size, send, True)}")
    return True


def wrong_block(a: Arena, i: int, n: int, counts: Sequence[int], recv: Array
                ) -> MismatchError:
    """A gatherv root's error: rank ``i`` sent ``n`` elements, not ``counts[i]``."""
    return _mismatch(a, f"rank {i} sent {_units(n, recv)}, this rank (the root, rank "
                        f"{a.chan.rank}) expects {_units(counts[i], recv, True)} (counts[{i}])")


def _gatherv_eager(a: Arena, spec: Spec, send: Array, recv: Array) -> bool:
    """:func:`gatherv` through the senders' eager rings, no sync, as a small gather: each
    sender puts a header (its count, whether its block fitted) and, where it fits, its block
    into its entry and returns. So no rank waits for all the others to be scheduled, nor a
    sender for the root, unless its block is large (np=4 on 2 cores, 16-byte blocks: the
    slots' sync made the call take 2.8x MPICH's time). Where a block is too large for an entry,
    the root begins the call by putting every rank's count and where its block goes into its
    own entry, having published its ``recv``: a sender whose block does not fit its entry
    waits for that and writes the block straight into the root's ``recv`` (the root waits for
    it to say so), as the senders do at once through the slots. A count that is not the
    root's is found at the root, which raises once every block has been taken, and at a
    sender of a large block (none is written)."""
    r, root, p = a.chan.rank, spec.root, a.chan.size
    dt = send.dtype
    isz = max(1, dt.itemsize)
    head = _head_bytes(p)
    per = a.vector_views
    if r != root:
        n = send.size
        fits = n * isz <= EAGER_MAX - head
        mine: list[memoryview] = []
        wrong: list[int] = []

        def put(_: int, entry: Array) -> None:
            views = _entry_views(per, entry, dt, head)
            _fill_gatherv(views, send, fits)
            mine.append(views[0])

        def follow(_: int, entry: Array | None) -> None:  # (raises nothing: it must end)
            if entry is None:  # the root expects no large block
                wrong.append(-1)
            else:
                lead, _data, _words = _entry_views(per, entry, dt, head)
                if lead[1 + r] == n:
                    a.write(root, 0, lead[1 + p + r] * isz, send)
                else:
                    wrong.append(lead[1 + r])
            mine[0][2] = 1  # written (or refused): the root may go on

        a.eager_gather(_WHOLE, root, _WHOLE, fill=put, follow=None if fits else follow,
                       need=head + n * isz if fits else head)
        if wrong:
            expects = "fewer" if wrong[0] < 0 else wrong[0]
            raise _mismatch(a, f"the root (rank {root}) expects {_units(expects, send)} from "
                               f"this rank (rank {r}), which sent {_units(n, send, True)}")
        return True
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    large = max((n for i, n in enumerate(c) if i != r), default=0) * isz > EAGER_MAX - head
    bad: list[tuple[int, int]] = []

    def lead(_: int, entry: Array) -> None:  # (what a sender of a large block needs)
        h, _data, _words = _entry_views(per, entry, dt, head)
        for i in range(p):
            h[1 + i], h[1 + p + i] = c[i], d[i]

    def take(i: int, entry: Array) -> None:  # (raises only where the call cannot end)
        _take_gatherv(a, i, _entry_views(per, entry, dt, head), c, d, recv, bad)

    if large:
        a.publish(0, recv)
    a.eager_gather(_WHOLE, root, _WHOLE, fill=take, lead=lead if large else None)
    recv[d[r] : d[r] + c[r]] = send  # (in place: the same bytes onto themselves)
    if bad:
        raise wrong_block(a, *bad[0], c, recv)
    return True


def scatterv(a: Arena, spec: Spec, send: Array, recv: Array, op: Op | None = None
             ) -> bool:
    """``spec.counts[i]`` elements of the root's ``send`` from ``spec.displs[i]`` into rank
    i's ``recv`` (the root's counts and displs; other ranks know their own block only):
    through the slots, or where ranks share cores through the root's eager ring, which makes
    no rank wait for all the others to be scheduled (same job, 8-byte blocks: np=2, 3.2 us
    through the slots against 4.6 through the ring; np=4 on 2 cores, 23.1 against 17.4)."""
    if eager(a, spec, recv, False):
        return _scatterv_eager(a, spec, send, recv)
    return _scatterv_slots(a, spec, send, recv)


def eager(a: Arena, spec: Spec, mine: Array, gathers: bool) -> bool:
    """Whether a scatterv (``mine``: this rank's ``recv``) or, ``gathers``, a gatherv (its
    ``send``) takes the eager rings rather than the slots: where ranks share cores (a gatherv
    only where ranks may write each other's memory: a block too large for an entry is written
    straight into the root's ``recv``), else as ``shm_policy.vector_eager`` says of the other
    rank's block, by the root's counts at the root and by ``mine`` at the other rank. Ranks
    whose counts agree decide alike; where they do not, one waits in the rings and the other
    in the slots, and the engine's monitor fails the call on both as a mismatch."""
    if a.crowded:
        return a.direct or not gathers
    p, r, root = a.chan.size, a.chan.rank, spec.root
    if p != 2:
        return False
    n = mine.size if r != root else spec.counts[1 - r] if spec.counts else 0
    return vector_eager(n * mine.dtype.itemsize, p, EAGER_MAX - _head_bytes(p))


def _scatterv_slots(a: Arena, spec: Spec, send: Array, recv: Array) -> bool:
    """:func:`scatterv` through the slots, one sync; blocks too large for them are read
    straight out of the root's ``send`` where ranks may read each other's memory (a second
    sync), else moved on the message path."""
    r, root = a.chan.rank, spec.root
    head, data, cap = _views(a, recv.dtype)
    if r == root:
        c, d = spec.counts, spec.displs
        assert c is not None and d is not None
        large = sum(c) - c[r] > cap
        _pack(head[r], data[r], c, d, send, r, large)
        if large and a.direct:
            a.publish(0, send)
        a.sync()
        recv[...] = send[d[r] : d[r] + c[r]]  # (in place: the same bytes onto themselves)
        if large and a.direct:
            a.sync()  # every rank has read its block
        return not large or a.direct
    a.sync()
    return scatterv_got(a, root, recv, head[root], data[root])


def scatterv_got(a: Arena, root: int, recv: Array, h: memoryview, data: Array) -> bool:
    """A scatterv receiver's rest of the call after the slots' sync, ``h`` the root's header
    and ``data`` the rest of its slot: its block copied out (or, where the header says large,
    read straight out of the root's ``send``, else: False, the message path)."""
    r, p = a.chan.rank, a.chan.size
    n, at = h[1 + r], h[1 + p + r]
    wrong = n != recv.size
    if h[0]:
        if not a.direct:
            return False  # (the message path finds a wrong size)
        if not wrong:
            a.read(root, 0, at * recv.itemsize, recv)
        a.sync()
    elif not wrong:
        recv[...] = data[at : at + n]
    if wrong:
        raise _mismatch(a, f"the root (rank {root}) sends {_units(n, recv)} to this rank (rank "
                           f"{r}), which expects {_units(recv.size, recv, True)}")
    return True


def _scatterv_eager(a: Arena, spec: Spec, send: Array, recv: Array) -> bool:
    """:func:`scatterv` through the root's eager ring, no sync: the root returns once the header
    and blocks are in its entry. The header says whether they fit the entry; if not, every
    rank reads its block straight out of the root's ``send`` where ranks may read each other's
    memory (then a sync), else takes the message path."""
    r, root, p = a.chan.rank, spec.root, a.chan.size
    dt = recv.dtype
    isz = max(1, dt.itemsize)
    head = _head_bytes(p)
    per = a.vector_views
    if r == root:
        c, d = spec.counts, spec.displs
        assert c is not None and d is not None
        others = (sum(c) - c[r]) * isz
        large = others > EAGER_MAX - head
        plan = None if large else _span(per, spec, (EAGER_MAX - head) // isz)
        need = head + (0 if large else others if plan is None else (plan[2] - plan[1]) * isz)

        def put(_: int, entry: Array) -> None:
            _fill_scatterv(_entry_views(per, entry, dt, head), plan, c, d, send, r, large)

        if large and a.direct:
            a.publish(0, send)
        a.eager_bcast(_WHOLE, root, fill=put, need=need)
        recv[...] = send[d[r] : d[r] + c[r]]  # (in place: the same bytes onto themselves)
        if large and a.direct:
            a.sync()  # every rank has read its block
        return not large or a.direct
    got: list[tuple[int, int, int]] = []

    def take(_: int, entry: Array) -> None:  # (raises nothing: the broadcast must end)
        got.append(_take_scatterv(_entry_views(per, entry, dt, head), r, p, recv))

    a.eager_bcast(_WHOLE, root, fill=take)
    return scatterv_taken(a, root, recv, got[0])


def scatterv_taken(a: Arena, root: int, recv: Array, got: tuple[int, int, int]) -> bool:
    """A scatterv receiver's rest of the call after its eager broadcast, ``got`` what
    :func:`_take_scatterv` found in the header (whether large, its count, where its block
    lies): its block read straight out of the root's ``send`` where large (then a sync), or
    False (the message path) where ranks may not read each other's memory. Raises:
    MismatchError (the root's count for this rank is not its own)."""
    r, isz = a.chan.rank, max(1, recv.dtype.itemsize)
    large, n, at = got
    if large:
        if not a.direct:
            return False  # (the message path finds a wrong size)
        if n == recv.size:
            a.read(root, 0, at * isz, recv)
        a.sync()
    if n != recv.size:
        raise _mismatch(a, f"the root (rank {root}) sends {_units(n, recv)} to this rank (rank "
                           f"{r}), which expects {_units(recv.size, recv, True)}")
    return True


def _fill_gatherv(views: tuple[memoryview, Array, Array], send: Array, fits: bool) -> None:
    """A gatherv sender's eager entry (its header and data ``views``): its count, whether its
    block fits the entry (if not, it writes it into the root's ``recv`` itself), unwritten,
    and the block where it fits."""
    h, data, _words = views
    n = send.size
    h[0], h[1], h[2] = n, int(not fits), 0
    if fits:
        data[:n] = send


def _take_gatherv(a: Arena, i: int, views: tuple[memoryview, Array, Array],
                  c: Sequence[int], d: Sequence[int], recv: Array,
                  bad: list[tuple[int, int]]) -> None:
    """A gatherv root's taking of rank ``i``'s eager entry (its header and data ``views``):
    its block into ``recv`` where its count is the root's (or, where it writes the block
    itself, a wait until it has), else (i, its count) noted in ``bad``. Raises: as
    Arena.await_peer, only where the call cannot end."""
    h, data, _words = views
    n = h[0]
    if h[1]:  # the sender writes its block itself, into recv: wait for it
        a.await_peer(i, lambda: h[2] != 0, f"rank {i} to write its block")
    elif n == c[i]:
        recv[d[i] : d[i] + n] = data[:n]
    if n != c[i]:
        bad.append((i, n))


def _fill_scatterv(views: tuple[memoryview, Array, Array], plan: tuple[Array, int, int] | None,
                   c: Sequence[int], d: Sequence[int], send: Array, r: int,
                   large: bool) -> None:
    """A scatterv root's eager entry (its header and data ``views``): packed by
    :func:`_pack`, or where ``plan`` (see :func:`_span`) the header words and one copy of
    the span of ``send`` that holds the blocks as they lie."""
    h, data, words = views
    if plan is None:
        _pack(h, data, c, d, send, r, large)
    else:
        words[: plan[0].size] = plan[0]
        data[: plan[2] - plan[1]] = send[plan[1] : plan[2]]


def _take_scatterv(views: tuple[memoryview, Array, Array], r: int, p: int, recv: Array
                   ) -> tuple[int, int, int]:
    """A scatterv receiver's reading of the root's eager entry (its header and data
    ``views``): its block into ``recv`` where it is there and of ``recv``'s size; (whether
    large, the count, where the block lies), as the header says. Raises nothing."""
    h, data, _words = views
    n, at = h[1 + r], h[1 + p + r]
    if not h[0] and n == recv.size:
        recv[...] = data[at : at + n]
    return h[0], n, at


def eager_scatterv_runner(a: Arena, spec: Spec, dt: np.dtype[Any]) -> VRunner | None:
    """A runner of repeated scatterv calls of ``spec`` and ``dt`` through the root's eager
    ring (:func:`_scatterv_eager`'s steps, with the entries' views made once: see
    ``Arena.filled_bcast_runner``). A root whose blocks do not fit the entry gets a runner of
    the large steps where ranks may read each other's memory (:func:`_large_scatterv_root`),
    else None. Same
    job, old and new code swapped each round, np=4 on 2 cores, medians of 9, without a runner
    and with: 4-byte blocks 15.3 -> 9.5 us (1.59x), 4 KiB 17.2 -> 11.4 (1.48x), 32 KiB 30.1 ->
    24.4 (1.25x); gatherv (:func:`eager_gatherv_runner`) 23.3 -> 13.6 (1.76x), 24.2 -> 14.4
    (1.68x), 38.8 -> 27.5 (1.41x)."""
    r, root, p = a.chan.rank, spec.root, a.chan.size
    isz, head = max(1, dt.itemsize), _head_bytes(p)
    views = [_entry_views(a.vector_views, x, dt, head) for x in a.ring_entries(root, _WHOLE)]
    if r != root:
        take = a.filled_bcast_runner(root, False,
                                     lambda e, recv: _take_scatterv(views[e], r, p, recv))

        def receive(_: Arena, _s: Spec, _send: Array, recv: Array, _op: Op | None) -> bool:
            return scatterv_taken(a, root, recv, take(recv))

        return receive
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    own = slice(d[r], d[r] + c[r])
    others = (sum(c) - c[r]) * isz
    if others > EAGER_MAX - head:
        return _large_scatterv_root(a, views, c, d, own) if a.direct else None
    plan = _span(a.vector_views, spec, (EAGER_MAX - head) // isz)
    need = head + (others if plan is None else (plan[2] - plan[1]) * isz)
    put = a.filled_bcast_runner(
        root, need > EAGER_SMALL,
        lambda e, send: _fill_scatterv(views[e], plan, c, d, send, r, False))

    def scatter(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        put(send)
        recv[...] = send[own]  # (in place: the same bytes onto themselves)
        return True

    return scatter


def _large_scatterv_root(a: Arena, views: list[tuple[memoryview, Array, Array]],
                         c: Sequence[int], d: Sequence[int], own: slice) -> VRunner:
    """The root's runner of repeated scatterv calls whose blocks do not fit its eager entry
    (:func:`_scatterv_eager`'s large steps): its ``send`` published, the header (made once)
    broadcast, its own block copied, then a sync once every rank has read its block. Same
    job, without it and with, np=4 on 2 cores, medians of 9: 128 KiB blocks 1.13x, 256 KiB
    1.16x, 1 MiB 1.06x; np=8 128 KiB 1.13x, 256 KiB 0.97x (0.77-1.20); np=3 256 KiB 1.06x."""
    words = np.array([1, *c, *d], np.int64)
    size = words.size
    put = a.filled_bcast_runner(a.chan.rank, False,
                                lambda e, _send: views[e][2].__setitem__(slice(0, size), words))

    def scatter(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        a.publish(0, send)
        put(send)
        recv[...] = send[own]  # (in place: the same bytes onto themselves)
        a.sync()  # every rank has read its block
        return True

    return scatter


def eager_gatherv_runner(a: Arena, spec: Spec, dt: np.dtype[Any], n: int) -> VRunner | None:
    """A runner of repeated gatherv calls of ``spec`` and ``dt`` (``n``: this rank's count)
    through the senders' eager rings (:func:`_gatherv_eager`'s steps, with the entries' views
    made once: see ``Arena.filled_gather_runner``); None where a block does not fit an entry
    (this sender's, or at the root any other rank's by its counts)."""
    r, root, p = a.chan.rank, spec.root, a.chan.size
    isz, head = max(1, dt.itemsize), _head_bytes(p)
    if r != root:
        if n * isz > EAGER_MAX - head:
            return None
        mine = [_entry_views(a.vector_views, x, dt, head) for x in a.ring_entries(r, _WHOLE)]
        put = a.filled_gather_runner(root, head + n * isz > EAGER_SMALL,
                                     lambda e, send: _fill_gatherv(mine[e], send, True))

        def send_block(_: Arena, _s: Spec, send: Array, _recv: Array, _op: Op | None) -> bool:
            put(send)
            return True

        return send_block
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    if max((m for i, m in enumerate(c) if i != r), default=0) * isz > EAGER_MAX - head:
        return None
    views = [[_entry_views(a.vector_views, x, dt, head) for x in a.ring_entries(i, _WHOLE)]
             if i != r else [] for i in range(p)]
    bad: list[tuple[int, int]] = []
    take = a.filled_gather_runner(
        root, False, lambda i, e, recv: _take_gatherv(a, i, views[i][e], c, d, recv, bad))
    own = slice(d[r], d[r] + c[r])

    def gather(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        bad.clear()
        take(recv)
        recv[own] = send  # (in place: the same bytes onto themselves)
        if bad:
            raise wrong_block(a, *bad[0], c, recv)
        return True

    return gather


def alltoallv(a: Arena, spec: Spec, send: Array, recv: Array, op: Op | None = None
              ) -> bool:
    """Block j of ``send`` (``spec.counts[j]`` elements at ``spec.displs[j]``) to rank j,
    which receives it into ``recv`` at its ``rdispls`` (``rcounts`` it expects). A rank whose
    blocks do not fit its slot has them read straight out of its ``send`` where ranks may read
    each other's memory (a second sync), else every rank takes the message path."""
    sc, sd = spec.counts, spec.displs
    assert sc is not None and sd is not None
    r = a.chan.rank
    head, data, cap = _views(a, recv.dtype)
    large = sum(sc) - sc[r] > cap
    _pack(head[r], data[r], sc, sd, send, r, large)
    if large and a.direct:
        a.publish(0, send)
    a.sync()
    return alltoallv_take(a, spec, send, recv, head, data)


def alltoallv_take(a: Arena, spec: Spec, send: Array, recv: Array, head: list[memoryview],
                   data: list[Array]) -> bool:
    """An alltoallv's rest of the call after the slots' sync, ``head`` and ``data`` every
    rank's header and the rest of its slot: each block copied out of its sender's slot (or
    read straight out of its ``send`` where any rank's header says large, else: False, the
    message path)."""
    sd, rc, rd = spec.displs, spec.rcounts, spec.rdispls
    assert sd is not None and rc is not None and rd is not None
    r, p = a.chan.rank, a.chan.size
    read = False  # (the same answer on every rank; a loop: any() of a generator took 0.3 us)
    for h in head:
        if h[0]:
            read = True
            break
    if read and not a.direct:
        return False
    wrong = sent = -1  # (the first wrong block's sender and count, read before a second sync)
    for i, h in enumerate(head):
        n = rc[i]
        if i == r:
            recv[rd[r] : rd[r] + n] = send[sd[r] : sd[r] + n]
        elif h[1 + r] != n:
            if wrong < 0:
                wrong, sent = i, h[1 + r]
        elif h[0]:
            a.read(i, 0, h[1 + p + r] * recv.itemsize, recv[rd[i] : rd[i] + n])
        else:
            at = h[1 + p + r]
            recv[rd[i] : rd[i] + n] = data[i][at : at + n]
    if read:
        a.sync()  # no rank changes its send while a peer still reads it
    if wrong >= 0:
        raise _mismatch(a, f"rank {wrong} sends {_units(sent, recv)} to this rank "
                           f"(rank {r}), which expects {_units(rc[wrong], recv, True)} "
                           f"(recvcounts[{wrong}])")
    return True


def reduce_scatter(a: Arena, spec: Spec, send: Array, recv: Array, op: Op | None = None
                   ) -> bool:
    """Reduce every rank's ``send`` (``spec.counts`` blocks, the same on every rank: they are
    in the signature) and give rank i block i, combined in rank order: as reduce_scatter_block
    does, through the slots where the whole vector fits one (one sync, each rank combining its
    block of every slot), else straight out of the ranks' ``send`` where ranks may read each
    other's memory (see ``_combine_slice``: two syncs), else on the message path."""
    c = spec.counts
    assert c is not None and op is not None
    r = a.chan.rank
    lo = sum(c[:r])
    n = c[r]
    _, data, cap = _views(a, recv.dtype)
    if sum(c) <= cap:
        data[r][: sum(c)] = send
        a.sync()
        if len(data) == 1:
            recv[...] = send[lo : lo + n]
        else:
            _combine_in_rank_order(op, recv, [d[lo : lo + n] for d in data])
        return True
    if a.direct:
        a.publish(0, send)
    a.sync()
    if not a.direct:
        return False
    _combine_slice(a, send, recv, lo, op)
    a.sync()  # every rank has read its block of this one's send
    return True


#: the runners, by collective
RUN = {"allgatherv": allgatherv, "gatherv": gatherv, "scatterv": scatterv,
       "alltoallv": alltoallv, "reduce_scatter": reduce_scatter}
