"""ringworld.MPI's Sendrecv and Isendrecv with one array as both buffers send what it held
(see tests/comm/test_sendrecv_overlap.py): through the plain-array path and the checked one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(120)


def _ring(comm: Any, n: int) -> list[bool]:
    from ringworld import MPI

    world = MPI.COMM_WORLD
    p, r = world.Get_size(), world.Get_rank()
    right, left = (r + 1) % p, (r - 1) % p
    expect = np.arange(n) + 1000 * left
    ok = []
    for _ in range(3):
        x = np.arange(n, dtype=np.float64) + 1000 * r
        world.Sendrecv(x, right, 0, x, left, 0)
        ok.append(bool(np.array_equal(x, expect)))
        x = np.arange(n, dtype=np.float64) + 1000 * r
        world.Sendrecv([x, MPI.DOUBLE], right, 0, [x, n, MPI.DOUBLE], left, 0)  # checked
        ok.append(bool(np.array_equal(x, expect)))
        x = np.arange(n, dtype=np.float64) + 1000 * r
        world.Isendrecv(x, right, 0, x, left, 0).Wait()
        ok.append(bool(np.array_equal(x, expect)))
    return ok


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [4, 1 << 17])
def test_sendrecv_on_one_array(transport: str, n: int) -> None:
    for rank, ok in enumerate(run_processes(3, _ring, n, transport=transport, timeout=100)):
        assert all(ok), f"rank {rank}: {ok}"
