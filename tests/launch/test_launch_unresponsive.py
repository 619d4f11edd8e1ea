"""A rank that stops responding (here: SIGSTOP) is the root cause the launcher reports, and it
never keeps a job alive: the survivors that fail on finding it are secondary, and with
--enable-recovery the launcher kills it once the survivors are done."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_util import LAUNCHER, TRANSPORTS, kill_all, script, wait_dead

from ringworld.launch.procset import ProcessSet

pytestmark = pytest.mark.timeout(150)
LIVENESS = "3"  # seconds without heartbeats before the monitors declare a rank failed

# Rank 1 stops itself (as a debugger, a cut link or a hung native call would leave it) while the
# others wait for it in a collective; without --enable-recovery the survivors fail with
# PeerFailure once the monitors declare it. With RECOVER the survivors shrink and finish.
STOPS = """
    import os, signal, sys
    import numpy as np
    import ringworld

    comm = ringworld.init()
    print(f"rank {comm.rank} pid {os.getpid()}", flush=True)
    comm.barrier()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    out = np.empty(4)
    try:
        comm.allreduce(np.full(4, comm.rank + 1.0), out, timeout=100)
    except (ringworld.PeerFailure, ringworld.CommRevoked):
        if "RECOVER" not in sys.argv:
            raise
        comm.revoke()
        comm = comm.shrink()
        comm.allreduce(np.full(4, comm.rank + 1.0), out, timeout=100)
        print(f"survivor {comm.rank} of {comm.size}: sum {out[0]:.0f}", flush=True)
"""


def run_job(tmp_path: Path, *args: str, timeout: float = 90
            ) -> tuple[int, str, str, dict[int, int]]:
    """Run a job of STOPS in a session of its own; kill whatever is left however it ends."""
    env = {**os.environ, "RINGWORLD_LIVENESS_TIMEOUT": LIVENESS}
    cmd = [*LAUNCHER, "run", *args, str(script(tmp_path, STOPS))]
    if "--enable-recovery" in args:
        cmd.append("RECOVER")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    out = err = ""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # the job hung: kill it, keep what it said for the failure
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[test: the job ran past {timeout} s and was killed]"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pids = {int(r): int(p) for r, p in re.findall(r"^rank (\d+) pid (\d+)$", out, re.M)}
        left = wait_dead(list(pids.values()), within=5.0)
        kill_all(left)  # a stopped rank must not outlive the test
    assert left == [], f"ranks {left} outlived the launcher:\n{out}\n{err}"
    assert sorted(pids) == [0, 1, 2], out + err
    return proc.returncode, out, err, pids


def report_of(stderr: str) -> list[str]:
    at = stderr.find("ringworld: job ")
    assert at >= 0, stderr
    return stderr[at:].splitlines()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stopped_rank_is_the_root_cause_not_the_survivor_that_found_it(
        tmp_path: Path, transport: str) -> None:
    code, _, err, pids = run_job(tmp_path, "-n", "3", "--transport", transport)
    report = report_of(err)
    assert re.fullmatch(
        rf"ringworld: job \w+ failed: rank 1 \(pid {pids[1]}\) stopped responding: "
        r"no heartbeat for [\d.]+ s \(liveness timeout 3 s; .*\), found by rank [02]; "
        r"its process is stopped", report[0]), "\n".join(report)
    # the survivors are listed as such: stopped by ringworld, or failed because of rank 1
    others = report[1]
    assert others.startswith("ringworld: other ranks: "), report
    assert "rank 1 " not in others and "ranks 1" not in others, report
    for rank in (0, 2):
        assert re.search(rf"\b{rank}\b", others), report
    for part in others.removeprefix("ringworld: other ranks: ").split("; "):
        assert part.endswith(("stopped by ringworld", "because of it (peer failure)")), report
    assert not any(re.search(r"failed: rank [02] ", line) for line in report), report
    assert code == 1, err  # a survivor's status: rank 1 has none of its own (it was killed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_with_recovery_a_stopped_rank_is_killed_once_the_survivors_finish(
        tmp_path: Path, transport: str) -> None:
    code, out, err, pids = run_job(tmp_path, "-n", "3", "--enable-recovery",
                                   "--transport", transport)
    assert sorted(re.findall(r"^survivor (\d) of 2: sum 3$", out, re.M)) == ["0", "1"], out + err
    report = report_of(err)
    assert re.match(rf"ringworld: job \w+ lost rank 1 \(pid {pids[1]}\): stopped responding: ",
                    report[0]), "\n".join(report)
    assert report[0].endswith("the other ranks ran on (--enable-recovery)"), report
    assert "ranks 0, 2 had finished" in report[1], report
    assert code == 0, err  # the survivors finished


# -- the process set itself, with a declaration of the monitors' made up -----------------------

PEER_FAILURE = (
    "import sys\n"
    "print('Traceback (most recent call last):', file=sys.stderr)\n"
    "print('ringworld.errors.PeerFailure: peer rank 1 failed: not responding', file=sys.stderr)\n"
    "sys.exit(1)\n"
)


@pytest.mark.timeout(60)
def test_a_rank_the_monitors_declared_is_the_cause_even_if_it_runs(tmp_path: Path) -> None:
    # Rank 1 is not stopped (it sleeps: a cut link looks the same to the launcher); the
    # monitors' declaration is all that tells it failed. Rank 0 fails because of it.
    declared = {1: "no heartbeat for 3.0 s (liveness timeout 3 s; ...), found by rank 0"}
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e, ProcessSet(
            stdout=o, stderr=e, find_unresponsive=lambda: declared) as ps:
        sleeper = ps.spawn(1, [sys.executable, "-c", "import time; time.sleep(100)"],
                           os.environ)
        ps.spawn(0, [sys.executable, "-c", PEER_FAILURE], os.environ)
        result = ps.wait()
    assert wait_dead([sleeper], within=2.0) == []
    root = result.root_cause
    assert root is not None and (root.rank, root.pid) == (1, sleeper), result
    assert root.describe() == f"stopped responding: {declared[1]}"
    assert root.returncode == -signal.SIGKILL  # killed, not asked: it does not respond
    first = result.exits[0]
    assert first.secondary and not first.stopped and first.returncode == 1, result
