"""Smoke runs of ``ringworld bench pingpong``: tiny sizes, checking on, zero wrong payloads.

Timings are never asserted; only that the benchmark ran, verified its data and found it right.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringworld._argtypes import parse_size, parse_sizes
from ringworld.bench import pingpong_rank as pr

JOB_TIMEOUT = 100  # seconds, below pytest's own timeout
SMOKE = [
    "--sizes", "0,8,100,4KiB,64KiB,200000", "--iters", "20", "--repeats", "2",
    "--startup-runs", "1", "--startup-np", "2", "--timeout", "60",
]


def _bench(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "ringworld", "bench", "pingpong", *SMOKE, "--json", str(out),
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
    assert out.is_file(), f"no JSON written\n{proc.stdout}\n{proc.stderr}"
    return proc, json.loads(out.read_text())


def _assert_verified(run: dict[str, Any], sizes: int) -> None:
    assert run["ok"], run["error"]
    v = run["verify"]
    assert v["wrong_bytes"] == v["wrong_counts"] == v["wrong_objects"] == 0, v
    assert v["checks"] > 0
    assert [row["size"] for row in run["latency"]] == [0, 8, 100, 4096, 65536, 200000][:sizes]
    assert len(run["stream"]) == sizes
    assert all(row["cpu_cores"] > 0 for row in run["stream"])  # both ranks' CPU, measured
    assert run["object"]["half_rtt_us"] > 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_pingpong_ringworld(tmp_path: Path, transport: str) -> None:
    proc, doc = _bench(tmp_path, "--transport", transport)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = doc["runs"][f"ringworld-{transport}"]
    _assert_verified(run, 6)
    assert run["startup"]["median_s"] > 0
    assert "verification:" in proc.stdout
    assert "WRONG" not in proc.stdout


def test_pingpong_through_ringworld_mpi(tmp_path: Path) -> None:
    """``--api mpi``: the mpi4py backend's calls through ringworld.MPI, checked alike."""
    proc, doc = _bench(tmp_path, "--transport", "shm", "--api", "mpi", "--startup-runs", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = doc["runs"]["ringworldMPI-shm"]
    _assert_verified(run, 6)
    assert "ringworld.MPI" in run["library"]
    assert "rwMPI-shm" in proc.stdout


def test_pingpong_against_socket(tmp_path: Path) -> None:
    proc, doc = _bench(tmp_path, "--transport", "tcp", "--against", "socket")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_verified(doc["runs"]["socket"], 6)
    assert "tcp/socket" in proc.stdout
    assert "CPU while streaming" in proc.stdout


def _mpi_python() -> str | None:
    env = os.environ.get("RINGWORLD_MPI_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("mpi4py") is not None else None


def test_pingpong_against_mpi4py(tmp_path: Path) -> None:
    python = _mpi_python()
    if python is None:
        pytest.skip("mpi4py is not importable and RINGWORLD_MPI_PYTHON is not set "
                    "(scripts/install-peers.sh makes a venv with mpi4py and mpich)")
    proc, doc = _bench(tmp_path, "--transport", "shm", "--against", "mpi4py",
                       "--mpi-python", python)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = doc["runs"]["mpi4py"]
    _assert_verified(run, 6)
    assert run["startup"]["median_s"] > 0


def test_missing_mpi_python_is_a_clear_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ringworld", "bench", "pingpong", "--against", "mpi4py",
           "--mpi-python", str(tmp_path / "nope" / "python")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
    assert proc.returncode == 2
    assert "--mpi-python" in proc.stderr


# --- the checking itself, in threads: a corrupting link must be caught ----------------------


class _Pending:
    def __init__(self, buf: Any) -> None:
        self.buf = buf


def _thread_pair(corrupt: bool) -> tuple[pr.Ops, pr.Ops]:
    """Two in-process ranks over queues; ``corrupt`` flips one byte of every payload."""
    boxes: list[queue.Queue[Any]] = [queue.Queue(), queue.Queue()]

    def make(rank: int) -> pr.Ops:
        def send(buf: Any, dest: int, tag: int) -> None:
            data = bytearray(buf.tobytes())
            if corrupt and data:
                data[len(data) // 2] ^= 0xFF
            boxes[dest].put(bytes(data))

        def recv_count(buf: Any, source: int, tag: int) -> int:
            data = boxes[rank].get(timeout=30)
            buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            return len(data)

        def wait_all(handles: list[Any]) -> None:
            for h in handles:
                if isinstance(h, _Pending):
                    recv_count(h.buf, 1 - rank, 0)

        return pr.Ops(
            library="threads", rank=rank, size=2, send=send, recv=recv_count,
            recv_count=recv_count, isend=send, irecv=lambda b, s, t: _Pending(b),
            wait_all=wait_all, send_obj=lambda o, d, t: boxes[d].put(o),
            recv_obj=lambda source, tag: boxes[rank].get(timeout=30),
            barrier=lambda: None, close=lambda: None,
        )

    return make(0), make(1)


def _measure_in_threads(corrupt: bool) -> pr.Checker:
    args = pr.parse_args(["--sizes", "0,8,1000", "--iters", "5", "--repeats", "2"])
    checkers = [pr.Checker(), pr.Checker()]
    failures: list[BaseException] = []

    def rank_main(ops: pr.Ops) -> None:
        try:
            pr.measure(ops, args, checkers[ops.rank])
        except BaseException as exc:  # re-raised in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=rank_main, args=(ops,)) for ops in _thread_pair(corrupt)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    checkers[0].merge({k: getattr(checkers[1], k) for k in
                       ("checks", "wrong_bytes", "wrong_counts", "wrong_objects")})
    return checkers[0]


def test_checking_passes_a_faithful_link() -> None:
    check = _measure_in_threads(corrupt=False)
    assert check.checks > 0
    assert check.errors == 0


def test_checking_catches_a_corrupting_link() -> None:
    check = _measure_in_threads(corrupt=True)
    assert check.wrong_bytes > 0


def test_pattern_is_unique_per_word_and_seed() -> None:
    a = pr.pattern(8 * 4096, 1).view(np.uint64)
    assert len(np.unique(a)) == a.size
    assert not np.array_equal(pr.pattern(64, 1), pr.pattern(64, 2))
    assert pr.pattern(13, 3).size == 13
    assert pr.aligned(100).ctypes.data % pr.ALIGN == 0


def test_parse_sizes() -> None:
    assert parse_sizes("0,8, 4KiB,1M,64MiB") == [0, 8, 4096, 1 << 20, 64 << 20]
    assert parse_size("2k") == 2048
    with pytest.raises(Exception, match="not a size"):
        parse_size("3 parsecs")
