"""Scatterv and gatherv on two ranks with cores of their own take the eager rings (no sync)
where the other rank's block is over VECTOR_EAGER_FROM and up to VECTOR_EAGER_TO bytes, the
slots elsewhere (``shm_policy.vector_eager``): the data is right on either side of both
edges, first calls and repeats alike, and a disagreement whose sides fall on different paths
fails both ranks with a MismatchError that says what happened, never a wrong result or a hang."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld import runtime
from ringworld.algorithms import shm_policy
from ringworld.algorithms.shm_policy import VECTOR_EAGER_FROM, VECTOR_EAGER_TO
from ringworld.errors import MismatchError
from ringworld.testing import run_processes

_F4 = 4  # bytes of a float32
# the other rank's block, in float32 elements: on either side of both edges, and inside
_EDGES = [VECTOR_EAGER_FROM // _F4, VECTOR_EAGER_FROM // _F4 + 1, 8192,
          VECTOR_EAGER_TO // _F4, VECTOR_EAGER_TO // _F4 + 1]


def _eager_now(n: int) -> bool:
    return VECTOR_EAGER_FROM < n * _F4 <= VECTOR_EAGER_TO


def _block(i: int, n: int, k: int) -> np.ndarray:
    """Rank i's block of n float32 in round k (unique per element, rank and round)."""
    return (np.arange(n) * 3 + i * 1_000_003 + k * 7).astype(np.float32)


def _steps(comm: ringworld.Communicator) -> tuple[int, int]:
    """(the windows' syncs, their eager calls) so far: which path a call took."""
    a: Any = comm._arena
    return a.epoch, a._bseq


def _pair(comm: ringworld.Communicator) -> list[str]:
    r = comm.rank
    errors: list[str] = []
    warm = np.zeros(1)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    if comm._arena is None or comm._arena.crowded:
        return [f"rank {r}: no uncrowded windows ({comm._arena})"]
    for n in _EDGES:
        for root in (0, 1):
            # the root's own block is short and the other's is n: the other block decides
            counts = [n, n]
            counts[root] = 3
            displs = [counts[1] + 5, 0] if root == 0 else [0, counts[0] + 2]
            length = max(d + c for d, c in zip(displs, counts, strict=True)) + 1
            for k in range(4):  # the first call, then repeats (a runner from the second)
                before = _steps(comm)
                send = _block(r, counts[r], k)
                recv = np.full(length, -1, np.float32) if r == root else None
                comm.gatherv(send, recv, counts, displs, root=root)
                after = _steps(comm)
                eager = after[0] == before[0] and after[1] > before[1]
                if eager != _eager_now(n):
                    errors.append(f"gatherv n={n} root={root} round {k}: steps {before} -> "
                                  f"{after}")
                if recv is not None:
                    want = np.full(length, -1, np.float32)
                    for i in (0, 1):
                        want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k)
                    if not np.array_equal(recv, want):
                        errors.append(f"gatherv n={n} root={root} round {k}: wrong data")
                whole = np.full(length, -1, np.float32)
                for i in (0, 1):
                    whole[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k + 50)
                out = np.full(counts[r], -1, np.float32)
                before = _steps(comm)
                comm.scatterv(whole if r == root else None, out, counts, displs, root=root)
                after = _steps(comm)
                eager = after[0] == before[0] and after[1] > before[1]
                if eager != _eager_now(n):
                    errors.append(f"scatterv n={n} root={root} round {k}: steps {before} -> "
                                  f"{after}")
                if not np.array_equal(out, _block(r, counts[r], k + 50)):
                    errors.append(f"scatterv n={n} root={root} round {k}: wrong data")
    return errors


def test_pair_scatterv_and_gatherv_take_the_rings_between_the_edges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 64)  # (cores of their own, anywhere)
    assert run_processes(2, _pair, timeout=120) == [[], []]


