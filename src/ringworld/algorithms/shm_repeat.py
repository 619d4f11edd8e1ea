"""Runners for the repeats of small shared-memory collectives.

A small allreduce, allgather, alltoall or reduce_scatter_block is one sync through the slots
(see :mod:`ringworld.algorithms.shm_collectives`): each rank copies its input into its slot,
syncs, and reads every rank's. At 8 bytes that is a few microseconds, and the lookups around
it (the slots' views for this dtype and count, which block is this rank's, how to combine) are
a good part of them. A program repeats the same call, so :func:`quick` does them once, for a
call's shape, and returns a runner that only copies, syncs and reads (and copies the blocks out
with one ``np.concatenate`` rather than a slice assignment per rank). Same job, np=2, 8-byte
blocks, with and without it: allreduce 3.53 -> 2.80 us, allgather 3.73 -> 2.89, alltoall 4.02
-> 3.02, reduce_scatter_block 4.28 -> 3.04; np=4 on two cores within the noise (+2% to -12%).
A bcast of up to EAGER_MAX bytes is one entry of the root's eager ring: its runner is the
arena's (:meth:`~ringworld.algorithms.shm_arena.Arena.bcast_runner`; 8 bytes: 3.25 -> 2.25 us).

The v-variants' repeats (:func:`quick_vector`) do the same for
:mod:`ringworld.algorithms.shm_vector`'s slot paths: the slots' header and data views of both
parities, this rank's header words (its counts and where its blocks lie) and its blocks'
places, made once; a header word that says anything but the usual (a peer's large blocks, a
count this rank does not expect) hands the rest of the call to shm_vector's own steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ringworld.algorithms.shm_collectives import _combine_in_rank_order
from ringworld.algorithms.shm_eager_reduce import REDUCE_WORDS, Fold
from ringworld.algorithms.shm_policy import (
    EAGER_MAX,
    OWN_APART,
    bcast_eager,
    gathers_direct,
    gathers_eager,
    scatter_apart,
    scatter_skip,
)
from ringworld.algorithms.shm_vector import (
    alltoallv_take,
    eager,
    eager_gatherv_runner,
    eager_scatterv_runner,
    gatherv_sent,
    scatterv_got,
    slot_views,
    wrong_block,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ringworld.algorithms.schedule import Spec
    from ringworld.algorithms.shm_arena import Arena
    from ringworld.comm.ops import Op

Array = np.ndarray[Any, Any]
Runner = Callable[["Arena", Array, Array, "Op | None", int], None]
VRunner = Callable[["Arena", "Spec", Array, Array, "Op | None"], bool]


def quick(a: Arena, coll: str, send: Array, recv: Array, op: Op | None,
          root: int) -> Runner | None:
    """A runner of ``coll`` on ``a`` with ``shm_collectives.RUN[coll]``'s arguments (its
    ``a``, op and root are those given here), for flat arrays of ``send``'s and ``recv``'s
    dtype and size, that takes the same steps; None where such a call does not go through
    the slots or an eager entry (larger ones, other collectives). Cost: the slots' or
    entries' views, once."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    if coll == "bcast":
        return a.bcast_runner(root, recv) if bcast_eager(a, recv.nbytes) else None
    if coll == "scatter":  # (one entry of the root's ring holds every block: see scatter)
        n = recv.size
        if recv.nbytes * p > EAGER_MAX:
            return None
        apart = scatter_apart(recv.nbytes)  # (the entry without the root's own block)
        if r == root:
            return a.bcast_runner(root, send[n:] if apart else send,
                                  own=slice(r * n, (r + 1) * n), apart=apart)
        return a.bcast_runner(root, recv, skip=scatter_skip(r, root, n, recv.nbytes),
                              whole=recv.nbytes * (p - apart))
    if coll == "allreduce" and op is not None and recv.nbytes <= a.small_reduce:
        return _allreduce(a, op, _by_epoch(a, dt, recv.size))
    if coll == "reduce" and op is not None and send.nbytes <= a.small_reduce:
        if a.crowded:  # (the eager rings, as reduce: a gather's put, the root's Fold)
            return a.gather_runner(root, send) if r != root else _reduce_root(a, op, send, root)
        return _allreduce(a, op, _by_epoch(a, send.dtype, send.size), root=root)
    if coll == "gather":  # (as gather: the eager rings where gather_eager says, else slots)
        if gathers_eager(a, send.nbytes):
            return a.gather_runner(root, send)
        if a.crowded or send.nbytes > a.small:
            return None
        if gathers_direct(a, send.nbytes):
            return None  # (the direct path: see gather)
        views = _by_epoch(a, send.dtype, send.size)
        return _gather(a, views) if r == root else _put(a, views)
    if send.nbytes > a.small or coll not in ("allgather", "alltoall", "reduce_scatter_block"):
        return None
    views = _by_epoch(a, dt, send.size)
    if coll == "allgather":
        return _gather(a, views)
    n = send.size // p  # alltoall and reduce_scatter_block: this rank's block of every slot
    if coll == "alltoall" and n * dt.itemsize >= OWN_APART:
        return _alltoall(a, views, n)
    own = tuple(tuple(s[r * n : (r + 1) * n] for s in v) for v in views)
    if coll == "alltoall":
        return _gather(a, views, own)
    return None if op is None else _allreduce(a, op, views, own)


