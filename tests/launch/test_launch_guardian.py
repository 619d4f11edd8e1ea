"""The guardian: a launcher killed with SIGKILL leaves nothing its ranks started, a launcher that
exits normally takes its guardian with it, and the guardian kills only the sessions it was told
of and still holds."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from launch_util import TRANSPORTS, Launcher, alive, kill_all, ringworld, script, wait_dead

from ringworld.launch import guardian

pytestmark = pytest.mark.timeout(120)

# Each rank starts two grandchildren, one in its process group and one in a process group of its
# own (same session), reports the pids, then blocks on a message nobody sends.
STARTS_CHILDREN = """
    import os, subprocess, sys, ringworld
    comm = ringworld.init()
    same = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "300"], process_group=0)
    print("pids", os.getpid(), same.pid, other.pid, flush=True)
    comm.barrier()
    comm.recv_obj(source=(comm.rank + 1) % comm.size, tag=3, timeout=200)
"""


def guardians_of(launcher: int) -> list[int]:
    """The guardian processes ``launcher`` started (its children running guardian.py)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == launcher and b"ringworld/launch/guardian.py" in cmdline:
            found.append(int(name))
    return found


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_launcher_killed_with_sigkill_leaves_nothing_the_ranks_started(
        tmp_path: Path, transport: str) -> None:
    prog = script(tmp_path, STARTS_CHILDREN)
    job = Launcher("run", "-n", "3", "--transport", transport, str(prog),
                   start_new_session=True)
    pids: list[int] = []
    try:
        lines = job.read_lines(3, timeout=60)
        pids = [int(p) for line in lines for p in re.findall(r"\d+", line)]
        assert len(pids) == 9, lines
        keepers = guardians_of(job.proc.pid)
        job.proc.kill()
        job.proc.wait(10)
        left = wait_dead(pids, within=10.0)
        assert left == [], f"{left} of ranks and their children {pids} outlived the launcher"
        assert len(keepers) == 1
        assert wait_dead(keepers, within=10.0) == [], "the guardian outlived the job"
    finally:
        kill_all([p for p in pids if alive(p)])
        job.close()


def test_the_guardian_goes_with_a_job_that_ends_normally(tmp_path: Path) -> None:
    prog = script(tmp_path, """
        import os
        from pathlib import Path
        for name in os.listdir("/proc"):  # this rank's siblings: the launcher's guardian
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if (int(stat.rpartition(")")[2].split()[1]) == os.getppid()
                    and b"launch/guardian.py" in cmd):
                print("guardian", name, flush=True)
    """)
    r = ringworld("run", "-n", "2", str(prog))
    assert r.returncode == 0, r.stderr
    found = {int(p) for p in re.findall(r"^guardian (\d+)$", r.stdout, re.M)}
    assert len(found) == 1, r.stdout
    assert not alive(found.pop())


# -- the guardian's protocol, in this process ----------------------------------------------------

LEADER = ("import subprocess, sys, time\n"
          "child = subprocess.Popen(['sleep', '60'])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(60)\n")


@contextlib.contextmanager
def session_with_a_child():  # -> (leader Popen, child pid)
    """A process leading a session of its own (as a rank does) with a child in it."""
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE,
                              start_new_session=True)
    child = 0
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        yield leader, child
    finally:
        kill_all([leader.pid] + ([child] if child and alive(child) else []))
        leader.wait(10)
        assert leader.stdout is not None
        leader.stdout.close()


def serve_messages(messages: bytes, close: bool = True) -> None:
    """Run the guardian's loop here on a pipe holding ``messages`` (then EOF if ``close``)."""
    r, w = os.pipe()
    done = threading.Event()

    def serve() -> None:
        try:
            guardian.serve(r)
        finally:
            done.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        os.write(w, messages)
    finally:
        if close:
            os.close(w)
    assert done.wait(10), "the guardian's loop did not return"
    os.close(r)
    if not close:
        os.close(w)


@pytest.mark.timeout(60)
def test_eof_without_done_kills_the_sessions_it_was_told_of() -> None:
    with session_with_a_child() as (leader, child), session_with_a_child() as (other, stray):
        serve_messages(b"+%d\n" % leader.pid)
        assert wait_dead([child], within=5.0) == []
        assert leader.wait(5) == -9
        assert other.poll() is None and alive(stray)  # never told of: untouched


@pytest.mark.timeout(60)
def test_done_or_a_forgotten_session_kills_nothing() -> None:
    with session_with_a_child() as (leader, child):
        serve_messages(b"+%d\ndone\n" % leader.pid, close=False)  # returns on done, no EOF
        serve_messages(b"+%d\ndone\n" % leader.pid)
        serve_messages(b"+%d\n-%d\n" % (leader.pid, leader.pid))
        serve_messages(b"+%d\n+not a number\n-%d\n" % (leader.pid, leader.pid))
        assert leader.poll() is None and alive(child)


@pytest.mark.timeout(60)
def test_the_launchers_side_starts_and_stops_a_guardian() -> None:
    g = guardian.Guardian.start()
    assert g is not None
    proc = g._proc
    with session_with_a_child() as (leader, child):
        g.watch(leader.pid)
        g.forget(leader.pid)
        g.close()
        g.close()  # idempotent
        assert proc.returncode == 0  # it exited on done, and was reaped
        assert leader.poll() is None and alive(child)
