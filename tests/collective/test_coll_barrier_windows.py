"""Barriers in the shared windows: a communicator that runs only barriers maps its windows
after BARRIERS_ON_MESSAGES of them (on messages till then), and its repeats take a short path
(``CollectiveCore.barrier``) that must still be a barrier: no rank leaves before every rank has
entered, a rank in another call is a MismatchError on every rank, a dead rank a PeerFailure
naming it. Each check runs where ranks have cores of their own and where they share them."""

from __future__ import annotations

import mmap
import time

import numpy as np
import pytest

import ringworld
from ringworld import runtime
from ringworld.errors import MismatchError, PeerFailure
from ringworld.testing import run_processes
from ringworld.tuning.select import BARRIERS_ON_MESSAGES

pytestmark = pytest.mark.timeout(120)
ROUNDS = 40


@pytest.fixture(params=[False, True], ids=["roomy", "crowded"])
def crowded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Ranks with cores of their own, or sharing them (the ranks are forked: they see the
    patched count)."""
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if request.param else 64)
    return bool(request.param)


def _barriers(comm: ringworld.Communicator, board: mmap.mmap) -> list[str]:
    """Rounds of barriers: in round k one rank (k % p) sleeps, then writes k into its word
    of ``board`` (shared by the forked ranks) before the barrier; after it, every rank must
    read k there. The path each barrier took is checked too."""
    p, r = comm.size, comm.rank
    words = memoryview(board).cast("q")
    errors: list[str] = []
    for k in range(1, ROUNDS + 1):
        late = k % p
        if r == late:
            time.sleep(0.002 if k % 5 else 0.03)
            words[late] = k
        comm.barrier()
        if words[late] != k:
            errors.append(f"round {k}: rank {r} left the barrier before rank {late} entered")
        want = "dissemination" if k <= BARRIERS_ON_MESSAGES else "shm"
        if comm.last_algorithm != want:
            errors.append(f"round {k}: ran {comm.last_algorithm}, want {want}")
    return errors


@pytest.mark.parametrize("size", [2, 3, 5])
def test_barriers_map_the_windows_and_still_wait_for_every_rank(size: int,
                                                                 crowded: bool) -> None:
    board = mmap.mmap(-1, 8 * size)
    results = run_processes(size, _barriers, board, transport="shm", timeout=100)
    assert [e for errs in results for e in errs] == []


def _mismatch(comm: ringworld.Communicator) -> list[str]:
    """Barriers in the windows, then rank 1 calls an allreduce where the others repeat the
    barrier: every rank raises MismatchError naming its own call and rank 1's;
    the communicator stays usable (an allreduce and barriers after it)."""
    r = comm.rank
    for _ in range(BARRIERS_ON_MESSAGES + 3):
        comm.barrier()
    out: list[str] = []
    try:
        if r == 1:
            comm.allreduce(np.ones(2), np.empty(2), timeout=20)
        else:
            comm.barrier()
        out.append(f"rank {r}: no error")
    except MismatchError as exc:
        own = "allreduce float64 sum, 16 bytes" if r == 1 else "barrier, 0 bytes"
        if (f"this rank: {own}" not in str(exc)
                or "rank 1: allreduce float64 sum, 16 bytes" not in str(exc)):
            out.append(f"rank {r}: {exc}")
    got = np.empty(2)
    comm.allreduce(np.full(2, float(r)), got, timeout=20)
    if got.tolist() != [float(sum(range(comm.size)))] * 2:
        out.append(f"rank {r}: allreduce after the mismatch gave {got}")
    for _ in range(3):
        comm.barrier()
    return out


def test_a_rank_in_another_call_fails_every_rank_and_leaves_it_usable(crowded: bool) -> None:
    assert run_processes(3, _mismatch, transport="shm", timeout=100) == [[]] * 3


def _leaves(comm: ringworld.Communicator) -> str:
    """Barriers in the windows; then rank 2 leaves (finalizes and exits) while the others
    wait in the next one."""
    for _ in range(BARRIERS_ON_MESSAGES + 3):
        comm.barrier()
    if comm.rank == 2:
        return "left"
    try:
        comm.barrier()
    except PeerFailure as exc:
        return f"{comm.last_algorithm}: {exc}"
    return "no error"


def test_a_rank_that_leaves_fails_the_barrier_naming_it(crowded: bool) -> None:
    results = run_processes(3, _leaves, transport="shm", timeout=60)
    assert results[2] == "left"
    for r in (0, 1):
        assert results[r].startswith("shm: ") and "rank 2" in results[r], results[r]