def _alltoall(a: Arena, views: tuple[list[Array], list[Array]], n: int) -> Runner:
    """An alltoall of ``n``-element blocks through the slots (of at least OWN_APART bytes), as
    its slot path: the blocks for the others into this rank's slot, arrive, its own block
    straight from ``send`` to ``recv`` while the others copy theirs in, wait, then its block
    of every other rank's slot out."""
    r, p = a.chan.rank, a.chan.size
    others = [i for i in range(p) if i != r]
    into = tuple([(v[r][i * n : (i + 1) * n], i * n, (i + 1) * n) for i in others]
                 for v in views)
    out = tuple([(v[i][r * n : (r + 1) * n], i * n, (i + 1) * n) for i in others]
                for v in views)
    lo, hi = r * n, (r + 1) * n

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        e = a.epoch & 1
        for dst, b0, b1 in into[e]:
            dst[...] = send[b0:b1]
        a.sync(wait=False)
        recv[lo:hi] = send[lo:hi]  # (in place: the same bytes onto themselves)
        a.sync(arrive=False)
        for src, b0, b1 in out[e]:
            recv[b0:b1] = src

    return run


def _by_epoch(a: Arena, dt: np.dtype[Any], count: int) -> tuple[list[Array], list[Array]]:
    """Every rank's slots as ``count`` of ``dt``, indexed by the arena's epoch's parity (the
    next sync's slots are the other parity's)."""
    return a.slots(1, dt, count), a.slots(0, dt, count)


def _allreduce(a: Arena, op: Op, views: tuple[list[Array], list[Array]],
               blocks: tuple[tuple[Array, ...], ...] | None = None, root: int = -1) -> Runner:
    """Copy in, sync, combine every rank's slot (or ``blocks``: a block of each) in rank
    order, as the slot paths of allreduce and reduce_scatter_block; and of reduce (``root``:
    only there)."""
    r = a.chan.rank
    ins = views if blocks is None else blocks
    uf = op.ufunc if a.chan.size == 2 else None
    combines = root < 0 or r == root

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        e = a.epoch & 1
        views[e][r][...] = send
        a.sync()
        if not combines:
            return
        x = ins[e]
        if uf is not None:
            uf(x[0], x[1], out=recv)
        else:
            _combine_in_rank_order(op, recv, x)

    return run


def _reduce_root(a: Arena, op: Op, like: Array, root: int) -> Runner:
    """The root of a small reduce through the eager rings (see ``shm_collectives.reduce``):
    every other rank's entries' views made once, each taken into a :class:`Fold` in rank
    order as it is stamped."""
    views = [a.ring_entries(i, like) if i != root else [] for i in range(a.chan.size)]
    fold = Fold(op, root)
    take = a.filled_gather_runner(root, False, lambda i, e, _recv: fold.take(i, views[i][e]),
                                  REDUCE_WORDS)

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        fold.begin(send, recv)
        take(recv)
        fold.end()

    return run


def _put(a: Arena, views: tuple[list[Array], list[Array]]) -> Runner:
    """Copy in, sync: a gather's rank other than the root, as gather's slot path."""
    r = a.chan.rank

    def run(_: Arena, send: Array, _recv: Array, _op: Op | None, _root: int) -> None:
        views[a.epoch & 1][r][...] = send
        a.sync()

    return run


