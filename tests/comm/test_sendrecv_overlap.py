"""sendrecv with one buffer as both its send and receive buffer (or overlapping views) sends
what the buffer held: it used to post the receive first and send from the buffer after, so a
message that landed first (a ring of ranks, each sendrecv(x, right, x, left)) was sent on in
its place, at every size, over shared memory and TCP. The send now reads a copy where the
buffers may share memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ringworld.comm.point_to_point import may_overlap
from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(120)


def _ring(comm: Any, n: int) -> list[bool]:
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    ok = []
    for _ in range(4):
        x = np.arange(n, dtype=np.float64) + 1000 * r
        comm.sendrecv(x, right, x, left)  # the same array
        ok.append(bool(np.array_equal(x, np.arange(n) + 1000 * left)))
        y = np.arange(n + 1, dtype=np.float64) + 1000 * r
        comm.sendrecv(y[:-1], right, y[1:], left)  # overlapping views
        ok.append(bool(np.array_equal(y[1:], np.arange(n) + 1000 * left)))
    return ok


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [4, 65536, 1 << 20])
def test_a_ring_of_sendrecv_on_one_buffer_passes_what_it_held(transport: str, n: int) -> None:
    for rank, ok in enumerate(run_processes(3, _ring, n, transport=transport, timeout=100)):
        assert all(ok), f"rank {rank}: {ok}"


def test_may_overlap() -> None:
    a, b = np.zeros(8), np.zeros(8)
    assert may_overlap(a, a) and may_overlap(a, a[2:]) and may_overlap(a[:5], a[4:])
    assert not may_overlap(a, b) and not may_overlap(a[:4], a[4:])
    raw = bytearray(16)
    assert may_overlap(raw, memoryview(raw)[8:])  # one exporter: counted as overlapping
    assert not may_overlap(raw, bytearray(16)) and not may_overlap(b"x", bytearray(1))
