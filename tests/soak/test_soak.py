"""Soak run (issue 6): thousands of mixed operations with every result verified, and no leak of
memory, file descriptors, threads, shared-memory segments or processes.

``soak_rank.py`` (next to this file) is the rank program: one seeded sequence of steps, the same
on every rank, of collectives with forced algorithms (blocking, nonblocking, several in flight),
object collectives, point-to-point with buffers and objects, wildcards and probes, and
sub-communicators made by dup/split/create and freed; every result is compared with numpy.

CI runs ``RINGWORLD_SOAK_OPS`` steps per transport (default 5000: about 25 s each on 2 cores).
The long version (timeouts scale with the count)::

    RINGWORLD_SOAK_OPS=50000 python -m pytest -q tests/soak -k soak_run

``RINGWORLD_SOAK_SEED`` picks another sequence. Memory is compared between the end of the
warm-up (a fifth of the steps) and the end, both taken with every sub-communicator freed and the
library's bounded caches emptied, and with glibc's mmap threshold fixed
(``MALLOC_MMAP_THRESHOLD_``) so that large numpy buffers go back to the system when freed instead
of moving the threshold and leaving heap slack that looks like a leak.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ringworld.launch.job import remove_shm_segments

HERE = Path(__file__).resolve().parent
RANK_PROGRAM = HERE / "soak_rank.py"
OPS = int(os.environ.get("RINGWORLD_SOAK_OPS", "5000"))
SEED = int(os.environ.get("RINGWORLD_SOAK_SEED", "1"))
#: The launcher's limit: ranks time out inside after 60 s of waiting, long before this.
JOB_TIMEOUT = 90 + OPS * 0.03
#: RSS growth allowed between the warm-up and the end (KiB): allocator slack, the scratch
#: buffers grown to the largest call. Objects: the gc-tracked object count may grow this much.
RSS_SLACK_KIB = 16 * 1024 + OPS // 4
OBJECT_SLACK = 2000


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _started(sync: Path) -> list[dict[str, Any]]:
    found = []
    for f in sync.glob("started.*"):
        with contextlib.suppress(ValueError, OSError):
            found.append(json.loads(f.read_text()))
    return found


def run_soak(tmp_path: Path, transport: str, n: int, ops: int, *,
             extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                               dict[str, Any]]:
    """Run the soak job; return its result and what was left after it: pids still alive
    (killed before returning) and /dev/shm files of the job (removed before returning)."""
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "RINGWORLD_SOAK_OPS": str(ops), "RINGWORLD_SOAK_SEED": str(SEED),
           "RINGWORLD_SOAK_DIR": str(sync), "MALLOC_MMAP_THRESHOLD_": "131072",
           **(extra_env or {})}
    cmd = [sys.executable, "-m", "ringworld", "run", "-n", str(n), "--transport", transport,
           str(RANK_PROGRAM)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    left: dict[str, Any] = {"pids": [], "shm": []}
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[test_soak: the job ran past {JOB_TIMEOUT:.0f} s and was killed]"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        started = _started(sync)
        pids = [int(s["pid"]) for s in started]
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left["pids"] = [p for p in pids if _alive(p)]
        for pid in left["pids"]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for job in {s["job"] for s in started if s.get("job")}:
            left["shm"] += remove_shm_segments(job)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), left


def reports_of(r: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return sorted((json.loads(line[5:]) for line in r.stdout.splitlines()
                   if line.startswith("SOAK ")), key=lambda d: d["rank"])


def summary(reports: list[dict[str, Any]]) -> str:
    lines = []
    for d in reports:
        w, e = d["probes"]["warm"], d["probes"]["end"]
        lines.append(
            f"rank {d['rank']} ({d['transport']}): {d['steps']} steps, {d['calls']} calls, "
            f"{d['checked']} elements checked, {d['wrong']} wrong, {d['seconds']} s; "
            f"RSS {w['rss_kib']} -> {e['rss_kib']} KiB, fds {w['fds']} -> {e['fds']}, threads "
            f"{w['threads']}/{w['tasks']} -> {e['threads']}/{e['tasks']}, gc objects "
            f"{w['gc_objects']} -> {e['gc_objects']}")
    return "\n".join(lines)


@pytest.mark.timeout(JOB_TIMEOUT + 60)
@pytest.mark.parametrize(("transport", "n"), [("shm", 4), ("tcp", 3)])
def test_soak_run(tmp_path: Path, transport: str, n: int) -> None:
    r, left = run_soak(tmp_path, transport, n, OPS)
    tail = r.stderr[-6000:]
    assert r.returncode == 0, tail
    reports = reports_of(r)
    assert [d["rank"] for d in reports] == list(range(n)), r.stdout[-3000:] + tail
    print(summary(reports))
    for d in reports:
        assert d["transport"] == transport
        assert d["steps"] == OPS and d["calls"] >= OPS // 2, d
        assert d["checked"] > OPS, d  # the checks did run
        assert d["wrong"] == 0, "\n".join(d["failures"])
        w, e = d["probes"]["warm"], d["probes"]["end"]
        rank = f"rank {d['rank']}: {w} -> {e}"
        for what in ("fds", "threads", "tasks", "shm_maps"):
            assert e[what] == w[what], f"{what} changed: {rank}"
        assert w["shm_files"] == e["shm_files"] == 0, rank  # segments are unlinked at once
        assert e["rss_kib"] - w["rss_kib"] <= RSS_SLACK_KIB, f"RSS grew: {rank}, {d['curve']}"
        assert e["gc_objects"] - w["gc_objects"] <= OBJECT_SLACK, f"objects: {rank}"
        # finalize gives back every thread, descriptor and mapping the library took
        before, after = d["before_init"], d["after_finalize"]
        assert after["threads"] == before["threads"] and after["tasks"] == before["tasks"], d
        assert after["fds"] <= before["fds"] and after["shm_maps"] == 0, d
    assert reports[0]["shm_after_all_finalized"] == []  # once every rank has finalized
    assert left == {"pids": [], "shm": []}  # nothing outlives the job


@pytest.mark.timeout(150)
def test_the_soak_counts_a_wrong_element(tmp_path: Path) -> None:
    """The checks can fail: rank 1 flips a bit of one result it received; only it reports it."""
    r, left = run_soak(tmp_path, "shm", 3, 300, extra_env={"RINGWORLD_SOAK_CORRUPT": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    reports = reports_of(r)
    assert [d["wrong"] for d in reports] == [0, 1, 0], summary(reports)
    assert "SOAK-WRONG rank 1 step" in r.stderr and "1 of" in reports[1]["failures"][0]
    assert left == {"pids": [], "shm": []}


FREED = """
import numpy as np
import ringworld

