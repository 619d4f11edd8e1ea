"""Broadcast: the root's buffer (RECV on every rank) is copied to every rank.

``linear``: the root sends to each rank in turn (p-1 messages from one rank; tiny worlds).

``binomial``: relative rank v = (rank - root) mod p receives from v - lowbit(v) and forwards to
v + 2^k for every 2^k below lowbit(v); log2 p rounds::

    v: 0 ──> 4            round 0 (largest subtree first)
       0 ──> 2, 4 ──> 6   round 1
       0 ──> 1, 2 ──> 3, 4 ──> 5, 6 ──> 7

``ring``: the seed's pipelined chain. The message is cut into segments that flow root -> v1 ->
v2 -> ...; in step k rank v receives segment k while forwarding segment k-1, so every link is busy
and the time is (p - 2 + segments) segment transfers instead of (p - 1) whole messages.

``scatter_allgather``: (van de Geijn) binomial scatter of p blocks, then a ring allgather in which
the root, holding every block, only sends; every rank sends about 2n bytes in total whatever p
is, the best for large messages on many ranks.
"""

from __future__ import annotations

from ringworld.algorithms.schedule import (
    RECV,
    Schedule,
    Spec,
    Step,
    Xfer,
    blocks,
    pipeline,
    schedule,
    segmented,
    step,
)


def lowbit(v: int, p: int) -> int:
    """The subtree span of relative rank v in a binomial tree over p ranks (p for the root)."""
    if v == 0:
        m = 1
        while m < p:
            m <<= 1
        return m
    return v & -v


def linear(s: Spec) -> Schedule:
    """The root sends the whole buffer to each other rank."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    if r == root:
        return schedule([step(sends=[Xfer(i, RECV, 0, n) for i in range(p) if i != root])])
    return schedule([step(recvs=[Xfer(root, RECV, 0, n)])])


def binomial(s: Spec) -> Schedule:
    """log2 p rounds along a binomial tree rooted at ``root``."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    v = (r - root) % p
    span = lowbit(v, p)
    steps = []
    if v:
        steps.append(step(recvs=[Xfer((v - span + root) % p, RECV, 0, n)]))
    sends = []
    m = span >> 1
    while m:
        if v + m < p:
            sends.append(Xfer((v + m + root) % p, RECV, 0, n))
        m >>= 1
    steps.append(step(sends=sends))
    return schedule(steps)


def ring(s: Spec) -> Schedule:
    """A pipelined chain from the root in segments of ``s.segment`` elements."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    v = (r - root) % p
    prev, nxt = (r - 1) % p, (r + 1) % p
    parts = []
    for start, length in segmented(n, s.segment):
        seg: list[Step] = []
        if v:
            seg.append(step(recvs=[Xfer(prev, RECV, start, length)]))
        if v < p - 1:
            seg.append(step(sends=[Xfer(nxt, RECV, start, length)]))
        parts.append(schedule(seg))
    return pipeline(parts)


def scatter_allgather(s: Spec) -> Schedule:
    """Binomial scatter of p blocks from the root, then a ring allgather of the blocks (the
    root only sends in it)."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    blk = blocks(n, p)  # block i belongs to relative rank i

    def span_of(lo: int, hi: int) -> tuple[int, int]:  # elements of relative blocks [lo, hi)
        hi = min(hi, p)
        start = blk[lo][0] if lo < p else n
        end = blk[hi - 1][0] + blk[hi - 1][1] if hi > lo else start
        return start, end - start

    v = (r - root) % p
    span = lowbit(v, p)
    steps = []
    if v:
        st, ln = span_of(v, v + span)
        steps.append(step(recvs=[Xfer((v - span + root) % p, RECV, st, ln)]))
    sends = []
    m = span >> 1
    while m:
        if v + m < p:
            st, ln = span_of(v + m, v + 2 * m)
            sends.append(Xfer((v + m + root) % p, RECV, st, ln))
        m >>= 1
    steps.append(step(sends=sends))
    nxt, prev = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        sb = (v - k) % p
        rb = (v - k - 1) % p
        # the root holds every block already: it only sends, and its left neighbour does not
        # send to it (one block in p less to move; half the traffic on two ranks)
        recvs = [] if v == 0 else [Xfer(prev, RECV, *blk[rb])]
        sends = [] if v == p - 1 else [Xfer(nxt, RECV, *blk[sb])]
        steps.append(step(recvs, sends))
    return schedule(steps)
