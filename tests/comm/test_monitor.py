"""Heartbeats: a stopped rank is found within the liveness timeout, a busy one is not, and a
collective timeout names the ranks that entered it and those that are missing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ringworld import config
from ringworld.errors import ConfigError

pytestmark = pytest.mark.timeout(120)
LIVENESS = 2.0


def _run(tmp_path: Path, body: str, n: int, transport: str,
         liveness: float = LIVENESS) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    env = {**os.environ, "RINGWORLD_LIVENESS_TIMEOUT": str(liveness)}
    return subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", str(n),
                           "--transport", transport, str(prog)],
                          capture_output=True, text=True, timeout=100, check=False,
                          stdin=subprocess.DEVNULL, env=env)


STOPPED = """
import os, signal, time
import numpy as np
import ringworld

comm = ringworld.init()
comm.allreduce(np.ones(4), np.empty(4))
if comm.rank == 2:
    os.kill(os.getpid(), signal.SIGSTOP)
start = time.monotonic()
try:
    comm.allreduce(np.ones(4), np.empty(4), timeout=60)
except ringworld.PeerFailure as exc:
    print(f"rank {comm.rank} after {time.monotonic() - start:.2f} s: rank {exc.rank}: {exc}",
          flush=True)
    time.sleep(2)  # leave the other survivor time to find it too before this rank exits
    raise SystemExit(5) from None
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_stopped_rank_fails_the_others_within_the_liveness_timeout(
        tmp_path: Path, transport: str) -> None:
    r = _run(tmp_path, STOPPED, 3, transport)
    assert r.returncode == 5, r.stdout + r.stderr
    found = re.findall(r"rank (\d) after ([\d.]+) s: rank (\d): (.*)", r.stdout)
    assert found, r.stdout + r.stderr
    assert sorted(rank for rank, *_ in found) == ["0", "1"], r.stdout
    for _, seconds, failed, text in found:
        assert failed == "2" and "not responding" in text
        assert float(seconds) < LIVENESS + 2.0, r.stdout


def test_a_rank_computing_for_long_is_not_a_failure(tmp_path: Path) -> None:
    body = """
    import time
    import numpy as np
    import ringworld

    comm = ringworld.init()
    comm.barrier()
    if comm.rank == 1:  # pure Python, holding the interpreter, for 3x the liveness timeout
        end, x = time.monotonic() + 6.0, 0
        while time.monotonic() < end:
            x += 1
    out = np.empty(4)
    comm.allreduce(np.full(4, comm.rank + 1.0), out, timeout=60)
    assert (out == 3.0).all()
    print("ok", comm.rank, flush=True)
    """
    r = _run(tmp_path, body, 2, "shm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split("\n")[:2]) == ["ok 0", "ok 1"]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_inside_one_long_call_holding_the_interpreter_is_not_a_failure(
        tmp_path: Path, transport: str) -> None:
    """One C call that never lets the monitor thread run (sum over a range holds the GIL
    throughout) for several times the liveness timeout: its heartbeats stop, but its process
    runs, and the ranks on its host vouch for it; a stopped one they do not (the test
    above)."""
    body = """
    import time
    import numpy as np
    import ringworld

    comm = ringworld.init()
    comm.barrier()
    if comm.rank == 1:
        t = time.perf_counter()
        sum(range(10 ** 7))
        rate = 10 ** 7 / (time.perf_counter() - t)
        t = time.perf_counter()
        sum(range(int(rate * 9.0)))  # one call, about 9 s (6 s and more on a busy host)
        print(f"held {time.perf_counter() - t:.1f} s", flush=True)
    out = np.empty(4)
    comm.allreduce(np.full(4, comm.rank + 1.0), out)  # rank 0 waits here, with no timeout
    assert (out == 3.0).all()
    print("ok", comm.rank, flush=True)
    """
    r = _run(tmp_path, body, 2, transport)
    assert r.returncode == 0, r.stdout + r.stderr
    held = re.search(r"held ([\d.]+) s", r.stdout)
    assert held and float(held.group(1)) > 2 * LIVENESS, r.stdout  # it did starve the monitor
    assert sorted(line for line in r.stdout.split("\n") if line.startswith("ok")) == [
        "ok 0", "ok 1"], r.stdout


