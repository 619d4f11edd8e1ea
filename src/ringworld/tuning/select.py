"""Choosing a collective's algorithm: forced per call, forced by environment, or cheapest.

Order of precedence: the call's ``algorithm=`` argument, then ``RINGWORLD_ALGORITHMS``
(``allreduce:ring,...``), then the cost model (:mod:`ringworld.tuning.cost`) over the algorithms
that can run this call (non-commutative ops exclude those that combine out of rank order;
uneven blocks exclude those needing equal blocks). :func:`explain` returns the whole table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ringworld.algorithms.registry import REGISTRY, Algorithm, algorithm
from ringworld.errors import ConfigError
from ringworld.tuning.cost import SHM_MODELS, Constants, predict

HIERARCHICAL = "hierarchical"  # allreduce within hosts, then across (the communicator runs it)
SHM = "shm"  # the shared-memory algorithms (ringworld.algorithms.shm): blocking calls only

LINEAR_MAX_RANKS = 2  # "linear for tiny worlds": beyond this only if forced


class Selector:
    """Picks algorithms for one job: its forced choices and measured constants."""

    def __init__(self, constants: dict[str, Constants],
                 forced: tuple[tuple[str, str], ...] = (), segment_bytes: int = 1 << 20) -> None:
        self.constants = constants
        self.segment_bytes = segment_bytes
        self._memo: dict[tuple[str, int, float, str, bool, bool, bool], str] = {}
        self.forced: dict[str, str] = {}
        for coll, name in forced:
            try:
                if name != SHM and (coll, name) != ("allreduce", HIERARCHICAL):
                    algorithm(coll, name)
            except ValueError as exc:
                raise ConfigError(f"RINGWORLD_ALGORITHMS: {exc}") from None
            self.forced[coll] = name

    def candidates(self, collective: str, *, commutative: bool = True,
                   equal_blocks: bool = True) -> list[Algorithm]:
        """The algorithms of ``collective`` able to run a call with these properties."""
        return [a for a in REGISTRY[collective].values()
                if (commutative or not a.commutative_only)
                and (equal_blocks or not a.equal_blocks_only)]

    def explain(self, collective: str, p: int, nbytes: float, transport: str, *,
                commutative: bool = True, equal_blocks: bool = True,
                shm: bool = False) -> list[tuple[str, float]]:
        """Every runnable algorithm with its predicted seconds, cheapest first.

        ``shm``: the shared-memory algorithm may run (blocking call, ranks share memory).
        """
        c = self.constants.get(transport, self.constants["shm"])
        rows = []
        for a in self.candidates(collective, commutative=commutative,
                                 equal_blocks=equal_blocks):
            t = predict(collective, a.name, p, nbytes, c, self.segment_bytes)
            if a.name == "linear" and p > LINEAR_MAX_RANKS:
                t = math.inf if len(REGISTRY[collective]) > 1 else t
            rows.append((a.name, t))
        if shm and equal_blocks and collective in SHM_MODELS:
            rows.append((SHM, predict(collective, SHM, p, nbytes, c)))
        rows.sort(key=lambda row: row[1])
        return rows

    def hierarchical(self, host_sizes: Sequence[int], nbytes: float,
                     link_bandwidth: float = math.inf) -> tuple[float, float]:
        """Predicted seconds of an allreduce on hosts holding ``host_sizes`` ranks: the best
        flat algorithm over TCP, and the hierarchical one (reduce within each host over shared
        memory, allreduce among one leader per host over TCP, bcast within each host).

        ``link_bandwidth`` (bytes/s between hosts, measured) bounds both from below by the
        bytes each host's link must carry: at least 2n(p-1)/p flat (a ring in rank order),
        2n(h-1)/h hierarchical."""
        p, k, h = sum(host_sizes), max(host_sizes), len(host_sizes)
        flat = self.explain("allreduce", p, nbytes, "tcp")[0][1]
        within = (self.explain("reduce", k, nbytes, "shm", shm=True)[0][1]
                  + self.explain("bcast", k, nbytes, "shm", shm=True)[0][1]) if k > 1 else 0.0
        across = self.explain("allreduce", h, nbytes, "tcp")[0][1] if h > 1 else 0.0
        if link_bandwidth < math.inf and h > 1:
            flat = max(flat, 2 * nbytes * (p - 1) / p / link_bandwidth)
            across = max(across, 2 * nbytes * (h - 1) / h / link_bandwidth)
        return flat, within + across

    def choose(self, collective: str, p: int, nbytes: float, transport: str,
               requested: str | None = None, *, commutative: bool = True,
               equal_blocks: bool = True, shm: bool = False) -> str:
        """The algorithm to run.

        Raises:
            ValueError: ``requested`` is unknown, or cannot run this call (e.g. a
                commutative-only algorithm with a non-commutative op).
        """
        name = requested or self.forced.get(collective)
        if name == HIERARCHICAL:  # run by the communicator itself, for blocking calls only
            if requested is not None:
                raise ValueError(f"algorithm='hierarchical' is only for blocking allreduce "
                                 f"with a commutative op, not {collective} here")
            name = None
        if name == SHM:
            if collective not in SHM_MODELS:
                raise ValueError(f"algorithm='shm' is not available for {collective}; it "
                                 f"exists for {', '.join(SHM_MODELS)}")
            if shm and equal_blocks:
                return SHM
            if requested is not None:
                raise ValueError("algorithm='shm' needs a blocking call on ranks that share "
                                 "memory (shm transport) with equal blocks")
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
        key = (collective, p, nbytes, transport, commutative, equal_blocks, shm)
        found = self._memo.get(key)
        if found is None:
            if p == 1:
                found = next(iter(REGISTRY[collective]))
            else:
                found = self.explain(collective, p, nbytes, transport, commutative=commutative,
                                     equal_blocks=equal_blocks, shm=shm)[0][0]
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = found
        return found
