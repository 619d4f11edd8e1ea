"""Gather and scatter: blocks of ``count`` elements between every rank and the root.

Gather: RECV at the root holds p blocks, block i from rank i. Scatter is its mirror image (SEND
at the root holds p blocks, rank i receives block i into RECV).

``linear``: the root exchanges one message with every rank (p-1 messages through the root).

``binomial``: relative rank v = (rank - root) mod p owns the contiguous relative blocks
[v, v + lowbit(v)); a gather collects its children's ranges into scratch and sends the whole
range up in one message, a scatter does the reverse: log2 p rounds and p-1 messages in all, of
growing size near the root::

    gather, p = 8:  round 0  1->0 3->2 5->4 7->6   (1 block each)
                    round 1  2->0 6->4              (2 blocks)
                    round 2  4->0                   (4 blocks)

The v-variants (``gatherv``/``scatterv``) are linear: only the root knows every block's size.
"""

from __future__ import annotations

from ringworld.algorithms.bcast import lowbit
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
    schedule,
    step,
)


def gather_linear(s: Spec) -> Schedule:
    """Every rank sends its block to the root."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    if r != root:
        return schedule([step(sends=[Xfer(root, SEND, 0, n)])])
    return schedule([step([Xfer(i, RECV, i * n, n) for i in range(p) if i != r], (),
                          [copy(RECV, r * n, n, SEND, 0)])])


def _subtree(v: int, p: int) -> int:
    return min(lowbit(v, p), p - v)


def _unrotate(p: int, root: int, n: int, to_tmp: bool) -> list[Local]:
    """Copies between relative order in TMP and rank order in RECV/SEND at the root."""
    head = (p - root) * n   # relative blocks 0..p-root-1 are ranks root..p-1
    if to_tmp:  # scatter: SEND (rank order) -> TMP (relative order)
        return [copy(TMP, 0, head, SEND, root * n), copy(TMP, head, root * n, SEND, 0)]
    return [copy(RECV, root * n, head, TMP, 0), copy(RECV, 0, root * n, TMP, head)]


def gather_binomial(s: Spec) -> Schedule:
    """Binomial gather through relative-order scratch (direct into RECV when root is 0)."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    v = (r - root) % p
    size = _subtree(v, p)
    buf = RECV if (v == 0 and root == 0) else TMP
    steps: list[Step] = [step(locals_=[copy(buf, 0, n, SEND, 0)])]
    recvs = []
    m = 1
    while m < lowbit(v, p):
        if v + m < p:
            recvs.append(Xfer((v + m + root) % p, buf, m * n, _subtree(v + m, p) * n))
        m <<= 1
    steps.append(step(recvs))
    if v:
        steps.append(step(sends=[Xfer((v - lowbit(v, p) + root) % p, TMP, 0, size * n)]))
    elif root:
        steps.append(step(locals_=_unrotate(p, root, n, to_tmp=False)))
    return schedule(steps, 0 if buf == RECV else size * n)


def scatter_linear(s: Spec) -> Schedule:
    """The root sends each rank its block."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    if r != root:
        return schedule([step([Xfer(root, RECV, 0, n)])])
    return schedule([step((), [Xfer(i, SEND, i * n, n) for i in range(p) if i != r],
                          [copy(RECV, 0, n, SEND, r * n)])])


def scatter_binomial(s: Spec) -> Schedule:
    """Binomial scatter: each rank receives its subtree's blocks and passes them down."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    v = (r - root) % p
    size = _subtree(v, p)
    steps: list[Step] = []
    if v:
        steps.append(step([Xfer((v - lowbit(v, p) + root) % p, TMP, 0, size * n)]))
        buf = TMP
    elif root:
        steps.append(step(locals_=_unrotate(p, root, n, to_tmp=True)))
        buf = TMP
    else:
        buf = SEND
    sends = []
    m = lowbit(v, p) >> 1
    while m:
        if v + m < p:
            sends.append(Xfer((v + m + root) % p, buf, m * n, _subtree(v + m, p) * n))
        m >>= 1
    steps.append(step((), sends, [copy(RECV, 0, n, buf, 0)]))
    return schedule(steps, 0 if buf == SEND else size * n)


def gatherv_linear(s: Spec) -> Schedule:
    """Every rank sends its block to the root, which places it at ``displs[i]``."""
    p, r, root = s.size, s.rank, s.root
    if r != root:
        return schedule([step(sends=[Xfer(root, SEND, 0, s.n)])])
    assert s.counts is not None and s.displs is not None
    c, d = s.counts, s.displs
    return schedule([step([Xfer(i, RECV, d[i], c[i]) for i in range(p) if i != r], (),
                          [copy(RECV, d[r], c[r], SEND, 0)])])


def scatterv_linear(s: Spec) -> Schedule:
    """The root sends block i (``counts[i]`` at ``displs[i]``) to rank i."""
    p, r, root = s.size, s.rank, s.root
    if r != root:
        return schedule([step([Xfer(root, RECV, 0, s.n)])])
    assert s.counts is not None and s.displs is not None
    c, d = s.counts, s.displs
    return schedule([step((), [Xfer(i, SEND, d[i], c[i]) for i in range(p) if i != r],
                          [copy(RECV, 0, c[r], SEND, d[r])])])
