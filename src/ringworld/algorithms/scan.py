"""Scan (inclusive prefix) and exscan (exclusive prefix) over ranks, in rank order.

``linear``: a chain: rank r waits for the prefix of ranks 0..r-1 from r-1, combines its own
vector on the right and passes the result on; p-1 sequential hops.

``recursive_doubling``: (Hillis-Steele) in round k rank r sends its partial, which covers ranks
[r - 2^k + 1, r], to r + 2^k and receives the partial of [r - 2^(k+1) + 1, r - 2^k] from
r - 2^k, combining it on the left; log2 p rounds. Ranges stay contiguous, so non-commutative
ops are applied in rank order. For exscan, the received partials are also collected, in order,
into the result; rank 0's RECV is left untouched (undefined in MPI).
"""

from __future__ import annotations

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
    reduce,
    schedule,
    step,
)


def linear(s: Spec) -> Schedule:
    """Inclusive prefix along a chain."""
    p, r, n = s.size, s.rank, s.n
    steps: list[Step] = []
    if r == 0:
        steps.append(step(locals_=[copy(RECV, 0, n, SEND, 0)]))
    else:
        steps.append(step([Xfer(r - 1, TMP, 0, n)], (),
                          [copy(RECV, 0, n, SEND, 0), reduce(RECV, 0, n, TMP, 0, src_left=True)]))
    if r < p - 1:
        steps.append(step(sends=[Xfer(r + 1, RECV, 0, n)]))
    return schedule(steps, n if r else 0)


def recursive_doubling(s: Spec) -> Schedule:
    """Inclusive prefix in log2 p rounds."""
    p, r, n = s.size, s.rank, s.n
    steps: list[Step] = [step(locals_=[copy(RECV, 0, n, SEND, 0)])]
    d = 1
    while d < p:
        recvs = [Xfer(r - d, TMP, 0, n)] if r - d >= 0 else []
        sends = [Xfer(r + d, RECV, 0, n)] if r + d < p else []
        locs = [reduce(RECV, 0, n, TMP, 0, src_left=True)] if recvs else []
        steps.append(step(recvs, sends, locs))
        d *= 2
    return schedule(steps, n if p > 1 else 0)


def exscan_linear(s: Spec) -> Schedule:
    """Exclusive prefix along a chain (rank 0's RECV untouched)."""
    p, r, n = s.size, s.rank, s.n
    steps: list[Step] = []
    if r == 0:
        if p > 1:
            steps.append(step(sends=[Xfer(1, SEND, 0, n)]))
        return schedule(steps)
    if r == p - 1:
        return schedule([step([Xfer(r - 1, RECV, 0, n)])])
    steps.append(step([Xfer(r - 1, TMP, n, n)], (),
                      [copy(TMP, 0, n, SEND, 0), reduce(TMP, 0, n, TMP, n, src_left=True),
                       copy(RECV, 0, n, TMP, n)]))
    steps.append(step(sends=[Xfer(r + 1, TMP, 0, n)]))
    return schedule(steps, 2 * n)


def exscan_recursive_doubling(s: Spec) -> Schedule:
    """Exclusive prefix in log2 p rounds: partial in TMP[0:n], incoming in TMP[n:2n]."""
    p, r, n = s.size, s.rank, s.n
    if p == 1:  # nothing to combine, and RECV stays untouched (there is no TMP to copy into)
        return schedule([])
    steps: list[Step] = [step(locals_=[copy(TMP, 0, n, SEND, 0)])]
    d = 1
    while d < p:
        recvs = [Xfer(r - d, TMP, n, n)] if r - d >= 0 else []
        sends = [Xfer(r + d, TMP, 0, n)] if r + d < p else []
        locs: list[Local] = []
        if recvs:
            locs.append(reduce(TMP, 0, n, TMP, n, src_left=True))
            if d == 1:
                locs.append(copy(RECV, 0, n, TMP, n))
            else:
                locs.append(reduce(RECV, 0, n, TMP, n, src_left=True))
        steps.append(step(recvs, sends, locs))
        d *= 2
    return schedule(steps, 2 * n)