def _gather(a: Arena, views: tuple[list[Array], list[Array]],
            blocks: tuple[tuple[Array, ...], ...] | None = None) -> Runner:
    """Copy in, sync, copy every rank's slot (or ``blocks``: a block of each) into ``recv``
    in rank order, as the slot paths of allgather and alltoall; and of gather at its root
    (whose own block goes through its slot too, which gather's own steps leave out)."""
    r = a.chan.rank
    ins = views if blocks is None else blocks
    concatenate = np.concatenate

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        e = a.epoch & 1
        views[e][r][...] = send
        a.sync()
        concatenate(ins[e], out=recv)

    return run


def quick_vector(a: Arena, coll: str, spec: Spec, send: Array, recv: Array
                 ) -> VRunner | None:
    """A runner of the v-variant ``coll`` on ``a`` with ``shm_vector.RUN[coll]``'s arguments
    and return (its ``a`` and ``spec`` are those given here), for flat arrays of ``send``'s
    and ``recv``'s dtype and size, that takes the same steps; None where such a call does not
    go through the slots with every block of this rank's in its slot, nor through the eager
    rings with every block in an entry (ranks that share cores take those for a scatterv, and
    for a gatherv where they may write each other's memory: see shm_vector; larger blocks,
    but a crowded scatterv's root where ranks may read each other's memory; reduce_scatter).
    Cost: the slots' or entries' views and this rank's header words, once."""
    if coll == "reduce_scatter":
        return None
    dt = send.dtype if coll == "gatherv" else recv.dtype
    if coll == "scatterv" and eager(a, spec, recv, False):  # (the root's eager ring)
        return eager_scatterv_runner(a, spec, dt)
    if coll == "gatherv" and eager(a, spec, send, True):  # (the senders' rings)
        return eager_gatherv_runner(a, spec, dt, send.size)
    views = (slot_views(a, 1, dt), slot_views(a, 0, dt))  # (by the epoch's parity)
    heads, datas = (views[0][0], views[1][0]), (views[0][1], views[1][1])
    cap, r, root = views[0][2], a.chan.rank, spec.root
    if coll == "gatherv" and r != root:  # (the counts are the root's)
        return None if send.size > cap else _gatherv_sender(a, root, send.size, heads, datas)
    if coll == "scatterv" and r != root:
        return _scatterv_receiver(a, root, recv.size, heads, datas)
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    if coll == "allgatherv":
        return None if max(c) > cap else _allgatherv(a, c, d, datas, recv.size)
    if coll == "gatherv":
        if any(n > cap for i, n in enumerate(c) if i != r):
            return None
        return _gatherv_root(a, c, d, heads, datas)
    if sum(c) - c[r] > cap:  # (a scatterv's root, an alltoallv rank: blocks into its slot)
        return None
    own = slice(d[r], d[r] + c[r]) if coll == "scatterv" else None
    return _put_then(a, spec, own, heads, datas)


_Pair = tuple[list[Any], list[Any]]  # (per epoch parity: every rank's header, or its data)


