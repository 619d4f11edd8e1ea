"""Shared-memory collectives: on one host every rank reads the others' data directly.

Each rank of the communicator owns a window (mapped by all, see ``map_shared``)::

    [ counter (own cache line) | pad to 4 KiB | slot 0, slot 1 (SLOT each) | area 0 | area 1
      | eager ring (EAGER_RING entries of EAGER_SMALL, EAGER_BIG of EAGER_MAX) ]

A *sync* is a flag barrier: a rank stores its epoch in its counter and waits until every
counter has reached it (x86 stores become visible in program order, so data written before
the counter is seen by a rank that has seen the counter). Messages and matching are bypassed;
the transport is still polled while waiting, so other operations keep moving. The windows,
the sync and the bookkeeping around them are :class:`~ringworld.algorithms.shm_arena.Arena`;
this module holds the collectives that run over them.

allreduce, per chunk of at most CHUNK bytes::

    1. rank i copies its input chunk (all but its own slice) into its area 0
    2. sync
    3. rank i combines slice i of every rank's chunk, in rank order, into its output and
       into its area 1 (one pass over p inputs: each element is reduced once, by one rank,
       so the result is bitwise identical everywhere and non-commutative ops are fine)
    4. sync
    5. rank i copies every other rank's reduced slice from their area 1

That is (2 - 1/p) n bytes copied and n/p reduced per rank, against 4 n (p-1)/p bytes moved
through a transport by the ring. bcast, allgather, reduce_scatter_block, alltoall and reduce
follow the same pattern. Rules that keep back-to-back collectives safe without extra syncs:
area 0 is written only before a collective's first sync and read only before its last; area 1
is written only after its first sync.

Large copy-only transfers (alltoall, allgather and bcast from sizes the arena's Policy gives,
larger where ranks share cores: see ``ringworld.tuning.shm_paths``) skip the windows when the
kernel lets ranks read and write each other's memory (probed once, agreed by all): each rank
publishes its buffer's address, and peers copy straight out of it (one copy instead of two),
with a sync before anyone may touch its buffer again; in an allgather each rank instead writes
its block into the others' buffers, a piece at a time just after copying it into its own.
Reduce_scatter_block and allreduce from their sizes read their slice of the others' inputs the
same way (allreduce then the others' results too). In a broadcast the root, which would be
idle, writes the first 1/p of the data into every other rank's buffer while they read the rest
(on two ranks, from 16 MiB, the two take pieces from either end until they meet, so a rank
slowed by other work copies less).
Other broadcasts stream (see ``_stream``): the root fills a ring of pieces while the others
empty it.

Small and medium messages take one sync (data up to a slot, SLOT bytes; an allreduce's or
reduce's vector while p of them are at most COMBINE_ALL: ``Policy.small``): every rank writes
its data into slot ``epoch % 2``, syncs, and reads what it needs from everyone's slot; a rank
reusing a slot two syncs later knows everyone has passed the sync in between, so has finished
reading it.
Allreduce then has every rank combine all p inputs in rank order (same operands, same order:
identical results); a barrier is just a sync. Small broadcasts take no sync at all: the root
stamps its data into a ring in its window and returns, the others copy it out when they get
there (see ``Arena.eager_bcast``). These paths copy by assignment (``dst[...] = src``,
same shapes and dtypes): 0.13 us a call where ``np.copyto`` costs 0.44.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from ringworld.algorithms.schedule import blocks
from ringworld.algorithms.shm_arena import (
    CONSUMED,
    MAX_RANKS,
    RACE_ALLGATHER,
    RACE_ALLTOALL,
    RACE_REDUCE_SCATTER,
    Arena,
)
from ringworld.algorithms.shm_eager_reduce import reduce_eager
from ringworld.algorithms.shm_policy import (
    CHUNK,
    DIRECT,
    EAGER_BIG,
    EAGER_MAX,
    EAGER_RING,
    EAGER_SMALL,
    OWN_APART,
    RACED,
    SLOT,
    SMALL,
    Policy,
    bcast_eager,
    gathers_direct,
    gathers_eager,
    scatter_apart,
    scatter_skip,
)
from ringworld.algorithms.shm_race import RACE_COST, RACE_LAST, RACE_TRY, _Race
from ringworld.comm.ops import Op
from ringworld.errors import MismatchError

__all__ = ["CHUNK", "DIRECT", "EAGER_BIG", "EAGER_MAX", "EAGER_RING", "EAGER_SMALL", "MAX_RANKS",
           "RACED", "RACE_COST",
           "RACE_LAST", "RACE_TRY", "RUN", "SLOT", "SMALL", "Arena", "Policy", "_Race",
           "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "reduce",
           "reduce_scatter_block", "scan", "scatter"]

Array = np.ndarray[Any, Any]

PIECE = 1 << 18  # streamed broadcasts move pieces this large (they stay in cache)
# direct broadcasts on two ranks of at least SHARE_FROM bytes share out their copying as it
# goes, in pieces of SHARE_PIECE (see _bcast_shared); smaller ones, and those of more ranks or
# ranks sharing cores, split it in fixed parts. np=2 beside one busy process, MPICH time /
# Ringworld time: 16 MiB 0.88 -> 1.26 (medians of 3), and in alternating single runs
# 0.87, 1.26, 0.92 -> 1.10, 1.36, 1.88 (2.0-2.1 ms against 2.2-3.3); 64 MiB 1.03 -> 1.34.
# At 4-8 MiB the alternating runs were noise (4 MiB: 1.03-1.64 fixed, 0.93-1.53 shared).
# Quiet unchanged (1.15-1.58 against 1.12-1.46); 512 KiB pieces lost 10-20% quiet at 16 MiB.
# np=4 on 2 cores lost (4 MiB quiet 0.93 -> 0.57): there the fixed parts let the root copy one
# cached quarter to every receiver, and ranks take turns on the cores anyway
SHARE_FROM = 16 << 20
SHARE_PIECE = 1 << 20
# the pieces of a direct allgather: each is copied to the rank's own recv and then written to
# the others' while it is still in cache. Blocks of up to GATHER_WHOLE go whole, larger ones in
# GATHER_PIECE pieces (np=2, same job, medians of five: 8 MiB allgather 217 us whole, 260 in
# 512 KiB pieces; 16 MiB 952-993 in 512 KiB pieces, 1039-1102 in 4 MiB, 1041-1064 whole;
# 64 MiB 5.47-5.51 ms against 5.76-5.82 and 6.26-6.34; 256 KiB pieces no better, 128 KiB worse.
# On an earlier VM: 64 MiB 12.4 ms with 4 MiB pieces, 13.3 whole, 13.5 reading from the peer)
GATHER_WHOLE = 4 << 20
GATHER_PIECE = 512 << 10


def _combine_in_rank_order(op: Op, dst: Array, ins: Sequence[Array]) -> None:
    """``dst = ins[0] op ins[1] op ...`` (at least two inputs), in place, in rank order."""
    op.combine_into(dst, ins[0], ins[1])
    for x in ins[2:]:
        op.reduce_into(dst, x, src_left=False)


def _publish_blocks(a: Arena, send: Array, n: int, b0: int, m: int, which: int = 0) -> None:
    """Copy elements [b0, b0 + m) of every other rank's block (``n`` each) of ``send`` into
    this rank's area ``which``, block j at j * m, for rank j to take after the next sync."""
    r = a.chan.rank
    a.place(which, send[b0:])
    mine = a.area(r, which, send.dtype, a.chan.size * m)
    for j in range(a.chan.size):
        if j != r:
            np.copyto(mine[j * m : (j + 1) * m], send[j * n + b0 : j * n + b0 + m])


