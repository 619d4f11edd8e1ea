"""Mismatch detection on the message path: ranks that disagree on a collective call (which
collective, count, dtype, op, root) all get a MismatchError showing the disagreeing calls,
instead of a hang or garbage. (The shared-memory path checks the same at every sync.)"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ringworld.testing import run_threads

pytestmark = pytest.mark.timeout(120)

def _disagree(comm: Any, kind: str, stay: float) -> list[str]:
    """Ranks disagree on a call as ``kind`` says; returns each call's outcome on this rank.
    Runs in threads here and, by its source, as the program of ``ringworld run`` jobs; ``stay``
    s after the call, a process stays until the others have seen it too."""
    import time

    import numpy as np

    import ringworld

    r = comm.rank
    odd = r == 1
    seen = []
    try:
        if kind == "count":
            n = 12 if odd else 10
            comm.allreduce(np.ones(n), np.empty(n), algorithm="ring", timeout=20)
        elif kind == "collective":
            if odd:
                comm.bcast(np.ones(8), root=0, algorithm="binomial", timeout=20)
            else:
                comm.allreduce(np.ones(8), np.empty(8), algorithm="recursive_doubling",
                               timeout=20)
        elif kind == "dtype":
            a = np.ones(8, dtype=np.float32 if odd else np.float64)
            comm.allgather(a, np.empty(8 * comm.size, a.dtype), algorithm="ring", timeout=20)
        elif kind == "op":
            op = ringworld.MAX if odd else ringworld.SUM
            comm.allreduce(np.ones(8), np.empty(8), op, algorithm="recursive_doubling",
                           timeout=20)
        elif kind == "object":
            if odd:
                comm.bcast_obj("x", root=0, timeout=20)
            else:
                comm.allgather_obj(r, timeout=20)
        elif kind == "object-buffer":
            if odd:
                comm.allreduce_obj(r, timeout=20)
            else:
                comm.allreduce(np.ones(4), np.empty(4), algorithm="recursive_doubling",
                               timeout=20)
        elif kind == "root":
            comm.bcast(np.ones(8), root=1 if r == 2 else 0, algorithm="binomial", timeout=20)
        elif kind == "roots":  # every rank its own root: ranks only send, nobody receives
            comm.bcast(np.full(8, r + 1.0), root=r, algorithm="binomial", timeout=20)
        elif kind == "roots-large":  # the same, with sends that wait for a receiver
            comm.bcast(np.full(1 << 19, r + 1.0), root=r, algorithm="binomial", timeout=20)
        elif kind == "roots-object":
            comm.bcast_obj(r, root=r, timeout=20)
        seen.append(f"rank {r}: ok")
    except ringworld.MismatchError as exc:
        seen.append(f"rank {r}: mismatch: {exc}")
    time.sleep(stay)
    if kind.startswith("root"):  # ranks that finished the broken call fail in their next one
        try:
            comm.allreduce(np.ones(2), np.empty(2), algorithm="ring", timeout=20)
            seen.append(f"next {r}: ok")
        except ringworld.MismatchError as exc:
            seen.append(f"next {r}: mismatch: {exc}")
        time.sleep(stay)
    return seen


PROGRAM = "from typing import Any\n\n" + inspect.getsource(_disagree) + """
import sys
import ringworld

for line in _disagree(ringworld.init(), sys.argv[1], 1.0):
    print(line, flush=True)
"""


def _threads(kind: str, n: int) -> str:
    """The outcome lines of ``kind`` on ``n`` ranks that are threads (the fast tier)."""
    return "\n".join(line for lines in run_threads(n, _disagree, kind, 0.0)
                     for line in lines)


SIGNATURE = (r"(allreduce|bcast|allgather)\(algorithm=\w+, count=\d+, dtype=\w+, op=[\w-]+, "
             r"root=\d\)")


def _run(tmp_path: Path, kind: str, n: int, transport: str) -> str:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", str(n), "--transport",
                        transport, str(prog), kind], capture_output=True, text=True,
                       timeout=100, check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _outcome(tmp_path: Path, kind: str, n: int, world: str) -> str:
    """Every rank's outcome lines: ranks as threads, or a ``ringworld run`` job over ``world``."""
    return _threads(kind, n) if world == "threads" else _run(tmp_path, kind, n, world)


@pytest.mark.parametrize(("kind", "world"), [
    *((k, "threads") for k in ("count", "collective", "dtype", "op")),
    ("count", "shm"), ("count", "tcp")])
def test_two_ranks_that_disagree_both_see_both_calls(tmp_path: Path, kind: str,
                                                     world: str) -> None:
    out = _outcome(tmp_path, kind, 2, world)
    for rank in (0, 1):
        m = re.search(rf"rank {rank}: mismatch: collective mismatch on world, call #0: "
                      rf"world rank {rank} called ({SIGNATURE}), but world rank {1 - rank} "
                      rf"called ({SIGNATURE})", out)
        assert m, out
        assert m.group(1) != m.group(3)  # the two calls shown differ
    if kind == "count":
        assert "count=10" in out and "count=12" in out


