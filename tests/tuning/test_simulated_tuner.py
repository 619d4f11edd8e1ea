"""The run-time tuner costing algorithms by simulating their schedules on the job's topology.

Every test gives the code under test its constants (:data:`C`, fixed here) and its machine (a
made-up /sys, or a job-built layout), so neither a retune of the shipped defaults nor the
machine the tests run on changes what they check.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ringworld import Communicator
from ringworld.config import from_env
from ringworld.errors import ConfigError
from ringworld.topology.sim import Network
from ringworld.tuning import constants
from ringworld.tuning.cost import Constants, predict
from ringworld.tuning.cost import model as cost_model
from ringworld.tuning.estimate import schedule_time
from ringworld.tuning.select import SIM_MAX_RANKS, Selector
from ringworld.tuning.simulated import Simulated, job_topology

# The constants every test runs with: the reference machine's as measured on 2026-11-29 (the
# shipped defaults of then), written out so that a retune of constants.DEFAULTS leaves them be.
C: dict[str, Constants] = {
    "shm": Constants(step=51e-6, message=15e-6, bandwidth=4.3e9, reduce_rate=4.5e9,
                     copy_rate=4.4e9, sync=7.6e-6),
    "tcp": Constants(step=91e-6, message=33e-6, bandwidth=3.8e9, reduce_rate=4.5e9,
                     copy_rate=4.4e9),
    "self": Constants(step=2e-6, message=1e-6, bandwidth=1e12, reduce_rate=4.5e9,
                      copy_rate=4.4e9),
}
SEG = 1 << 20
HOST4 = (0, 0, 0, 0)  # one job-built host of four cores: independent of this machine's /sys


def _sim_point(layout: tuple[int, ...], coll: str, algo: str, n: int) -> float:
    net = Network(job_topology(layout, C["shm"], C["tcp"]), len(layout))
    return schedule_time(net, coll, algo, n, 1, SEG)


def test_explain_times_are_the_simulated_schedules() -> None:
    s = Selector(C, simulate=True)
    rows = dict(s.explain("allreduce", 4, 1 << 20, "shm", layout=HOST4))
    for algo in ("ring", "rabenseifner", "recursive_doubling", "reduce_bcast"):
        assert rows[algo] == pytest.approx(_sim_point(HOST4, "allreduce", algo, 1 << 20))
    # between two powers of two the time is interpolated, and it grows with the size
    lo, mid, hi = (dict(s.explain("bcast", 4, n, "shm", layout=HOST4))["binomial"]
                   for n in (1 << 20, 3 << 19, 2 << 20))
    assert lo < mid < hi
    assert mid == pytest.approx((lo + hi) / 2)


def _cores(root: Path, n: int) -> str:
    """A made-up /sys of one NUMA node with ``n`` cores; return its root."""
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text(f"0-{n - 1}\n")
    (root / "devices/system/node/node0").mkdir(parents=True)
    (root / "devices/system/node/node0/cpulist").write_text(f"0-{n - 1}\n")
    return str(root)


def test_simulation_changes_the_choice_where_the_formula_is_wrong(tmp_path: Path) -> None:
    # Measured on this project's 2-core machine (np=4, 4 MiB bcast): binomial 4.6 ms,
    # scatter-allgather 7.5 ms. The formula model prefers scatter-allgather; simulating the
    # schedules on two cores shared by four ranks does not.
    sysfs = _cores(tmp_path, 2)
    formula = Selector(C, sysfs=sysfs)
    sim = Selector(C, simulate=True, sysfs=sysfs)
    assert formula.choose("bcast", 4, 4 << 20, "shm") == "scatter_allgather"
    assert sim.choose("bcast", 4, 4 << 20, "shm") == "binomial"
    # with a core per rank (a job-built host) the simulation agrees with the formula
    assert sim.choose("bcast", 4, 4 << 20, "shm", layout=HOST4) == "scatter_allgather"
    # both still agree on the clear cases
    for s in (formula, sim):
        assert s.choose("allreduce", 4, 8, "shm") == "recursive_doubling"
        assert s.choose("allreduce", 2, 8, "shm", shm=True) == "shm"


def test_the_cache_model_speeds_up_what_fits(tmp_path: Path) -> None:
    cached = dict(C, shm=C["shm"]._replace(cache_bytes=64 << 20, cache_speedup=3.0))
    sysfs = _cores(tmp_path, 4)  # a core per rank, whatever machine runs this
    plain = Simulated(C, SEG, sysfs=sysfs)
    fast = Simulated(cached, SEG, sysfs=sysfs)
    t_plain = plain.seconds("allreduce", "ring", 4, 1 << 20, "shm", HOST4)
    t_fast = fast.seconds("allreduce", "ring", 4, 1 << 20, "shm", HOST4)
    assert t_fast < 0.6 * t_plain
    # the shared-memory algorithm's formula gets the same speed-up
    assert fast.shm_seconds("allreduce", 4, 1 << 20, "shm") < plain.shm_seconds(
        "allreduce", 4, 1 << 20, "shm")


def test_the_memory_bus_and_shared_cores_reach_the_tuner(tmp_path: Path) -> None:
    """A calibrated bus bounds what the tuner predicts for large calls (shared-memory formula
    and simulated schedules alike, per host), and ranks that outnumber the cores get the
    shared-memory algorithm's crowded paths."""
    sysfs = _cores(tmp_path, 2)
    bus = dict(C, shm=C["shm"]._replace(bus_rate=1e9))  # far below what the rates allow
    shm = C["shm"]
    assert min(shm.bandwidth, shm.reduce_rate, shm.copy_rate) > 4 * bus["shm"].bus_rate
    plain, slow = Simulated(C, SEG, sysfs=sysfs), Simulated(bus, SEG, sysfs=sysfs)
    n = 16 << 20
    # two ranks each read 16 MiB of the peer's vector (2 bytes of traffic per byte read)
    # and combine 8 MiB: at least their traffic over the bus
    t = slow.shm_seconds("allreduce", 2, n, "shm")
    assert t > 2 * plain.shm_seconds("allreduce", 2, n, "shm")
    assert t >= 2 * 2 * (n // 2) / 1e9
    ring = slow.seconds("allreduce", "ring", 2, n, "shm", (0, 0))
    assert ring > 2 * plain.seconds("allreduce", "ring", 2, n, "shm", (0, 0))
    # on two hosts each host's bus carries only its own rank's traffic
    apart = slow.seconds("allreduce", "ring", 2, n, "shm", (0, 1))
    assert apart < ring
    # four ranks on two cores: a 384 KiB alltoall per rank is read straight from the peers
    # (crowded) where ranks with cores of their own copy it through the windows (here the
    # faster way: fast copies, slow reads)
    c = C["shm"]._replace(copy_rate=20e9, read_rate=1e9)
    sim = Simulated(dict(C, shm=c), SEG, sysfs=sysfs)
    crowded, alone = cost_model("alltoall", "shm", crowded=True), cost_model("alltoall", "shm")
    assert crowded is not None and alone is not None
    blk = (384 << 10) // 4
    shared, own = crowded(4, blk, 0).time(c, streams=4), alone(4, blk, 0).time(c, streams=4)
    assert shared > 1.5 * own
    assert sim.shm_seconds("alltoall", 4, blk, "shm") == pytest.approx(shared)
    # within a job topology's hosts never: every host must reach the same verdict, whatever
    # its own cores
    assert sim.shm_seconds("alltoall", 4, blk, "shm", HOST4) == pytest.approx(own)
    sel = Selector(dict(C, shm=c), simulate=True, sysfs=sysfs)
    rows = dict(sel.explain("alltoall", 4, blk, "shm", shm=True, layout=HOST4))
    assert rows["shm"] == pytest.approx(own)
    assert dict(sel.explain("alltoall", 4, blk, "shm", shm=True))["shm"] == pytest.approx(shared)


def test_large_or_single_rank_communicators_use_the_formulas() -> None:
    s = Selector(C, simulate=True)
    p = SIM_MAX_RANKS + 1
    assert s.simulator(p, "shm") is None and s.simulator(1, "shm") is None
    rows = dict(s.explain("allreduce", p, 1 << 20, "shm"))
    assert rows["ring"] == predict("allreduce", "ring", p, 1 << 20, C["shm"], SEG)
    assert Selector(C).simulator(4, "shm") is None  # simulate=False: never


def test_hierarchical_choice_follows_the_link_between_hosts() -> None:
    s = Selector(C, simulate=True)
    slow_flat, slow_hier = s.hierarchical([4, 4], 16 << 20, 1e8)  # 100 MB/s between hosts
    assert slow_hier < 0.8 * slow_flat
    fast_flat, fast_hier = s.hierarchical([4, 4], 16 << 20, 1e11)
    assert fast_flat < fast_hier  # a link as fast as memory: the flat ring spreads the work
    assert fast_flat < slow_flat and math.isfinite(fast_hier)


def test_job_topology_places_ranks_on_their_hosts() -> None:
    topo = job_topology((0, 1, 0, 1, 1), C["shm"], C["tcp"], 1e9)
    assert topo.hosts() == ["h0", "h1", "h0", "h1", "h1"]
    net = Network(topo, 5)
    # a message between hosts crosses the network; one within a host does not
    assert "switch" in " ".join(net.describe(x) for x in net.route(0, 1).resources)
    assert "switch" not in " ".join(net.describe(x) for x in net.route(0, 2).resources)


def test_tuner_setting_is_read_and_checked() -> None:
    env = {"RINGWORLD_RANK": "0", "RINGWORLD_SIZE": "1"}
    assert from_env(env).tuner == "simulate"
    assert from_env({**env, "RINGWORLD_TUNER": "formula"}).tuner == "formula"
    with pytest.raises(ConfigError, match="RINGWORLD_TUNER"):
        from_env({**env, "RINGWORLD_TUNER": "guess"})


def _auto_ibcast(comm: Communicator) -> str:
    x = np.arange(1 << 20, dtype=np.float32) * (comm.rank == 0)  # 4 MiB
    comm.ibcast(x, 0).wait(60)
    assert float(x[-1]) == float((1 << 20) - 1)
    return comm.last_algorithm


@pytest.mark.parametrize("tuner", ["simulate", "formula"])
def test_jobs_choose_with_the_configured_tuner(tuner: str, tmp_path: Path) -> None:
    from ringworld.testing import run_processes
    from ringworld.tuning.calibrate import save

    # the ranks get this test's constants (every transport), not the shipped defaults
    path = tmp_path / "tuning.json"
    save(path, C)
    table = constants.load(str(path))
    assert table == C
    # what this machine's simulator (or formula) says, computed here the way the ranks do
    expect = Selector(table, simulate=tuner == "simulate").choose("bcast", 3, 4 << 20, "shm")
    out = run_processes(3, _auto_ibcast, transport="shm", timeout=60,
                        env={"RINGWORLD_TUNER": tuner, "RINGWORLD_TUNING_FILE": str(path)})
    assert out == [expect] * 3
