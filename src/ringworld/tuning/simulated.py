"""The run-time tuner's view of the topology model: algorithms timed by simulating them.

:class:`Simulated` answers the selector's question "how long would this algorithm take for this
call?" by running the registry schedule the communicator would run through the simulator
(:mod:`ringworld.topology.sim`), on the job's topology, with the job's constants (those of
``RINGWORLD_TUNING_FILE``, as ``ringworld calibrate --fit --save`` writes them, cache model
included; else the built-in defaults).

* Ranks on one host: this machine as discovered from /sys (its cores and NUMA nodes; more ranks
  than cores share them), carrying the transport's constants.
* Ranks on several hosts: :func:`job_topology`, built only from the job's placement and
  constants (never from one host's /sys), so that every rank of every host reaches the same
  verdict.

Each algorithm is simulated at the powers of two around the call's size and interpolated
linearly between them, and each point is simulated once per process: a loop over one size
pays for the simulation on its first call only. The simulation is deterministic, so every rank
of a communicator, given the same constants, chooses the same algorithm without talking.
Simulating costs about p^2 (about 1 ms per algorithm and size at 4 ranks, 3 ms at 8, 12 ms at
16), so the selector
leaves communicators of more than ``SIM_MAX_RANKS`` ranks to the formulas of
:mod:`ringworld.tuning.cost` (:mod:`ringworld.tuning.select`). The shared-memory algorithms are
not message schedules: they keep their formulas, with the calibrated cache model applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ringworld.topology.discover import MEM_BANDWIDTH, discover
from ringworld.topology.model import Device, Link, Topology, build
from ringworld.topology.sim import Network
from ringworld.tuning.cost import Constants
from ringworld.tuning.estimate import (
    call_bus,
    call_factor,
    core_params,
    schedule_time,
    shares_cores,
    shm_time,
    sped_up,
)

NIC_BANDWIDTH = 100e9  # bytes/s between a host's memory and its NIC (never the bottleneck)

Layout = tuple[int, ...]  # each rank's host index


def job_topology(layout: Layout, shm: Constants, tcp: Constants,
                 link_bandwidth: float = math.inf) -> Topology:
    """The job's hosts as placed: each host a memory node with one core per rank (carrying the
    shared-memory constants) and a NIC on one network switch.

    A NIC's link carries ``link_bandwidth`` bytes/s each way (measured between hosts; else
    half of ``tcp.bandwidth``, which counts bytes sent plus received); a message between hosts
    crosses two of them and pays, in their latencies, what a TCP step costs beyond a
    shared-memory one.
    """
    bw = link_bandwidth if link_bandwidth < math.inf else tcp.bandwidth / 2
    lat = max(0.0, tcp.step - shm.step) / 2
    devs = [Device("switch", "switch", None, "network switch")]
    links: list[Link] = []
    ranks: list[str] = []
    seen: dict[int, int] = {}
    for h in sorted(set(layout)):
        devs += [Device(f"h{h}.mem", "cpu", f"h{h}", "memory"),
                 Device(f"h{h}.nic", "nic", f"h{h}", "NIC")]
        links += [Link(f"h{h}.nic", f"h{h}.mem", "pcie", NIC_BANDWIDTH),
                  Link(f"h{h}.nic", "switch", "net", bw, lat)]
    for h in layout:
        j = seen[h] = seen.get(h, -1) + 1
        devs.append(Device(f"h{h}.core{j}", "core", f"h{h}", "rank core"))
        links.append(Link(f"h{h}.core{j}", f"h{h}.mem", "mem", MEM_BANDWIDTH))
        ranks.append(f"h{h}.core{j}")
    name = f"job:{len(seen)}hosts:{len(layout)}ranks"
    return build(name, devs, links, ranks).with_params("core", core_params(shm))


class Simulated:
    """Predicted seconds of registry schedules on the job's topology, cached per size point."""

    def __init__(self, constants: Mapping[str, Constants], segment_bytes: int,
                 sysfs: str = "/sys") -> None:
        self.constants = constants
        self.segment = segment_bytes
        self.sysfs = sysfs
        self._local: Topology | None = None
        self._nets: dict[tuple[object, ...], Network] = {}
        self._points: dict[tuple[object, ...], float] = {}

    def seconds(self, collective: str, algorithm: str, p: int, nbytes: float, transport: str,
                layout: Layout | None = None, link_bandwidth: float = math.inf) -> float:
        """Simulated seconds of ``algorithm`` for a call of ``nbytes`` (the vector, or one
        rank's block for the blocked collectives) on ``p`` ranks over ``transport``.

        ``layout``: each rank's host index for a job topology (:func:`job_topology`); None:
        ranks on this machine as discovered.
        Raises:
            ValueError: unknown collective or algorithm.
        Cost: two simulations the first time a power-of-two size class is met, then a lookup.
        """
        nb = max(1, int(nbytes))
        lo = 1 << (nb.bit_length() - 1)
        key = (collective, algorithm, p, transport, layout, link_bandwidth)
        t_lo = self._point(key, lo)
        if nb == lo:
            return t_lo
        t_hi = self._point(key, 2 * lo)
        return t_lo + (t_hi - t_lo) * (nb - lo) / lo

    def shm_seconds(self, collective: str, p: int, nbytes: float, transport: str,
                    layout: Layout | None = None) -> float:
        """The shared-memory algorithm's formula with the cache model
        (:func:`ringworld.tuning.estimate.shm_time`). Ranks on this machine (``layout``
        None) that outnumber its cores get the crowded paths; within a job topology's hosts
        they never do, so that every host, whatever its cores, reaches the same verdict."""
        crowd = layout is None and shares_cores(self._machine(), p)
        return shm_time(self._constants(transport), collective, p, nbytes, crowd)

    def _point(self, key: tuple[str, str, int, str, Layout | None, float], n: int) -> float:
        found = self._points.get((*key, n))
        if found is None:
            collective, algorithm, p, transport, layout, bw = key
            c = self._constants(transport)
            speed = call_factor(c, collective, p, n)
            # the call's fixed part, as shm_seconds counts it (Work.time), so they compare alike
            found = c.call + float(schedule_time(self._net(p, transport, layout, bw, speed),
                                                 collective, algorithm, n, 1, self.segment,
                                                 call_bus(c, collective, p, n), layout))
            self._points[(*key, n)] = found
        return found

    def _machine(self) -> Topology:
        """This machine as discovered from /sys (once per process)."""
        if self._local is None:
            self._local = discover(self.sysfs, nvidia_smi=lambda: None).topology
        return self._local

    def _constants(self, transport: str) -> Constants:
        return self.constants.get(transport, self.constants["shm"])

    def _net(self, p: int, transport: str, layout: Layout | None, link_bandwidth: float,
             speed: float) -> Network:
        key = (p, transport, layout, link_bandwidth, speed)
        net = self._nets.get(key)
        if net is None:
            if layout is None:
                topo = self._machine().with_params("core",
                                                   core_params(self._constants(transport)))
                topo = topo.with_ranks(p)
            else:
                topo = job_topology(layout, self._constants("shm"), self._constants("tcp"),
                                    link_bandwidth)
            net = self._nets[key] = Network(sped_up(topo, speed), p)
        return net
