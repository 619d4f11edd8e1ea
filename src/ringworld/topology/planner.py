"""Plan a collective on a topology: build candidate schedules, time each, explain the winner.

Candidates are the registry's algorithms in rank order and topology-aware schedules built from
them (:mod:`ringworld.topology.plans`): rings along the searched ring orders (one, or several at
once on DGX-class meshes), broadcast trees along the locality order (and improved by a swap
search on small worlds), pipelined chains along the best ring, hierarchical schedules on
multi-host topologies, and on ``seed-pcie-4gpu`` the seed's plan 1 and plan 2. Every candidate
is simulated (:mod:`ringworld.topology.sim`); the fastest wins. Worlds too large to build a
candidate's every rank in reasonable time skip it (said in ``skipped``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringworld.algorithms import registry
from ringworld.algorithms.schedule import Schedule, Spec
from ringworld.topology import plans, search
from ringworld.topology.model import Topology
from ringworld.topology.program import Programs
from ringworld.topology.sim import Network, SimResult, simulate

COLLECTIVES = ("allreduce", "bcast", "allgather", "reduce")
ITEMSIZE = 4               # float32, as the benchmark
SEGMENT_BYTES = 1 << 20    # the communicator's default pipelining segment
RECORD_MAX = 200_000       # record transfers (for --json) up to this many messages
EXPLICIT_BUILD_MAX = 500_000  # ranks x steps a candidate may build rank by rank
LINEAR_MAX = 8


def bus_factor(collective: str, p: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    if collective == "allreduce":
        return 2 * (p - 1) / p if p > 1 else 1.0
    if collective == "allgather":
        return (p - 1) / p if p > 1 else 1.0
    return 1.0


@dataclass(slots=True)
class Candidate:
    """One way to run the collective, and its simulated outcome."""

    name: str
    algorithm: str
    description: str
    builder: Callable[[int], Schedule]
    rotation: bool = True
    steps_hint: int = 0  # estimated steps per rank (to skip what is too big to build)
    result: SimResult | None = None
    error: str | None = None

    @property
    def time(self) -> float:
        """Predicted seconds (inf when it could not be simulated)."""
        return self.result.time if self.result is not None else math.inf


@dataclass(slots=True)
class Plan:
    """Every candidate (fastest first), the chosen one and why."""

    topology: Topology
    collective: str
    nbytes: int
    root: int
    candidates: list[Candidate]
    net: Network
    skipped: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate:
        """The fastest candidate."""
        return self.candidates[0]

    def busbw(self, c: Candidate) -> float:
        """nccl-tests bus bandwidth of a candidate, bytes/s."""
        return self.nbytes / c.time * bus_factor(self.collective, self.net.p) if c.time else 0.0

    def busiest(self, c: Candidate) -> tuple[str, float, float] | None:
        """(resource, bytes carried, seconds at full speed) of the most loaded resource."""
        if c.result is None or not c.result.load:
            return None
        cap = self.net.capacity
        x = max(c.result.load, key=lambda k: c.result.load[k] / cap[k] if c.result else 0.0)
        return self.net.describe(x), c.result.load[x], c.result.load[x] / cap[x]

    def contention(self, c: Candidate) -> str:
        """``; up to k messages share X at once`` for the most shared link, or ``""``."""
        if c.result is None or not c.result.sharing:
            return ""
        eng = set(self.net.router.engine.values())
        links = {x: k for x, k in c.result.sharing.items() if x not in eng}
        if not links:
            return ""
        x = max(links, key=lambda k: (links[k], c.result.load.get(k, 0.0) if c.result else 0))
        if links[x] < 2:
            return "; no link is shared by two messages at once"
        return f"; up to {links[x]} messages share {self.net.describe(x)} at once"

    def explain(self) -> list[str]:
        """Why the chosen candidate wins, in a few sentences."""
        ok = [c for c in self.candidates if c.result is not None]
        if not ok:
            return ["no candidate could be simulated"]
        win = ok[0]
        lines = [f"chosen: {win.name} ({win.algorithm}), predicted {_ms(win.time)}, busbw "
                 f"{self.busbw(win) / 1e9:.2f} GB/s."]
        if len(ok) > 1:
            nxt = ok[1]
            lines.append(f"it beats the runner-up {nxt.name} ({_ms(nxt.time)}) by "
                         f"{(nxt.time / win.time - 1) * 100:.1f}% and the slowest, "
                         f"{ok[-1].name}, by {ok[-1].time / win.time:.2f}x.")
        shown = ok[:2] + [c for c in ok[2:] if c.name in SEED_PLANS]
        for c in shown:
            b = self.busiest(c)
            steps = max(1, c.steps_hint)
            overhead = float(self.net.overhead.max()) * steps
            msgs = c.result.messages if c.result is not None else 0
            if b is not None:
                kind = "bandwidth-bound" if b[2] >= overhead else "latency-bound"
                lines.append(f"{c.name} ({_ms(c.time)}): {kind}; busiest resource {b[0]} "
                             f"carries {_size(b[1])}, {_ms(b[2])} at full speed; {steps} "
                             f"steps (~{_ms(overhead)} of per-step overhead); {msgs} messages"
                             f"{self.contention(c)}.")
        return lines

    def to_json(self, transfers: bool = True) -> dict[str, Any]:
        """The plan as JSON: each candidate with its transfers when recorded."""
        out = []
        for c in self.candidates:
            row: dict[str, Any] = {"name": c.name, "algorithm": c.algorithm,
                                   "description": c.description,
                                   "predicted_s": c.time if c.result else None,
                                   "error": c.error}
            if c.result is not None:
                b = self.busiest(c)
                row.update({"algbw_GBps": self.nbytes / c.time / 1e9 if c.time else None,
                            "busbw_GBps": self.busbw(c) / 1e9, "steps": c.steps_hint,
                            "messages": c.result.messages, "executor": c.result.executor,
                            "busiest": None if b is None else {
                                "resource": b[0], "bytes": b[1], "seconds": b[2]}})
                if transfers and c.result.transfers is not None:
                    row["transfers"] = [list(t) for t in c.result.transfers]
                    row["transfer_fields"] = ["source", "destination", "bytes", "start", "end"]
                else:
                    row["transfers"] = None
            out.append(row)
        return {"topology": self.topology.name, "collective": self.collective,
                "bytes": self.nbytes, "ranks": self.net.p, "root": self.root,
                "chosen": self.chosen.name, "explanation": self.explain(),
                "skipped": self.skipped, "candidates": out}


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def _size(n: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def _registry(collective: str, name: str, p: int, spec: Callable[[int], Spec],
              extra_steps: int = 0) -> Candidate:
    long = name in ("ring", "scatter_allgather", "linear", "pairwise")
    hint = (2 * p + extra_steps) if long else 2 * max(1, p.bit_length()) + 2
    return Candidate(name, name, f"registry {collective}/{name} in rank order",
                     lambda r: registry.build(collective, name, spec(r)), True, hint)


def _gather_spec(p: int, blk: int) -> Callable[[int], Spec]:
    return lambda r: Spec(p, r, blk)


def candidates(net: Network, collective: str, nbytes: int, root: int = 0,
               segment_bytes: int = SEGMENT_BYTES, search_trees: bool = True
               ) -> list[Candidate]:
    """The candidate schedules of ``collective`` of ``nbytes`` on ``net``.

    Raises:
        ValueError: unknown collective, root out of range, or a size below one element.
    """
    p = net.p
    if collective not in COLLECTIVES:
        raise ValueError(f"collective {collective!r}: one of {', '.join(COLLECTIVES)}")
    if not 0 <= root < p:
        raise ValueError(f"root {root} outside 0..{p - 1}")
    seg = max(1, segment_bytes // ITEMSIZE)
    if collective == "allgather":
        return _allgather_candidates(net, nbytes)
    n = nbytes // ITEMSIZE
    if n < 1:
        raise ValueError(f"size {nbytes} B is under one element")
    if collective == "reduce":
        return _reduce_candidates(net, n, root)
    if collective == "allreduce":
        return _allreduce_candidates(net, n)
    return _bcast_candidates(net, n, root, seg, search_trees)


def _allgather_candidates(net: Network, nbytes: int) -> list[Candidate]:
    """Allgather of ``nbytes`` in all: the registry's, and a ring along the searched order."""
    p = net.p
    out: list[Candidate] = []
    blk = nbytes // (ITEMSIZE * p)
    if blk < 1:
        raise ValueError(f"size {nbytes} B is under one element per rank")
    for name in registry.REGISTRY["allgather"]:
        if name == "linear" and p > LINEAR_MAX:
            continue
        out.append(_registry("allgather", name, p, _gather_spec(p, blk)))
    rings = search.find_rings(net, 1)
    if rings and rings[0][0] != list(range(p)):
        order = rings[0][0]
        displs = tuple(order[u] * blk for u in range(p))
        out.append(Candidate(
            "ring(searched)", "ring", f"ring allgather along {_fmt(order)}",
            plans.on_order(lambda v: registry.build("allgather", "ring", Spec(
                p, v, blk, counts=(blk,) * p, displs=displs)), order), False, p))
    return out


