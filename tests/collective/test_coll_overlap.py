"""A send buffer that shares memory with the receive buffer (passed apart, not as IN_PLACE)
gives the right result: the same array as both (alltoall(x, x), allreduce(x, x)), a view of
it, a block of the receive buffer that is not this rank's own. alltoall(x, x) returned another
rank's partly overwritten data over TCP at every size and over shared memory for large
messages, and so did an allgather from the receive buffer's first block, a scatter into
another block of the root's send buffer and an alltoallw between blocks of one array; the
checks now read such a send buffer from a copy,
and a repeat on such arrays takes the checked path again (not the kept one, which would read
the caller's arrays). MPI calls them erroneous; MPICH refuses the very same buffer twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ringworld.testing import run_processes, run_threads

pytestmark = pytest.mark.timeout(180)


def _cases(c: Any, n: int) -> dict[str, Callable[[], bool]]:
    p, r = c.size, c.rank

    def own(q: int) -> np.ndarray:  # rank q's data, unique per element
        return np.arange(n, dtype=np.float64) * (q + 1) + q

    def blocks(q: int) -> np.ndarray:  # rank q's p blocks, block j for rank j
        return np.concatenate([own(q) + 1000 * j for j in range(p)])

    everyone = np.concatenate([own(q) for q in range(p)])
    mine_from_all = np.concatenate([own(q) + 1000 * r for q in range(p)])
    total = sum(own(q) for q in range(p))

    def allreduce_same() -> bool:
        x = own(r)
        c.allreduce(x, x)
        return np.array_equal(x, total)

    def allreduce_shifted() -> bool:
        x = np.concatenate([own(r), [0.0]])
        c.allreduce(x[:-1], x[1:])
        return np.array_equal(x[1:], total)

    def scan_same() -> bool:
        x = own(r)
        c.scan(x, x)
        return np.array_equal(x, sum(own(q) for q in range(r + 1)))

    def reduce_same() -> bool:
        x = own(r)
        c.reduce(x, x if r == 0 else None, root=0)
        return r != 0 or np.array_equal(x, total)

    def alltoall_same() -> bool:
        x = blocks(r)
        c.alltoall(x, x)
        return np.array_equal(x, mine_from_all)

    def alltoall_view() -> bool:
        x = blocks(r)
        c.alltoall(x[:], x)
        return np.array_equal(x, mine_from_all)

    def alltoallv_same() -> bool:
        x = blocks(r)
        c.alltoallv(x, x, [n] * p, [n] * p)
        return np.array_equal(x, mine_from_all)

    def alltoallw_blocks_of_one_array() -> bool:  # send block j, receive block i: one array
        x = blocks(r)
        c.alltoallw([x[j * n : (j + 1) * n] for j in range(p)],
                    [x[i * n : (i + 1) * n] for i in range(p)])
        return np.array_equal(x, mine_from_all)

    def alltoallw_same_arrays() -> bool:
        parts = [own(r) + 1000 * j for j in range(p)]
        c.alltoallw(parts, parts)
        return np.array_equal(np.concatenate(parts), mine_from_all)

    def reduce_scatter_first_block() -> bool:
        x = blocks(r)
        c.reduce_scatter_block(x, x[:n])
        return np.array_equal(x[:n], sum(own(q) + 1000 * r for q in range(p)))

    def allgather_first_block() -> bool:
        buf = np.zeros(n * p)
        buf[:n] = own(r)
        c.allgather(buf[:n], buf)
        return np.array_equal(buf, everyone)

    def allgatherv_last_block() -> bool:
        buf = np.zeros(n * p)
        buf[-n:] = own(r)
        c.allgatherv(buf[-n:], buf, [n] * p)
        return np.array_equal(buf, everyone)

    def gather_root_last_block() -> bool:
        buf = np.zeros(n * p)
        buf[-n:] = own(r)
        c.gather(buf[-n:] if r == 0 else own(r), buf if r == 0 else None, root=0)
        return r != 0 or np.array_equal(buf, everyone)

    def scatter_root_other_block() -> bool:
        x = np.concatenate([own(j) for j in range(p)])
        if r == 0:
            c.scatter(x, x[n : 2 * n], root=0)
            return np.array_equal(x[n : 2 * n], own(0))
        y = np.zeros(n)
        c.scatter(None, y, root=0)
        return np.array_equal(y, own(r))

    def scatterv_root_other_block() -> bool:
        x = np.concatenate([own(j) for j in range(p)])
        if r == 0:
            c.scatterv(x, x[n : 2 * n], [n] * p, root=0)
            return np.array_equal(x[n : 2 * n], own(0))
        y = np.zeros(n)
        c.scatterv(None, y, None, root=0)
        return np.array_equal(y, own(r))

    def repeats() -> bool:  # the kept paths: the same arrays again, and new views each call
        ok = True
        x = np.empty(n * p)
        for _ in range(3):
            x[:] = blocks(r)
            c.alltoall(x, x)
            ok = ok and np.array_equal(x, mine_from_all)
        for _ in range(3):
            y = blocks(r)
            c.alltoall(y[:], y)
            ok = ok and np.array_equal(y, mine_from_all)
        for _ in range(3):
            buf = np.zeros(n * p)
            buf[:n] = own(r)
            c.allgatherv(buf[:n], buf, [n] * p)
            ok = ok and np.array_equal(buf, everyone)
        for _ in range(3):
            z = own(r)
            c.allreduce(z, z)
            ok = ok and np.array_equal(z, total)
        return ok

    return {name: fn for name, fn in locals().items()
            if callable(fn) and name not in ("own", "blocks")}


def _run_all(comm: Any, n: int) -> dict[str, str]:
    out = {}
    for name, case in _cases(comm, n).items():
        try:
            out[name] = "ok" if case() else "wrong data"
        except Exception as exc:  # the outcome is the point
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _check(results: list[dict[str, str]]) -> None:
    bad = {(rank, name): got for rank, found in enumerate(results)
           for name, got in found.items() if got != "ok"}
    assert not bad, bad


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [4, 65536])
def test_overlapping_buffers_give_the_right_result(transport: str, n: int) -> None:
    _check(run_processes(3, _run_all, n, transport=transport, timeout=150))


@pytest.mark.parametrize("size", [2, 5])
def test_overlapping_buffers_between_threads(size: int) -> None:
    _check(run_threads(size, _run_all, 1000, timeout=120))


def _mpi_alltoall_same(comm: Any) -> bool:
    from ringworld import MPI

    world = MPI.COMM_WORLD
    p, r = world.Get_size(), world.Get_rank()
    x = np.concatenate([np.arange(5.0) + 100 * r + 10 * j for j in range(p)])
    ok = True
    for _ in range(3):  # (the MPI layer's repeat path too)
        y = x.copy()
        world.Alltoall(y, y)
        ok = ok and np.array_equal(y, np.concatenate([np.arange(5.0) + 100 * q + 10 * r
                                                      for q in range(p)]))
    return ok


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_mpi_alltoall_of_one_array(transport: str) -> None:
    assert run_processes(3, _mpi_alltoall_same, transport=transport, timeout=90) == [True] * 3
