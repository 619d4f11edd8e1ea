"""Allreduce: every rank gets the op applied over all ranks' SEND, in RECV (may alias SEND).

``linear``: every rank sends its vector to every other and combines all p in rank order: one
step, p-1 messages each way; the tiny-world choice.

``recursive_doubling``: log2 p exchanges of the whole vector with rank XOR 2^k. Non-powers of
two fold first: of the first 2*rem ranks (rem = p - 2^floor(log2 p)), each even rank hands its
vector to the odd one above it and gets the result back at the end. Groups stay contiguous, so
rank order is kept (non-commutative ops allowed); the small-message choice.

``ring``: ring reduce-scatter then ring allgather, 2(p-1) steps of n/p elements: every link busy
every step, each rank sends 2n(p-1)/p; the large-message choice (the seed's ring collectives)::

    reduce-scatter             allgather
    r sends block r-k    ...   r sends block r+1-k
    r adds block r-k-1   ...   r stores block r-k

``rabenseifner``: recursive halving reduce-scatter (each step exchanges half of the remaining
range with rank XOR 2^k), then recursive doubling allgather in reverse: 2 log2 p steps and the
same 2n bytes as the ring; the medium-message choice. Commutative ops only.

``reduce_bcast``: binomial reduce to rank 0 then binomial broadcast; keeps rank order.

All give bitwise identical results on every rank: each element is combined once, by one rank
(ring, rabenseifner), or in the same order everywhere (linear, recursive doubling).
"""

from __future__ import annotations

from ringworld.algorithms import bcast, reduce
from ringworld.algorithms.schedule import (
    RECV,
    SEND,
    TMP,
    Schedule,
    Spec,
    Step,
    Xfer,
    blocks,
    copy,
    reduce_to,
    schedule,
    step,
)
from ringworld.algorithms.schedule import reduce as red


def linear(s: Spec) -> Schedule:
    """Everyone sends to everyone; each combines the p vectors in rank order."""
    p, r, n = s.size, s.rank, s.n
    others = [i for i in range(p) if i != r]
    locs = [copy(TMP, r * n, n, SEND, 0), copy(RECV, 0, n, TMP, 0)]
    locs += [red(RECV, 0, n, TMP, i * n, src_left=False) for i in range(1, p)]
    return schedule([step([Xfer(i, TMP, i * n, n) for i in others],
                          [Xfer(i, SEND, 0, n) for i in others], locs)], p * n)


def pow2_below(p: int) -> int:
    """The largest power of two <= p."""
    m = 1
    while m * 2 <= p:
        m *= 2
    return m


