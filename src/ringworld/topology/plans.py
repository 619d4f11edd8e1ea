"""Topology-aware schedules, built from the registry's schedules (the IR the communicator runs).

Nothing here is a second implementation of a collective: every plan is a registry schedule with
its ranks renamed (:func:`on_order`, the ring or tree laid along a chosen rank order), several
schedules run side by side on disjoint slices (:func:`multi_ring_allreduce`, one per ring, as
NCCL uses several rings), registry schedules on sub-groups run one after the other
(:func:`hierarchical_allreduce`: reduce-scatter inside each host, allreduce of each shard
across hosts, allgather inside each host), or a broadcast given as explicit rounds of
(source, destination) pairs (:func:`rounds_bcast`, the seed's plan 1 and plan 2)::

    plan 1 (root GPU0)              plan 2
    round 0: GPU0 -> GPU2           round 0: GPU0 -> GPU1
    round 1: GPU0 -> GPU1,          round 1: GPU0 -> GPU2,
             GPU2 -> GPU3                    GPU1 -> GPU3   (both cross the root complex)

Each builder maps a rank to its :class:`~ringworld.algorithms.schedule.Schedule`, so the result
runs through :func:`ringworld.algorithms.check.run` (data) and the timing simulator alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ringworld.algorithms import registry
from ringworld.algorithms.schedule import (
    RECV,
    SEND,
    TMP,
    Local,
    Schedule,
    Spec,
    Step,
    Xfer,
    blocks,
    displacements,
    pipeline,
    schedule,
    segmented,
    step,
)

Builder = Callable[[int], Schedule]
BufMap = dict[int, tuple[int, int]]  # buffer -> (new buffer, element offset)


def remap(sched: Schedule, peers: Sequence[int] | None = None,
          bufs: BufMap | None = None) -> Schedule:
    """``sched`` with peer v renamed ``peers[v]`` and each buffer's slices moved per ``bufs``.
    Cost: O(size of the schedule)."""
    bm = bufs or {}

    def mb(buf: int, start: int) -> tuple[int, int]:
        nb = bm.get(buf)
        return (buf, start) if nb is None else (nb[0], start + nb[1])

    def mx(x: Xfer) -> Xfer:
        b, st = mb(x.buf, x.start)
        return Xfer(peers[x.peer] if peers is not None else x.peer, b, st, x.length)

    def ml(op: Local) -> Local:
        db, ds = mb(op.dbuf, op.dstart)
        sb, ss = mb(op.sbuf, op.sstart)
        ob, os_ = mb(op.obuf, op.ostart) if op.obuf >= 0 else (op.obuf, op.ostart)
        return Local(op.kind, db, ds, op.length, sb, ss, op.src_left, ob, os_)

    return Schedule(tuple(Step(tuple(map(mx, s.recvs)), tuple(map(mx, s.sends)),
                               tuple(map(ml, s.locals))) for s in sched.steps), sched.tmp)


def on_order(build_virtual: Callable[[int], Schedule], order: Sequence[int]) -> Builder:
    """Run a schedule written for ranks 0..p-1 with virtual rank v on real rank ``order[v]``."""
    inv = {real: v for v, real in enumerate(order)}
    if sorted(inv) != list(range(len(order))):
        raise ValueError(f"order {list(order)[:16]}... is not a permutation of the ranks")
    return lambda r: remap(build_virtual(inv[r]), peers=order)


def together(parts: Sequence[Schedule]) -> Schedule:
    """Run schedules on disjoint data at the same time: step k holds every part's step k
    (their scratch areas are laid side by side). Parts must keep each pair's messages in the
    same order on both sides (ring schedules do: each message is sent and received in the same
    step index)."""
    tmp_at = 0
    moved = []
    for part in parts:
        moved.append(remap(part, bufs={TMP: (TMP, tmp_at)}) if tmp_at else part)
        tmp_at += part.tmp
    longest = max((len(p.steps) for p in moved), default=0)
    steps = []
    for k in range(longest):
        here = [p.steps[k] for p in moved if k < len(p.steps)]
        steps.append(Step(tuple(x for s in here for x in s.recvs),
                          tuple(x for s in here for x in s.sends),
                          tuple(x for s in here for x in s.locals)))
    return schedule(steps, tmp_at)


def split(n: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """(start, length) slices of ``n`` elements in proportion to ``weights``."""
    total = sum(weights)
    ends = [round(n * sum(weights[: i + 1]) / total) for i in range(len(weights))]
    ends[-1] = n
    starts = [0, *ends[:-1]]
    return [(a, b - a) for a, b in zip(starts, ends, strict=True)]


def multi_ring_allreduce(orders: Sequence[Sequence[int]], weights: Sequence[float],
                         n: int) -> Builder:
    """Ring allreduce on several rank orders at once, ring i on a ``weights[i]`` share."""
    p = len(orders[0])
    slices = split(n, weights)

    def build(r: int) -> Schedule:
        parts = []
        for order, (off, ln) in zip(orders, slices, strict=True):
            inner = on_order(_ring_part(p, ln), order)(r)
            parts.append(remap(inner, bufs={SEND: (SEND, off), RECV: (RECV, off)}))
        return together(parts)
    return build


def _ring_part(p: int, n: int) -> Callable[[int], Schedule]:
    return lambda v: registry.build("allreduce", "ring", Spec(p, v, n))


def rounds_bcast(rounds: Sequence[Sequence[tuple[int, int]]], p: int, n: int,
                 segment: int = 0) -> Builder:
    """A broadcast given as rounds of (source, destination) rank pairs, each pair one message
    of the whole buffer (segments of ``segment`` elements pipelined down the tree).

    Raises:
        ValueError: a rank receives twice, or sends before it has received.
    """
    seen: set[int] = set()
    receivers: set[int] = set()
    for rnd in rounds:
        for a, b in rnd:
            if b in receivers or not (0 <= a < p and 0 <= b < p):
                raise ValueError(f"pair {a}->{b}: destination receives twice or out of range")
            receivers.add(b)
    roots = {a for rnd in rounds for a, _ in rnd} - receivers
    if len(roots) > 1:
        raise ValueError(f"several ranks send without receiving: {sorted(roots)}")
    for rnd in rounds:
        for a, _ in rnd:
            if a not in seen and a not in roots:
                raise ValueError(f"rank {a} sends before it receives")
        seen.update(b for _, b in rnd)

    def build(r: int) -> Schedule:
        parts = []
        for start, length in segmented(n, segment):
            steps = []
            for rnd in rounds:
                for a, b in rnd:
                    if a == r:
                        steps.append(step(sends=[Xfer(b, RECV, start, length)]))
                    elif b == r:
                        steps.append(step(recvs=[Xfer(a, RECV, start, length)]))
            parts.append(schedule(steps))
        return pipeline(parts)
    return build


def halving_rounds(order: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Binomial broadcast rounds along ``order`` (order[0] is the root), farthest half first:
    round 0 sends from position 0 to position 2^(K-1), and so on."""
    p = len(order)
    k = max(0, (p - 1).bit_length())
    rounds = []
    for i in range(k):
        d = 1 << (k - 1 - i)
        rounds.append([(order[a], order[a + d]) for a in range(0, p, 2 * d) if a + d < p])
    return [r for r in rounds if r]


