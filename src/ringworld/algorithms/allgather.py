"""Allgather: every rank's block (``counts[i]`` elements, at ``displs[i]`` in RECV) to every rank.

``ring``: p-1 steps; in step k rank r forwards block r-k to r+1 and receives block r-k-1 from
r-1: each rank sends (p-1) blocks, every link busy every step; the large-message choice.

``recursive_doubling``: log2 p exchanges with rank XOR 2^k, each doubling the contiguous range
of blocks held (non-powers of two fold: even ranks below 2*rem hand their block to the odd rank
above and get everything back at the end).

``bruck``: log2 p steps for any p. Blocks are kept rotated (slot i holds rank r+i's block); in
step k rank r sends its first min(2^k, p-2^k) slots to r-2^k and appends what r+2^k sends. A
final rotation puts them in rank order; the small-message choice for non-powers of two::

    slot:      0   1   2   3   4
    start:    [r]
    step 0:   [r  r+1]
    step 1:   [r  r+1 r+2 r+3]
    step 2:   [r  r+1 r+2 r+3 r+4]

``linear``: every rank sends its block to every other in one step.
"""

from __future__ import annotations

from ringworld.algorithms.allreduce import pow2_below
from ringworld.algorithms.schedule import (
    RECV,
    SEND,
    TMP,
    Schedule,
    Spec,
    Step,
    Xfer,
    copy,
    displacements,
    schedule,
    step,
)


def _layout(s: Spec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    counts = s.counts if s.counts is not None else (s.n,) * s.size
    displs = s.displs if s.displs is not None else displacements(counts)
    return counts, displs


def ring(s: Spec) -> Schedule:
    """p-1 forwarding steps around the ring."""
    p, r = s.size, s.rank
    c, d = _layout(s)
    prev, nxt = (r - 1) % p, (r + 1) % p
    steps: list[Step] = [step(locals_=[copy(RECV, d[r], c[r], SEND, 0)])]
    for k in range(p - 1):
        sb, rb = (r - k) % p, (r - k - 1) % p
        steps.append(step([Xfer(prev, RECV, d[rb], c[rb])], [Xfer(nxt, RECV, d[sb], c[sb])]))
    return schedule(steps)


def linear(s: Spec) -> Schedule:
    """Everyone sends its block to everyone in one step."""
    p, r = s.size, s.rank
    c, d = _layout(s)
    others = [i for i in range(p) if i != r]
    return schedule([step([Xfer(i, RECV, d[i], c[i]) for i in others],
                          [Xfer(i, SEND, 0, c[r]) for i in others],
                          [copy(RECV, d[r], c[r], SEND, 0)])])


def recursive_doubling(s: Spec) -> Schedule:
    """Exchange doubling contiguous ranges of blocks (packed layout only)."""
    p, r, n = s.size, s.rank, s.n
    pof2 = pow2_below(p)
    rem = p - pof2
    steps: list[Step] = [step(locals_=[copy(RECV, r * n, n, SEND, 0)])]
    if r < 2 * rem and r % 2 == 0:
        steps.append(step(sends=[Xfer(r + 1, RECV, r * n, n)]))
        steps.append(step(recvs=[Xfer(r + 1, RECV, 0, p * n)]))
        return schedule(steps)

    def first(nr: int) -> int:  # first real rank of folded rank nr
        return 2 * nr if nr < rem else nr + rem

    def peer(nr: int) -> int:
        return 2 * nr + 1 if nr < rem else nr + rem

    if r < 2 * rem:
        steps.append(step(recvs=[Xfer(r - 1, RECV, (r - 1) * n, n)]))
        nr = r // 2
    else:
        nr = r - rem
    mask = 1
    while mask < pof2:
        partner = nr ^ mask
        mine = nr & ~(mask - 1)
        theirs = partner & ~(mask - 1)
        ms, me = first(mine), first(mine + mask) if mine + mask < pof2 else p
        ts, te = first(theirs), first(theirs + mask) if theirs + mask < pof2 else p
        steps.append(step([Xfer(peer(partner), RECV, ts * n, (te - ts) * n)],
                          [Xfer(peer(partner), RECV, ms * n, (me - ms) * n)]))
        mask <<= 1
    if r < 2 * rem:
        steps.append(step(sends=[Xfer(r - 1, RECV, 0, p * n)]))
    return schedule(steps)


def bruck(s: Spec) -> Schedule:
    """ceil(log2 p) steps on rotated slots, then a rotation into rank order (packed layout)."""
    p, r, n = s.size, s.rank, s.n
    steps: list[Step] = [step(locals_=[copy(TMP, 0, n, SEND, 0)])]
    dist = 1
    while dist < p:
        k = min(dist, p - dist)
        steps.append(step([Xfer((r + dist) % p, TMP, dist * n, k * n)],
                          [Xfer((r - dist) % p, TMP, 0, k * n)]))
        dist *= 2
    head = (p - r) * n  # slots 0..p-r-1 are ranks r..p-1
    steps.append(step(locals_=[copy(RECV, r * n, head, TMP, 0),
                               copy(RECV, 0, r * n, TMP, head)]))
    return schedule(steps, p * n)
