"""Alltoall: block j of rank i's SEND goes to block i of rank j's RECV.

``linear``: post every send and receive at once (one step; tiny worlds).

``pairwise``: p-1 steps; in step k rank r sends to r+k and receives from r-k, so every rank
sends and receives exactly one block per step: the large-message choice.

``bruck``: ceil(log2 p) steps for small blocks. After rotating so slot i holds the block for
rank r+i, step k sends every slot whose index has bit k set to rank r+2^k (packed into one
message); after all steps each block has travelled its index, i.e. reached its owner::

    slot index (binary)   step 0 (bit 0)   step 1 (bit 1)   step 2 (bit 2)
    1 = 001                 +1
    3 = 011                 +1               +2
    6 = 110                                  +2               +4

The v- and w-variants use ``linear``/``pairwise`` with per-peer counts (w: one buffer per peer,
buffers 3.. hold the sends and 3+p.. the receives).
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
    displacements,
    schedule,
    step,
)

Layout = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _layout(s: Spec) -> Layout:
    p, n = s.size, s.n
    sc = s.counts if s.counts is not None else (n,) * p
    sd = s.displs if s.displs is not None else displacements(sc)
    rc = s.rcounts if s.rcounts is not None else (n,) * p
    rd = s.rdispls if s.rdispls is not None else displacements(rc)
    return sc, sd, rc, rd


def linear(s: Spec) -> Schedule:
    """Every block moves at once."""
    p, r = s.size, s.rank
    sc, sd, rc, rd = _layout(s)
    others = [i for i in range(p) if i != r]
    return schedule([step([Xfer(i, RECV, rd[i], rc[i]) for i in others],
                          [Xfer(i, SEND, sd[i], sc[i]) for i in others],
                          [copy(RECV, rd[r], rc[r], SEND, sd[r])])])


def pairwise(s: Spec) -> Schedule:
    """p-1 steps, one block each way per step."""
    p, r = s.size, s.rank
    sc, sd, rc, rd = _layout(s)
    steps: list[Step] = [step(locals_=[copy(RECV, rd[r], rc[r], SEND, sd[r])])]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        steps.append(step([Xfer(src, RECV, rd[src], rc[src])], [Xfer(dst, SEND, sd[dst], sc[dst])]))
    return schedule(steps)


def bruck(s: Spec) -> Schedule:
    """log2 p packed exchanges on rotated blocks (packed, equal blocks only)."""
    p, r, n = s.size, s.rank, s.n
    rot = 0            # TMP: p rotated slots
    pack = p * n       # then the outgoing pack
    unpack = pack + (p // 2 + 1) * n  # then the incoming one

    def runs(bit: int) -> list[tuple[int, int]]:  # (first slot, slots) with ``bit`` set
        return [(i, min(bit, p - i)) for i in range(bit, p, 2 * bit)]

    def packing(bit: int, into: bool) -> list[Local]:
        out, at = [], 0
        for first, k in runs(bit):
            if into:
                out.append(copy(TMP, pack + at * n, k * n, TMP, rot + first * n))
            else:
                out.append(copy(TMP, rot + first * n, k * n, TMP, unpack + at * n))
            at += k
        return out

    head = (p - r) * n
    locs = [copy(TMP, rot, head, SEND, r * n), copy(TMP, rot + head, r * n, SEND, 0)]
    bit = 1
    steps: list[Step] = []
    while bit < p:
        locs += packing(bit, True)
        steps.append(step(locals_=locs))
        k = sum(c for _, c in runs(bit))
        steps.append(step([Xfer((r - bit) % p, TMP, unpack, k * n)],
                          [Xfer((r + bit) % p, TMP, pack, k * n)]))
        locs = packing(bit, False)
        bit *= 2
    locs += [copy(RECV, ((r - i) % p) * n, n, TMP, rot + i * n) for i in range(p)]
    steps.append(step(locals_=locs))
    return schedule(steps, unpack + (p // 2 + 1) * n)


def w_linear(s: Spec) -> Schedule:
    """Alltoallw, all at once: per-peer buffers, ``counts``/``rcounts`` elements each."""
    p, r = s.size, s.rank
    assert s.counts is not None and s.rcounts is not None
    others = [i for i in range(p) if i != r]
    return schedule([step([Xfer(i, 3 + p + i, 0, s.rcounts[i]) for i in others],
                          [Xfer(i, 3 + i, 0, s.counts[i]) for i in others],
                          [copy(3 + p + r, 0, s.rcounts[r], 3 + r, 0)])])


def w_pairwise(s: Spec) -> Schedule:
    """Alltoallw in p-1 pairwise steps."""
    p, r = s.size, s.rank
    assert s.counts is not None and s.rcounts is not None
    steps: list[Step] = [step(locals_=[copy(3 + p + r, 0, s.rcounts[r], 3 + r, 0)])]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        steps.append(step([Xfer(src, 3 + p + src, 0, s.rcounts[src])],
                          [Xfer(dst, 3 + dst, 0, s.counts[dst])]))
    return schedule(steps)
