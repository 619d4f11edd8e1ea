"""Choosing how a collective runs: every "which path" decision of a call is made here.

:meth:`Selector.choose` picks the algorithm of a call among every kind the registry holds
(schedules over messages, the direct shared-memory path, the hierarchical composite);
:meth:`Selector.use_hierarchy` decides a blocking allreduce across hosts; the shared-memory
collectives' own thresholds are :attr:`Selector.shm_policy` (handed to each arena);
:meth:`Selector.plan` returns a decision with its reasons (``Communicator.plan`` asks it for a
live call, ``ringworld plan --explain`` for a job that is not running).

Order of precedence: the call's ``algorithm=`` argument, then ``RINGWORLD_ALGORITHMS``
(``allreduce:ring,...``), then the cost model (:mod:`ringworld.tuning.cost`) over the algorithms
that can run this call (non-commutative ops exclude those that combine out of rank order;
uneven blocks exclude those needing equal blocks). :meth:`Selector.explain` returns the whole
table.

Where the cost comes from: by default (``RINGWORLD_TUNER=simulate``; see docs/topology.md,
"How the tuner uses this") each algorithm's schedule is run through the topology simulator on
the job's topology (:mod:`ringworld.tuning.simulated`) for communicators of 2 to
:data:`SIM_MAX_RANKS` ranks, the closed-form models of :mod:`ringworld.tuning.cost` beyond (and
everywhere with ``RINGWORLD_TUNER=formula``). Both use the same constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ringworld.algorithms.registry import (
    COMPOSITE,
    DIRECT,
    HIERARCHICAL,
    REGISTRY,
    SHM,
    VECTOR_DIRECT,
    Algorithm,
    algorithm,
    lookup,
)
from ringworld.algorithms.shm_policy import Policy
from ringworld.errors import ConfigError
from ringworld.tuning import shm_paths
from ringworld.tuning.cost import SHM_MODELS, Constants, model, predict

if TYPE_CHECKING:
    from ringworld.tuning.simulated import Layout, Simulated

__all__ = ["HIERARCHICAL", "SHM", "Plan", "Selector", "job_selector"]


class Plan(NamedTuple):
    """How one call runs, and why (see :meth:`Selector.plan`)."""

    collective: str
    algorithm: str
    kind: str  # the registry's: "schedule", "direct" or "composite"
    why: str
    costs: tuple[tuple[str, float], ...] = ()  # predicted seconds, cheapest first

    def __str__(self) -> str:
        lines = [f"{self.collective}: {self.algorithm} ({self.kind}): {self.why}"]
        lines += [f"  {name:<20} {t * 1e6:12.1f} us" if math.isfinite(t)
                  else f"  {name:<20} {'not chosen unless asked for':>27}"
                  for name, t in self.costs]
        return "\n".join(lines)

LINEAR_MAX_RANKS = 2  # "linear for tiny worlds": beyond this only if forced
SIM_MAX_RANKS = 8  # larger communicators are costed by formula (simulating them takes long)
#: a communicator's barriers go on messages (dissemination) until this many have run there
#: while no other collective mapped the shared windows; the next maps them (the arena loads
#: numpy: a script's start-up barriers stay light) and from then on barriers are one sync.
#: Same machine, barriers only: np=2 9-11 us on messages against 3.1 in the windows; np=4
#: on 2 cores 114-154 us against 26-35.
BARRIERS_ON_MESSAGES = 4


class Selector:
    """Picks algorithms for one job: its forced choices and measured constants."""

    def __init__(self, constants: dict[str, Constants],
                 forced: tuple[tuple[str, str], ...] = (), segment_bytes: int = 1 << 20,
                 simulate: bool = False, sysfs: str = "/sys",
                 shm_policy: Policy = shm_paths.DEFAULT) -> None:
        self.constants = constants
        # where the shared-memory collectives take direct copies, and race: handed to each
        # communicator's arena when it maps its windows
        self.shm_policy = shm_policy
        self.segment_bytes = segment_bytes
        self.simulate = simulate
        self.sysfs = sysfs  # where this machine is discovered (simulated costs on one host)
        self._sim: Simulated | None = None  # made on the first simulated choice
        self._memo: dict[tuple[object, ...], str] = {}
        self.forced: dict[str, str] = {}
        for coll, name in forced:
            try:
                lookup(coll, name)
            except ValueError as exc:
                raise ConfigError(f"RINGWORLD_ALGORITHMS: {exc}") from None
            self.forced[coll] = name

    def candidates(self, collective: str, *, commutative: bool = True,
                   equal_blocks: bool = True) -> list[Algorithm]:
        """The algorithms of ``collective`` able to run a call with these properties."""
        return [a for a in REGISTRY[collective].values()
                if (commutative or not a.commutative_only)
                and (equal_blocks or not a.equal_blocks_only)]

    def simulator(self, p: int, transport: str) -> Simulated | None:
        """The simulating cost source for a communicator of ``p`` ranks, or None where the
        formulas decide (``simulate`` off, one rank, or more than SIM_MAX_RANKS)."""
        if not self.simulate or not 1 < p <= SIM_MAX_RANKS or transport == "self":
            return None
        if self._sim is None:  # loads the topology layer: only once a choice needs it
            from ringworld.tuning.simulated import Simulated

            self._sim = Simulated(self.constants, self.segment_bytes, self.sysfs)
        return self._sim

    def explain(self, collective: str, p: int, nbytes: float, transport: str, *,
                commutative: bool = True, equal_blocks: bool = True, shm: bool = False,
                layout: Layout | None = None,
                link_bandwidth: float = math.inf) -> list[tuple[str, float]]:
        """Every runnable algorithm with its predicted seconds, cheapest first.

        ``shm``: the shared-memory algorithm may run (blocking call, ranks share memory).
        ``layout``: each rank's host index when the ranks span hosts (None: one host);
        ``link_bandwidth``: measured bytes/s between hosts (simulated costs only).
        Cost: a few simulations the first time a size class is met (see
        :mod:`ringworld.tuning.simulated`), else microseconds.
        """
        c = self.constants.get(transport, self.constants["shm"])
        sim = self.simulator(p, transport)
        rows = []
        for a in self.candidates(collective, commutative=commutative,
                                 equal_blocks=equal_blocks):
            if a.name == "linear" and p > LINEAR_MAX_RANKS and len(REGISTRY[collective]) > 1:
                t = math.inf
            elif sim is not None and model(collective, a.name) is not None:
                t = sim.seconds(collective, a.name, p, nbytes, transport, layout,
                                link_bandwidth)
            else:
                t = predict(collective, a.name, p, nbytes, c, self.segment_bytes)
            rows.append((a.name, t))
        if shm and equal_blocks and collective in SHM_MODELS:
            rows.append((SHM, predict(collective, SHM, p, nbytes, c) if sim is None
                         else sim.shm_seconds(collective, p, nbytes, transport, layout)))
        rows.sort(key=lambda row: row[1])
        return rows

    def hierarchical(self, host_sizes: Sequence[int], nbytes: float,
                     link_bandwidth: float = math.inf) -> tuple[float, float]:
        """Predicted seconds of an allreduce on hosts holding ``host_sizes`` ranks: the best
        flat algorithm over TCP, and the hierarchical one (reduce within each host over shared
        memory, allreduce among one leader per host over TCP, bcast within each host).

        Simulated on the job's topology with the link at ``link_bandwidth`` (bytes/s between
        hosts, measured) where :meth:`simulator` allows; otherwise by formula, with
        ``link_bandwidth`` bounding both from below by the bytes each host's link must carry:
        at least 2n(p-1)/p flat (a ring in rank order), 2n(h-1)/h hierarchical."""
        p, k, h = sum(host_sizes), max(host_sizes), len(host_sizes)
        if self.simulator(p, "tcp") is not None:
            return self._hierarchical_simulated(host_sizes, nbytes, link_bandwidth)
        flat = self.explain("allreduce", p, nbytes, "tcp")[0][1]
        within = (self.explain("reduce", k, nbytes, "shm", shm=True)[0][1]
                  + self.explain("bcast", k, nbytes, "shm", shm=True)[0][1]) if k > 1 else 0.0
        across = self.explain("allreduce", h, nbytes, "tcp")[0][1] if h > 1 else 0.0
        if link_bandwidth < math.inf and h > 1:
            flat = max(flat, 2 * nbytes * (p - 1) / p / link_bandwidth)
            across = max(across, 2 * nbytes * (h - 1) / h / link_bandwidth)
        return flat, within + across

    def _hierarchical_simulated(self, host_sizes: Sequence[int], nbytes: float,
                                link_bandwidth: float) -> tuple[float, float]:
        """:meth:`hierarchical` by simulation on the job's topology: the flat algorithms on
        every rank, the hierarchical one as its three phases in turn (each host's reduce and
        bcast on a host of the largest size, the leaders' allreduce across hosts)."""
        p, k, h = sum(host_sizes), max(host_sizes), len(host_sizes)
        layout = tuple(i for i, n in enumerate(host_sizes) for _ in range(n))
        flat = self.explain("allreduce", p, nbytes, "tcp", layout=layout,
                            link_bandwidth=link_bandwidth)[0][1]
        host = (0,) * k  # a job-built host, not this one's /sys: every host must agree
        within = (self.explain("reduce", k, nbytes, "shm", shm=True, layout=host)[0][1]
                  + self.explain("bcast", k, nbytes, "shm", shm=True, layout=host)[0][1]
                  ) if k > 1 else 0.0
        across = self.explain("allreduce", h, nbytes, "tcp", layout=tuple(range(h)),
                              link_bandwidth=link_bandwidth)[0][1] if h > 1 else 0.0
        return flat, within + across

    def use_hierarchy(self, host_sizes: Sequence[int], nbytes: float, requested: str | None,
                      link_bandwidth: Callable[[], float]) -> bool:
        """Whether a blocking allreduce with a commutative op on ranks spread over hosts of
        ``host_sizes`` ranks runs hierarchically: asked for by name (``requested``, or
        RINGWORLD_ALGORITHMS), or chosen freely where some host has several ranks and
        :meth:`hierarchical` predicts it faster. ``link_bandwidth()`` measures the link
        between hosts (collective on the communicator: called by every rank or none, as the
        answer depends on nothing a rank could see differently).
        """
        name = requested or self.forced.get("allreduce")
        if name is not None:
            return _kind("allreduce", name) == COMPOSITE
        if len(host_sizes) < 2 or max(host_sizes) < 2:
            return False
        flat, hier = self.hierarchical(host_sizes, nbytes, link_bandwidth())
        return hier < flat

    def plan(self, collective: str, p: int, nbytes: float, transport: str,
             requested: str | None = None, *, commutative: bool = True,
             equal_blocks: bool = True, shm: bool = False, layout: Layout | None = None,
             hierarchical: bool = False) -> Plan:
        """What :meth:`choose` picks for this call, with why and every candidate's predicted
        cost (``hierarchical``: :meth:`use_hierarchy` said the call runs hierarchically).

        Raises:
            ValueError: as :meth:`choose`.
        """
        if hierarchical:
            name = requested or self.forced.get("allreduce") or HIERARCHICAL
            why = ("asked for in the call" if requested else "forced by RINGWORLD_ALGORITHMS"
                   if self.forced.get("allreduce") else
                   "the ranks span hosts and it is predicted faster than any flat algorithm")
            return Plan(collective, name, COMPOSITE, why)
        name = self.choose(collective, p, nbytes, transport, requested,
                           commutative=commutative, equal_blocks=equal_blocks, shm=shm,
                           layout=layout)
        costs = tuple(self.explain(collective, p, nbytes, transport, commutative=commutative,
                                   equal_blocks=equal_blocks, shm=shm, layout=layout))
        forced = self.forced.get(collective)
        if requested is not None:
            why = "asked for in the call"
        elif forced == name:
            why = "forced by RINGWORLD_ALGORITHMS"
        elif name == SHM and collective in VECTOR_DIRECT:
            why = ("the ranks share memory: every v-variant takes the shared windows (blocks "
                   "too large for their slots then move on the message path)")
        elif p == 1 or len(costs) == 1:
            why = "the only algorithm that can run this call"
        else:
            source = "simulated" if self.simulator(p, transport) is not None else "formula"
            why = f"cheapest predicted ({source} costs, {transport} constants)"
            if forced is not None:
                why += f"; RINGWORLD_ALGORITHMS' {forced!r} cannot run this call"
        return Plan(collective, name, _kind(collective, name), why, costs)

    def choose(self, collective: str, p: int, nbytes: float, transport: str,
               requested: str | None = None, *, commutative: bool = True,
               equal_blocks: bool = True, shm: bool = False,
               layout: Layout | None = None) -> str:
        """The algorithm to run (``layout``: see :meth:`explain`).

        Where ranks outnumber cores a small broadcast takes the shared-memory path too: its
        waits yield the core at once (see ``comm.engine``) and its root runs ahead through the
        eager ring (``algorithms.shm``), which beats the binomial tree (``ringworld bench
        bcast``, 1 KiB, np=4 on 2 cores: 55 us with a flag barrier, 7 with the ring, against
        the tree's 117-136).

        Raises:
            ValueError: ``requested`` is unknown, or cannot run this call (e.g. a
                commutative-only algorithm with a non-commutative op).
        """
        name = requested or self.forced.get(collective)
        kind = None if name is None else _kind(collective, name)
        if kind == COMPOSITE:  # decided by use_hierarchy, for blocking calls only
            if requested is not None:
                raise ValueError(f"algorithm={name!r} is only for blocking allreduce "
                                 f"with a commutative op, not {collective} here")
            name = None
        elif kind == DIRECT:
            if shm and (equal_blocks or collective in VECTOR_DIRECT):
                return SHM
            if requested is not None:
                raise ValueError(f"algorithm={name!r} needs a blocking call on ranks that "
                                 "share memory (shm transport)" + (
                                     "" if collective in VECTOR_DIRECT else " with equal blocks"))
            name = None  # forced by the environment but impossible here: choose freely
        if name is not None:
            algo = algorithm(collective, name)
            runnable = ((commutative or not algo.commutative_only)
                        and (equal_blocks or not algo.equal_blocks_only))
            if runnable:
                return name
            if requested is not None:  # asked for in this call: say why it cannot run
                if algo.commutative_only and not commutative:
                    ok = [a.name for a in self.candidates(collective, commutative=False)]
                    raise ValueError(f"algorithm={name!r} combines out of rank order and cannot "
                                     f"run a non-commutative op; use one of {ok}")
                raise ValueError(f"algorithm={name!r} needs equal blocks on every rank")
            # forced job-wide (RINGWORLD_ALGORITHMS) but unable to run this call: choose freely
        if shm and collective in VECTOR_DIRECT:
            return SHM  # every size (see VECTOR_DIRECT): sizes differ by rank, the choice not
        key = (collective, p, nbytes, transport, commutative, equal_blocks, shm, layout)
        found = self._memo.get(key)
        if found is None:
            algos = REGISTRY[collective]
            if p == 1 or (len(algos) == 1 and not (shm and collective in SHM_MODELS)):
                found = next(iter(algos))  # nothing to compare (a barrier loads no numpy)
            else:
                found = self.explain(collective, p, nbytes, transport, commutative=commutative,
                                     equal_blocks=equal_blocks, shm=shm, layout=layout)[0][0]
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = found
        return found


def _kind(collective: str, name: str) -> str:
    """The registry kind of algorithm ``name``; ValueError if there is none."""
    return lookup(collective, name).kind


def job_selector(tuning_file: str | None, algorithms: tuple[tuple[str, str], ...] = (),
                 tuner: str = "simulate") -> Selector:
    """The selector of a job configured as RINGWORLD_TUNING_FILE, RINGWORLD_ALGORITHMS and
    RINGWORLD_TUNER say (what ``init()`` builds, and ``ringworld plan --explain`` asks).

    Raises:
        ConfigError: the tuning file cannot be read, or a forced algorithm does not exist.
    """
    from ringworld.tuning import constants

    return Selector(constants.load(tuning_file), algorithms, simulate=tuner == "simulate")