def test_a_rank_that_loses_the_job_store_raises_instead_of_waiting(tmp_path: Path) -> None:
    """A rank cut off from the job (its monitor's store requests fail, as when its link is
    cut or the launcher is gone) can no longer learn of failures: its waits raise CommBroken
    saying so, instead of waiting for good (the others declare it failed)."""
    body = """
    import socket, time
    import numpy as np
    import ringworld
    from ringworld import runtime

    comm = ringworld.init()
    comm.barrier()
    if comm.rank == 1:
        runtime._monitor._store._sock.shutdown(socket.SHUT_RDWR)  # the link to the store dies
        start = time.monotonic()
        try:
            comm.recv(np.empty(4), 0)  # rank 0 never sends; no timeout
        except ringworld.CommBroken as exc:
            print(f"rank 1 after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    else:
        try:
            comm.recv(np.empty(4), 1)
        except ringworld.PeerFailure as exc:
            print(f"rank 0: rank {exc.rank} failed", flush=True)
    """
    r = _run(tmp_path, body, 2, "shm")
    m = re.search(r"rank 1 after ([\d.]+) s: (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert "lost contact with the job" in m.group(2), r.stdout
    assert float(m.group(1)) < LIVENESS + 10, r.stdout


def test_a_stopped_rank_is_found_after_its_watchers_finished(tmp_path: Path) -> None:
    """Rank 2 stops; the ranks that watch its heartbeats (1, 0 and 4 of 5) finish and leave.
    Rank 3, waiting for rank 2, must still learn of it: those left watch those left."""
    body = """
    import os, signal, time
    import numpy as np
    import ringworld

    comm = ringworld.init()
    comm.barrier()
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif comm.rank == 3:
        start = time.monotonic()
        try:
            comm.recv(np.empty(4), 2)  # no timeout
        except ringworld.PeerFailure as exc:
            print(f"rank 3 after {time.monotonic() - start:.1f} s: rank {exc.rank}: {exc}",
                  flush=True)
    """
    r = _run(tmp_path, body, 5, "shm")
    m = re.search(r"rank 3 after ([\d.]+) s: rank (\d): (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert m.group(2) == "2" and "not responding" in m.group(3), r.stdout
    assert float(m.group(1)) < LIVENESS + 10, r.stdout


def test_a_rank_that_finished_is_not_a_failure(tmp_path: Path) -> None:
    body = """
    import time
    import numpy as np
    import ringworld

    comm = ringworld.init()
    comm.barrier()
    if comm.rank != 2:  # rank 2 leaves; the others go on talking past the liveness timeout
        # A fixed number of exchanges, not a deadline: with a deadline per rank, one rank could
        # stop while its partner, whose clock read earlier, posted one more exchange.
        start = time.monotonic()
        for _ in range(130):
            comm.sendrecv(np.ones(2), 1 - comm.rank, np.empty(2), 1 - comm.rank)
            time.sleep(0.05)
        assert time.monotonic() - start > 3 * 2.0
        print("ok", comm.rank, flush=True)
    """
    r = _run(tmp_path, body, 3, "tcp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok") == 2


WAITS_FOR_FINISHED = """
import numpy as np
import ringworld

comm = ringworld.init()
comm.barrier()
if comm.rank == 1:  # rank 0 leaves at once; rank 1 waits for a message it never sends
    try:
        comm.recv(np.empty(2), 0, timeout=30)
    except ringworld.PeerFailure as exc:
        print("failure:", exc.rank, exc, flush=True)
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_waiting_for_a_rank_that_finished_says_it_finished(tmp_path: Path,
                                                           transport: str) -> None:
    r = _run(tmp_path, WAITS_FOR_FINISHED, 2, transport)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "failure: 0 " in r.stdout, r.stdout + r.stderr
    assert "rank 0 had already left the job" in r.stdout, r.stdout


MISSING = """
import time
import numpy as np
import ringworld

comm = ringworld.init()
comm.allreduce(np.ones(4), np.empty(4))
if comm.rank == 2:
    time.sleep(12)
    raise SystemExit(0)
try:
    comm.allreduce(np.ones(4), np.empty(4), timeout=3)
except ringworld.Timeout as exc:
    print(f"rank {comm.rank}: {exc}", flush=True)
    raise SystemExit(6) from None
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_timeout_names_who_entered_and_who_is_missing(tmp_path: Path, transport: str) -> None:
    r = _run(tmp_path, MISSING, 3, transport, liveness=20.0)
    assert r.returncode == 6, r.stdout + r.stderr
    out = r.stdout
    assert "not complete after 3 s" in out
    assert re.search(r"ranks of world that entered #\d+: \[0, 1\]; missing: \[2\]", out), out
    assert re.search(r"rank 2: not in a communication call", out), out
    assert re.search(r"rank [01]: waiting for [\d.]+ s on allreduce", out), out


def test_liveness_setting_is_checked() -> None:
    assert config.from_env({}).liveness_timeout == 20.0
    assert config.from_env({"RINGWORLD_LIVENESS_TIMEOUT": "0"}).liveness_timeout == 0.0
    for bad in ("abc", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match="RINGWORLD_LIVENESS_TIMEOUT"):
            config.from_env({"RINGWORLD_LIVENESS_TIMEOUT": bad})