@pytest.mark.parametrize(("world", "n"), [("threads", 3), ("threads", 4), ("threads", 5),
                                          ("threads", 8), ("shm", 4), ("tcp", 4)])
def test_every_rank_waiting_in_the_call_fails(tmp_path: Path, world: str, n: int) -> None:
    out = _outcome(tmp_path, "count", n, world)
    lines = {int(m.group(1)): m.group(2) for m in re.finditer(r"rank (\d): (.*)", out)}
    assert sorted(lines) == list(range(n)), out
    for line in lines.values():  # the two disagreeing calls, even on ranks not involved
        assert line.startswith("mismatch: collective mismatch on world, call #0:"), out
        assert "count=10" in line and "count=12" in line, out


@pytest.mark.parametrize("world", ["threads", "tcp"])
def test_a_root_disagreement_fails_every_rank_by_its_next_call(tmp_path: Path,
                                                               world: str) -> None:
    out = _outcome(tmp_path, "root", 3, world)
    assert re.search(r"rank 2: mismatch: .*world rank 2 called bcast\(.*root=1\), but world "
                     r"rank \d called", out), out
    for rank in range(3):  # and every rank's next call on the communicator fails, showing it
        assert re.search(rf"next {rank}: mismatch: collective mismatch on world, call #0: "
                         r".*bcast\(.*root=1\)", out), out


@pytest.mark.parametrize(("kind", "world"), [("object", "threads"), ("object-buffer", "threads"),
                                             ("object", "shm"), ("object-buffer", "tcp")])
def test_object_collectives_are_checked_too(tmp_path: Path, kind: str, world: str) -> None:
    out = _outcome(tmp_path, kind, 2, world)
    for rank in (0, 1):
        line = re.search(rf"rank {rank}: (.*)", out)
        assert line and line.group(1).startswith("mismatch: collective mismatch on world"), out
    for rank in (0, 1):  # both calls on each rank's line
        line = re.search(rf"rank {rank}: (.*)", out)
        assert line
        if kind == "object":
            assert "bcast_obj(root=0, op=-)" in line.group(1), out
            assert "allgather_obj(root=0, op=-)" in line.group(1), out
        else:
            assert "allreduce_obj(root=0, op=sum)" in line.group(1), out
            assert "allreduce(algorithm=" in line.group(1), out


@pytest.mark.parametrize(("world", "kind"), [
    ("threads", "roots"), ("threads", "roots-large"), ("threads", "roots-object"),
    ("shm", "roots"), ("tcp", "roots-large"), ("tcp", "roots-object")])
def test_ranks_that_each_think_they_are_the_root_fail(tmp_path: Path, world: str,
                                                      kind: str) -> None:
    """Both ranks only send: no receive meets the other's message. The message of the same
    call with another signature (or of a call already finished) is caught when it arrives or
    when the call starts; the broadcast itself or, at the latest, the next call that polls for
    messages fails on both ranks, showing both calls. (Shared-memory collectives do not poll
    when they need not wait: they find it at the first call after a poll. In-process sends
    never wait for a receiver, so a large broadcast there behaves as a small one.)"""
    out = _outcome(tmp_path, kind, 2, world)
    call = r"bcast_obj\(root=\d" if kind == "roots-object" else r"bcast\([^)]*root=\d\)"
    for rank in (0, 1):
        seen = re.findall(rf"(?:rank|next) {rank}: (.*)", out)
        assert len(seen) == 2, out
        assert "mismatch: collective mismatch on world, call #0:" in seen[1], out
        assert len(re.findall(call, seen[1])) == 2, out  # both calls shown
        # sends waiting for a receiver fail in the call itself
        if kind == "roots-large" and world != "threads":
            assert seen[0].startswith("mismatch:"), out


LAST = """
import numpy as np
import ringworld

comm = ringworld.init()
comm.barrier()
comm.bcast(np.full(8, comm.rank + 1.0), root=comm.rank, algorithm="binomial")  # both: root
other = 1 - comm.rank
comm.sendrecv_obj("after", other, other)  # the other's broadcast has arrived by now
print(f"rank {comm.rank}: returned", flush=True)
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_disagreement_in_the_last_call_fails_the_job_at_exit(tmp_path: Path,
                                                                transport: str) -> None:
    """Both ranks think they are the root of a small broadcast, the job's last collective:
    both only send and return. Exit finds the message nobody took: the job fails, showing
    the mismatch, instead of ending well with a wrong result."""
    prog = tmp_path / "prog.py"
    prog.write_text(LAST)
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", "--transport",
                        transport, str(prog)], capture_output=True, text=True, timeout=100,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "ringworld: collective mismatch on world, call #" in r.stderr, r.stdout + r.stderr
    assert "root=0" in r.stderr and "root=1" in r.stderr, r.stdout + r.stderr  # both calls
