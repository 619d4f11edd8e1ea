"""Run the schedules of all ranks of a collective in one process, with no transport.

This is how schedules are checked without starting processes: every rank's program runs with
rendezvous semantics (a transfer completes only when both its send and its receive are posted;
k-th send from a to b matches b's k-th receive from a), so a schedule that could deadlock on a
real transport deadlocks here too and is reported. It also checks that matched messages have
equal sizes, that no message is left unreceived, and that a step never receives into memory it
is sending from or receiving into twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ringworld.algorithms.schedule import COPY, Local, Schedule, Step, Xfer
from ringworld.comm.ops import Op


class ScheduleError(AssertionError):
    """A schedule deadlocked, mismatched a message size or raced on its own buffers."""


Buffers = list[np.ndarray[Any, Any]]
# per (sender, receiver): the posted transfers, as (rank, its slice)
_Queues = defaultdict[tuple[int, int], list[tuple[int, np.ndarray[Any, Any]]]]


def _overlaps(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return a.size > 0 and b.size > 0 and bool(np.shares_memory(a, b))


def run(schedules: Sequence[Schedule], buffers: Sequence[Buffers], op: Op | None = None,
        transfers: Callable[[int, int, int, int], None] | None = None) -> None:
    """Execute ``schedules[r]`` on ``buffers[r]`` for every rank r; TMP buffers are added.

    ``buffers[r]`` is [SEND, RECV, ...extra]; SEND may alias RECV (in-place). ``transfers``, if
    given, is told (source, dest, bytes, round) for every message.

    Raises:
        ScheduleError: deadlock, size mismatch, leftover message or a racing step.
    """
    p = len(schedules)
    bufs: list[Buffers] = []
    for r in range(p):
        b: Buffers = list(buffers[r])
        dtype = b[1].dtype if len(b) > 1 else np.dtype(np.uint8)
        tmp = np.full(schedules[r].tmp, 0, dtype=dtype)
        bufs.append([b[0], b[1], tmp, *b[2:]])
    pos = [0] * p
    posted = [False] * p
    sends: _Queues = defaultdict(list)
    recvs: _Queues = defaultdict(list)
    matched: defaultdict[tuple[int, int], int] = defaultdict(int)
    open_count = [0] * p
    rnd = 0
    while True:
        progress = False
        for r in range(p):
            steps = schedules[r].steps
            if pos[r] < len(steps) and not posted[r]:
                open_count[r] = _post(r, pos[r], steps[pos[r]], bufs[r], sends, recvs)
                posted[r] = True
                progress = True
        if _match(sends, recvs, matched, open_count, transfers, rnd):
            progress = True
        for r in range(p):
            if posted[r] and open_count[r] == 0:
                _run_locals(r, schedules[r].steps[pos[r]].locals, bufs[r], op)
                pos[r] += 1
                posted[r] = False
                progress = True
        rnd += 1
        if all(pos[r] == len(schedules[r].steps) for r in range(p)):
            break
        if not progress:
            stuck = {r: pos[r] for r in range(p) if pos[r] < len(schedules[r].steps)}
            raise ScheduleError(f"deadlock: ranks stuck at steps {stuck}")
    for key in set(sends) | set(recvs):
        if len(sends[key]) != len(recvs[key]):
            raise ScheduleError(f"{len(sends[key])} messages from rank {key[0]} to {key[1]} "
                                f"but {len(recvs[key])} receives")


def _view(r: int, bufs: Buffers, x: Xfer) -> np.ndarray[Any, Any]:
    """The slice of rank ``r``'s buffers that transfer ``x`` names (checked)."""
    arr = bufs[x.buf]
    if x.start < 0 or x.start + x.length > arr.size:
        raise ScheduleError(f"rank {r}: slice {x} outside buffer {x.buf} of {arr.size}")
    return arr[x.start : x.start + x.length]


def _post(r: int, index: int, s: Step, bufs: Buffers, sends: _Queues, recvs: _Queues) -> int:
    """Post rank ``r``'s step ``s`` (number ``index``): queue its transfers; return how many.

    Raises:
        ScheduleError: a slice is outside its buffer, or a receive overlaps another transfer.
    """
    rv = [_view(r, bufs, x) for x in s.recvs]
    sv = [_view(r, bufs, x) for x in s.sends]
    for i, av in enumerate(rv):
        for bv in rv[i + 1:] + sv:
            if _overlaps(av, bv):
                raise ScheduleError(f"rank {r} step {index}: receive {s.recvs[i]}"
                                    " overlaps another transfer of the step")
    for x, v in zip(s.recvs, rv, strict=True):
        recvs[(x.peer, r)].append((r, v))
    for x, v in zip(s.sends, sv, strict=True):
        sends[(r, x.peer)].append((r, v))
    return len(rv) + len(sv)


def _match(sends: _Queues, recvs: _Queues, matched: defaultdict[tuple[int, int], int],
           open_count: list[int], transfers: Callable[[int, int, int, int], None] | None,
           rnd: int) -> bool:
    """Deliver every posted send that has a posted receive; return whether any was.

    Raises:
        ScheduleError: a matched send and receive differ in size.
    """
    progress = False
    for key in set(sends) | set(recvs):
        sq, rq = sends[key], recvs[key]
        k = matched[key]
        while k < len(sq) and k < len(rq):
            (sr, sdata), (rr, rdata) = sq[k], rq[k]
            if sdata.size != rdata.size:
                raise ScheduleError(f"message {k} from rank {key[0]} to {key[1]}: "
                                    f"{sdata.size} elements sent, {rdata.size} expected")
            rdata[...] = sdata
            if transfers is not None:
                transfers(key[0], key[1], sdata.nbytes, rnd)
            open_count[sr] -= 1
            open_count[rr] -= 1
            k += 1
            progress = True
        matched[key] = k
    return progress


def _run_locals(r: int, locals_: Sequence[Local], bufs: Buffers, op: Op | None) -> None:
    """Run the local copies and reductions that end a step of rank ``r``.

    Raises:
        ScheduleError: a local is outside its buffers, or reduces with no ``op``.
    """
    for loc in locals_:
        dst = bufs[loc.dbuf][loc.dstart : loc.dstart + loc.length]
        src = bufs[loc.sbuf][loc.sstart : loc.sstart + loc.length]
        if dst.size != loc.length or src.size != loc.length:
            raise ScheduleError(f"rank {r}: local {loc} outside its buffers")
        if loc.kind == COPY:
            dst[...] = src
        elif op is None:
            raise ScheduleError("schedule reduces but no op was given")
        elif loc.obuf < 0:
            op.reduce_into(dst, src, loc.src_left)
        else:
            other = bufs[loc.obuf][loc.ostart : loc.ostart + loc.length]
            if other.size != loc.length:
                raise ScheduleError(f"rank {r}: local {loc} outside its buffers")
            if loc.src_left:
                op.combine_into(dst, src, other)
            else:
                op.combine_into(dst, other, src)
