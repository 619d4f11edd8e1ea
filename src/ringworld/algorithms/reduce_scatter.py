"""Reduce-scatter: reduce p blocks across ranks; rank i gets reduced block i (``counts[i]``).

``ring``: p-1 steps around the ring. In step s rank r sends its partial of block r-s-1 to
r+1 and receives the partial of block r-s-2 from r-1, adding its own contribution; after p-1
steps it holds block r complete. Every link is busy every step and each rank sends (p-1)/p of
the data: the bandwidth-optimal schedule. Commutative ops only::

    step 0:  r sends SEND[r-1]            receives block r-2, adds SEND[r-2]
    step 1:  r sends partial of r-2       receives block r-3, adds SEND[r-3]
    ...
    step p-2: receives block r, adds SEND[r]  -> RECV

``pairwise``: in step s rank r sends block r+s straight to its owner and receives its own block
from r-s; the owner then combines the p contributions in rank order, so this one is also correct
for non-commutative ops (and is the small-message choice: p-1 messages, one reduction pass).
"""

from __future__ import annotations

from collections.abc import Sequence

from ringworld.algorithms.schedule import (
    RECV,
    SEND,
    TMP,
    Local,
    Schedule,
    Spec,
    Step,
    Xfer,
    copy,
    displacements,
    reduce,
    reduce_to,
    schedule,
    step,
)


def _layout(s: Spec) -> tuple[tuple[int, int], ...]:
    counts = s.counts if s.counts is not None else (s.n,) * s.size
    return tuple(zip(displacements(counts), counts, strict=True))


def ring_blocks(p: int, r: int, blk: Sequence[tuple[int, int]],
                final: tuple[int, int] | None = None) -> tuple[list[Step], int, tuple[int, int]]:
    """Ring reduce-scatter of SEND's blocks ``blk``; rank r's result goes to ``final``.

    Returns the steps, the scratch they need and where block r ends up (``final``, or a TMP
    region when ``final`` is None).
    """
    width = max((ln for _, ln in blk), default=0)
    tmp = 2 * width if p > 1 else 0
    own = blk[r]
    if final is None:
        final = (TMP, 0)
        tmp = max(tmp, own[1])
    if p == 1:
        return [step(locals_=[copy(final[0], final[1], own[1], SEND, own[0])])], tmp, final
    steps: list[Step] = []
    prev, nxt = (r - 1) % p, (r + 1) % p
    send_from = (SEND, blk[(r - 1) % p][0])
    for k in range(p - 1):
        b = (r - k - 1) % p
        c = (r - k - 2) % p
        region = (k % 2) * width
        last = k == p - 2
        locs: list[Local]
        if last and final != (TMP, region):  # one pass: final <- received op own
            locs = [reduce_to(final[0], final[1], blk[c][1], TMP, region, SEND, blk[c][0],
                              src_left=True)]
        else:
            locs = [reduce(TMP, region, blk[c][1], SEND, blk[c][0], src_left=False)]
        steps.append(step([Xfer(prev, TMP, region, blk[c][1])],
                          [Xfer(nxt, send_from[0], send_from[1], blk[b][1])], locs))
        send_from = (TMP, region)
    return steps, tmp, final


def ring(s: Spec) -> Schedule:
    """Ring reduce-scatter (commutative ops)."""
    steps, tmp, _ = ring_blocks(s.size, s.rank, _layout(s), (RECV, 0))
    return schedule(steps, tmp)


def pairwise(s: Spec) -> Schedule:
    """Direct exchange of blocks, then a rank-ordered combine at each owner."""
    p, r = s.size, s.rank
    blk = _layout(s)
    n = blk[r][1]

    def slot(i: int) -> tuple[int, int]:
        return (SEND, blk[r][0]) if i == r else (TMP, (i - (i > r)) * n)

    steps = []
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        steps.append(step([Xfer(src, TMP, slot(src)[1], n)], [Xfer(dst, SEND, *blk[dst])]))
    # rank order; the first two contributions in one pass (no copy of the first)
    locs = ([reduce_to(RECV, 0, n, *slot(1), *slot(0), src_left=False)] if p > 1
            else [copy(RECV, 0, n, *slot(0))])
    locs += [reduce(RECV, 0, n, *slot(i), src_left=False) for i in range(2, p)]
    steps.append(step(locals_=locs))
    return schedule(steps, (p - 1) * n)
