"""Blocking collectives that run on messages (over TCP; in-process ranks) are kept for the
repeat path as those in the shared windows are (``core.OnMessages``): a call repeated on the
same arrays, or on new arrays of its shape, runs its schedule again without the checks. The
results stay right as the caller moves between the same arrays, fresh ones, ``IN_PLACE`` and
one array passed as both (each kept under its own key), as roots and ops change, for counts
0, 1 and not divisible by the size; a rank off the root that passes no recvbuf keeps its
sendbuf untouched. A repeat still finds a disagreement between ranks, refuses a bad timeout
locally and a freed communicator. The ranks' small blocks are taken straight from the stream
(``CollectiveRequest._start_taking``): a block of the wrong length is left to the general
path, which reports it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.collective.core import OnMessages
from ringworld.testing import run_processes, run_threads

Check = Callable[[], str | None]
ORDER = ["same", "same", "fresh", "both", "same", "inplace", "fresh", "both", "inplace", "same"]


def _data(q: int, count: int, k: int, dtype: Any) -> np.ndarray:
    """Rank ``q``'s input in round ``k``: unique per element, rank and round."""
    return (np.arange(count) * 7 + q * 1000 + k * 13 + 1).astype(dtype)


class _Arrays:
    """Arrays per (collective, role) that stay the same ("same") or are made anew."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, str], np.ndarray] = {}

    def get(self, key: tuple[str, str], count: int, dtype: Any, fresh: bool) -> np.ndarray:
        a = self.kept.get(key)
        if fresh or a is None or a.size != count or a.dtype != np.dtype(dtype):
            a = np.empty(count, dtype)
            if not fresh:
                self.kept[key] = a
        return a


def _round(comm: ringworld.Communicator, k: int, how: str, n: int, dtype: Any,
           arrays: _Arrays) -> list[str]:
    """One call of every collective in mode ``how``; the errors found."""
    p, r = comm.size, comm.rank
    fresh = how == "fresh"
    errors: list[str] = []
    mine = _data(r, n, k, dtype)
    total = sum((_data(q, n, k, dtype) for q in range(p)), np.zeros(n, dtype))

    def arr(name: str, count: int) -> np.ndarray:
        return arrays.get((name, how), count, dtype, fresh)

    def expect(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            errors.append(f"{what} ({how}, round {k}, n={n}, {np.dtype(dtype)}): {got} != {want}")

    # allreduce, scan: in place, one array as both, or two arrays
    for name, want in (("allreduce", total),
                       ("scan", sum((_data(q, n, k, dtype) for q in range(r + 1)),
                                    np.zeros(n, dtype)))):
        call = getattr(comm, name)
        recv = arr(f"{name}.recv", n)
        if how in ("inplace", "both"):
            recv[:] = mine
            call(ringworld.IN_PLACE if how == "inplace" else recv, recv)
        else:
            send = arr(f"{name}.send", n)
            send[:] = mine
            call(send, recv)
            expect(f"{name} sendbuf", send, mine)
        expect(name, recv, want)
    root = k % p
    # bcast (its one buffer is always both)
    buf = arr("bcast", n)
    buf[:] = mine if r == root else -1
    comm.bcast(buf, root)
    expect("bcast", buf, _data(root, n, k, dtype))
    # reduce: off the root, no recvbuf in odd rounds (kept under the sendbuf), else an
    # ignored one; the sendbuf comes out untouched
    send = arr("reduce.send", n)
    send[:] = mine
    if r == root:
        recv = arr("reduce.recv", n)
        if how == "inplace":
            recv[:] = mine
            comm.reduce(ringworld.IN_PLACE, recv, ringworld.SUM, root)
        else:
            comm.reduce(send, recv, ringworld.SUM, root)
        expect("reduce", recv, total)
    else:
        ignored = None if k % 2 else arr("reduce.recv", n)
        if ignored is not None:
            ignored[:] = -3
        comm.reduce(send, send if how == "both" else ignored, ringworld.SUM, root)
        if ignored is not None:
            expect("reduce's ignored recvbuf", ignored, np.full(n, -3, dtype))
    expect("reduce sendbuf", send, mine)
    # the blocked collectives: block j of rank q is _data(q, n * p, k)[j * n:(j + 1) * n]
    whole = [_data(q, n * p, k, dtype) for q in range(p)]
    send, recv = arr("allgather.send", n), arr("allgather.recv", n * p)
    send[:] = mine
    comm.allgather(send, recv)
    expect("allgather", recv, np.concatenate([_data(q, n, k, dtype) for q in range(p)]))
    send, recv = arr("alltoall.send", n * p), arr("alltoall.recv", n * p)
    send[:] = whole[r]
    comm.alltoall(send, recv)
    expect("alltoall", recv, np.concatenate([whole[q][r * n:(r + 1) * n] for q in range(p)]))
    send, recv = arr("rsb.send", n * p), arr("rsb.recv", n)
    send[:] = whole[r]
    comm.reduce_scatter_block(send, recv)
    expect("reduce_scatter_block", recv,
           sum((w[r * n:(r + 1) * n] for w in whole), np.zeros(n, dtype)))
    send = arr("gather.send", n)
    send[:] = mine
    recv = arr("gather.recv", n * p)
    recv[:] = -5
    comm.gather(send, recv, root)
    expect("gather", recv, np.concatenate([_data(q, n, k, dtype) for q in range(p)])
           if r == root else np.full(n * p, -5, dtype))
    send, recv = arr("scatter.send", n * p), arr("scatter.recv", n)
    send[:] = whole[root] if r == root else -6
    comm.scatter(send, recv, root)
    expect("scatter", recv, whole[root][r * n:(r + 1) * n])
    return errors


def _repeats(comm: ringworld.Communicator) -> list[str]:
    errors: list[str] = []
    arrays = _Arrays()
    k = 0
    for n in (5, 1, 0, 7):
        for dtype in (np.int64, np.float32):
            for how in ORDER:
                errors += _round(comm, k, how, n, dtype, arrays)
                k += 1
    if comm.size > 1:  # the repeats ran on messages, kept (not on the checked path each call)
        last = comm._cache.last
        for coll in ("allreduce", "scan", "bcast", "reduce", "allgather", "alltoall",
                     "reduce_scatter_block", "gather", "scatter"):
            run = last[coll][5] if coll in last else None
            if type(run) is not OnMessages:
                errors.append(f"{coll}: its last call was not kept on messages ({run!r})")
        if comm.last_algorithm in ("shm", ""):
            errors.append(f"last algorithm {comm.last_algorithm!r}: not on messages")
    return errors


#: two schedules per collective, forced as RINGWORLD_ALGORITHMS does (in-process ranks would
#: run small calls in the shared windows); over TCP the selector chooses
FORCED = {
    "trees": (("allreduce", "recursive_doubling"), ("scan", "recursive_doubling"),
              ("bcast", "binomial"), ("reduce", "binomial"), ("allgather", "ring"),
              ("alltoall", "pairwise"), ("reduce_scatter_block", "pairwise"),
              ("gather", "binomial"), ("scatter", "binomial")),
    "rings": (("allreduce", "ring"), ("scan", "linear"), ("bcast", "linear"),
              ("reduce", "linear"), ("allgather", "bruck"), ("alltoall", "bruck"),
              ("reduce_scatter_block", "ring"), ("gather", "linear"), ("scatter", "linear")),
}


@pytest.mark.parametrize("forced", sorted(FORCED))
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeats_on_messages_stay_right_in_process(size: int, forced: str) -> None:
    results = run_threads(size, _repeats, timeout=120, algorithms=FORCED[forced])
    assert [e for errs in results for e in errs] == []


@pytest.mark.parametrize("size", [2, 3])
def test_repeats_over_tcp_stay_right(size: int) -> None:
    results = run_processes(size, _repeats, transport="tcp", timeout=120)
    assert [e for errs in results for e in errs] == []


def test_repeats_on_shared_memory_messages_stay_right() -> None:
    """Schedules forced over the shared-memory transport: its take of a block, too."""
    env = {"RINGWORLD_ALGORITHMS": ",".join(f"{c}:{a}" for c, a in FORCED["trees"])}
    results = run_processes(3, _repeats, transport="shm", timeout=120, env=env)
    assert [e for errs in results for e in errs] == []


def _mismatch(comm: ringworld.Communicator) -> list[str]:
    """Both ranks repeat a kept allreduce; then rank 1 calls it on a longer vector, and after
    that on the same arrays seen as another dtype: every rank fails, none returns data."""
    out: list[str] = []
    a, b = np.arange(4, dtype=np.int64), np.empty(4, dtype=np.int64)
    for _ in range(3):
        comm.allreduce(a, b)
    x, y = (np.arange(5, dtype=np.int64), np.empty(5, dtype=np.int64)) if comm.rank else (a, b)
    try:
        comm.allreduce(x, y, timeout=20)
        out.append("a longer vector on one rank: no error")
    except ringworld.MismatchError as exc:
        out.append(type(exc).__name__)
    return out


def test_a_kept_call_still_finds_a_disagreement() -> None:
    results = run_processes(2, _mismatch, transport="tcp", timeout=60)
    assert results == [["MismatchError"], ["MismatchError"]], results


def _local_errors(comm: ringworld.Communicator) -> list[str]:
    """A bad timeout on a repeat is refused before the call takes its number (the next call
    lines up on every rank); a freed duplicate refuses its kept call."""
    errors: list[str] = []
    a = np.arange(3, dtype=np.float64) + comm.rank
    b = np.empty(3)
    for _ in range(3):
        comm.allreduce(a, b)
    try:
        comm.allreduce(a, b, timeout=-1.0)
        errors.append("a negative timeout was accepted")
    except ValueError:
        pass
    comm.allreduce(a, b, timeout=20)
    if not np.array_equal(b, sum(np.arange(3.0) + q for q in range(comm.size))):
        errors.append(f"after the refused timeout: {b}")
    dup = comm.dup()
    for _ in range(2):
        dup.allreduce(a, b)
    dup.free()
    try:
        dup.allreduce(a, b)
        errors.append("a freed communicator ran its kept call")
    except ringworld.CommError as exc:
        if "freed" not in str(exc):
            errors.append(f"unclear: {exc}")
    return errors


def test_a_kept_call_refuses_a_bad_timeout_and_a_freed_communicator() -> None:
    results = run_processes(3, _local_errors, transport="tcp", timeout=60)
    assert [e for errs in results for e in errs] == []


def _mpi_bcast(comm: ringworld.Communicator) -> list[str]:
    """ringworld.MPI's Bcast runs the call on the buffer's bytes and keeps it under a key whose
    repeats pass the typed array: a repeat runs the schedule on the bytes, as the call did
    (its counts are bytes), and the data come out right."""
    from ringworld import MPI
    from ringworld.algorithms import executor

    errors: list[str] = []
    dtypes: list[list[str]] = []
    made = executor.CollectiveRequest.__init__

    def spy(self: Any, chan: Any, sched: Any, arrays: Any, *args: Any, **kw: Any) -> None:
        dtypes.append([a.dtype.str for a in arrays if a.size])
        made(self, chan, sched, arrays, *args, **kw)

    executor.CollectiveRequest.__init__ = spy  # type: ignore[method-assign]
    try:
        world = MPI.COMM_WORLD
        for k in range(6):
            buf = (np.arange(9, dtype=np.float64) + k if comm.rank == k % 2
                   else np.zeros(9))
            world.Bcast(buf, k % 2)
            if not np.array_equal(buf, np.arange(9, dtype=np.float64) + k):
                errors.append(f"round {k}: {buf}")
    finally:
        executor.CollectiveRequest.__init__ = made  # type: ignore[method-assign]
    if type(comm._cache.last["bcast"][5]) is not OnMessages:
        errors.append("Bcast was not kept on messages")
    if not dtypes or any(d != ["|u1"] for d in dtypes):
        errors.append(f"schedules ran on {dtypes}, not on the bytes")
    return errors


def test_an_adapter_call_on_bytes_repeats_on_bytes() -> None:
    results = run_processes(2, _mpi_bcast, transport="tcp", timeout=60)
    assert [e for errs in results for e in errs] == []


def _vrepeats(comm: ringworld.Communicator) -> list[str]:
    """The v-variants repeated on messages (kept in ``CallCache.vector``): rank q's block has
    q + 1 or q + 2 elements, the counts changing every third call (a call of other counts
    takes the checked path), on the same arrays or fresh ones; the side a rank does not pass
    is None."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    kept = {}

    def expect(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            errors.append(f"{what}: {got} != {want}")

    for k in range(18):
        fresh = k % 3 == 2
        c = [q + 1 + (k // 3) % 2 for q in range(p)]
        d = [sum(c[:q]) for q in range(p)]
        total = sum(c)
        root = (k // 6) % p

        def arr(name: str, n: int, c: tuple[int, ...] = tuple(c),
                fresh: bool = fresh) -> np.ndarray:
            key = (name, n, c)
            if fresh or key not in kept:
                kept[key] = np.empty(n, np.int64)
            return kept[key]

        mine = np.arange(c[r], dtype=np.int64) + 100 * r + k
        blocks = [np.arange(c[q], dtype=np.int64) + 100 * q + k for q in range(p)]
        send, recv = arr("agv.s", c[r]), arr("agv.r", total)
        send[:] = mine
        comm.allgatherv(send, recv, c, d)
        expect(f"allgatherv {k}", recv, np.concatenate(blocks))
        send = arr("gv.s", c[r])
        send[:] = mine
        recv = arr("gv.r", total) if r == root else None
        comm.gatherv(send, recv, c if r == root else None, d if r == root else None, root)
        if recv is not None:
            expect(f"gatherv {k}", recv, np.concatenate(blocks))
        src = arr("sv.s", total) if r == root else None
        if src is not None:
            src[:] = np.concatenate(blocks)
        got = arr("sv.r", c[r])
        comm.scatterv(src, got, c if r == root else None, d if r == root else None, root)
        expect(f"scatterv {k}", got, blocks[r])
        # alltoallv: rank r sends c[q] elements to rank q, each 1000 r + 10 q + i
        out = arr("atv.s", total)
        out[:] = np.concatenate([np.arange(c[q]) + 1000 * r + 10 * q + k for q in range(p)])
        into = arr("atv.r", c[r] * p, (c[r], p))
        comm.alltoallv(out, into, c, [c[r]] * p)
        expect(f"alltoallv {k}", into,
               np.concatenate([np.arange(c[r]) + 1000 * q + 10 * r + k for q in range(p)]))
        whole = arr("rs.s", total)
        whole[:] = np.arange(total) * (r + 1) + k
        part = arr("rs.r", c[r])
        comm.reduce_scatter(whole, part, c)
        expect(f"reduce_scatter {k}", part,
               sum(np.arange(total) * (q + 1) + k for q in range(p))[d[r]:d[r] + c[r]])
    if p > 1:
        for coll in ("allgatherv", "gatherv", "scatterv", "alltoallv", "reduce_scatter"):
            entry = comm._cache.vector.get(coll)
            if entry is None or entry[4] is not None or type(entry[10]) is not OnMessages:
                errors.append(f"{coll}: not kept on messages ({entry and entry[10]!r})")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_vector_repeats_on_messages_stay_right(size: int) -> None:
    results = run_processes(size, _vrepeats, transport="tcp", timeout=120)
    assert [e for errs in results for e in errs] == []


@pytest.mark.parametrize("size", [2, 5])
def test_vector_repeats_on_messages_stay_right_in_process(size: int) -> None:
    forced = (("allgatherv", "ring"), ("gatherv", "linear"), ("scatterv", "linear"),
              ("alltoallv", "pairwise"), ("reduce_scatter", "pairwise"))
    results = run_threads(size, _vrepeats, timeout=120, algorithms=forced)
    assert [e for errs in results for e in errs] == []


def _empty_side(comm: ringworld.Communicator) -> list[str]:
    """A kept call whose array is empty holds no view of the user's memory: rank 0's block is
    an empty slice of a larger array, which is freed once the caller drops it."""
    import gc
    import weakref

    errors: list[str] = []
    local = np.arange(1000, dtype=np.int64)
    gone = weakref.ref(local)
    out = np.empty(4, np.int64)
    mine = local[:0] if comm.rank == 0 else np.arange(4, dtype=np.int64)
    for _ in range(3):
        comm.allgatherv(mine, out, [0, 4])
        if not np.array_equal(out, np.arange(4)):
            errors.append(f"allgatherv: {out}")
    entry = comm._cache.vector.get("allgatherv")
    if entry is None or type(entry[10]) is not OnMessages:
        errors.append("allgatherv was not kept on messages")
    del local, mine
    gc.collect()
    if gone() is not None:
        errors.append(f"rank {comm.rank}: the kept call holds the user's array")
    return errors


def test_a_kept_call_holds_no_user_memory() -> None:
    results = run_processes(2, _empty_side, transport="tcp", timeout=60)
    assert [e for errs in results for e in errs] == []


def _odd_root(comm: ringworld.Communicator) -> list[str]:
    """A kept call keyed on root 1 is no repeat for a root of True or 1.0, which equal 1: the
    checks refuse those (TypeError) on the shared windows' path and on messages alike, on every
    rank, and the communicator goes on."""
    errors: list[str] = []
    buf = np.arange(4, dtype=np.float64) if comm.rank == 1 else np.zeros(4)
    for _ in range(3):
        comm.bcast(buf, 1)
    for odd in (True, 1.0):
        try:
            comm.bcast(buf, odd)  # type: ignore[arg-type]
            errors.append(f"root {odd!r} was accepted")
        except TypeError:
            pass
    comm.bcast(buf, 1)
    if not np.array_equal(buf, np.arange(4.0)):
        errors.append(f"after the refusals: {buf}")
    return errors


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_root_that_only_equals_the_kept_one_is_refused(transport: str) -> None:
    results = run_processes(2, _odd_root, transport=transport, timeout=60)
    assert [e for errs in results for e in errs] == []
