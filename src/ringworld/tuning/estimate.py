"""The simulated time of one registry schedule: what calibration and the run-time tuner share.

:func:`schedule_time` builds, for every rank, the schedule the communicator would run for a
collective (``ringworld.algorithms.registry``) and times it with the simulator
(:mod:`ringworld.topology.sim`). :func:`cache_factor` is the calibrated cache model: how much
faster than main memory a call whose buffers fit in the cache moves and combines its bytes.
Both that and the shared-memory formulas (:func:`shm_time`) take the host's memory bus into
account where ``Constants.bus_rate`` is set: ranks that stream at once share it, so a call
takes at least its ranks' memory traffic (:func:`traffic`) over that rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ringworld.algorithms import registry
from ringworld.algorithms.schedule import Spec
from ringworld.config import DEFAULT_EAGER_BYTES
from ringworld.topology.model import Params, Topology
from ringworld.topology.program import Program, Programs
from ringworld.topology.sim import Network, simulate
from ringworld.tuning.cost import ALIASES, Constants, model

# collectives whose Spec.n is one rank's block (the others: the whole vector)
BLOCKED = frozenset({"gather", "scatter", "allgather", "alltoall", "reduce_scatter_block"})


def core_params(c: Constants) -> Params:
    """A CPU-core rank's simulator constants from measured (or default) tuning constants.

    ``c.bandwidth`` counts the bytes a rank sends plus receives in an exchange. On one host the
    simulator charges a transfer to the receiver's engine only (the receiver copies the bytes
    out of the sender's memory), so the engine's rate is what a rank receives: half of it.
    """
    return Params(c.step, c.message, c.bandwidth / 2, c.reduce_rate, c.copy_rate,
                  c.rendezvous, DEFAULT_EAGER_BYTES)


def base(collective: str) -> str:
    """The collective whose schedules run ``collective`` (gatherv runs gather's, ...)."""
    return ALIASES.get(collective, collective)


def working_set(collective: str, nbytes: int, nranks: int) -> float:
    """Bytes the buffers of one call span, over all ranks (send and receive buffers);
    ``nbytes`` is the vector, or for allgather the whole gathered buffer, for
    reduce_scatter_block and alltoall the whole send buffer."""
    per_rank = {"bcast": nbytes, "allgather": nbytes + nbytes / nranks,
                "reduce_scatter_block": nbytes + nbytes / nranks}.get(collective, 2 * nbytes)
    return nranks * per_rank


def cache_factor(c: Constants, collective: str, nbytes: int, nranks: int) -> float:
    """How much faster than its main-memory rates a call of ``nbytes`` runs under ``c``'s
    cache model: ``cache_speedup`` up to ``cache_bytes`` of working set, 1 from twice that,
    geometric in between."""
    if c.cache_bytes <= 0 or c.cache_speedup == 1.0:
        return 1.0
    ws = working_set(collective, nbytes, nranks)
    if ws <= c.cache_bytes:
        return c.cache_speedup
    if ws >= 2 * c.cache_bytes:
        return 1.0
    return float(c.cache_speedup ** (1 - math.log2(ws / c.cache_bytes)))


def bus_rate(c: Constants, collective: str, nbytes: int, nranks: int) -> float:
    """The memory bus rate in effect for a call of ``nbytes`` (as :func:`cache_factor` counts
    them): ``c.bus_rate`` once the working set is twice the cache, 0 (no limit) while it fits,
    and in between the rate over the share of traffic that reaches main memory (the same
    log-scale share by which :func:`cache_factor` falls from ``cache_speedup`` to 1)."""
    if c.bus_rate <= 0 or c.cache_bytes <= 0:
        return c.bus_rate
    share = math.log2(max(1.0, working_set(collective, nbytes, nranks) / c.cache_bytes))
    return 0.0 if share <= 0 else c.bus_rate / min(1.0, share)


def _as_measured(collective: str, p: int, n: int) -> tuple[str, int]:
    """The base collective and the bytes as :func:`cache_factor` counts them, of a call of
    ``n`` bytes as the selector counts them (the vector, or one rank's block for the blocked
    collectives)."""
    b = base(collective)
    return b, n * p if b in BLOCKED else n


def call_factor(c: Constants, collective: str, p: int, n: int) -> float:
    """:func:`cache_factor` of a call of ``n`` bytes as the selector counts them."""
    b, nbytes = _as_measured(collective, p, n)
    return cache_factor(c, b, nbytes, p)


def call_bus(c: Constants, collective: str, p: int, n: int) -> float:
    """:func:`bus_rate` of a call of ``n`` bytes as the selector counts them."""
    b, nbytes = _as_measured(collective, p, n)
    return bus_rate(c, b, nbytes, p)


def sped_up(topo: Topology, speedup: float) -> Topology:
    """``topo`` with its CPU cores' byte rates (transport, reduction, copy) times
    ``speedup``."""
    if speedup == 1.0:
        return topo
    core = next((d for d in topo.devices if d.kind == "core"), None)
    if core is None:
        return topo
    b = core.params()
    return topo.with_params("core", replace(b, engine=b.engine * speedup,
                                            reduce_rate=b.reduce_rate * speedup,
                                            copy_rate=b.copy_rate * speedup))


def spec(collective: str, p: int, rank: int, n: int, segment: int) -> Spec:
    """The Spec of a call of ``n`` elements (one rank's block for the blocked collectives,
    else the vector) rooted at 0, pipelined in ``segment`` elements where that applies."""
    b = base(collective)
    if b == "barrier":
        return Spec(p, rank)
    if b in BLOCKED:
        return Spec(p, rank, n)
    return Spec(p, rank, n, 0, segment=segment)


def traffic(progs: Programs) -> list[float]:
    """Each rank's bytes of memory traffic in ``progs``: 2 per byte received or copied (one
    copy: a read and a write), 3 per byte reduced (two reads, a write). Cost: O(steps)."""
    def one(prog: Program) -> float:
        return float(sum(2 * (sum(b for _, b in s.recvs) + s.copied) + 3 * s.reduced
                         for s in prog))
    if progs.relative is not None:
        return [one(progs.relative)] * progs.p
    return [one(progs.rank(r)) for r in range(progs.p)]


def schedule_time(net: Network, collective: str, algorithm: str, n: int, itemsize: int,
                  segment: int, bus: float = 0.0, hosts: Sequence[int] | None = None) -> float:
    """Simulated seconds of ``algorithm``'s schedule of ``collective`` for ``n`` elements of
    ``itemsize`` bytes (see :func:`spec`) on every rank of ``net``; with ``bus`` (bytes/s of
    one host's memory traffic, ``Constants.bus_rate``), at least the busiest host's
    :func:`traffic` over it (``hosts``: each rank's host; None: all on one).

    Raises:
        ValueError: unknown collective or algorithm. Cost: builds p schedules and simulates
        them (about 0.1 ms per message).
    """
    p, b = net.p, base(collective)
    progs = Programs.explicit(lambda r: registry.build(b, algorithm, spec(b, p, r, n, segment)),
                              p, itemsize)
    t = simulate(net, progs).time
    if bus > 0:
        per_host: dict[int, float] = {}
        for r, x in enumerate(traffic(progs)):
            h = 0 if hosts is None else hosts[r]
            per_host[h] = per_host.get(h, 0.0) + x
        t = max(t, max(per_host.values()) / bus)
    return t


def shares_cores(topo: Topology, p: int) -> bool:
    """Whether ``p`` ranks on the one host of ``topo`` outnumber its cores (then they share
    them, and the shared-memory algorithm takes its crowded paths)."""
    return p > sum(1 for d in topo.devices if d.kind == "core")


def shm_time(c: Constants, collective: str, p: int, nbytes: float,
             crowded: bool = False) -> float:
    """Predicted seconds of the shared-memory algorithm (not a message schedule: its formula,
    :data:`ringworld.tuning.cost.SHM_MODELS`) for ``nbytes`` (the vector, or one rank's block
    for the blocked collectives), with the byte rates sped up by ``c``'s cache model, and
    its p ranks sharing the memory bus (:func:`call_bus`); ``crowded``: ranks share cores
    (:func:`shares_cores`), and the algorithm takes its paths for that.

    Direct peer reads (``read_rate``) are not sped up: the kernel's copy costs about 0.55 us
    per 4 KiB page whether the data is cached or not (here 7.2 GB/s at 0.5-2 MiB, where a
    cached memcpy runs at 18-25 GB/s, and 5.8 GB/s at 8 MiB against memcpy's 8)."""
    f = call_factor(c, collective, p, int(nbytes))
    c = c._replace(bus_rate=call_bus(c, collective, p, int(nbytes)))
    if f != 1.0:
        c = c._replace(bandwidth=c.bandwidth * f, reduce_rate=c.reduce_rate * f,
                       copy_rate=c.copy_rate * f, read_rate=c.reads)
    m = model(collective, "shm", crowded)
    return math.inf if m is None else m(p, nbytes, 0).time(c, streams=p)