def _apart(at: int, nbytes: int, other_at: int, other_nbytes: int) -> bool:
    """Whether two published buffers (addresses and sizes) do not overlap."""
    return at + nbytes <= other_at or other_at + other_nbytes <= at


def _parts(n: int, chunk_elems: int) -> list[tuple[int, int]]:
    step = max(1, chunk_elems)
    return [(s, min(step, n - s)) for s in range(0, n, step)] or [(0, 0)]


def barrier(a: Arena) -> None:
    """A barrier: one sync over the shared counters."""
    a.sync()


def allreduce(a: Arena, send: Array, recv: Array, op: Op, root: int = 0) -> None:
    """Allreduce through shared memory (rank-ordered, bitwise identical on all ranks)."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    if recv.nbytes <= a.small_reduce:  # one sync; every rank combines all in rank order
        slot = a.slots(a.next_parity(), dt, recv.size)
        slot[r][...] = send
        a.sync()
        uf = op.ufunc
        if uf is not None and p == 2:  # the latency-critical case, without the helpers
            uf(slot[0], slot[1], out=recv)
        else:
            _combine_in_rank_order(op, recv, slot)
        return
    if a.direct and recv.nbytes >= a.direct_min["allreduce"]:
        _allreduce_direct(a, send, recv, op)
        return
    inplace = np.shares_memory(send, recv)
    for c0, m in _parts(recv.size, a.chunk // dt.itemsize):
        blk = blocks(m, p)
        s0, sl = blk[r]
        src = send[c0 : c0 + m]
        a.place(0, src)
        mine = a.area(r, 0, dt, m)
        if inplace:  # our own slice is overwritten below while others' are still needed
            np.copyto(mine, src)
        else:
            np.copyto(mine[:s0], src[:s0])
            np.copyto(mine[s0 + sl :], src[s0 + sl :])
        a.sync()
        ins = [a.area(i, 0, dt, m)[s0 : s0 + sl] for i in range(p)]
        if not inplace:
            ins[r] = src[s0 : s0 + sl]
        dst = recv[c0 + s0 : c0 + s0 + sl]
        _combine_in_rank_order(op, dst, ins)
        a.place(1, recv[c0:])
        np.copyto(a.area(r, 1, dt, m)[s0 : s0 + sl], dst)
        a.sync()
        for i in range(p):
            if i != r:
                b0, bl = blk[i]
                np.copyto(recv[c0 + b0 : c0 + b0 + bl], a.area(i, 1, dt, m)[b0 : b0 + bl])


def _allreduce_direct(a: Arena, send: Array, recv: Array, op: Op) -> None:
    """Allreduce reading peers' buffers directly: rank i reads slice i of every other rank's
    input (a chunk at a time, into its own window), combines them in rank order into its
    ``recv``, and after a sync reads every other slice from its owner's ``recv``.

    Per rank that is (p-1)/p n bytes read twice and n/p reduced p-1 times, against the windows'
    copy in, copy of the result out and copy of the others' results in: one pass over the data
    less. Each slice is computed once, so every rank gets bitwise the same result.
    """
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    isz = dt.itemsize
    blk = blocks(recv.size, p)
    s0, sl = blk[r]
    a.publish(0, send)
    a.publish(1, recv)
    a.sync()
    if (p == 2 and recv.nbytes >= SHARE_FROM and not a.crowded
            and all(_apart(c[24], recv.nbytes, c[25], recv.nbytes) for c in a.counters)):
        _allreduce_shared(a, send, recv, op)
        a.sync()  # every piece is in both ranks' recv
        return
    _combine_slice(a, send, recv[s0 : s0 + sl], s0, op)
    a.sync()  # every slice is combined (and every input read): fetch the others' results
    for i, (b0, bl) in enumerate(blk):
        if i != r and bl:
            a.read(i, 1, b0 * isz, recv[b0 : b0 + bl])
    a.sync()  # no rank reuses its recv while a peer still reads from it


def _combine_slice(a: Arena, send: Array, out: Array, s0: int, op: Op) -> None:
    """``out`` = elements [s0, s0 + out.size) of every rank's ``send`` combined in rank order,
    read straight from the peers' buffers (published as buffer 0 before a sync), a chunk at a
    time. ``out`` may overlap this rank's ``send`` (in place).

    This rank's windows serve as scratch: no peer reads them while buffers are read directly.
    Cost: (p-1) out.nbytes read from peers and p-1 combining passes.
    """
    p, r = a.chan.size, a.chan.rank
    dt = out.dtype
    isz = dt.itemsize
    # the running result is out's piece, except where out holds this rank's own input and that
    # is not the first operand (reading rank 0's piece there would overwrite it first)
    apart = r > 0 and np.shares_memory(send, out)
    for off, m in _parts(out.size, a.chunk // isz):
        if not m:
            break
        c0 = s0 + off
        mine = send[c0 : c0 + m]
        if apart:
            a.place(1, mine)
            acc = a.area(r, 1, dt, m)
        else:
            acc = out[off : off + m]
        a.place(0, mine)
        tmp = a.area(r, 0, dt, m)
        if r:
            a.read(0, 0, c0 * isz, acc)
        left = mine if r == 0 else acc
        for i in range(1, p):
            if i == r:
                right = mine
            else:
                a.read(i, 0, c0 * isz, tmp)
                right = tmp
            op.combine_into(acc, left, right)
            left = acc
        if apart:
            np.copyto(out[off : off + m], acc)


def reduce(a: Arena, send: Array, recv: Array, op: Op, root: int) -> None:
    """Reduce to ``root`` through shared memory (each rank combines one slice; a small
    vector in one sync, the root combining every rank's copy in rank order)."""
    p, r = a.chan.size, a.chan.rank
    dt = send.dtype
    if a.crowded and send.nbytes <= a.small_reduce:
        reduce_eager(a, send, recv, op, root)
        return
    if send.nbytes <= a.small_reduce:
        slot = a.slots(a.next_parity(), dt, send.size)
        slot[r][...] = send
        a.sync()
        if r == root:
            uf = op.ufunc
            if p == 1:
                np.copyto(recv, slot[0])
            elif uf is not None and p == 2:  # as allreduce's, without the helpers
                uf(slot[0], slot[1], out=recv)
            else:
                _combine_in_rank_order(op, recv, slot)
        return
    for c0, m in _parts(send.size, a.chunk // dt.itemsize):
        blk = blocks(m, p)
        s0, sl = blk[r]
        a.place(0, send[c0:])
        np.copyto(a.area(r, 0, dt, m), send[c0 : c0 + m])
        a.sync()
        ins = [a.area(i, 0, dt, m)[s0 : s0 + sl] for i in range(p)]
        if r != root:
            a.place(1, send[c0:])
        dst = (recv[c0 + s0 : c0 + s0 + sl] if r == root else a.area(r, 1, dt, m)[s0 : s0 + sl])
        _combine_in_rank_order(op, dst, ins)
        a.sync()
        if r == root:
            for i in range(p):
                if i != r:
                    b0, bl = blk[i]
                    np.copyto(recv[c0 + b0 : c0 + b0 + bl], a.area(i, 1, dt, m)[b0 : b0 + bl])


def bcast(a: Arena, send: Array, buf: Array, op: Op | None, root: int) -> None:
    """Broadcast ``buf`` (``send`` is the same array): small ones through the root's eager
    ring (no sync), large ones by direct copies or streamed through the root's window."""
    r = a.chan.rank
    if bcast_eager(a, buf.nbytes):
        a.eager_bcast(buf if buf.ndim == 1 else buf.reshape(-1), root)
        return
    if a.direct and buf.nbytes >= a.direct_min["bcast"]:
        # every rank publishes its buffer; the root, idle otherwise, writes the first 1/p of
        # the data into every other rank's buffer while each of them reads the rest: both
        # sides copy at once ((p-1)/p of the bytes each, rather than the receivers all of them)
        a.publish(0, buf)
        a.sync()
        raw = buf.reshape(-1).view(np.uint8)
        if raw.size >= SHARE_FROM and a.chan.size == 2 and not a.crowded:
            _bcast_shared(a, raw, root)
        else:
            head = (raw.size // a.chan.size) & ~63
            if r == root:
                for j in range(a.chan.size):
                    if j != root:
                        a.write(j, 0, 0, raw[:head])
            else:
                a.read(root, 0, head, raw[head:])
        a.sync()
        return
    raw = buf.reshape(-1).view(np.uint8)
    _stream(a, raw if r == root else None, [root], lambda j: raw)


def _claims(a: Arena, n: int, front: bool, word: int = 0, theirs: int = 0) -> Iterator[int]:
    """The pieces (of ``n``) this rank takes where two ranks share out a direct call's work as
    it goes (between two syncs): this one from the front (``front``) or from the back, each
    taking its next piece only while the other has not taken it (two may take the one piece
    where they meet: the work must allow that). A rank slowed by other work on its CPU takes
    fewer, where halves fixed in advance made the call wait for it. Each side tells its
    progress in its header's progress word (this one in ``word``, the other in ``theirs``),
    tagged with the sync count: a word of an earlier call reads as no progress."""
    tag = (a.epoch & 0x7FFFFFFF) << 32
    other = 1 - a.chan.rank
    for k in range(n):  # this rank's (k+1)-th piece, if the other has not taken it
        w = a.told(other, theirs)  # how many pieces the other has taken from its end
        taken = w & 0xFFFFFFFF if w >> 32 << 32 == tag else 0
        i = k if front else n - 1 - k
        if (i >= n - taken) if front else (i < taken):
            return  # every piece left is the other's
        a.tell(tag | (k + 1), word)
        yield i


def _bcast_shared(a: Arena, raw: Array, root: int) -> None:
    """The copying of a direct broadcast on two ranks, shared out as it goes (see _claims):
    the receiver reads pieces of the root's buffer from the front, the root writes pieces into
    the receiver's buffer from the back (a piece both take is copied twice: the same bytes to
    the same place)."""
    me, other = a.chan.rank, 1 - a.chan.rank
    for i in _claims(a, -(-raw.size // SHARE_PIECE), me != root):
        piece = raw[i * SHARE_PIECE : (i + 1) * SHARE_PIECE]
        if me == root:
            a.write(other, 0, i * SHARE_PIECE, piece)
        else:
            a.read(root, 0, i * SHARE_PIECE, piece)


def _reduce_scatter_shared(a: Arena, send: Array, recv: Array, op: Op) -> None:
    """The combining of a direct reduce_scatter_block on two ranks, shared out as it goes (see
    _claims): each rank combines its own block from the front into its ``recv`` (progress word
    0) and then the other's from the back, writing those pieces into the other's ``recv``
    (word 1), so a rank slowed by other work combines less even of its own block. Each piece
    is combined in rank order by whichever rank takes it. Neither rank's ``recv`` may overlap
    its ``send``. Cost per piece: the peer's input read, one combining pass (and the result
    written to the peer for a piece of its block)."""
    me, other = a.chan.rank, 1 - a.chan.rank
    dt = recv.dtype
    isz, n = dt.itemsize, recv.size
    step = max(1, SHARE_PIECE // isz)
    a.place(0, send)
    scratch = a.area(me, 0, dt, step)  # (this rank's window: no peer reads it meanwhile)
    for block, front in ((me, True), (other, False)):
        for i in _claims(a, -(-n // step), front, 1 - front, int(front)):
            lo = i * step
            at = block * n + lo
            mine = send[at : at + min(step, n - lo)]
            theirs = scratch[: mine.size]
            a.read(other, 0, at * isz, theirs)
            dst = recv[lo : lo + step] if front else theirs
            if me == 0:
                op.combine_into(dst, mine, theirs)
            else:
                op.combine_into(dst, theirs, mine)
            if not front:
                a.write(other, 1, lo * isz, dst)


def _allreduce_shared(a: Arena, send: Array, recv: Array, op: Op) -> None:
    """The combining of a direct allreduce on two ranks, shared out as it goes (see _claims):
    rank 0 takes pieces from the front, rank 1 from the back, and each piece's result goes
    into both ranks' ``recv``, combined in rank order by whichever rank takes it (a piece both
    take gets the same bytes twice). Both inputs must stay unchanged meanwhile: neither rank
    runs in place. Cost per piece: its peer's input read, one combining pass, the result
    written to the peer; the same as the fixed halves' in all."""
    me, other = a.chan.rank, 1 - a.chan.rank
    dt = recv.dtype
    isz = dt.itemsize
    step = max(1, SHARE_PIECE // isz)
    a.place(0, send)
    scratch = a.area(me, 0, dt, step)  # (this rank's window: no peer reads it meanwhile)
    for i in _claims(a, -(-recv.size // step), me == 0):
        lo = i * step
        mine, dst = send[lo : lo + step], recv[lo : lo + step]
        theirs = scratch[: dst.size]
        a.read(other, 0, lo * isz, theirs)
        if me == 0:
            op.combine_into(dst, mine, theirs)
        else:
            op.combine_into(dst, theirs, mine)
        a.write(other, 1, lo * isz, dst)


def _consumed(ctr: list[memoryview], me: int, n: int, stream: int) -> bool:
    word = CONSUMED + me
    return all(c[word] >= n or c[31] == stream for i, c in enumerate(ctr) if i != me)


def _behind(ctr: list[memoryview], ranks: tuple[int, ...], me: int, n: int) -> list[int]:
    word = CONSUMED + me
    return [ranks[i] for i, c in enumerate(ctr) if i != me and c[word] < n]


def _produced(src: memoryview, n: int) -> bool:
    return bool(src[28] >= n)


def _refused(a: Arena, me: int, stream: int, nbytes: int) -> None:
    bad = [i for i, c in enumerate(a.counters) if i != me and c[31] == stream]
    if bad:
        raise MismatchError(f"{a.what}: rank(s) {bad} expected another size than this rank's "
                            f"{nbytes} bytes")


def _stream(a: Arena, produce: Array | None, producers: Sequence[int],
            into: Callable[[int], Array]) -> None:
    """Move byte streams of one length from ``producers`` to every other rank, piece by piece.

    Each producer copies piece i of ``produce`` into slot i mod NSLOTS of a ring in its area 0
    and bumps its produced counter; every other rank copies the piece into ``into(producer)``
    as soon as it is there and bumps its consumed counter for that producer; a producer reuses
    a slot once everyone has taken the piece that used it before. Producer and consumers copy at
    once on different cores, a piece (in cache) apart: about one copy's time in all, where the
    windows' copy-in, sync, copy-out took two. Piece numbers run on across calls (every rank
    counts the same pieces); a producer returns only once everyone has taken all its pieces, so
    the next collective may write its window.

    Raises:
        MismatchError: ranks disagree on the length (raised on every rank).
    """
    r = a.chan.rank
    ctr = a.counters
    mine = ctr[r]
    nbytes = produce.size if produce is not None else into(producers[0]).size
    pieces = max(1, -(-nbytes // PIECE))
    base = a.pieces
    a.pieces += pieces
    nslots = a.chunk // PIECE
    ranks = a.chan.world_ranks
    stream = base + 1
    area: Array | None = None
    if produce is not None:
        a.place(0, produce)
        mine[30] = nbytes
        area = a.area(r, 0, produce.dtype, a.chunk)
    sources = [j for j in producers if j != r]
    for i in range(pieces):
        g = base + i
        lo = i * PIECE
        n = min(PIECE, nbytes - lo)
        at = (g % nslots) * PIECE
        if area is not None and produce is not None:
            if i >= nslots and not _consumed(ctr, r, g - nslots + 1, stream):
                a.wait_for(partial(_consumed, ctr, r, g - nslots + 1, stream),
                           partial(_behind, ctr, ranks, r, g - nslots + 1), "a free slot")
                _refused(a, r, stream, nbytes)
            np.copyto(area[at : at + n], produce[lo : lo + n])
            mine[28] = g + 1
            a.chan.wake_peers()
        for j in sources:
            src = ctr[j]
            if src[28] < g + 1:
                a.wait_for(partial(_produced, src, g + 1), partial(list, (ranks[j],)),
                           f"piece {i} of {pieces} from rank {j}")
            if i == 0 and src[30] != nbytes:
                mine[31] = stream  # tell the producers, which would wait for us forever
                a.chan.wake_peers()
                raise MismatchError(f"{a.what}: rank {j} sends {src[30]} bytes, this rank "
                                    f"(rank {r}) expects {nbytes}")
            np.copyto(into(j)[lo : lo + n], a.area(j, 0, np.dtype(np.uint8), a.chunk)[at : at + n])
            mine[CONSUMED + j] = g + 1
            a.chan.wake_peers()
    if produce is not None:
        end = base + pieces
        if not _consumed(ctr, r, end, stream):
            a.wait_for(partial(_consumed, ctr, r, end, stream),
                       partial(_behind, ctr, ranks, r, end), "every rank to take this one's data")
        _refused(a, r, stream, nbytes)


def allgather(a: Arena, send: Array, recv: Array, op: Op | None = None, root: int = 0) -> None:
    """Every rank publishes its block; every rank copies all the others'."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    n = send.size
    if send.nbytes <= a.small:
        sl = a.slots(a.next_parity(), dt, n)
        sl[r][...] = send
        a.sync()
        for i in range(p):
            recv[i * n : (i + 1) * n] = sl[i]
        return
    if a.direct and a.race(RACE_ALLGATHER, send.nbytes,
                           send.nbytes >= a.direct_min["allgather"]):
        # each rank writes its block into every other rank's recv, a piece at a time right
        # after copying the piece into its own: the piece is read from memory once, not p times
        a.publish(0, recv)
        a.sync()
        src = send.reshape(-1).view(np.uint8)
        own = recv[r * n : (r + 1) * n].reshape(-1).view(np.uint8)
        apart = not np.shares_memory(send, recv)
        at = r * send.nbytes
        step = max(1, src.size if src.size <= GATHER_WHOLE else GATHER_PIECE)
        for lo in range(0, src.size, step):
            piece = src[lo : lo + step]
            if apart:
                np.copyto(own[lo : lo + step], piece)
            for j in range(p):
                if j != r:
                    a.write(j, 0, at + lo, piece)
        a.sync()  # every block has landed
        a.raced()
        return
    for k, (b0, m) in enumerate(_parts(n, a.chunk // dt.itemsize)):
        a.place(k % 2, send[b0:])
        np.copyto(a.area(r, k % 2, dt, m), send[b0 : b0 + m])
        if not np.shares_memory(send, recv):
            np.copyto(recv[r * n + b0 : r * n + b0 + m], send[b0 : b0 + m])
        a.sync()
        for i in range(p):
            if i != r:
                np.copyto(recv[i * n + b0 : i * n + b0 + m], a.area(i, k % 2, dt, m))
    a.sync()
    a.raced()


def reduce_scatter_block(a: Arena, send: Array, recv: Array, op: Op, root: int = 0) -> None:
    """Every rank publishes its p blocks; rank i combines block i of all, in rank order."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    n = recv.size
    if send.nbytes <= a.small:  # one sync; each rank combines its block of all, in rank order
        slot = a.slots(a.next_parity(), dt, p * n)
        slot[r][...] = send
        a.sync()
        own = slice(r * n, (r + 1) * n)
        _combine_in_rank_order(op, recv, [s[own] for s in slot])
        return
    if a.direct and a.race(RACE_REDUCE_SCATTER, recv.nbytes,
                           recv.nbytes >= a.direct_min["reduce_scatter_block"]):
        a.publish(0, send)
        a.publish(1, recv)
        a.sync()
        if (p == 2 and send.nbytes >= SHARE_FROM and not a.crowded
                and all(_apart(c[24], send.nbytes, c[25], recv.nbytes) for c in a.counters)):
            _reduce_scatter_shared(a, send, recv, op)
        else:
            _combine_slice(a, send, recv, r * n, op)
        a.sync()  # every rank has read its block of this one's send
        a.raced()
        return
    for b0, m in _parts(n, a.chunk // dt.itemsize // p):
        _publish_blocks(a, send, n, b0, m)
        a.sync()
        ins = [send[r * n + b0 : r * n + b0 + m] if i == r
               else a.area(i, 0, dt, p * m)[r * m : (r + 1) * m] for i in range(p)]
        dst = recv[b0 : b0 + m]
        _combine_in_rank_order(op, dst, ins)
        a.sync()
    a.raced()


def alltoall(a: Arena, send: Array, recv: Array, op: Op | None = None, root: int = 0) -> None:
    """Every rank publishes its p blocks; every rank copies its block from each."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    n = recv.size // p
    if send.nbytes <= a.small:  # one sync through the slots
        slot = a.slots(a.next_parity(), dt, p * n)
        if n * dt.itemsize < OWN_APART:
            slot[r][...] = send
            a.sync()
            for i in range(p):
                recv[i * n : (i + 1) * n] = slot[i][r * n : (r + 1) * n]
            return
        others = [i for i in range(p) if i != r]  # (see OWN_APART)
        for i in others:
            slot[r][i * n : (i + 1) * n] = send[i * n : (i + 1) * n]
        a.arrive()
        recv[r * n : (r + 1) * n] = send[r * n : (r + 1) * n]  # (in place: onto themselves)
        a.await_all()
        for i in others:
            recv[i * n : (i + 1) * n] = slot[i][r * n : (r + 1) * n]
        return
    if a.direct and a.race(RACE_ALLTOALL, send.nbytes,
                           send.nbytes >= a.direct_min["alltoall"]):
        a.publish(0, send)
        a.sync()
        for i in range(p):
            if i != r:
                a.read(i, 0, r * n * dt.itemsize, recv[i * n : (i + 1) * n])
        a.arrive()  # this rank is done with the others' buffers; its own block meanwhile
        np.copyto(recv[r * n : (r + 1) * n], send[r * n : (r + 1) * n])
        a.await_all()
        a.raced()
        return
    for b0, m in _parts(n, a.chunk // dt.itemsize // p):
        _publish_blocks(a, send, n, b0, m)
        np.copyto(recv[r * n + b0 : r * n + b0 + m], send[r * n + b0 : r * n + b0 + m])
        a.sync()
        for i in range(p):
            if i != r:
                np.copyto(recv[i * n + b0 : i * n + b0 + m],
                          a.area(i, 0, dt, p * m)[r * m : (r + 1) * m])
        a.sync()
    a.raced()


def gather(a: Arena, send: Array, recv: Array, op: Op | None = None, root: int = 0) -> None:
    """Every rank's block into the root's ``recv`` (block i from rank i): small blocks through
    the eager rings where ranks share cores or there are two (no sync: ranks other than the
    root return once their block is in their ring, and the root copies the blocks out; np=4
    on 2 cores, 32 B: 0.47x -> 0.79x of MPICH, 256 KiB 2.0x -> 3.9x; np=2: see
    ``shm_policy.gather_eager``), else through the slots (one sync), large ones written by their
    owners straight into the root's ``recv``, others through the windows a chunk at a time
    (the root copying out one chunk while the others copy in the next)."""
    p, r = a.chan.size, a.chan.rank
    dt = send.dtype
    n = send.size
    if gathers_eager(a, send.nbytes):
        if r == root:
            recv[r * n : (r + 1) * n] = send  # (its own place when in place: harmless)
        a.eager_gather(send, root, recv)
        return
    direct = gathers_direct(a, send.nbytes)  # (before the slots)
    if send.nbytes <= a.small and not direct:
        sl = a.slots(a.next_parity(), dt, n)
        if r == root:
            recv[r * n : (r + 1) * n] = send  # (its own place when in place: harmless)
        else:
            sl[r][...] = send
        a.sync()
        if r == root:
            for i in range(p):
                if i != r:
                    recv[i * n : (i + 1) * n] = sl[i]
        return
    if direct:
        if r == root:
            a.publish(0, recv)
        a.sync()
        if r != root:
            raw = send.reshape(-1).view(np.uint8)
            for lo in range(0, raw.size, GATHER_PIECE):
                a.write(root, 0, r * send.nbytes + lo, raw[lo : lo + GATHER_PIECE])
        elif not np.shares_memory(send, recv):
            np.copyto(recv[r * n : (r + 1) * n], send)
        a.sync()  # every block has landed
        return
    if r == root and not np.shares_memory(send, recv):
        np.copyto(recv[r * n : (r + 1) * n], send)
    for k, (b0, m) in enumerate(_parts(n, a.chunk // dt.itemsize)):
        if r != root:
            a.place(k % 2, send[b0:])
            np.copyto(a.area(r, k % 2, dt, m), send[b0 : b0 + m])
        a.sync()
        if r == root:
            for i in range(p):
                if i != r:
                    np.copyto(recv[i * n + b0 : i * n + b0 + m], a.area(i, k % 2, dt, m))
    a.sync()  # the root has read every area


def scatter(a: Arena, send: Array, recv: Array, op: Op | None = None, root: int = 0) -> None:
    """Block i of the root's ``send`` into rank i's ``recv``: through the root's eager ring
    (no sync: the root returns once its data is there, as a small broadcast's) where all p
    blocks fit an entry, read straight out of the root's ``send`` when large, else through the
    root's windows a chunk of every block at a time."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    n = recv.size
    if recv.nbytes * p <= EAGER_MAX:
        apart = scatter_apart(recv.nbytes)  # (the entry without the root's own block)
        lo, hi = r * n, (r + 1) * n
        if r == root and apart:

            def others(_: int, entry: Array) -> None:
                if lo:
                    entry[:lo] = send[:lo]
                if hi < send.size:
                    entry[lo:] = send[hi:]

            a.eager_bcast(send[n:], root, fill=others, need=(p - 1) * recv.nbytes)
        elif r == root:
            a.eager_bcast(send, root)
        else:
            a.eager_bcast(recv, root, scatter_skip(r, root, n, recv.nbytes))
        if r == root:
            recv[...] = send[lo:hi]  # (its own place when in place: harmless)
        return
    if a.direct and recv.nbytes >= a.direct_min["scatter"]:
        if r == root:
            a.publish(0, send)
        a.sync()
        if r != root:
            a.read(root, 0, r * recv.nbytes, recv)
        elif not np.shares_memory(send, recv):
            np.copyto(recv, send[r * n : (r + 1) * n])
        a.sync()  # every rank has read its block
        return
    if r == root and not np.shares_memory(send, recv):
        np.copyto(recv, send[r * n : (r + 1) * n])
    for k, (b0, m) in enumerate(_parts(n, a.chunk // dt.itemsize // p)):
        if r == root:
            _publish_blocks(a, send, n, b0, m, k % 2)
        a.sync()
        if r != root:
            np.copyto(recv[b0 : b0 + m], a.area(root, k % 2, dt, p * m)[r * m : (r + 1) * m])
    a.sync()  # every rank has read the root's areas


def scan(a: Arena, send: Array, recv: Array, op: Op, root: int = 0,
         exclusive: bool = False) -> None:
    """Prefix reduction in rank order: rank r's ``recv`` = the inputs of ranks 0..r combined
    (``exclusive``: of ranks 0..r-1; rank 0's ``recv`` untouched). Every rank publishes its
    input (a small one in its slot, one sync; larger ones a chunk at a time in its area 0, two
    syncs a chunk) and combines those of the ranks before it itself. Cost on rank r: r
    combining passes, where the chain makes rank r wait for r hops."""
    r = a.chan.rank
    dt = recv.dtype
    k = r if exclusive else r + 1  # inputs to combine: of ranks 0..k-1
    if recv.nbytes <= a.small_reduce:
        slot = a.slots(a.next_parity(), dt, recv.size)
        slot[r][...] = send
        a.sync()
        _prefix(op, recv, slot[:k])
        return
    for c0, m in _parts(recv.size, a.chunk // dt.itemsize):
        a.place(0, send[c0:])
        np.copyto(a.area(r, 0, dt, m), send[c0 : c0 + m])
        a.sync()
        _prefix(op, recv[c0 : c0 + m], [a.area(i, 0, dt, m) for i in range(k)])
        a.sync()  # every rank has read this chunk of every area


def _prefix(op: Op, dst: Array, ins: Sequence[Array]) -> None:
    """``dst`` = ``ins`` combined in order (none: ``dst`` untouched); ``dst`` overlaps none."""
    if len(ins) == 1:
        dst[...] = ins[0]
    elif ins:
        _combine_in_rank_order(op, dst, ins)


#: The direct kind's entries, each run as ``run(arena, send, recv, op, root)`` (an argument a
#: collective does not use is ignored: one signature, so a caller runs any without adapting).
RUN: dict[str, Callable[..., None]] = {
    "bcast": bcast, "reduce": reduce, "allreduce": allreduce,
    "reduce_scatter_block": reduce_scatter_block, "allgather": allgather, "alltoall": alltoall,
    "gather": gather, "scatter": scatter, "scan": scan,
    "exscan": partial(scan, exclusive=True),
}
