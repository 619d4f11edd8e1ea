"""Reduce: combine every rank's SEND with the op; the result lands in RECV at the root.

``linear``: every rank sends to the root, which combines all p vectors in rank order.

``binomial``: relative rank v accumulates its subtree [v, v + lowbit(v)) by receiving from
v + 2^k for growing k, then sends the partial to its parent; log2 p rounds. Subtrees are
contiguous ranges, so each partial is combined as (lower ranks) op (higher ranks). For a
non-commutative op the tree is rooted at rank 0 (so "relative" order is rank order) and rank 0
forwards the result to the root.

``ring``: a ring reduce-scatter (every rank ends up owning one reduced block), then each rank
sends its block to the root: about 2n bytes per rank, the large-message choice. Commutative ops
only (blocks are combined in ring order).
"""

from __future__ import annotations

from ringworld.algorithms.bcast import lowbit
from ringworld.algorithms.reduce_scatter import ring_blocks
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
    reduce,
    schedule,
    step,
)


def linear(s: Spec) -> Schedule:
    """All ranks send to the root; the root combines in rank order."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    if r != root:
        return schedule([step(sends=[Xfer(root, SEND, 0, n)])])
    locs = [copy(TMP, r * n, n, SEND, 0), copy(RECV, 0, n, TMP, 0)]
    locs += [reduce(RECV, 0, n, TMP, i * n, src_left=False) for i in range(1, p)]
    recvs = [Xfer(i, TMP, i * n, n) for i in range(p) if i != root]
    return schedule([step(recvs, (), locs)], p * n)


def binomial(s: Spec) -> Schedule:
    """A binomial tree; rank order is kept for non-commutative ops."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    tree_root = root if s.commutative else 0
    v = (r - tree_root) % p
    acc = RECV if r == tree_root and r == root else TMP
    acc_at = 0
    inbox = n if acc == TMP else 0  # where children's partials arrive in TMP
    steps: list[Step] = [step(locals_=[copy(acc, acc_at, n, SEND, 0)])]
    span = lowbit(v, p)
    m = 1
    while m < span:
        if v + m < p:
            child = (v + m + tree_root) % p
            steps.append(step([Xfer(child, TMP, inbox, n)], (),
                              [reduce(acc, acc_at, n, TMP, inbox, src_left=False)]))
        m <<= 1
    if v:
        steps.append(step(sends=[Xfer((v - span + tree_root) % p, acc, acc_at, n)]))
    elif root != tree_root:
        steps.append(step(sends=[Xfer(root, acc, acc_at, n)]))
    if r == root and root != tree_root:
        steps.append(step(recvs=[Xfer(tree_root, RECV, 0, n)]))
    tmp = (n if acc == RECV else 2 * n) if p > 1 else 0
    return schedule(steps, tmp)


def ring(s: Spec) -> Schedule:
    """Ring reduce-scatter into blocks, then every block goes to the root."""
    p, r, n, root = s.size, s.rank, s.n, s.root
    blk = blocks(n, p)
    steps, tmp, where = ring_blocks(p, r, blk)
    own = blk[r]
    if r == root:
        recvs = [Xfer(i, RECV, *blk[i]) for i in range(p) if i != root]
        steps.append(step(recvs, (), [copy(RECV, own[0], own[1], *where)]))
    else:
        steps.append(step(sends=[Xfer(root, where[0], where[1], own[1])]))
    return schedule(steps, tmp)
