"""RINGWORLD_TCP_CHECKSUM=1 turns per-frame checksums on for a launched job's TCP transport."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

PROGRAM = """
import numpy as np, ringworld
comm = ringworld.init()
transport = comm._engine.transports[0]
a = np.arange(300000.0)
b = np.empty_like(a)
comm.allreduce(a, b, algorithm="ring")
assert (b == 2 * a).all()
print(f"rank {comm.rank} checksum {transport._checksum}", flush=True)
"""


@pytest.mark.parametrize("flag", ["1", "0"])
def test_the_variable_reaches_the_transport(tmp_path: Path, flag: str) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = {**os.environ, "RINGWORLD_TCP_CHECKSUM": flag}
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", "--transport",
                        "tcp", str(prog)], capture_output=True, text=True, timeout=60,
                       check=False, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    want = "True" if flag == "1" else "False"
    assert sorted(r.stdout.split("\n")[:2]) == [f"rank 0 checksum {want}",
                                                f"rank 1 checksum {want}"]