comm = ringworld.init()
engine = comm._engine
x, y = np.arange(4.0), np.empty(4)

def state():
    return len(engine.posted) + len(engine.unexpected)

for i in range(20):
    d = comm.dup(); d.allreduce(x, y, algorithm="ring"); d.free()
before = state()
for i in range(300):
    d = comm.dup()
    d.allreduce(x, y, algorithm="ring")
    d.sendrecv(x, (d.rank + 1) % d.size, y, (d.rank - 1) % d.size)
    d.free()
print(f"rank {comm.rank}: per-context queues {before} -> {state()}", flush=True)
"""


@pytest.mark.timeout(120)
def test_freed_communicators_leave_no_matching_state(tmp_path: Path) -> None:
    prog = tmp_path / "freed.py"
    prog.write_text(FREED)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", "--transport", "tcp",
                        str(prog)], capture_output=True, text=True, timeout=100,
                       stdin=subprocess.DEVNULL, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    found = [tuple(map(int, m)) for m in re.findall(r"queues (\d+) -> (\d+)", r.stdout)]
    assert len(found) == 2, r.stdout
    for before, after in found:
        assert after - before < 20, r.stdout  # 300 communicators created and freed


DROPPED = """
import gc, os
import numpy as np
import ringworld

comm = ringworld.init()
x, y = np.ones(1000), np.empty(1000)
def state():
    gc.collect()
    maps = sum(1 for line in open("/proc/self/maps") if "ringworld-" in line)
    return len(os.listdir("/proc/self/fd")), maps
comm.dup().allreduce(x, y)  # warm-up: the world's own window, scratch
before = state()
for _ in range(40):
    d = comm.dup()
    d.allreduce(x, y)  # maps this communicator's shared windows
    del d              # dropped without free()
print(f"rank {comm.rank}: fds, maps {before} -> {state()}", flush=True)
"""


@pytest.mark.timeout(120)
def test_dropped_communicators_release_their_shared_windows(tmp_path: Path) -> None:
    prog = tmp_path / "dropped.py"
    prog.write_text(DROPPED)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", str(prog)],
                       capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"fds, maps \((\d+), (\d+)\) -> \((\d+), (\d+)\)", r.stdout)
    assert len(found) == 2, r.stdout
    for fds0, maps0, fds1, maps1 in found:
        assert int(fds1) - int(fds0) < 5 and int(maps1) - int(maps0) < 5, r.stdout
