"""Calibration files, the calibrated local topology, and predicted vs measured runs."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringworld.algorithms import registry
from ringworld.errors import ConfigError
from ringworld.topology.program import Programs
from ringworld.topology.sim import Network
from ringworld.tuning import calibrate, constants, cost, estimate
from ringworld.tuning.cost import Constants, Work

pytestmark = pytest.mark.timeout(300)


def test_saved_constants_drive_the_local_topology(tmp_path) -> None:
    c = Constants(step=40e-6, message=9e-6, bandwidth=2e9, reduce_rate=3e9, copy_rate=5e9)
    path = tmp_path / "cal.json"
    calibrate.save(path, {"shm": c})
    assert constants.load(str(path))["shm"] == c  # the tuner reads the same file
    prm = calibrate.params(path)
    # the engine is what a rank receives: half of the exchange's sent-plus-received bandwidth
    assert (prm.overhead, prm.engine, prm.reduce_rate) == (40e-6, 1e9, 3e9)
    topo = calibrate.local_topology(path, 2)
    assert topo.size == 2
    assert topo.by_id[topo.ranks[0]].params() == prm
    slow = calibrate.predict(topo, "allreduce", "ring", 4 << 20, 2)
    fast_c = c._replace(bandwidth=8e9)
    calibrate.save(path, {"shm": fast_c})
    fast = calibrate.predict(calibrate.local_topology(path, 2), "allreduce", "ring", 4 << 20, 2)
    assert fast < slow
    # 2 ranks, 4 MiB: each rank receives 2 MiB twice, at 1 GB/s (its engine; on one host the
    # sender's is not charged), so one exchange costs what one-way traffic does
    assert 2 * (2 << 20) / 1e9 < slow < 1.5 * 2 * (2 << 20) / 1e9
    with pytest.raises(ConfigError):
        calibrate.params(path, "tcp_nope")
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError):
        calibrate.params(tmp_path / "bad.json")


def test_compare_runs_the_real_collectives() -> None:
    rows = calibrate.compare(2, [256 << 10], ["allreduce", "bcast"])
    assert {(r.collective, r.algorithm) for r in rows} >= {("allreduce", "ring"),
                                                           ("bcast", "binomial")}
    for r in rows:
        assert r.measured > 0 and r.predicted > 0 and math.isfinite(r.ratio)


def test_compare_times_the_blocked_collectives_by_their_whole_buffer() -> None:
    """reduce_scatter_block and alltoall as ``ringworld bench`` sizes them: the whole send
    buffer, of p blocks (3 ranks: blocks of a third)."""
    nbytes = 3 * (96 << 10)
    rows = calibrate.compare(3, [nbytes], ["reduce_scatter_block", "alltoall"], jobs=1)
    got = {(r.collective, r.algorithm) for r in rows}
    assert got >= {("reduce_scatter_block", "ring"), ("reduce_scatter_block", "pairwise"),
                   ("alltoall", "pairwise"), ("alltoall", "bruck")}, got
    for r in rows:
        assert r.nbytes == nbytes and r.measured > 0 and math.isfinite(r.ratio), r
    # the simulated call moves blocks of nbytes / p float32 elements
    from ringworld.topology.sim import Network
    from ringworld.tuning.estimate import schedule_time, shm_time

    c = constants.DEFAULTS["shm"]
    topo = calibrate.local_topology(nranks=3, constants=c)
    for coll in ("alltoall", "reduce_scatter_block"):
        want = schedule_time(Network(topo, 3), coll, "pairwise", nbytes // 12, 4,
                             calibrate.SEGMENT_BYTES // 4)
        assert calibrate.predict(topo, coll, "pairwise", nbytes, 3) == pytest.approx(want)
    crowded = estimate.shares_cores(topo, 3)  # (on a machine of fewer than 3 cores)
    assert calibrate.predict_row(topo, c, "alltoall", "shm", nbytes, 3) == pytest.approx(
        shm_time(c, "alltoall", 3, nbytes / 3, crowded))


def test_calibrate_command_refuses_an_unknown_collective() -> None:
    proc = subprocess.run([sys.executable, "-m", "ringworld", "calibrate", "--compare",
                           "--collectives", "allreduce,alltoal"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--collectives" in proc.stderr and "alltoal" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_calibrate_command_compare_with_a_constants_file(tmp_path) -> None:
    path = tmp_path / "cal.json"
    calibrate.save(path, {"shm": constants.DEFAULTS["shm"]})
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "ringworld", "calibrate", "--compare",
                           "--constants", str(path), "--sizes", "128KiB", "--collectives",
                           "allgather", "--json", str(out), "--jobs", "2"],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pred/meas" in proc.stdout
    assert "predictions within 25% of the measured median of 2 job(s)" in proc.stdout
    rows = json.loads(out.read_text())
    assert {r["algorithm"] for r in rows} == {"ring", "recursive_doubling", "bruck", "shm"}
    by_algo = re.search(r"by algorithm: ring (\d) of 1, recursive_doubling (\d) of 1, "
                        r"bruck (\d) of 1, shm (\d) of 1", proc.stdout)
    assert by_algo, proc.stdout
    near = [abs(r["ratio"] - 1) <= 0.25 for r in rows]
    assert [int(k) for k in by_algo.groups()] == [int(x) for x in near]
    assert all(r["job_spread"] >= 1.0 for r in rows)


def test_measurements_are_the_median_over_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = iter([[{"collective": "bcast", "algorithm": "ring", "bytes": 8, "seconds": s}]
                 for s in (3.0, 1.0, 2.0)])
    monkeypatch.setattr(calibrate, "_measure_job", lambda *args: next(jobs))
    rows = calibrate.measure_collectives(2, [8], ["bcast"], jobs=3)
    assert rows == [{"collective": "bcast", "algorithm": "ring", "bytes": 8, "seconds": 2.0,
                     "spread": 3.0}]
    with pytest.raises(ValueError, match="jobs=0"):
        calibrate.measure_collectives(2, [8], ["bcast"], jobs=0)


def test_held_out_jobs_alternate_with_the_fitted_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[int] = []

    def job(nranks: int, sizes: list[int], *rest: object) -> list[dict[str, float]]:
        order.append(sizes[0])
        return [{"collective": "bcast", "algorithm": "ring", "bytes": sizes[0],
                 "seconds": float(len(order))}]

    monkeypatch.setattr(calibrate, "_measure_job", job)
    fit_rows, check_rows = calibrate.measure_held_out(2, [8], [16], ["bcast"], jobs=3)
    assert order == [8, 16, 8, 16, 8, 16]
    assert fit_rows[0]["bytes"] == 8 and fit_rows[0]["seconds"] == 3.0  # median of 1, 3, 5
    assert check_rows[0]["bytes"] == 16 and check_rows[0]["seconds"] == 4.0  # of 2, 4, 6
    assert check_rows[0]["spread"] == 3.0


def test_fit_recovers_the_constants_that_produced_the_times() -> None:
    """Times simulated with known constants, fitted from constants off by 1.5-3x: the fit
    finds constants that reproduce every time closely (and says how far off it started)."""
    true = Constants(step=30e-6, message=8e-6, bandwidth=3e9, reduce_rate=2.5e9, copy_rate=6e9)
    topo = calibrate.local_topology(nranks=2, constants=true)
    rows = [{"collective": coll, "algorithm": algo, "bytes": nb,
             "seconds": calibrate.predict(topo, coll, algo, nb, 2)}
            for coll, algo in [("allreduce", "ring"), ("allreduce", "recursive_doubling"),
                               ("bcast", "binomial"), ("allgather", "bruck")]
            for nb in (64 << 10, 4 << 20)]
    start = true._replace(step=90e-6, bandwidth=1e9, reduce_rate=5e9)
    f = calibrate.fit(rows, start, 2)
    assert f.worst_before > 0.5
    assert f.rms_after < 0.1 * f.rms_before
    assert f.worst_after < 0.1
    fitted = calibrate.local_topology(nranks=2, constants=f.constants)
    for r in rows:
        coll, nb = str(r["collective"]), int(r["bytes"])
        got = calibrate.predict_row(fitted, f.constants, coll, str(r["algorithm"]), nb, 2)
        assert abs(got / float(r["seconds"]) - 1) < 0.1
    with pytest.raises(ValueError, match="at least one"):
        calibrate.fit([], start, 2)
    with pytest.raises(ValueError, match="positive"):
        calibrate.fit([{**rows[0], "seconds": 0.0}], start, 2)


def test_fit_finds_the_rate_of_direct_reads_apart_from_the_bandwidth() -> None:
    """The shared-memory algorithm's large paths read peers' memory directly; with reads at a
    quarter of the message bandwidth (half of what 0 assumes), the fit finds that rate."""
    true = Constants(step=30e-6, message=8e-6, bandwidth=4e9, reduce_rate=3e9, copy_rate=5e9,
                     sync=8e-6, read_rate=1e9)
    topo = calibrate.local_topology(nranks=2, constants=true)
    rows = [{"collective": coll, "algorithm": algo, "bytes": nb,
             "seconds": calibrate.predict_row(topo, true, coll, algo, nb, 2)}
            for coll, algo in [("allreduce", "ring"), ("bcast", "binomial"),
                               ("allgather", "ring"), ("allgather", "shm"), ("bcast", "shm")]
            for nb in (1 << 20, 4 << 20, 16 << 20)]
    f = calibrate.fit(rows, true._replace(read_rate=0.0), 2)
    assert f.worst_before > 0.3  # the direct paths, predicted at twice the true rate
    assert f.worst_after < 0.1
    assert f.constants.read_rate == pytest.approx(1e9, rel=0.15)


def test_fit_finds_the_rendezvous_cost_apart_from_the_step() -> None:
    """Messages above the eager limit pay a handshake; with one of 60 us in the times (and none
    assumed), the fit finds it, and the step cost, from calls with small and large messages."""
    true = Constants(step=30e-6, message=8e-6, bandwidth=4e9, reduce_rate=3e9, copy_rate=5e9,
                     sync=8e-6, read_rate=2e9, rendezvous=60e-6)
    topo = calibrate.local_topology(nranks=2, constants=true)
    rows = [{"collective": coll, "algorithm": algo, "bytes": nb,
             "seconds": calibrate.predict_row(topo, true, coll, algo, nb, 2)}
            for coll, algo in [("allreduce", "ring"), ("allreduce", "recursive_doubling"),
                               ("bcast", "binomial"), ("allgather", "ring")]
            for nb in (16 << 10, 64 << 10, 1 << 20, 4 << 20)]
    f = calibrate.fit(rows, true._replace(rendezvous=0.0), 2)
    assert f.worst_before > 0.1  # the 1 MiB calls, predicted without their handshakes
    assert f.worst_after < 0.1
    assert f.constants.rendezvous == pytest.approx(60e-6, rel=0.25)
    assert f.constants.step == pytest.approx(30e-6, rel=0.25)


def test_fit_finds_the_cost_of_a_call_apart_from_its_steps() -> None:
    """Each call costs a fixed part (argument checks, bookkeeping) besides its steps; with 40 us
    of it in the times (and none assumed), the fit finds it, and the step cost, from calls of
    one step and of many (pipelined segments) and from the shared-memory ones (no steps)."""
    true = Constants(step=10e-6, message=4e-6, bandwidth=8e9, reduce_rate=6e9, copy_rate=9e9,
                     sync=3e-6, read_rate=6e9, rendezvous=3e-6, call=40e-6)
    topo = calibrate.local_topology(nranks=2, constants=true)
    rows = [{"collective": coll, "algorithm": algo, "bytes": nb,
             "seconds": calibrate.predict_row(topo, true, coll, algo, nb, 2)}
            for coll, algo in [("allreduce", "recursive_doubling"), ("bcast", "ring"),
                               ("bcast", "binomial"), ("allgather", "shm"),
                               ("reduce_scatter_block", "shm")]
            for nb in (64 << 10, 1 << 20, 4 << 20, 16 << 20)]
    assert calibrate.predict_row(topo, true, "bcast", "ring", 16 << 20, 2) > \
        calibrate.predict_row(topo, true._replace(call=0.0), "bcast", "ring", 16 << 20, 2)
    f = calibrate.fit(rows, true._replace(call=0.0), 2)
    assert f.worst_before > 0.2  # the small calls, predicted without their fixed part
    assert f.worst_after < 0.1
    assert f.constants.call == pytest.approx(40e-6, rel=0.25)
    assert f.constants.step == pytest.approx(10e-6, rel=0.25)


def test_calibrate_command_fits_saves_and_compares(tmp_path) -> None:
    path = tmp_path / "fit.json"
    proc = subprocess.run([sys.executable, "-m", "ringworld", "calibrate", "--fit", "--save",
                           str(path), "--compare", "--sizes", "256KiB,1MiB", "--compare-sizes",
                           "512KiB", "--collectives", "allreduce", "--jobs", "1"],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "fitted to 8 measured calls: rms log error" in proc.stdout, proc.stdout
    saved = constants.load(str(path))["shm"]
    assert all(math.isfinite(v) and v > 0 for v in saved[:5])
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("allreduce ")]
    assert {r[1] for r in rows} == {"ring", "rabenseifner", "recursive_doubling", "shm"}
    assert {r[2] for r in rows} == {str(512 << 10)}  # compared at --compare-sizes


def test_cache_model_speeds_up_small_working_sets_only() -> None:
    c = Constants(step=30e-6, message=8e-6, bandwidth=3e9, reduce_rate=2.5e9, copy_rate=6e9,
                  cache_bytes=8 << 20, cache_speedup=2.0)
    assert estimate.working_set("allreduce", 1 << 20, 2) == 4 << 20
    assert estimate.cache_factor(c, "allreduce", 1 << 20, 2) == 2.0  # 4 MiB: in the cache
    assert estimate.cache_factor(c, "allreduce", 4 << 20, 2) == 1.0  # 16 MiB: twice it
    assert 1.0 < estimate.cache_factor(c, "allreduce", 3 << 20, 2) < 2.0
    assert estimate.cache_factor(c._replace(cache_bytes=0.0), "bcast", 1, 2) == 1.0
    topo = calibrate.local_topology(nranks=2, constants=c)
    slow = calibrate.predict(topo, "allreduce", "ring", 1 << 20, 2)
    fast = calibrate.predict(topo, "allreduce", "ring", 1 << 20, 2, 2.0)
    assert fast < 0.75 * slow


def test_memory_bus_bounds_what_ranks_stream_at_once() -> None:
    """Ranks that stream at once share the host's memory bus: a call takes at least its ranks'
    traffic (2 bytes per byte received or copied, 3 per byte reduced) over ``bus_rate``, and
    only where its working set leaves the cache."""
    w = Work(0, 0, 2000, reduced=100, copied=300, read=50)
    assert w.traffic == 2000 + 2 * (300 + 50) + 3 * 100
    c = Constants(step=1e-6, message=1e-6, bandwidth=1e9, reduce_rate=1e9, copy_rate=1e9,
                  read_rate=1e9)
    alone = w.time(c)
    assert w.time(c._replace(bus_rate=1e9)) == alone  # one stream: no bus
    assert w.time(c, streams=4) == alone  # no bus rate: no limit
    bound = w.time(c._replace(bus_rate=1e9), streams=4)
    assert bound == pytest.approx(4 * w.traffic / 1e9)
    assert w.time(c._replace(bus_rate=1e12), streams=4) == alone  # a wide bus never binds
    # the direct shared-memory reduce_scatter_block on 2 ranks reads the peer's block into a
    # cached scratch area and combines it with its own into the output: 3 bytes of memory
    # traffic per byte of its block (the peer's read, its own read, the output written)
    n = 32 << 20
    direct = cost.model("reduce_scatter_block", "shm")
    assert direct is not None
    assert direct(2, n, 0).traffic == pytest.approx(3 * n)
    # a ring allreduce's schedule: every rank receives 2 (p-1)/p of the vector and reduces
    # (p-1)/p of it
    p, n = 4, 1 << 16
    topo = calibrate.local_topology(nranks=p, constants=c)
    net = Network(topo, p)
    progs = Programs.explicit(lambda r: registry.build("allreduce", "ring",
                                                       estimate.spec("allreduce", p, r, n, n)),
                              p, 4)
    got = estimate.traffic(progs)
    want = 2 * 2 * (p - 1) / p * 4 * n + 3 * (p - 1) / p * 4 * n
    assert got == [pytest.approx(want)] * p
    free = estimate.schedule_time(net, "allreduce", "ring", n, 4, n)
    assert estimate.schedule_time(net, "allreduce", "ring", n, 4, n, bus=1e15) == free
    assert estimate.schedule_time(net, "allreduce", "ring", n, 4, n, bus=1e8) == \
        pytest.approx(p * want / 1e8)
    # two hosts of two ranks: the busier host's traffic, half the total
    assert estimate.schedule_time(net, "allreduce", "ring", n, 4, n, bus=1e8,
                                  hosts=[0, 0, 1, 1]) == pytest.approx(2 * want / 1e8)
    # the bus binds only beyond the cache, fully from twice its size
    cached = c._replace(bus_rate=1e9, cache_bytes=8 << 20, cache_speedup=2.0)
    assert estimate.bus_rate(cached, "allreduce", 1 << 20, 2) == 0.0  # 4 MiB: in the cache
    assert estimate.bus_rate(cached, "allreduce", 4 << 20, 2) == 1e9  # 16 MiB: twice it
    assert estimate.bus_rate(cached, "allreduce", 3 << 20, 2) > 1e9
    assert estimate.bus_rate(c, "allreduce", 1 << 20, 2) == 0.0  # no bus rate


def _two_cores_32mib_cache(root: Path) -> Path:
    """A sysfs of two cores on one node with a 32 MiB last-level cache (the fit's starts
    depend on the cache size, and the simulated machine on the cores: not this machine's)."""
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    (root / "devices/system/node/node0").mkdir(parents=True)
    (root / "devices/system/node/node0/cpulist").write_text("0-1\n")
    for i, size in enumerate(("48K", "2048K", "32768K")):
        d = root / f"devices/system/cpu/cpu0/cache/index{i}"
        d.mkdir(parents=True)
        (d / "size").write_text(size + "\n")
    return root


def test_fit_finds_the_memory_bus_apart_from_the_rates(tmp_path: Path) -> None:
    """Two ranks that each copy and read at full speed run out of memory bus on large
    shared-memory calls; with a bus that binds there (and none assumed), the fit finds it
    while the calls it does not bind keep the rates."""
    true = Constants(step=20e-6, message=4e-6, bandwidth=30e9, reduce_rate=8e9, copy_rate=15e9,
                     sync=3e-6, read_rate=18e9, rendezvous=5e-6, call=25e-6, bus_rate=40e9)
    sysfs = _two_cores_32mib_cache(tmp_path)
    topo = calibrate.local_topology(nranks=2, constants=true, sysfs=sysfs)
    rows = [{"collective": coll, "algorithm": algo, "bytes": nb,
             "seconds": calibrate.predict_row(topo, true, coll, algo, nb, 2)}
            for coll, algo in [("allreduce", "ring"), ("bcast", "binomial"),
                               ("allgather", "ring"), ("alltoall", "shm"),
                               ("allgather", "shm"), ("bcast", "shm")]
            for nb in (1 << 20, 4 << 20, 16 << 20, 64 << 20)]
    f = calibrate.fit(rows, true._replace(bus_rate=0.0), 2, sysfs=sysfs)
    assert f.worst_before > 0.15  # the large shared-memory calls, predicted without the bus
    assert f.worst_after < 0.1
    assert f.constants.bus_rate == pytest.approx(40e9, rel=0.25)


def test_ranks_that_outnumber_the_cores_take_the_crowded_shared_memory_paths() -> None:
    """More ranks than cores share them; the shared-memory algorithm then starts its direct
    paths at other sizes (alltoall wherever the slots stop, past 256 KiB per rank's send
    buffer, not from 1 MiB) and races nothing, and the prediction follows the path that
    runs."""
    topo = calibrate.local_topology(nranks=2)
    cores = sum(1 for d in topo.devices if d.kind == "core")
    assert not estimate.shares_cores(topo, cores) and estimate.shares_cores(topo, cores + 1)
    c = Constants(step=20e-6, message=4e-6, bandwidth=30e9, reduce_rate=8e9, copy_rate=20e9,
                  sync=3e-6, read_rate=1e9)
    blk = 96 << 10  # 4 ranks: 384 KiB per rank's send buffer
    alone = estimate.shm_time(c, "alltoall", 4, blk)
    shared = estimate.shm_time(c, "alltoall", 4, blk, crowded=True)
    direct = cost.model("alltoall", "shm", crowded=True)
    assert direct is not None and direct(4, blk, 0).read > 0
    assert shared == pytest.approx(direct(4, blk, 0).time(c))
    assert shared > 2 * alone  # the slow direct reads, not the copies through the windows
    # calibrate's prediction of a job with one rank more than the cores (the whole send buffer)
    p = cores + 1
    blk = (384 << 10) // p  # 384 KiB per rank's send buffer: direct crowded, windows alone
    row = calibrate.predict_row(calibrate.local_topology(nranks=p, constants=c), c,
                                "alltoall", "shm", blk * p, p)
    assert row == pytest.approx(estimate.shm_time(c, "alltoall", p, blk, crowded=True))
    assert row != pytest.approx(estimate.shm_time(c, "alltoall", p, blk))
