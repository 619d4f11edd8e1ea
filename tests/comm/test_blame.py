"""Survivors name the first failure: a rank that crashed is said to have crashed, with its
exception, and a rank that left because another failed points to that one (issue 20: they
blamed the rank that had merely died of the first failure, saying it 'finalized', in two
tracebacks each)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path: Path, body: str, n: int, transport: str,
         *extra: str) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", str(n),
                           "--transport", transport, *extra, str(prog)],
                          capture_output=True, text=True, timeout=100, check=False,
                          stdin=subprocess.DEVNULL, env=dict(os.environ))


CRASH = """
import numpy as np
import ringworld

comm = ringworld.init()
comm.barrier()
if comm.rank == 1:
    raise ValueError("a bug on rank 1")
comm.allreduce(np.ones(4), np.empty(4))
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_crashed_rank_is_named_as_crashed_with_its_exception(tmp_path: Path,
                                                               transport: str) -> None:
    r = _run(tmp_path, CRASH, 3, transport, "--enable-recovery")  # the survivors run on
    said = re.findall(r"^ringworld\.errors\.PeerFailure: (.*)$", r.stderr, re.MULTILINE)
    assert len(said) == 2, r.stderr  # both survivors say what happened
    for text in said:
        assert text.startswith("peer rank 1 failed"), r.stderr
        assert "rank 1 crashed: ValueError: a bug on rank 1" in text, r.stderr
        assert "finalized" not in text, r.stderr
    tracebacks = len(re.findall(r"^Traceback", r.stderr, re.MULTILINE))
    assert tracebacks == 3, r.stderr  # one each (rank 1's own too), not chained twice


FIRST = """
import os, signal
import numpy as np
import ringworld

comm = ringworld.init()
comm.barrier()
buf = np.empty(4)
if comm.rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
if comm.rank == 0:
    comm.recv(buf, 2)  # dies of rank 2's failure, uncaught
try:
    comm.recv(buf, 0)  # rank 1 waits for rank 0
except ringworld.PeerFailure as exc:
    print(f"rank {comm.rank}: names rank {exc.rank}: {exc}", flush=True)
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_that_died_of_another_failure_points_to_it(tmp_path: Path,
                                                          transport: str) -> None:
    r = _run(tmp_path, FIRST, 3, transport, "--enable-recovery")
    m = re.search(r"rank 1: names rank (\d): (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert m.group(1) == "2", r.stdout  # the first failure, not rank 0 that died of it
    assert "rank 0, which this rank needed for" in m.group(2), r.stdout