def fold(p: int, r: int, n: int) -> tuple[list[Step], int, int, int]:
    """Fold a world of p ranks onto a power of two: (steps, pof2, rem, new rank or -1).

    Reads SEND; a folded-in rank leaves its partial in RECV, others have not written RECV.
    """
    pof2 = pow2_below(p)
    rem = p - pof2
    if r < 2 * rem:
        if r % 2 == 0:
            return [step(sends=[Xfer(r + 1, SEND, 0, n)])], pof2, rem, -1
        return ([step([Xfer(r - 1, TMP, 0, n)], (),
                      [reduce_to(RECV, 0, n, TMP, 0, SEND, 0, src_left=True)])],
                pof2, rem, r // 2)
    return [], pof2, rem, r - rem


def real(nr: int, rem: int) -> int:
    """The rank that folded rank ``nr`` stands for."""
    return nr * 2 + 1 if nr < rem else nr + rem


def unfold(r: int, rem: int, n: int) -> list[Step]:
    """Hand the result back to the ranks that sat out the power-of-two part."""
    if r < 2 * rem:
        if r % 2 == 0:
            return [step(recvs=[Xfer(r + 1, RECV, 0, n)])]
        return [step(sends=[Xfer(r - 1, RECV, 0, n)])]
    return []


def recursive_doubling(s: Spec) -> Schedule:
    """log2 p whole-vector exchanges (non-powers of two folded)."""
    p, r, n = s.size, s.rank, s.n
    if p == 1:
        return schedule([step(locals_=[copy(RECV, 0, n, SEND, 0)])])
    steps, pof2, rem, nr = fold(p, r, n)
    if nr >= 0:
        cur = RECV if r < 2 * rem else SEND  # where this rank's partial is
        mask = 1
        while mask < pof2:
            partner = nr ^ mask
            peer = real(partner, rem)
            steps.append(step([Xfer(peer, TMP, 0, n)], [Xfer(peer, cur, 0, n)],
                              [reduce_to(RECV, 0, n, TMP, 0, cur, 0, src_left=partner < nr)]))
            cur = RECV
            mask <<= 1
    steps += unfold(r, rem, n)
    return schedule(steps, n)


def ring(s: Spec) -> Schedule:
    """Ring reduce-scatter then ring allgather (commutative ops)."""
    p, r, n = s.size, s.rank, s.n
    if p == 1:
        return schedule([step(locals_=[copy(RECV, 0, n, SEND, 0)])])
    blk = blocks(n, p)
    prev, nxt = (r - 1) % p, (r + 1) % p
    steps: list[Step] = []
    for k in range(p - 1):
        sb, rb = blk[(r - k) % p], blk[(r - k - 1) % p]
        # step k sends the block reduced in step k-1 (this rank's own input at first) and
        # reduces the incoming partial with its own input straight into RECV
        steps.append(step([Xfer(prev, TMP, 0, rb[1])], [Xfer(nxt, SEND if k == 0 else RECV, *sb)],
                          [reduce_to(RECV, rb[0], rb[1], TMP, 0, SEND, rb[0], src_left=True)]))
    for k in range(p - 1):
        sb, rb = blk[(r + 1 - k) % p], blk[(r - k) % p]
        steps.append(step([Xfer(prev, RECV, *rb)], [Xfer(nxt, RECV, *sb)]))
    return schedule(steps, blk[0][1])


def rabenseifner(s: Spec) -> Schedule:
    """Recursive halving reduce-scatter + recursive doubling allgather (commutative ops)."""
    p, r, n = s.size, s.rank, s.n
    if p == 1:
        return schedule([step(locals_=[copy(RECV, 0, n, SEND, 0)])])
    steps, pof2, rem, nr = fold(p, r, n)
    if nr >= 0:
        blk = blocks(n, pof2)

        def span(lo: int, hi: int) -> tuple[int, int]:
            return blk[lo][0], blk[hi - 1][0] + blk[hi - 1][1] - blk[lo][0]

        cur = RECV if r < 2 * rem else SEND
        lo, hi = 0, pof2
        mask = pof2 >> 1
        done: list[tuple[int, tuple[int, int], tuple[int, int]]] = []
        while mask:
            partner = nr ^ mask
            peer = real(partner, rem)
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if nr & mask == 0 else ((mid, hi), (lo, mid))
            ks, kn = span(*keep)
            gs, gn = span(*give)
            steps.append(step([Xfer(peer, TMP, ks, kn)], [Xfer(peer, cur, gs, gn)],
                              [reduce_to(RECV, ks, kn, TMP, ks, cur, ks,
                                         src_left=partner < nr)]))
            cur = RECV
            done.append((peer, (ks, kn), (gs, gn)))
            lo, hi = keep
            mask >>= 1
        for peer, (ks, kn), (gs, gn) in reversed(done):
            steps.append(step([Xfer(peer, RECV, gs, gn)], [Xfer(peer, RECV, ks, kn)]))
    steps += unfold(r, rem, n)
    return schedule(steps, n)


def reduce_bcast(s: Spec) -> Schedule:
    """Binomial reduce to rank 0, then binomial broadcast from it (keeps rank order)."""
    rs = reduce.binomial(s._replace(root=0, commutative=False))
    bs = bcast.binomial(s._replace(root=0))
    return schedule(rs.steps + bs.steps, rs.tmp)
