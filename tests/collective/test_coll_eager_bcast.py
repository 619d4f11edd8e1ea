"""Shared-memory broadcasts of up to EAGER_MAX bytes through the root's eager ring
(``Arena.eager_bcast``): the root returns once its data is in the ring, up to EAGER_RING
small (EAGER_BIG large) broadcasts ahead of the slowest rank; every rank still gets every
broadcast, in order, and disagreements still fail.

Ranks are forked (``run_processes``); each checks every element of every broadcast itself and
returns what it found wrong."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from coll_support import RING_POLICY

import ringworld
from ringworld import runtime
from ringworld.algorithms import shm_collectives as shm
from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(120)


def _data(k: int, root: int, n: int, dtype: Any) -> np.ndarray[Any, Any]:
    """Broadcast number ``k``'s data from ``root``: unique per element, call and root."""
    return ((np.arange(n) * 7 + k * 1009 + root * 131) % 251).astype(dtype)


def _many_job(comm: ringworld.Communicator, calls: int, slow: int) -> list[str]:
    """``calls`` broadcasts of varying size, dtype and root; rank ``slow`` dawdles now and then,
    so that the roots run ahead and the ring wraps around while entries wait to be read."""
    wrong = []
    dtypes = [np.float64, np.int32, np.uint8, np.complex64, np.float16, np.bool_]
    for k in range(calls):
        dtype = dtypes[k % len(dtypes)]
        item = np.dtype(dtype).itemsize
        n = [0, 1, 3, 1000, shm.SMALL // item, shm.EAGER_MAX // item,
             shm.EAGER_MAX // item - 7][k % 7]
        root = (k // 3) % comm.size
        want = _data(k, root, n, dtype)
        buf = want.copy() if comm.rank == root else np.zeros(n, dtype)
        if comm.rank == slow and k % 5 == 0:  # (sizes cycle by 7: it hits them all)
            time.sleep(0.02)
        comm.bcast(buf, root=root)
        if comm.last_algorithm != "shm":
            wrong.append(f"call {k}: took {comm.last_algorithm}")
        if not np.array_equal(buf, want):
            wrong.append(f"call {k} (n={n}, {np.dtype(dtype)}, root {root}): "
                         f"{int(np.sum(buf != want))} elements wrong")
    grid = np.arange(12.0).reshape(3, 4) if comm.rank == 0 else np.zeros((3, 4))
    comm.bcast(grid, root=0)  # a 2-D buffer
    if not np.array_equal(grid, np.arange(12.0).reshape(3, 4)):
        wrong.append("2-D buffer")
    total = np.empty(1)
    comm.allreduce(np.ones(1), total)  # a synced collective after them: the ranks agree
    if total[0] != comm.size:
        wrong.append(f"allreduce after: {total[0]}")
    return wrong


@pytest.mark.parametrize("size", [2, 3, 5])
def test_every_rank_gets_every_broadcast_while_roots_run_ahead(size: int) -> None:
    calls = 4 * shm.EAGER_RING + 5
    results = run_processes(size, _many_job, calls, size - 1, timeout=100)
    assert results == [[]] * size


def _ahead_job(comm: ringworld.Communicator, late: float, n: int) -> tuple[float, float]:
    """Rank 1 starts ``late`` seconds after rank 0; rank 0 times the broadcasts of ``n``
    doubles the ring holds (EAGER_RING small ones, EAGER_BIG large ones: no reader needed)
    and the next one (which needs the first read)."""
    comm.selector.shm_policy = RING_POLICY  # (the ring whatever the machine)
    buf = np.arange(float(n))
    depth = shm.EAGER_RING if buf.nbytes <= shm.EAGER_SMALL else shm.EAGER_BIG
    comm.bcast(buf.copy(), root=0)  # maps the windows; both ranks are here
    if comm.rank == 1:
        time.sleep(late)
    t0 = time.perf_counter()
    for _ in range(depth):
        comm.bcast(buf if comm.rank == 0 else np.zeros(n), root=0)
    t1 = time.perf_counter()
    comm.bcast(buf if comm.rank == 0 else np.zeros(n), root=0)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


@pytest.mark.parametrize("n", [16, shm.EAGER_MAX // 8])
def test_the_root_returns_without_waiting_until_the_ring_is_full(n: int) -> None:
    late = 2.0
    (filled, next_one), _ = run_processes(2, _ahead_job, late, n, timeout=60)
    assert filled < late / 2  # a ring's worth of broadcasts, none of them read yet
    assert next_one > late / 2  # the next one waited for the reader to free an entry


def _mismatch_job(comm: ringworld.Communicator, kind: str) -> str:
    r = comm.rank
    buf = np.arange(8.0)
    # the windows first: a disagreement in the call that sets them up is caught there, as a
    # mismatch of their signed set-up barriers
    comm.allreduce(np.ones(2), np.empty(2), timeout=10)
    try:
        if kind == "roots":  # each rank thinks it is the root, twice
            comm.bcast(buf, root=r, timeout=10)
            comm.bcast(buf, root=r, timeout=10)
        elif kind == "count":  # rank 0 broadcasts once more than rank 1
            if r == 0:
                comm.bcast(buf, root=0, timeout=10)
        elif kind == "size":
            comm.bcast(np.arange(8.0 + r), root=0, timeout=10)
        elif kind == "collective":  # rank 1 broadcasts, rank 0 reduces
            if r == 1:
                comm.bcast(buf, root=0, timeout=10)
            else:
                comm.allreduce(buf, np.empty(8), timeout=10)
        elif kind == "gather roots":  # small gathers take the rings too (here: crowded)
            comm.gather(buf, np.empty(16), root=r, timeout=10)
        elif kind == "gather size":
            comm.gather(np.arange(8.0 + r), np.empty(16) if r == 0 else None, timeout=10)
        # a root that returned at once learns of it in its next synced call, where the ranks'
        # broadcasts are compared (or its peer is gone by then)
        comm.allreduce(np.ones(2), np.empty(2), timeout=10)
        return "ok"
    except ringworld.MismatchError as exc:
        return f"mismatch: {exc}"
    except ringworld.PeerFailure as exc:  # the peer left after its mismatch
        return f"peer failure: {exc}"


@pytest.mark.parametrize("kind", ["roots", "count", "size", "collective", "gather roots",
                                  "gather size"])
def test_disagreements_fail_as_mismatches(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind.startswith("gather"):  # small gathers take the rings where ranks share cores:
        monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)  # (inherited by the ranks)
    results = run_processes(2, _mismatch_job, kind, timeout=60)
    assert any(res.startswith("mismatch:") for res in results), results
    assert all(res.startswith(("mismatch:", "peer failure:")) for res in results), results
    if kind == "roots":  # the later root sees the other's stamp (or both do)
        assert any("ranks 0 and 1 both called it as the root" in res
                   or "ranks 1 and 0 both" in res for res in results), results
    if kind == "count":  # the next sync compares the ranks' broadcasts
        assert all("made different small broadcasts before it" in res for res in results), \
            results
    if kind == "size":  # the reader finds the root's stamp is another call's
        assert "broadcast something else" in results[1], results
    if kind == "collective":  # the reader finds the root went on to a synced call
        assert "without making this broadcast" in results[1], results
    if kind.startswith("gather"):  # a root finds the other's block is another call's
        assert any("sent something else" in res for res in results), results


def _stalled_job(comm: ringworld.Communicator, who: str) -> str:
    """The root (``who`` = "root") or the reader stops taking part; the other's wait ends in a
    Timeout naming what it waited for."""
    buf = np.zeros(8)
    comm.bcast(buf, root=0)
    stalled = 0 if who == "root" else 1
    if comm.rank == stalled:
        time.sleep(4)
        return "stalled"
    try:  # the root needs EAGER_RING + 1 broadcasts to wait: the ring is full then
        for _ in range(1 if who == "root" else shm.EAGER_RING + 1):
            comm.bcast(buf, root=0, timeout=1.5)
    except ringworld.Timeout as exc:
        return f"timeout: {exc}"
    return "returned"


@pytest.mark.parametrize("who", ["root", "reader"])
def test_a_stalled_peer_is_a_timeout_naming_it(who: str) -> None:
    results = run_processes(2, _stalled_job, who, timeout=60)
    waiter = results[1] if who == "root" else results[0]
    assert waiter.startswith("timeout: "), results
    if who == "root":
        assert "waiting for rank 0's broadcast" in waiter, results
    else:
        assert "to take broadcast 2 out of the ring" in waiter, results


def _gather_behind_broadcasts(comm: ringworld.Communicator) -> str:
    """Rank 0 broadcasts as far ahead as the ring lets it, then roots a small gather, whose
    stamp goes where a broadcast the slow reader has yet to take had its own."""
    r = comm.rank
    comm.allreduce(np.ones(2), np.empty(2), timeout=10)  # maps the shared windows
    bufs = [np.full(4, float(k)) if r == 0 else np.zeros(4) for k in range(2 * shm.EAGER_RING - 1)]
    for k, buf in enumerate(bufs):
        if r == 1 and k == shm.EAGER_RING - 1:
            time.sleep(0.5)  # rank 0 runs a full ring ahead meanwhile
        comm.bcast(buf, root=0, timeout=10)
    out = np.zeros(2 * 3) if r == 0 else None
    comm.gather(np.arange(3.0) + 10 * r, out, root=0, timeout=10)
    if any(not np.array_equal(buf, np.full(4, float(k))) for k, buf in enumerate(bufs)):
        return "wrong broadcast"
    if r == 0 and not np.array_equal(out, [0.0, 1, 2, 10, 11, 12]):
        return f"wrong gather {out}"
    return "ok"


def test_a_gather_root_does_not_stamp_over_a_broadcast_not_yet_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)  # crowded: the gather's rings
    assert run_processes(2, _gather_behind_broadcasts, timeout=60) == ["ok", "ok"]
