"""A failing rank takes the job down quickly and is reported as the root cause."""

from __future__ import annotations

import re
import time

import pytest
from launch_util import TRANSPORTS, kill_all, ringworld, script, wait_dead

pytestmark = pytest.mark.timeout(120)

# Every rank prints its pid; the survivors then block on a message from the failing rank that
# never comes, so only the launcher can end them. Without it they would wait for 100 s.
WAITING_FOR_RANK_1 = """
    import os, signal, sys, time, ringworld
    comm = ringworld.init()
    print("pid", os.getpid(), flush=True)
    comm.barrier()
    if comm.rank == 1:
        time.sleep(0.2)
        FAIL
    comm.recv_obj(source=1, tag=7, timeout=100)
"""


def pids_of(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r"^pid (\d+)$", stdout, re.M)]


def run_failing(tmp_path, failure: str, transport: str, n: int = 3):
    prog = script(tmp_path, WAITING_FOR_RANK_1.replace("FAIL", failure))
    start = time.monotonic()
    r = ringworld("run", "-n", str(n), "--transport", transport, str(prog), timeout=60)
    elapsed = time.monotonic() - start
    pids = pids_of(r.stdout)
    try:
        assert len(pids) == n, r.stdout + r.stderr
        assert wait_dead(pids, within=2.0) == [], "ranks outlived the launcher"
    finally:
        kill_all(pids)
    return r, elapsed


def report_of(stderr: str) -> str:
    at = stderr.find("ringworld: job ")
    assert at >= 0, stderr
    return stderr[at:]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exit_code_of_the_failing_rank_and_report(tmp_path, transport: str) -> None:
    r, elapsed = run_failing(tmp_path, "sys.exit(3)", transport)
    assert r.returncode == 3
    report = report_of(r.stderr)
    assert re.match(r"ringworld: job [0-9a-f]+ failed: rank 1 \(pid \d+\) exited with code 3\n",
                    report), report
    assert elapsed < 20, f"blocked ranks were not stopped promptly ({elapsed:.1f} s)"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exception_report_shows_the_traceback_tail(tmp_path, transport: str) -> None:
    r, elapsed = run_failing(
        tmp_path, "raise ValueError('rank one cannot go on: 4217')", transport
    )
    assert r.returncode == 1
    report = report_of(r.stderr)
    assert "failed: rank 1 " in report.splitlines()[0]
    assert "exited with code 1" in report.splitlines()[0]
    assert "  | Traceback (most recent call last):" in report
    assert report.rstrip().endswith("  | ValueError: rank one cannot go on: 4217"), report
    assert elapsed < 20


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_killed_by_sigkill(tmp_path, transport: str) -> None:
    r, elapsed = run_failing(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)", transport, n=4)
    assert r.returncode == 137
    report = report_of(r.stderr)
    first = report.splitlines()[0]
    assert re.search(r"failed: rank 1 \(pid \d+\) killed by SIGKILL$", first), report
    assert elapsed < 20


def test_report_keeps_only_the_last_20_stderr_lines(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, sys
        if os.environ["RINGWORLD_RANK"] == "1":
            for i in range(100):
                print(f"line {i}", file=sys.stderr)
            sys.exit(5)
    """)
    r = ringworld("run", "-n", "2", str(prog))
    assert r.returncode == 5
    report = report_of(r.stderr)
    assert "last 20 stderr lines of rank 1" in report
    assert [ln for ln in report.splitlines() if ln.startswith("  | ")] == [
        f"  | line {i}" for i in range(80, 100)
    ]
    # The forwarded stderr itself is complete.
    assert r.stderr.count("line ") == 100 + 20


def test_stopped_ranks_are_not_root_causes(tmp_path) -> None:
    # Rank 0 fails; rank 1 would exit with code 9 when terminated, so it must be reported
    # as stopped, not as a failure of its own.
    prog = script(tmp_path, """
        import os, signal, sys, time
        rank = int(os.environ["RINGWORLD_RANK"])
        if rank == 0:
            time.sleep(0.3)
            sys.exit(4)
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(9))
        time.sleep(100)
    """)
    r = ringworld("run", "-n", "3", str(prog))
    assert r.returncode == 4
    report = report_of(r.stderr)
    assert "failed: rank 0 " in report.splitlines()[0]
    assert "ranks 1, 2 stopped by ringworld" in report


def test_sigterm_ignored_escalates_to_sigkill(tmp_path) -> None:
    prog = script(tmp_path, """
        import os, signal, sys, time
        if os.environ["RINGWORLD_RANK"] == "0":
            time.sleep(0.3)
            sys.exit(2)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(100)
    """)
    start = time.monotonic()
    r = ringworld("run", "-n", "2", "--grace", "0.5", str(prog))
    assert r.returncode == 2
    assert time.monotonic() - start < 15
    assert "rank 1 stopped by ringworld" in r.stderr


def test_success_prints_no_report(tmp_path) -> None:
    prog = script(tmp_path, "import sys; print('ok'); print('note', file=sys.stderr)\n")
    r = ringworld("run", "-n", "2", str(prog))
    assert r.returncode == 0
    assert r.stdout == "ok\nok\n"
    assert r.stderr == "note\nnote\n"


def test_missing_program_exits_127() -> None:
    r = ringworld("run", "-n", "2", "no-such-program-ringworld-test")
    assert r.returncode == 127
    assert "cannot run 'no-such-program-ringworld-test'" in r.stderr


def test_program_not_executable_exits_126(tmp_path) -> None:
    target = tmp_path / "not-executable"
    target.write_text("#!/bin/sh\necho hi\n")
    target.chmod(0o644)
    r = ringworld("run", "-n", "2", str(target))
    assert r.returncode == 126
    assert "cannot run" in r.stderr
