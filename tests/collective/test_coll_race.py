"""The race between the direct and the window paths of the shared-memory alltoall, allgather and
reduce_scatter_block (``Arena.race``): rank 0 times both, every rank takes the one it picks.

The bookkeeping (:class:`shm._Race`) is checked on made-up times; the collectives run on forked
ranks with one path slowed down on purpose, so that the other must win, and every call's result
is checked, as is every rank taking the same path on every call."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.algorithms import shm_collectives as shm
from ringworld.testing import run_processes
from ringworld.tuning.shm_paths import DEFAULT


def _raced_from(nbytes: int, **more: Any) -> shm.Policy:
    """The default policy, with every raced collective raced from ``nbytes`` (and the slots
    taken only up to SMALL: their size reaches past the buffers raced here)."""
    more.setdefault("slot_max", shm.SMALL)
    return dataclasses.replace(DEFAULT, race_min=dict.fromkeys(shm.RACED, nbytes), **more)


def _feed(rec: Any, calls: int, cost: Callable[[bool], float]) -> list[bool]:
    """Run ``calls`` calls the way Arena.race does (the path of a call is planned while the
    one before it runs, its time not yet in); return the paths taken (True: direct)."""
    taken: list[bool] = []
    planned = rec.plan()
    for _ in range(calls):
        pick, planned = planned, rec.plan()
        rec.add(pick, cost(pick))
        taken.append(pick)
    return taken


def test_race_starts_on_the_default_then_tries_the_other() -> None:
    rec = shm._Race(True)
    taken = _feed(rec, 8, lambda direct: 1.0 if direct else 2.0)
    assert taken[:shm.RACE_TRY] == [True] * shm.RACE_TRY  # the default first
    assert False in taken[shm.RACE_TRY : 2 * shm.RACE_TRY + 1]  # then the other, for a time
    assert rec.best is True and taken[-2:] == [True, True]


def test_race_elects_the_faster_path_and_keeps_it() -> None:
    rec = shm._Race(True)
    taken = _feed(rec, 400, lambda direct: 3.0 if direct else 1.0)
    assert rec.best is False
    tail = taken[100:]
    # the loser is tried again now and then, less often while it keeps losing
    assert 0 < tail.count(True) <= len(tail) * shm.RACE_TRY // shm.RACE_LAST + shm.RACE_TRY
    assert rec.gap == shm.RACE_LAST


def test_tries_of_a_much_slower_path_are_rare() -> None:
    rec = shm._Race(True)
    taken = _feed(rec, 600, lambda direct: 1.0 if direct else 2.0)
    # the first try, then gaps of at least RACE_TRY * (2 - 1) / RACE_COST calls
    assert taken[: 2 * shm.RACE_TRY + 2].count(False) == shm.RACE_TRY
    spent = taken.count(False)
    assert spent <= shm.RACE_TRY * (1 + 600 * shm.RACE_COST / shm.RACE_TRY), taken
    assert spent * (2.0 - 1.0) <= 600 * 2 * shm.RACE_COST  # the time lost to tries
    rec = shm._Race(True)  # a near tie: tried far more often
    assert _feed(rec, 600, lambda direct: 1.0 if direct else 1.05).count(False) > spent


def test_race_follows_the_machine_when_it_changes_speed() -> None:
    rec = shm._Race(True)
    speeds = {"window": 1.0}

    def cost(direct: bool) -> float:
        return 2.0 if direct else speeds["window"]

    taken = _feed(rec, 200, cost)
    assert rec.best is False and taken[-1] is False
    speeds["window"] = 5.0  # the window copies slow down (on the reference VM: 2-3x)
    taken = _feed(rec, 10, cost)  # the best's median rises past the other's: tried at once
    assert rec.best is True and taken[-3:] == [True] * 3
    speeds["window"] = 1.0  # and recover: found at the next try, at most RACE_LAST calls on
    taken = _feed(rec, shm.RACE_LAST + 2 * shm.RACE_TRY + 2, cost)
    assert rec.best is False and taken[-1] is False


def test_one_slow_outlier_does_not_flip_the_choice() -> None:
    rec = shm._Race(True)
    _feed(rec, 30, lambda direct: 1.0 if direct else 2.0)
    rec.add(True, 50.0)  # one call preempted: the median of the last three stays low
    assert rec.best is True and rec.plan() is True


def test_a_try_that_is_only_noise_does_not_take_over() -> None:
    rec = shm._Race(True)
    times = iter([1.0, 1.1, 0.95, 1.05] * 100)  # both paths alike, within 10%
    taken = _feed(rec, 200, lambda direct: next(times))
    assert rec.best is True and taken[100:].count(True) >= 90


SLOW = 0.004  # seconds added to every call of the path made slow


def _race_job(comm: ringworld.Communicator, slow: str, policy: shm.Policy) -> dict[str, Any]:
    """Many calls of each raced collective, one path slowed; returns the paths taken per call
    and the wrong results found."""
    comm.selector.shm_policy = policy  # before the windows are mapped
    p, r = comm.size, comm.rank
    paths: list[str] = []
    race = shm.Arena.race

    def racing(self: shm.Arena, kind: int, nbytes: int, default: bool) -> bool:
        direct = race(self, kind, nbytes, default)
        path = "direct" if direct else "window"
        paths.append(path)
        if path == slow:
            time.sleep(SLOW)  # inside rank 0's timing, which starts in race()
        return direct

    shm.Arena.race = racing  # type: ignore[method-assign]
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    arena.crowded = False  # on every rank alike: 3 ranks on 2 cores would not race
    errors: list[str] = []
    n = 3001  # elements per block (int64: 24 KB, raced from 4 KiB here)
    taken: dict[str, list[str]] = {}
    for coll in ("alltoall", "allgather", "reduce_scatter_block"):
        start = len(paths)
        for it in range(40):
            base = np.arange(p * n, dtype=np.int64) * 7 + it * 1_000_003
            if coll == "alltoall":
                send = base + r * 100_000_019
                recv = np.full(p * n, -1, dtype=np.int64)
                comm.alltoall(send, recv)
                want = np.concatenate([(base + i * 100_000_019)[r * n : (r + 1) * n]
                                       for i in range(p)])
            elif coll == "allgather":
                send = base[:n] + r * 100_000_019
                recv = np.full(p * n, -1, dtype=np.int64)
                comm.allgather(send, recv)
                want = np.concatenate([base[:n] + i * 100_000_019 for i in range(p)])
            else:
                send = base + r * 100_000_019
                recv = np.full(n, -1, dtype=np.int64)
                comm.reduce_scatter_block(send, recv)
                want = sum(base[r * n : (r + 1) * n] + i * 100_000_019 for i in range(p))
            if not np.array_equal(recv, want):
                errors.append(f"{coll} call {it} rank {r}: "
                              f"{np.count_nonzero(recv != want)} wrong")
        taken[coll] = paths[start:]
    return {"taken": taken, "errors": errors, "direct": bool(arena.direct)}


@pytest.mark.parametrize("slow", ["direct", "window"])
@pytest.mark.parametrize("size", [2, 3])
def test_every_rank_takes_the_path_rank_0_finds_faster(size: int, slow: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    results = run_processes(size, _race_job, slow, _raced_from(4096), transport="shm",
                            timeout=120)
    if not all(res["direct"] for res in results):
        pytest.skip("this machine does not let ranks read each other's memory")
    assert [e for res in results for e in res["errors"]] == []
    fast = "window" if slow == "direct" else "direct"
    for coll in ("alltoall", "allgather", "reduce_scatter_block"):
        seqs = [res["taken"][coll] for res in results]
        assert all(s == seqs[0] for s in seqs), f"{coll}: ranks took different paths: {seqs}"
        seq = seqs[0]
        assert len(seq) == 40  # every call raced
        assert slow in seq[:8], f"{coll}: the slow path was never tried: {seq}"
        # after the first tries the fast path carries every call but two more tries (at most:
        # gaps of 4 and 8 calls after the tries lost, then 16)
        assert seq[12:].count(slow) <= 2 * shm.RACE_TRY, f"{coll}: {seq}"
        assert fast in seq[-shm.RACE_TRY - 1 :]


def _off_job(comm: ringworld.Communicator, crowded: bool,
             policy: shm.Policy) -> tuple[int, bool, bool]:
    comm.selector.shm_policy = policy
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    arena.crowded = crowded
    send = np.arange(comm.size * 100_000, dtype=np.int64) + comm.rank
    recv = np.empty_like(send)
    for _ in range(6):
        comm.alltoall(send, recv)
    want = np.concatenate([np.arange(comm.size * 100_000)[comm.rank * 100_000 :][:100_000] + i
                           for i in range(comm.size)])
    return len(arena._race_log), bool(np.array_equal(recv, want)), bool(arena.direct)


@pytest.mark.parametrize(("race", "crowded"), [(False, False), (True, True)])
def test_no_race_when_off_or_crowded(race: bool, crowded: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    results = run_processes(2, _off_job, crowded, _raced_from(4096, race=race),
                            transport="shm", timeout=60)
    assert [r[:2] for r in results] == [(0, True), (0, True)]


def test_no_race_from_race_max_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # the job's alltoall moves 1.6 MB per rank
    results = run_processes(2, _off_job, False, _raced_from(4096, race_max=64 << 10),
                            transport="shm", timeout=60)
    assert [r[:2] for r in results] == [(0, True), (0, True)]


def test_race_on_and_not_crowded_races(monkeypatch: pytest.MonkeyPatch) -> None:
    results = run_processes(2, _off_job, False, _raced_from(4096), transport="shm", timeout=60)
    if not results[0][2]:
        pytest.skip("this machine does not let ranks read each other's memory")
    assert [r[:2] for r in results] == [(1, True), (0, True)]  # rank 0 keeps the times


def _after_mismatch(comm: ringworld.Communicator, policy: shm.Policy) -> dict[str, Any]:
    """A mismatched alltoall (rank 0 raced, the others below race_min), then raced calls with
    the window path (the default at these sizes) slowed, so that rank 0's picks leave it."""
    comm.selector.shm_policy = policy
    p, r = comm.size, comm.rank
    paths: list[str] = []
    race = shm.Arena.race

    def racing(self: shm.Arena, kind: int, nbytes: int, default: bool) -> bool:
        direct = race(self, kind, nbytes, default)
        if nbytes >= policy.race_min[shm.RACED[kind]]:
            paths.append("direct" if direct else "window")
            if not direct:
                time.sleep(SLOW)
        return direct

    shm.Arena.race = racing  # type: ignore[method-assign]
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)
    arena: Any = comm._arena
    arena.crowded = False
    errors: list[str] = []
    n = 3001
    for it in range(12):
        send = np.arange(p * n, dtype=np.int64) + r * 100_000_019 + it
        recv = np.empty_like(send)
        comm.alltoall(send, recv)
    bad = 3001 if r == 0 else 300  # int64 blocks of 24 KB on rank 0, 2.4 KB elsewhere
    try:
        comm.alltoall(np.zeros(p * bad, dtype=np.int64), np.zeros(p * bad, dtype=np.int64),
                      timeout=20)
        errors.append("no MismatchError")
    except ringworld.MismatchError:
        pass
    start = len(paths)
    for it in range(30):
        send = np.arange(p * n, dtype=np.int64) * 3 + r * 100_000_019 + it
        recv = np.full(p * n, -1, dtype=np.int64)
        comm.alltoall(send, recv, timeout=20)
        want = np.concatenate([(np.arange(p * n, dtype=np.int64) * 3 + i * 100_000_019
                                + it)[r * n : (r + 1) * n] for i in range(p)])
        if not np.array_equal(recv, want):
            errors.append(f"call {it} rank {r}: {np.count_nonzero(recv != want)} wrong")
    return {"errors": errors, "paths": paths[start:], "direct": bool(arena.direct)}


def test_ranks_agree_on_the_paths_after_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    results = run_processes(2, _after_mismatch, _raced_from(16384), transport="shm",
                            timeout=120)
    if not all(res["direct"] for res in results):
        pytest.skip("this machine does not let ranks read each other's memory")
    assert [e for res in results for e in res["errors"]] == []
    assert results[0]["paths"] == results[1]["paths"]
    assert "direct" in results[0]["paths"]  # the picks left the default (windows)