def hierarchical_allreduce(groups: Sequence[Sequence[int]], n: int,
                           inter: str = "ring") -> Builder:
    """Reduce-scatter inside each group, allreduce (``inter``) of each shard across groups
    between ranks of the same local index, allgather inside each group.

    Raises:
        ValueError: groups of different sizes.
    """
    k = len(groups[0])
    if any(len(g) != k for g in groups):
        raise ValueError("hierarchical allreduce needs the same number of ranks per group")
    where = {r: (gi, j) for gi, g in enumerate(groups) for j, r in enumerate(g)}
    shards = blocks(n, k)
    counts = tuple(c for _, c in shards)
    offs = displacements(counts)

    def build(r: int) -> Schedule:
        gi, j = where[r]
        off, cnt = shards[j]
        local = list(groups[gi])
        across = [g[j] for g in groups]
        rs = remap(registry.build("reduce_scatter", "ring", Spec(k, j, cnt, counts=counts)),
                   local, {RECV: (RECV, off)})
        ar = remap(registry.build("allreduce", inter, Spec(len(groups), gi, cnt)), across,
                   {SEND: (RECV, off), RECV: (RECV, off)})
        ag = remap(registry.build("allgather", "ring", Spec(k, j, cnt, counts=counts,
                                                             displs=offs)),
                   local, {SEND: (RECV, off)})
        return schedule(rs.steps + ar.steps + ag.steps, max(rs.tmp, ar.tmp, ag.tmp))
    return build


def hierarchical_bcast(groups: Sequence[Sequence[int]], root: int, n: int, segment: int,
                       inter: str = "binomial", intra: str = "binomial") -> Builder:
    """Broadcast among one leader per group (the ranks with the root's local index), then
    from each leader inside its group.

    Raises:
        ValueError: ``root`` is in no group, or a group is too small to hold the local index.
    """
    where = {r: (gi, j) for gi, g in enumerate(groups) for j, r in enumerate(g)}
    if root not in where:
        raise ValueError(f"root {root} is in no group")
    g0, j0 = where[root]
    if any(len(g) <= j0 for g in groups):
        raise ValueError("every group needs a rank with the root's local index")
    leaders = [g[j0] for g in groups]

    def build(r: int) -> Schedule:
        gi, j = where[r]
        steps: list[Step] = []
        tmp = 0
        if j == j0:
            s = remap(registry.build("bcast", inter, Spec(len(groups), gi, n, g0,
                                                          segment=segment)), leaders)
            steps += s.steps
            tmp = s.tmp
        s = remap(registry.build("bcast", intra, Spec(len(groups[gi]), j, n, j0,
                                                      segment=segment)), list(groups[gi]))
        return schedule(steps + list(s.steps), max(tmp, s.tmp))
    return build
