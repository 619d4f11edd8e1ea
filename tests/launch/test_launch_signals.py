"""Stopping a job from outside, and leaving nothing behind: processes or /dev/shm files."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from launch_util import TRANSPORTS, Launcher, kill_all, ringworld, script, shm_files, wait_dead

pytestmark = pytest.mark.timeout(120)

# Each rank reports its pid and a grandchild's (same process group), then blocks on a message
# nobody sends: only a signal can end it.
BLOCKED = """
    import os, subprocess, sys, ringworld
    comm = ringworld.init()
    child = subprocess.Popen(["sleep", "300"])
    print("pids", os.getpid(), child.pid, flush=True)
    comm.barrier()
    comm.recv_obj(source=(comm.rank + 1) % comm.size, tag=3, timeout=200)
"""


def pids_in(lines: list[str]) -> list[int]:
    return [int(p) for line in lines for p in re.findall(r"\d+", line)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigint_stops_the_job_and_exits_130(tmp_path, transport: str) -> None:
    prog = script(tmp_path, BLOCKED)
    job = Launcher("run", "-n", "3", "--transport", transport, str(prog))
    pids: list[int] = []
    try:
        pids = pids_in(job.read_lines(3, timeout=60))
        time.sleep(0.2)  # let them reach the blocking receive
        start = time.monotonic()
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(30) == 130
        assert time.monotonic() - start < 10
        assert wait_dead(pids, within=2.0) == []
        assert "interrupted by SIGINT" in job.stderr()
    finally:
        kill_all(pids)
        job.close()


def test_sigterm_to_the_launcher_is_forwarded(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, signal, sys, time
        def bye(signum, frame):
            print("rank", os.environ["RINGWORLD_RANK"], "got", signal.Signals(signum).name,
                  flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(100)
    """)
    job = Launcher("run", "-n", "2", str(prog))
    try:
        job.read_lines(2, timeout=60)
        job.proc.send_signal(signal.SIGTERM)
        assert job.proc.wait(30) == 128 + signal.SIGTERM
        job.read_lines(4, timeout=10)
        assert sorted(job.lines[2:]) == ["rank 0 got SIGTERM", "rank 1 got SIGTERM"]
    finally:
        job.close()


def test_rank_ignoring_sigint_is_killed_after_the_grace_period(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("pid", os.getpid(), flush=True)
        time.sleep(100)
    """)
    job = Launcher("run", "-n", "2", "--grace", "0.5", str(prog))
    pids: list[int] = []
    try:
        pids = pids_in(job.read_lines(2, timeout=60))
        start = time.monotonic()
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(30) == 130
        elapsed = time.monotonic() - start
        assert 0.4 < elapsed < 10
        assert wait_dead(pids, within=2.0) == []
    finally:
        kill_all(pids)
        job.close()


def test_second_sigint_kills_at_once(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("pid", os.getpid(), flush=True)
        time.sleep(100)
    """)
    job = Launcher("run", "-n", "2", "--grace", "60", str(prog))
    pids: list[int] = []
    try:
        pids = pids_in(job.read_lines(2, timeout=60))
        job.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert job.proc.poll() is None  # still in its 60 s grace period
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(10) == 130
        assert wait_dead(pids, within=2.0) == []
    finally:
        kill_all(pids)
        job.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_launcher_killed_with_sigkill_leaves_no_ranks(tmp_path, transport: str) -> None:
    prog = script(tmp_path, BLOCKED)
    job = Launcher("run", "-n", "3", "--transport", transport, str(prog))
    pids: list[int] = []
    try:
        pids = pids_in(job.read_lines(3, timeout=60))
        rank_pids = pids[0::2]
        job.proc.kill()
        job.proc.wait(10)
        # PR_SET_PDEATHSIG takes the ranks down with the launcher.
        assert wait_dead(rank_pids, within=5.0) == []
    finally:
        kill_all(pids)
        job.close()


def test_failure_leaves_no_grandchildren(tmp_path) -> None:
    prog = script(tmp_path, BLOCKED.replace(
        "    comm.barrier()\n", "    comm.barrier()\n    if comm.rank == 2: sys.exit(6)\n"
    ))
    r = ringworld("run", "-n", "3", str(prog))
    pids = pids_in(re.findall(r"^pids .*$", r.stdout, re.M))
    try:
        assert r.returncode == 6, r.stderr
        assert len(pids) == 6
        assert wait_dead(pids, within=2.0) == []
    finally:
        kill_all(pids)


def test_success_leaves_no_grandchildren(tmp_path) -> None:
    prog = script(tmp_path, """
        import subprocess
        print("pid", subprocess.Popen(["sleep", "300"]).pid, flush=True)
    """)
    r = ringworld("run", "-n", "2", str(prog))
    pids = pids_in(r.stdout.splitlines())
    try:
        assert r.returncode == 0
        assert len(pids) == 2
        assert wait_dead(pids, within=2.0) == []
    finally:
        kill_all(pids)


@pytest.mark.parametrize("fails", [False, True])
def test_leftover_shm_segments_are_removed(tmp_path, fails: bool) -> None:
    prog = script(tmp_path, f"""
        import os, sys
        job, rank = os.environ["RINGWORLD_JOB_ID"], os.environ["RINGWORLD_RANK"]
        open(f"/dev/shm/ringworld-{{job}}-{{rank}}-leftover", "w").close()
        print(job)
        sys.exit(5 if {fails} and rank == "1" else 0)
    """)
    r = ringworld("run", "-n", "3", str(prog))
    job_id = r.stdout.split()[0]
    try:
        assert r.returncode == (5 if fails else 0)
        assert shm_files(job_id) == []
    finally:
        for name in shm_files(job_id):
            os.unlink(f"/dev/shm/{name}")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_shm_files_after_a_killed_job(tmp_path, transport: str) -> None:
    prog = script(tmp_path, """
        import os, sys, ringworld
        comm = ringworld.init()
        print(os.environ["RINGWORLD_JOB_ID"], flush=True)
        comm.barrier()
        if comm.rank == 0:
            os.kill(os.getpid(), 9)
        comm.recv_obj(source=0, tag=1, timeout=100)
    """)
    r = ringworld("run", "-n", "3", "--transport", transport, str(prog))
    assert r.returncode == 137
    assert shm_files(r.stdout.split()[0]) == []
