"""Start-up stays light: init() and the first barriers on several ranks load no numpy (a
communicator's barriers map the shared windows, which load it, only after
BARRIERS_ON_MESSAGES of them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringworld.tuning.select import BARRIERS_ON_MESSAGES


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_init_and_the_first_barriers_load_no_numpy(transport: str) -> None:
    code = ("import sys, ringworld\nc = ringworld.init()\n"
            f"for _ in range({BARRIERS_ON_MESSAGES}):\n    c.barrier()\n"
            "print(c.rank, 'numpy' in sys.modules, flush=True)\n")
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "3", "--transport",
                        transport, "-c", code], capture_output=True, text=True, timeout=50,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 False", "1 False", "2 False"]
