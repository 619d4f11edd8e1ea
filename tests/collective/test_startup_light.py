"""Start-up stays light: init() and a first barrier on several ranks load no numpy."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_init_and_a_barrier_load_no_numpy(transport: str) -> None:
    code = ("import sys, ringworld\nc = ringworld.init()\nc.barrier()\n"
            "print(c.rank, 'numpy' in sys.modules, flush=True)\n")
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "3", "--transport",
                        transport, "-c", code], capture_output=True, text=True, timeout=50,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 False", "1 False", "2 False"]