def _allgatherv(a: Arena, c: Sequence[int], d: Sequence[int], datas: _Pair, size: int
                ) -> VRunner:
    """Copy in, sync, copy every rank's block out of its slot (one ``np.concatenate`` where
    the displacements pack the blocks in rank order)."""
    r = a.chan.rank
    mine = tuple(x[r][: c[r]] for x in datas)
    blocks = tuple(tuple(x[i][:n] for i, n in enumerate(c)) for x in datas)
    spans = [(lo, lo + n) for lo, n in zip(d, c, strict=True)]
    if spans == [(sum(c[:i]), sum(c[: i + 1])) for i in range(len(c))] and size == sum(c):
        concatenate = np.concatenate

        def packed(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
            e = a.epoch & 1
            mine[e][...] = send
            a.sync()
            concatenate(blocks[e], out=recv)
            return True

        return packed

    def run(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        e = a.epoch & 1
        mine[e][...] = send
        a.sync()
        for (lo, hi), b in zip(spans, blocks[e], strict=True):
            recv[lo:hi] = b
        return True

    return run


def _gatherv_sender(a: Arena, root: int, n: int, heads: _Pair, datas: _Pair) -> VRunner:
    """Count and block into this rank's slot, sync; the root's header read as
    :func:`~ringworld.algorithms.shm_vector.gatherv_sent` reads it where it says anything but
    this block's count, in the slots."""
    r = a.chan.rank
    mine = tuple(h[r] for h in heads)
    data = tuple(x[r][:n] for x in datas)
    lead = tuple(h[root] for h in heads)

    def run(_: Arena, _s: Spec, send: Array, _recv: Array, _op: Op | None) -> bool:
        e = a.epoch & 1
        mine[e][0] = n
        data[e][...] = send
        a.sync()
        h = lead[e]
        if h[0] or h[1 + r] != n:
            return gatherv_sent(a, root, send, h)
        return True

    return run


def _gatherv_root(a: Arena, c: Sequence[int], d: Sequence[int], heads: _Pair, datas: _Pair
                  ) -> VRunner:
    """The root's header (not large, its counts and displacements) as one prepared block,
    sync, every rank's block in rank order (as gatherv writes them: where displacements
    overlap, the later rank's lands last), the root's own from its ``send``, each other out of
    its slot where its count is the root's."""
    r = a.chan.rank
    words = _words([0, *c, *d])
    mine = tuple(h[r][: len(words)] for h in heads)
    blocks = [(i, d[i], d[i] + n, n) for i, n in enumerate(c)]
    ins = tuple([(h[i], x[i][:n]) if i != r else (None, None) for i, _, _, n in blocks]
                for h, x in zip(heads, datas, strict=True))

    def run(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        e = a.epoch & 1
        mine[e][:] = words
        a.sync()
        bad = -1
        for (i, lo, hi, n), (h, src) in zip(blocks, ins[e], strict=True):
            if h is None:
                recv[lo:hi] = send  # (in place: the same bytes onto themselves)
            elif h[0] == n:
                recv[lo:hi] = src
            elif bad < 0:
                bad = i
        if bad >= 0:
            raise wrong_block(a, bad, heads[e][bad][0], c, recv)
        return True

    return run


def _scatterv_receiver(a: Arena, root: int, n: int, heads: _Pair, datas: _Pair) -> VRunner:
    """Sync, this rank's block out of the root's slot, where the root's header says what
    :func:`~ringworld.algorithms.shm_vector.scatterv_got` would take there."""
    r, p = a.chan.rank, a.chan.size
    lead = tuple(h[root] for h in heads)
    data = tuple(x[root] for x in datas)

    def run(_: Arena, _s: Spec, _send: Array, recv: Array, _op: Op | None) -> bool:
        e = a.epoch & 1
        a.sync()
        h = lead[e]
        if h[0] or h[1 + r] != n:
            return scatterv_got(a, root, recv, h, data[e])
        at = h[1 + p + r]
        recv[...] = data[e][at : at + n]
        return True

    return run


def _put_then(a: Arena, spec: Spec, own: slice | None, heads: _Pair, datas: _Pair
              ) -> VRunner:
    """Header and blocks into this rank's slot (as ``shm_vector._pack`` lays them out), sync,
    then: a scatterv root's own block out of its ``send`` at ``own``, or (None) an alltoallv's
    blocks out of every rank's slot by their headers
    (:func:`~ringworld.algorithms.shm_vector.alltoallv_take`)."""
    r = a.chan.rank
    c, d = spec.counts, spec.displs
    assert c is not None and d is not None
    at, where = 0, []
    for i, n in enumerate(c):
        where.append(at)
        if i != r:
            at += n
    words = _words([0, *c, *where])
    mine = tuple(h[r][: len(words)] for h in heads)
    packs = tuple([(d[i], d[i] + n, x[r][where[i] : where[i] + n])
                   for i, n in enumerate(c) if i != r and n] for x in datas)

    def run(_: Arena, _s: Spec, send: Array, recv: Array, _op: Op | None) -> bool:
        e = a.epoch & 1
        mine[e][:] = words
        for lo, hi, dst in packs[e]:
            dst[...] = send[lo:hi]
        a.sync()
        if own is not None:
            recv[...] = send[own]  # (in place: the same bytes onto themselves)
            return True
        return alltoallv_take(a, spec, send, recv, heads[e], datas[e])

    return run


def _words(values: list[int]) -> memoryview:
    """``values`` as int64 words, in the format of the headers' views (a slice of one is
    assigned them in one copy)."""
    return memoryview(np.array(values, np.int64).tobytes()).cast("q")
