"""``ringworld bench <collective>``: the reference, the checking, and smoke runs at tiny sizes.

Timings are never asserted; only that every size ran, was verified and was found right.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringworld.bench import sweep_rank as sr
from ringworld.bench.sweep import default_sizes, render

JOB_TIMEOUT = 60  # seconds per job, below pytest's own timeout
pytestmark = pytest.mark.timeout(90)


# --- the reference: expected() against a direct simulation of each collective ----------------


def _simulate(coll: str, n: int, c: int) -> list[np.ndarray | None]:
    """Each rank's result, computed from every rank's send data the obvious way (a v-variant
    runs with equal counts: its equal-block collective's result)."""
    sends = [sr.send_data(coll, q, n, c) for q in range(n)]
    coll = {"allgatherv": "allgather", "gatherv": "gather", "scatterv": "scatter",
            "alltoallv": "alltoall"}.get(coll, coll)
    if coll == "allreduce":
        return [sum(sends)] * n  # type: ignore[list-item]
    if coll == "reduce":
        return [sum(sends) if r == 0 else None for r in range(n)]  # type: ignore[misc]
    if coll == "scan":
        return [np.sum(sends[: r + 1], axis=0) for r in range(n)]
    if coll == "reduce_scatter":
        total = np.sum(sends, axis=0)
        return [total[r * c : (r + 1) * c] for r in range(n)]
    if coll == "bcast":
        return [sends[0]] * n
    if coll in ("allgather", "gather"):
        whole = np.concatenate(sends)
        return [whole if coll == "allgather" or r == 0 else None for r in range(n)]
    if coll == "alltoall":
        return [np.concatenate([sends[q][r * c : (r + 1) * c] for q in range(n)])
                for r in range(n)]
    if coll == "scatter":
        return [sends[0][r * c : (r + 1) * c] for r in range(n)]
    raise AssertionError(coll)


@pytest.mark.parametrize("coll", [c for c in sr.COLLECTIVES if c != "barrier"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_expected_matches_a_direct_simulation(coll: str, n: int) -> None:
    for c in (1, 7):
        for rank, want in enumerate(_simulate(coll, n, c)):
            got = sr.expected(coll, rank, n, c)
            if want is None:
                assert got is None
            else:
                assert got is not None
                np.testing.assert_array_equal(got, want)
                assert got.dtype == np.float32


def test_data_is_exact_and_distinct() -> None:
    u = sr.unique_values(1 << 16, 0)
    assert len(np.unique(u)) == u.size
    assert np.all(u == np.floor(u)) and u.max() < 2**24
    a, b = sr.reduce_values(4096, 0, 0), sr.reduce_values(4096, 0, 1)
    assert a.min() >= 1 and a.max() <= sr.REDUCE_MOD
    assert np.count_nonzero(a != b) > 4000
    assert np.count_nonzero(a != np.roll(a, 1)) == a.size  # a shifted block does not pass
    assert sr.aligned(100).ctypes.data % sr.ALIGN == 0


def test_count_wrong() -> None:
    want = sr.unique_values(100, 0)
    got = want.copy()
    assert sr.count_wrong(got, want) == (0, 100)
    got[3] += 1
    got[50] = np.nan
    assert sr.count_wrong(got, want) == (2, 100)
    assert sr.count_wrong(got[:10], want)[0] == 100
    assert sr.count_wrong(got, None) == (0, 0)


def test_sizes_and_factors() -> None:
    assert sr.bus_factor("allreduce", 4) == 1.5
    assert sr.bus_factor("allgather", 4) == sr.bus_factor("alltoall", 4) == 0.75
    assert sr.bus_factor("bcast", 4) == sr.bus_factor("reduce", 4) == 1
    assert sr.block_count("allreduce", 1 << 20, 4) == 1 << 18
    assert sr.block_count("alltoall", 1 << 20, 4) == 1 << 16  # the size is the whole buffer
    assert sr.block_count("allgather", 4, 4) == 1  # never empty
    assert sr.actual_bytes("allgather", 1, 4) == 16
    assert default_sizes(4, 64, 4) == [4, 16, 64]
    assert sr.parse_collectives("all") == list(sr.COLLECTIVES)
    with pytest.raises(argparse.ArgumentTypeError):
        sr.parse_collectives("allreduce,bogus")


# --- the sweep loop in-process, over a one-rank fake library ---------------------------------


def _fake_backend(corrupt: bool) -> sr.Backend:
    def make_op(coll: str, b: sr.Buffers) -> sr.Op:
        def op() -> None:
            if coll not in ("bcast", "barrier"):
                b.recv[:] = b.send[: b.recv.size]
            if corrupt and b.recv.size:
                b.recv[0] += 1

        return op

    return sr.Backend(library="fake", rank=0, size=1, barrier=lambda: None,
                      allgather_obj=lambda obj: [obj], make_op=make_op,
                      algorithm=lambda: "copy", close=lambda: None)


@pytest.mark.parametrize("corrupt", [False, True])
def test_sweep_counts_wrong_elements(corrupt: bool) -> None:
    args = sr.parse_args(["--collective", "all", "--sizes", "4,1000", "--iters", "3"])
    doc = sr.sweep(_fake_backend(corrupt), args)
    assert not doc["unsupported"]
    assert len(doc["rows"]) == 2 * (len(sr.COLLECTIVES) - 1) + 1  # barrier: one row
    for row in doc["rows"]:
        assert row["iters"] == 3 and row["time_us"] > 0 and row["algorithm"] == "copy"
        if row["collective"] != "barrier":
            assert row["checked"] > 0
            assert (row["wrong"] > 0) == corrupt, row


def test_sweep_adapts_iterations_to_the_time_budget() -> None:
    args = sr.parse_args(["--sizes", "64", "--time-per-size", "0.02"])
    (row,) = sr.sweep(_fake_backend(False), args)["rows"]
    assert row["iters"] > 10
    assert row["iters"] * row["time_us"] < 0.5e6


# --- smoke runs ------------------------------------------------------------------------------


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)


def test_every_collective_under_ringworld_run(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = _run([sys.executable, "-m", "ringworld", "run", "-n", "2",
                 str(sr.__file__), "--backend", "ringworld", "--collective", "all",
                 "--sizes", "4,1000,65536", "--iters", "3", "--time-per-size", "0.01",
                 "--out", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] and not doc["unsupported"]
    seen = {row["collective"] for row in doc["rows"]}
    assert seen == set(sr.COLLECTIVES)
    for row in doc["rows"]:
        assert row["wrong"] == 0, row
        assert row["collective"] == "barrier" or row["checked"] > 0
        assert row["algorithm"] not in ("", "?"), row


def _bench(tmp_path: Path, coll: str, *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                             dict[str, Any]]:
    out = tmp_path / "result.json"
    proc = _run([sys.executable, "-m", "ringworld", "bench", coll, "--np", "2",
                 "--sizes", "1K,64K", "--iters", "3", "--time-per-size", "0.01",
                 "--timeout", "50", "--json", str(out),
                 *extra])
    assert out.is_file(), f"no JSON written\n{proc.stdout}\n{proc.stderr}"
    return proc, json.loads(out.read_text())


def _assert_rows_ok(run: dict[str, Any], sizes: list[int]) -> None:
    assert run["ok"], run["error"]
    assert [r["size"] for r in run["rows"]] == sizes
    assert all(r["wrong"] == 0 and r["checked"] > 0 for r in run["rows"])


def _peer_python(var: str, module: str) -> str | None:
    env = os.environ.get(var)
    if env:
        return env
    return sys.executable if importlib.util.find_spec(module) is not None else None


def test_cli_allreduce_against_mpi4py_or_skipped(tmp_path: Path) -> None:
    """Against the real mpi4py when there is one, else the peer must be reported as skipped."""
    python = _peer_python("RINGWORLD_MPI_PYTHON", "mpi4py")
    proc, doc = _bench(tmp_path, "allreduce", "--algorithm", "ring", "--against", "mpi4py",
                       "--mpi-python", python or str(tmp_path / "nope"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_rows_ok(doc["runs"]["rw-shm"], [1024, 65536])
    assert {r["algorithm"] for r in doc["runs"]["rw-shm"]["rows"]} == {"ring"}
    assert "#wrong" in proc.stdout and "WRONG" not in proc.stdout
    assert "rw-shm: allreduce 1024 B" in proc.stderr  # progress
    if python is None:
        assert doc["runs"]["mpi4py"]["skipped"]
        assert "skipped mpi4py" in proc.stdout
    else:
        (label,) = (k for k in doc["runs"] if not k.startswith("rw-"))
        _assert_rows_ok(doc["runs"][label], [1024, 65536])
        assert f"{label}/rw" in proc.stdout


@pytest.mark.parametrize("coll", ["allreduce", "alltoall", "barrier"])
def test_cli_times_ringworld_through_its_mpi4py_layer(tmp_path: Path, coll: str) -> None:
    """``--api mpi``: the mpi4py peer's calls, made through ringworld.MPI under ringworld run,
    checked against the same numpy reference."""
    proc, doc = _bench(tmp_path, coll, "--api", "mpi")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = doc["runs"]["rwMPI-shm"]
    assert "ringworld.MPI" in run["library"]
    if coll == "barrier":
        assert run["ok"], run["error"]
    else:
        _assert_rows_ok(run, [1024, 65536])
    assert {r["algorithm"] for r in run["rows"]} == {"ringworld.MPI"}


def test_cli_api_mpi_refuses_what_it_cannot_time(tmp_path: Path) -> None:
    proc = _run([sys.executable, "-m", "ringworld", "bench", "allreduce", "--api", "mpi",
                 "--algorithm", "ring"])
    assert proc.returncode == 2
    assert "--api mpi" in proc.stderr


def test_cli_rejects_an_unknown_algorithm(tmp_path: Path) -> None:
    proc = _run([sys.executable, "-m", "ringworld", "bench", "bcast", "--algorithm", "nope"])
    assert proc.returncode == 2
    assert "binomial" in proc.stderr


def test_cli_against_gloo(tmp_path: Path) -> None:
    python = _peer_python("RINGWORLD_TORCH_PYTHON", "torch")
    if python is None:
        pytest.skip("torch is not importable and RINGWORLD_TORCH_PYTHON is not set "
                    "(scripts/install-peers.sh --torch adds it to the peers venv)")
    proc, doc = _bench(tmp_path, "reduce_scatter", "--against", "gloo", "--torch-python", python)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_rows_ok(doc["runs"]["gloo"], [1024, 65536])


def test_render_shows_peers_ratios_and_skips() -> None:
    from ringworld.bench.sweep import SweepRun

    row = {"size": 1024, "count": 256, "iters": 10, "time_us": 10.0, "algbw_GBps": 0.1,
           "busbw_GBps": 0.1, "wrong": 0, "checked": 512, "algorithm": "ring"}
    runs = [SweepRun("rw-shm", "ringworld", "ringworld 0", rows=[row]),
            SweepRun("mpich", "mpi4py", "MPICH", rows=[{**row, "time_us": 25.0}]),
            SweepRun("gloo", "gloo", skipped="no torch")]
    text = render(runs, "allreduce", 2)
    assert "2.50x" in text and "skipped gloo: no torch" in text
    assert "ok: 0 wrong of 512 elements" in text


def test_cli_plot_draws_bandwidth_against_size(tmp_path: Path) -> None:
    png = tmp_path / "bw.png"
    proc, doc = _bench(tmp_path, "allgather", "--plot", str(png))
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode == 2 and "matplotlib" in proc.stderr
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_rows_ok(doc["runs"]["rw-shm"], [1024, 65536])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def _row(size: int, us: float, wrong: int = 0) -> dict[str, Any]:
    return {"size": size, "count": size // 4, "iters": 10, "time_us": us,
            "algbw_GBps": size / us / 1e3, "busbw_GBps": size / us / 1e3, "wrong": wrong,
            "checked": 100, "algorithm": "ring"}


def test_rounds_merge_to_medians_and_ratio_ranges() -> None:
    from ringworld.bench.sweep import SweepRun, merge_rounds

    def rnd(mine: float, peer: float, wrong: int = 0) -> list[SweepRun]:
        return [SweepRun("rw-shm", "ringworld", rows=[_row(1024, mine, wrong)]),
                SweepRun("mpich", "mpi4py", rows=[_row(1024, peer)])]

    merged = merge_rounds([rnd(10.0, 20.0), rnd(40.0, 30.0), rnd(20.0, 10.0, wrong=1)])
    mine, peer = merged[0].rows[0], merged[1].rows[0]
    assert mine["time_us"] == 20.0 and peer["time_us"] == 20.0  # medians of each library
    assert mine["iters"] == 30 and mine["wrong"] == 1 and mine["rounds"] == 3
    assert mine["algbw_GBps"] == pytest.approx(1024 / 20.0 / 1e3)
    assert peer["ratio_range"] == [0.5, 2.0]  # 20/10, 30/40, 10/20 round by round
    text = render(merged, "allreduce", 2)
    assert "median of 3 alternating rounds" in text and "1.00x (0.50-2.00)" in text
    assert merge_rounds([rnd(1.0, 2.0)])[1].rows[0]["time_us"] == 2.0  # one round: as is


def test_load_runs_beside_busy_processes_and_stops_them() -> None:
    """`--load N` starts N spinning processes for the run and kills them however it ends."""
    from ringworld.bench import load

    with load.busy(2) as pids:
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # alive
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
    with pytest.raises(RuntimeError), load.busy(1) as pids:
        raise RuntimeError("the benchmark failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    assert "quiet" in load.describe(0) and "beside 2 busy processes" in load.describe(2)


def test_the_table_says_it_was_taken_under_load(tmp_path: Path) -> None:
    proc, doc = _bench(tmp_path, "allreduce", "--load", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "conditions: beside 1 busy process started by the benchmark" in proc.stdout
    assert doc["meta"]["load"] == 1
    proc = _run([sys.executable, "-m", "ringworld", "bench", "allreduce", "--load", "-1"])
    assert proc.returncode == 2 and "--load -1" in proc.stderr, proc.stderr
