"""Paths of the shared-memory collectives the broad matrix does not reach: direct reads (peers
copy straight out of each other's buffers, forced on small buffers by lowering the threshold in
the forked ranks), a streamed broadcast whose ranks disagree on the size, and a rank that leaves
while the others wait on a shared-memory sync."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.algorithms import shm
from ringworld.testing import run_processes


def _direct(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 5000 + 7  # elements per rank block: not a multiple of anything convenient
    mine = np.arange(n, dtype=np.float64) * 3 + r * 1_000_000
    everyone = [np.arange(n, dtype=np.float64) * 3 + i * 1_000_000 for i in range(p)]
    out = np.full(p * n, -1.0)
    comm.allgather(mine, out, algorithm="shm")
    if not np.array_equal(out, np.concatenate(everyone)):
        errors.append(f"allgather rank {r}")
    inplace = np.full(p * n, -1.0)
    inplace[r * n : (r + 1) * n] = mine
    comm.allgather(ringworld.IN_PLACE, inplace, algorithm="shm")
    if not np.array_equal(inplace, np.concatenate(everyone)):
        errors.append(f"allgather in place rank {r}")
    send = np.arange(p * n, dtype=np.int64) + r * 10_000_000
    recv = np.full(p * n, -1, dtype=np.int64)
    comm.alltoall(send, recv, algorithm="shm")
    want = np.concatenate([(np.arange(p * n, dtype=np.int64) + i * 10_000_000)[r * n:(r + 1) * n]
                           for i in range(p)])
    if not np.array_equal(recv, want):
        errors.append(f"alltoall rank {r}")
    for root in range(p):
        buf = mine.copy() if r == root else np.zeros(n)
        comm.bcast(buf, root, algorithm="shm")
        if not np.array_equal(buf, everyone[root]):
            errors.append(f"bcast root {root} rank {r}")
    arena: Any = comm._arena
    if arena is None or not arena.direct:
        errors.append(f"rank {r}: direct reads were not enabled")
    return errors


@pytest.mark.parametrize("size", [2, 3, 5])
def test_direct_reads(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm, "DIRECT_MIN_BCAST", 4096)  # inherited by the forked ranks
    monkeypatch.setattr(shm, "DIRECT_MIN_ALLTOALL", 4096)
    monkeypatch.setattr(shm, "DIRECT_MIN_ALLGATHER", 4096)
    results = run_processes(size, _direct, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _bcast_mismatch(comm: ringworld.Communicator) -> str:
    warm = np.zeros(100)
    comm.allreduce(warm.copy(), warm)  # maps the shared windows
    buf = np.zeros(100_000 + 8 * comm.rank)  # streamed broadcast, sizes disagree
    try:
        comm.bcast(buf, 0, algorithm="shm", timeout=20)
    except ringworld.MismatchError as exc:
        return str(exc)
    return "no error"


def test_streamed_bcast_mismatch_fails_every_rank() -> None:
    results = run_processes(3, _bcast_mismatch, transport="shm", timeout=60)
    assert all("expect" in r for r in results), results


def _leaves_early(comm: ringworld.Communicator, collective: str) -> str:
    warm = np.ones(1000)
    comm.allreduce(warm.copy(), warm)  # maps the shared windows
    if comm.rank == 1:
        return "left"  # exits without joining the next collective
    t = time.monotonic()
    try:
        if collective == "allreduce":
            comm.allreduce(np.ones(300_000), np.empty(300_000), algorithm="shm")
        else:
            comm.bcast(np.ones(300_000), 1, algorithm="shm")
    except ringworld.PeerFailure as exc:
        return f"{time.monotonic() - t:.1f}s {exc}"
    return "no error"


@pytest.mark.parametrize("collective", ["allreduce", "bcast"])
def test_a_rank_that_leaves_fails_the_shared_memory_collective(collective: str) -> None:
    results = run_processes(3, _leaves_early, collective, transport="shm", timeout=60)
    assert results[1] == "left"
    for r in (0, 2):
        seconds, _, message = results[r].partition(" ")
        assert "rank 1" in message and collective in message, results[r]
        assert float(seconds.rstrip("s")) < 5, results[r]