def _straddle(comm: ringworld.Communicator, coll: str, root_n: int, other_n: int) -> list[str]:
    """The root counts ``root_n`` elements for rank 1's block, rank 1 ``other_n``: what each
    rank raised, in this call and in the next."""
    r = comm.rank
    warm = np.zeros(1)
    comm.allreduce(warm.copy(), warm)
    counts, displs = [root_n, root_n], [0, root_n]
    seen: list[str] = []
    for step in ("call", "next"):
        try:
            if step == "next":
                comm.allreduce(warm.copy(), warm)
            elif coll == "gatherv" and r == 0:
                comm.gatherv(np.ones(root_n, np.float32), np.zeros(2 * root_n, np.float32),
                             counts, displs, root=0)
            elif coll == "gatherv":
                comm.gatherv(np.ones(other_n, np.float32), None, None, None, root=0)
            elif r == 0:
                comm.scatterv(np.ones(2 * root_n, np.float32), np.zeros(root_n, np.float32),
                              counts, displs, root=0)
            else:
                comm.scatterv(None, np.zeros(other_n, np.float32), None, None, root=0)
            seen.append(f"{step}: returned")
        except MismatchError as exc:
            seen.append(f"{step}: {exc}")
    return seen


@pytest.mark.parametrize("coll", ["gatherv", "scatterv"])
def test_counts_on_either_side_of_the_edge_fail_both_ranks(
        coll: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 64)
    inside, below = 8192, 2  # the rings' size and the slots'
    # the rings' rank waits for the other, which waits at the call's sync: both fail there
    # (the rings' rank for a gatherv is the root, for a scatterv rank 1)
    root_n, other_n = (inside, below) if coll == "gatherv" else (below, inside)
    out = run_processes(2, _straddle, coll, root_n, other_n, timeout=60)
    waiting = out[0] if coll == "gatherv" else out[1]
    assert "waits at this call's sync instead of making" in waiting[0], out
    assert "given other sizes than this rank" in waiting[0], out
    for seen in out:
        assert seen[0].startswith("call: ") and "returned" not in seen[0], out
        assert "returned" not in seen[1], out  # (the communicator knows it broke)
    # the other way round, the rings' rank returns at once (its part is done) and fails at
    # its next call; the slots' rank fails in this one (whichever of the two sees it first,
    # the other fails with its message), both told the ranks are at different calls
    root_n, other_n = other_n, root_n
    out = run_processes(2, _straddle, coll, root_n, other_n, timeout=60)
    ahead, behind = (1, 0) if coll == "gatherv" else (0, 1)
    assert out[ahead][0] == "call: returned", out
    # (the rank that sees it first raises; the other fails with the first 192 bytes of that)
    for seen in (out[ahead][1], out[behind][0]):
        assert "the ranks are at different calls (rank 0: #" in seen, out
    numbers = {int(i): int(n) for i, n in re.findall(r"rank (\d): #(\d+)", out[ahead][1])}
    assert numbers[ahead] == numbers[behind] + 1, out  # (the rank ahead at its next call)
    assert "a rank leaves a call without a sync" in out[ahead][1], out
    assert "returned" not in out[behind][1], out


@pytest.mark.parametrize(("nbytes", "p", "room", "want"), [
    (VECTOR_EAGER_FROM, 2, 1 << 20, False), (VECTOR_EAGER_FROM + 1, 2, 1 << 20, True),
    (VECTOR_EAGER_TO, 2, 1 << 20, True), (VECTOR_EAGER_TO + 1, 2, 1 << 20, False),
    (32 << 10, 3, 1 << 20, False), (32 << 10, 2, 32 << 10, True), (32 << 10, 2, 31 << 10, False),
    (0, 2, 1 << 20, False), (8, 2, 1 << 20, False)])
def test_vector_eager_edges(nbytes: int, p: int, room: int, want: bool) -> None:
    assert shm_policy.vector_eager(nbytes, p, room) is want