def _reduce_candidates(net: Network, n: int, root: int) -> list[Candidate]:
    """Reduce of ``n`` elements to ``root``: the registry's schedules."""
    p = net.p
    out: list[Candidate] = []
    for name in registry.REGISTRY["reduce"]:
        if name != "linear" or p <= LINEAR_MAX:
            out.append(_registry("reduce", name, p, lambda r: Spec(p, r, n, root)))
    return out


def _allreduce_candidates(net: Network, n: int) -> list[Candidate]:
    """Allreduce of ``n`` elements: the registry's, searched rings, hierarchical plans."""
    p = net.p
    out: list[Candidate] = []
    for name in registry.REGISTRY["allreduce"]:
        if name != "linear" or p <= LINEAR_MAX:
            out.append(_registry("allreduce", name, p, lambda r: Spec(p, r, n)))
    rings = search.find_rings(net)
    if rings and (rings[0][0] != list(range(p))):
        order = rings[0][0]
        out.append(Candidate(
            "ring(searched)", "ring", f"ring allreduce along {_fmt(order)} (bottleneck "
            f"{rings[0][1] / 1e9:.3g} GB/s)",
            plans.on_order(lambda v: registry.build("allreduce", "ring", Spec(p, v, n)),
                           order), False, 2 * p))
    if len(rings) > 1:
        for k in range(2, len(rings) + 1):
            orders = [o for o, _ in rings[:k]]
            weights = [b for _, b in rings[:k]]
            out.append(Candidate(
                f"rings x{k}", "ring", f"{k} concurrent ring allreduces on bandwidth-"
                f"weighted slices: " + "; ".join(_fmt(o) for o in orders),
                plans.multi_ring_allreduce(orders, weights, n), False, 2 * p))
    groups = _host_groups(net)
    if groups is not None:
        for inter in ("ring", "rabenseifner"):
            h = len(groups)
            steps = (2 * (h - 1) if inter == "ring" else 2 * h.bit_length()) + 4 * len(
                groups[0])
            out.append(Candidate(
                f"hier({inter})", f"reduce_scatter/ring+allreduce/{inter}+allgather/ring",
                f"reduce-scatter in each of {h} hosts, {inter} allreduce of each shard "
                "across hosts, allgather in each host",
                plans.hierarchical_allreduce(groups, n, inter), False, steps))
    return out


