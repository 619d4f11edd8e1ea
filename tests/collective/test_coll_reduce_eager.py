"""Small reduces and their repeats' runners. Where ranks share cores a small reduce goes through
the eager rings (``shm_eager_reduce.reduce_eager``; its runner ``shm_repeat._reduce_root`` at the
root, a gather's put elsewhere): each other rank puts its vector in its ring and returns, the
root combines them in rank order as they are stamped. Elsewhere it takes the slots, one sync
(its runner ``shm_repeat._allreduce`` with a root). Checked on 2, 3 and 5 forked ranks, crowded
and not: every dtype and every op defined on it (a non-commutative one in rank order), every
root, the root in place, counts 0, 1, 7 and the most the slots' rule takes (and one element
more: the windows' chunked path), each called three times (the third runs the runner); shapes
repeated past the rings' length with other eager calls between; then, crowded, a sender whose
call differs (size, op) fails the root with MismatchError naming it, and every rank by its next
synced call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from coll_support import ALL_DTYPES, MINIMAL_DTYPES, OPS, check, ops_for, reference, values

import ringworld
from ringworld import runtime
from ringworld.algorithms.shm_policy import EAGER_RING
from ringworld.errors import MismatchError, PeerFailure
from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=[False, True], ids=["roomy", "crowded"])
def crowded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Ranks with cores of their own, or sharing them (forked: they see the patched count)."""
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if request.param else 64)
    return bool(request.param)


def _reduce(comm: ringworld.Communicator, op: str, dt: np.dtype[Any], n: int, root: int,
            in_place: bool, what: str, errors: list[str]) -> None:
    """One reduce of every rank's ``values``, checked at the root against the rank-order
    fold; the others' send buffers must stay untouched."""
    r, p = comm.rank, comm.size
    mine = values(r, n, dt, op)
    send = mine.copy()
    recv = np.empty(n, dt) if r == root else None
    if in_place and r == root:
        assert recv is not None
        recv[...] = mine
        comm.reduce(ringworld.IN_PLACE, recv, OPS[op], root)
    else:
        comm.reduce(send, recv, OPS[op], root)
    if r == root:
        assert recv is not None
        try:
            check(recv, reference(op, dt, n, tuple(range(p))), what)
        except AssertionError as exc:
            errors.append(str(exc))
    elif not np.array_equal(send.view(np.uint8), mine.view(np.uint8)):
        errors.append(f"{what}: rank {r}'s sendbuf changed")


def _matrix(comm: ringworld.Communicator, crowded: bool) -> list[str]:
    p = comm.size
    errors: list[str] = []
    comm.allreduce(np.ones(1), np.zeros(1))  # (maps the windows)
    arena: Any = comm._arena
    if p > 1 and arena.crowded != crowded:
        return [f"rank {comm.rank}: the windows' crowded is {arena.crowded}"]
    roots = sorted({0, p // 2, p - 1})
    # (more ranks than this machine may have cores, spinning as if they had their own: a
    # smaller set of dtypes, for time)
    for dt in ALL_DTYPES if crowded or p == 2 else MINIMAL_DTYPES:
        most = (arena.small_reduce if p > 1 else 64) // dt.itemsize
        for op in ops_for(dt):
            for n in (0, 1, 7, most, most + 1):
                for root in roots:
                    for in_place in (False, True):
                        for k in range(3):  # checked, kept; the runner made; the runner
                            what = (f"reduce {dt} {op} n={n} root={root} in_place={in_place}"
                                    f" call {k}")
                            _reduce(comm, op, dt, n, root, in_place, what, errors)
                        if errors:
                            return errors
    return errors


# (5 ranks spinning as if each had a core take minutes on a small machine: roomy windows'
# combining in rank order beyond two ranks is covered at 3)
@pytest.mark.parametrize(("size", "crowded"),
                         [(2, False), (3, False), (2, True), (3, True), (5, True)])
def test_every_dtype_op_root_and_count(size: int, crowded: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    results = run_processes(size, _matrix, crowded, transport="shm", timeout=170)
    assert [e for errs in results for e in errs] == []


def _repeats(comm: ringworld.Communicator) -> list[str]:
    """Repeats of a few shapes past the rings' length, roots changing, with broadcasts and
    gathers (which take the same rings) between them, in an order the same on every rank."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    shapes = [("sum", np.dtype(np.int64), 5), ("affine", ALL_DTYPES[-1], 3),
              ("max", np.dtype(np.float32), 1000)]
    for k in range(3 * EAGER_RING):
        op, dt, n = shapes[k % len(shapes)]
        root = (k // 3) % p
        _reduce(comm, op, dt, n, root, k % 4 == 0, f"repeat {k}", errors)
        if k % 5 == 0:
            buf = np.arange(4) + k if r == root else np.zeros(4, np.int64)
            comm.bcast(buf, root)
            if buf.tolist() != list(range(k, k + 4)):
                errors.append(f"bcast after repeat {k}: {buf}")
        if k % 7 == 0:
            out = np.empty(2 * p, np.int64) if r == 0 else None
            comm.gather(np.full(2, r, np.int64), out, 0)
            if out is not None and out.tolist() != [i for i in range(p) for _ in range(2)]:
                errors.append(f"gather after repeat {k}: {out}")
    return errors


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.usefixtures("crowded")
def test_repeats_wrap_the_rings_beside_other_eager_calls(size: int) -> None:
    results = run_processes(size, _repeats, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []


def _mismatch(comm: ringworld.Communicator, kind: str) -> str:
    """Rank 2 sends a longer vector (``kind`` "size") or passes another op ("op"): the root
    (rank 0) raises MismatchError naming rank 2 and saying what differs; the others, whose
    part was done, learn of it by their next synced call (MismatchError, or PeerFailure once
    a rank that failed has left), as a small gather's senders do."""
    r = comm.rank
    comm.allreduce(np.ones(2), np.empty(2), timeout=20)
    n = 5 if kind == "size" and r == 2 else 4
    op = ringworld.MAX if kind == "op" and r == 2 else ringworld.SUM
    try:
        comm.reduce(np.ones(n) * (r + 1), np.empty(4) if r == 0 else None, op, 0, timeout=20)
        comm.allreduce(np.ones(2), np.empty(2), timeout=20)
        return "ok"
    except MismatchError as exc:
        return f"mismatch: {exc}"
    except PeerFailure as exc:
        return f"peer failure: {exc}"


@pytest.mark.parametrize("kind", ["size", "op"])
def test_a_sender_that_differs_fails_the_root_naming_it_and_then_every_rank(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)  # (crowded: the eager rings)
    results = run_processes(3, _mismatch, kind, transport="shm", timeout=120)
    assert "rank 2, a sender, sent something else" in results[0], results
    assert all(res.startswith(("mismatch:", "peer failure:")) for res in results), results
