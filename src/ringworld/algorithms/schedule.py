"""The schedule IR: what one rank does in a collective, as data.

A :class:`Schedule` is a tuple of :class:`Step`. In a step a rank posts all its receives, starts
all its sends, waits for all of them, then runs its local operations (copies and reductions) in
order. Transfers name a peer (communicator rank) and a slice of a buffer, in elements:

    buffer 0  SEND  the caller's input          buffer 2  TMP  scratch, ``Schedule.tmp`` elements
    buffer 1  RECV  the caller's output         3+        extra buffers (alltoallw: one per peer)

Messages between two ranks within one collective are matched in the order they were posted (the
transport is FIFO per pair and every message of one collective carries the same tag), so a send
matches the receiver's receive from that peer with the same position in its program, whatever
the step numbers. Schedules are pure functions of (size, rank, counts, root): they are cached,
checked exhaustively by :mod:`ringworld.algorithms.check` without processes, and costed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

SEND = 0
RECV = 1
TMP = 2

COPY = 0
REDUCE = 1


class Xfer(NamedTuple):
    """One message: to or from ``peer``, ``length`` elements of buffer ``buf`` from ``start``."""

    peer: int
    buf: int
    start: int
    length: int


class Local(NamedTuple):
    """A local copy or reduction of ``length`` elements: ``dst <- src`` or ``dst <- src op dst``.

    For a reduction ``src_left`` says whether ``src`` holds lower ranks' data (``src op dst``)
    or higher ranks' (``dst op src``); it matters only for non-commutative ops. With ``obuf``
    set, the second operand is that slice instead of ``dst`` (``dst <- src op other``), which
    saves copying an input into the output before reducing.
    """

    kind: int
    dbuf: int
    dstart: int
    length: int
    sbuf: int
    sstart: int
    src_left: bool = True
    obuf: int = -1   # REDUCE with another operand: dst <- src op other (no copy into dst first)
    ostart: int = 0


class Step(NamedTuple):
    """Receives and sends that run concurrently, then local operations in order."""

    recvs: tuple[Xfer, ...] = ()
    sends: tuple[Xfer, ...] = ()
    locals: tuple[Local, ...] = ()


class Schedule(NamedTuple):
    """One rank's program for one collective, and how much scratch it needs (elements)."""

    steps: tuple[Step, ...]
    tmp: int = 0


def copy(dbuf: int, dstart: int, count: int, sbuf: int, sstart: int) -> Local:
    """A local copy of ``count`` elements."""
    return Local(COPY, dbuf, dstart, count, sbuf, sstart, True)


def reduce(dbuf: int, dstart: int, count: int, sbuf: int, sstart: int,
           src_left: bool) -> Local:
    """A local reduction of ``count`` elements into the destination."""
    return Local(REDUCE, dbuf, dstart, count, sbuf, sstart, src_left)


def reduce_to(dbuf: int, dstart: int, length: int, sbuf: int, sstart: int, obuf: int,
              ostart: int, src_left: bool) -> Local:
    """``dst <- src op other`` (``other op src`` unless ``src_left``), out of place."""
    return Local(REDUCE, dbuf, dstart, length, sbuf, sstart, src_left, obuf, ostart)


def step(recvs: Iterable[Xfer] = (), sends: Iterable[Xfer] = (),
         locals_: Iterable[Local] = (), *, keep_empty: bool = False) -> Step:
    """A step without empty messages (both ends know the counts, so both drop them) and
    without no-op locals; ``keep_empty`` keeps zero-length messages (barriers need them)."""
    if not keep_empty:
        recvs = (x for x in recvs if x.length > 0)
        sends = (x for x in sends if x.length > 0)
    kept = tuple(op for op in locals_
                 if op.length > 0 and not (op.kind == COPY and op.dbuf == op.sbuf
                                          and op.dstart == op.sstart))
    return Step(tuple(recvs), tuple(sends), kept)


def schedule(steps: Iterable[Step], tmp: int = 0) -> Schedule:
    """A schedule without empty steps."""
    return Schedule(tuple(s for s in steps if s.recvs or s.sends or s.locals), tmp)


def blocks(count: int, parts: int) -> tuple[tuple[int, int], ...]:
    """Split ``count`` elements into ``parts`` nearly equal (start, length) blocks, larger first."""
    base, extra = divmod(count, parts)
    out = []
    at = 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((at, n))
        at += n
    return tuple(out)


def displacements(counts: Sequence[int]) -> tuple[int, ...]:
    """Packed displacements for ``counts`` (prefix sums starting at 0)."""
    out = []
    at = 0
    for c in counts:
        out.append(at)
        at += c
    return tuple(out)


def pipeline(parts: Sequence[Schedule]) -> Schedule:
    """Run several independent schedules software-pipelined: step k runs part j's step k-j.

    The parts must use disjoint data (e.g. the segments of a long message); the result keeps
    every part's step order, so it is correct whenever each part is, and lets segment j+1 move
    while segment j is reduced, with each segment small enough to stay in cache.
    """
    if len(parts) == 1:
        return parts[0]
    longest = max((len(p.steps) for p in parts), default=0)
    merged: list[Step] = []
    for k in range(longest + len(parts) - 1):
        recvs: list[Xfer] = []
        sends: list[Xfer] = []
        locs: list[Local] = []
        for j, p in enumerate(parts):
            i = k - j
            if 0 <= i < len(p.steps):
                s = p.steps[i]
                recvs.extend(s.recvs)
                sends.extend(s.sends)
                locs.extend(s.locals)
        merged.append(Step(tuple(recvs), tuple(sends), tuple(locs)))
    return schedule(merged, max((p.tmp for p in parts), default=0))


def segmented(count: int, segment: int) -> tuple[tuple[int, int], ...]:
    """(start, length) segments of at most ``segment`` elements covering ``count`` (>= 1 part)."""
    if segment <= 0 or count <= segment:
        return ((0, count),)
    return tuple((s, min(segment, count - s)) for s in range(0, count, segment))


class Spec(NamedTuple):
    """What a schedule is a function of.

    ``n`` is the per-rank block for gather/scatter/allgather/alltoall/reduce_scatter_block
    and the whole vector for bcast/reduce/allreduce/scan. ``counts`` (and ``displs``, in
    elements) describe the v-variants: per-rank blocks; for gatherv/scatterv only the root knows
    them and other ranks pass their own block size as ``n``. For alltoallv ``counts`` and
    ``displs`` are the send side and ``rcounts``/``rdispls`` the receive side.
    ``commutative`` is False for user ops that must be applied in rank order; ``segment`` is the
    pipelining chunk in elements (0: none).
    """

    size: int
    rank: int
    n: int = 0
    root: int = 0
    counts: tuple[int, ...] | None = None
    displs: tuple[int, ...] | None = None
    rcounts: tuple[int, ...] | None = None
    rdispls: tuple[int, ...] | None = None
    commutative: bool = True
    segment: int = 0