def _bcast_candidates(net: Network, n: int, root: int, seg: int,
                      search_trees: bool) -> list[Candidate]:
    """Bcast of ``n`` elements from ``root`` in segments of ``seg``: the registry's, trees
    along the locality order (and a searched one), a chain along a ring, the seed plans,
    hierarchical plans."""
    p = net.p
    out: list[Candidate] = []
    for name in registry.REGISTRY["bcast"]:
        if name != "linear" or p <= LINEAR_MAX:
            out.append(_registry("bcast", name, p, lambda r: Spec(p, r, n, root, segment=seg),
                                 n // seg))
    order = search.locality_order(net, root)
    out.append(Candidate("tree(locality)", "rounds", "binomial rounds along the locality order "
                         f"{_fmt(order)}, farthest half first",
                         plans.rounds_bcast(plans.halving_rounds(order), p, n), False,
                         max(1, (p - 1).bit_length())))
    if search_trees and 2 < p <= 16:
        def cost(o: list[int]) -> float:
            b = plans.rounds_bcast(plans.halving_rounds(o), p, n)
            return simulate(net, Programs.explicit(b, p, ITEMSIZE)).time
        best, _ = search.improve_order(order, cost)
        if best != order:
            out.append(Candidate("tree(searched)", "rounds", "binomial rounds along "
                                 f"{_fmt(best)} (swap search)",
                                 plans.rounds_bcast(plans.halving_rounds(best), p, n), False,
                                 max(1, (p - 1).bit_length())))
    rings = search.find_rings(net, 1)
    if rings and p > 2:
        ring = rings[0][0]
        at = ring.index(root)
        chain = ring[at:] + ring[:at]
        if chain != [(root + i) % p for i in range(p)]:
            out.append(Candidate(
                "chain(searched)", "ring", f"pipelined chain along {_fmt(chain)}",
                plans.on_order(lambda v: registry.build("bcast", "ring", Spec(
                    p, v, n, 0, segment=seg)), chain), False, p + n // seg))
    if net.topo.name == "seed-pcie-4gpu" and p == 4 and root == 0:
        for name, rounds in SEED_PLANS.items():
            out.append(Candidate(name, "rounds", "seed: " + "; then ".join(
                ", ".join(f"GPU{a}->GPU{b}" for a, b in rnd) for rnd in rounds),
                plans.rounds_bcast(rounds, p, n), False, 2))
    groups = _host_groups(net, equal=False)
    if groups is not None:
        for inter, intra in (("binomial", "binomial"), ("ring", "ring")):
            out.append(Candidate(f"hier({inter}/{intra})", f"bcast/{inter}+bcast/{intra}",
                                 f"{inter} broadcast between hosts, then {intra} inside each",
                                 plans.hierarchical_bcast(groups, root, n, seg, inter, intra),
                                 False, 2 * max(1, p.bit_length())))
    return out


SEED_PLANS = {"plan1": [[(0, 2)], [(0, 1), (2, 3)]], "plan2": [[(0, 1)], [(0, 2), (1, 3)]]}


def _fmt(order: list[int]) -> str:
    return "-".join(map(str, order)) if len(order) <= 16 else (
        "-".join(map(str, order[:8])) + f"-...({len(order)} ranks)")


def _host_groups(net: Network, equal: bool = True) -> list[list[int]] | None:
    """Ranks grouped by host when there are several hosts (of equal size if ``equal``)."""
    groups: dict[str | None, list[int]] = {}
    for r, h in enumerate(net.topo.hosts()):
        groups.setdefault(h, []).append(r)
    gs = list(groups.values())
    if len(gs) < 2 or (equal and len({len(g) for g in gs}) != 1):
        return None
    return gs


def evaluate(net: Network, c: Candidate, record: bool = True) -> bool:
    """Simulate one candidate into ``c.result`` (or ``c.error``); False when it is too large
    to build rank by rank (not rotation-symmetric and ranks x steps > EXPLICIT_BUILD_MAX)."""
    try:
        progs = None
        if c.rotation and net.p >= 64:
            progs = Programs.rotational(c.builder, net.p, ITEMSIZE, c.name)
        if progs is None:
            if c.steps_hint * net.p > EXPLICIT_BUILD_MAX:
                return False
            progs = Programs.explicit(c.builder, net.p, ITEMSIZE, c.name)
        c.steps_hint = progs.steps
        rec = record and progs.steps * net.p <= RECORD_MAX
        c.result = simulate(net, progs, record=rec)
    except Exception as exc:  # a candidate that cannot run is reported, not fatal
        c.error = f"{type(exc).__name__}: {exc}"
    return True


def plan(topo: Topology, collective: str, nbytes: int, root: int = 0, *,
         ranks: int | None = None, record: bool = True, segment_bytes: int = SEGMENT_BYTES,
         net: Network | None = None) -> Plan:
    """Build, simulate and rank every candidate.

    Raises:
        ValueError: see :func:`candidates`; TopologyError for an unusable topology.
    Cost: one simulation per candidate (seconds for thousands of ranks).
    """
    net = net or Network(topo, ranks)
    cands = candidates(net, collective, nbytes, root, segment_bytes)
    skipped = []
    kept = []
    for c in cands:
        if evaluate(net, c, record):
            kept.append(c)
        else:
            skipped.append(f"{c.name}: {net.p} ranks x ~{c.steps_hint} steps is too large to "
                           "build rank by rank")
    kept.sort(key=lambda c: c.time)
    return Plan(net.topo, collective, nbytes, root, kept, net, skipped)
