"""A small allreduce repeated on the same arrays skips its checks (the communicator keeps weak
references to the last call's buffers): the results stay right when the data changes, when the
arrays' dtype or writability change in place, when the call switches to and from ``IN_PLACE``,
and when the arrays are freed and new ones take their place."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ringworld
from ringworld.testing import run_processes


def _expect(p: int, k: int, n: int, dtype: type) -> np.ndarray:
    return sum((np.arange(n) * 7 + i * 1000 + k) for i in range(p)).astype(dtype)


def _repeat(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 5
    send = np.empty(n, dtype=np.int64)
    recv = np.full(n, -1, dtype=np.int64)
    for k in range(20):  # the same arrays, new data each time
        send[:] = np.arange(n) * 7 + r * 1000 + k
        comm.allreduce(send, recv)
        if not np.array_equal(recv, _expect(p, k, n, np.int64)):
            errors.append(f"repeat {k}: {recv}")
    if comm.size > 1 and comm.last_algorithm != "shm":
        errors.append(f"small allreduce ran {comm.last_algorithm}, not shm")
    # in place with the cached recvbuf, then out of place again
    recv[:] = np.arange(n) * 7 + r * 1000 + 50
    comm.allreduce(ringworld.IN_PLACE, recv)
    if not np.array_equal(recv, _expect(p, 50, n, np.int64)):
        errors.append(f"in place: {recv}")
    send[:] = np.arange(n) * 7 + r * 1000 + 51
    comm.allreduce(send, recv)
    if not np.array_equal(recv, _expect(p, 51, n, np.int64)):
        errors.append(f"out of place after in place: {recv}")
    # the dtype reassigned in place (same itemsize): float64 sums, not int64 ones
    send.dtype = np.float64
    recv.dtype = np.float64
    send[:] = np.arange(n) * 0.5 + r
    comm.allreduce(send, recv)
    want = sum(np.arange(n) * 0.5 + i for i in range(p))
    if not np.array_equal(recv, want):
        errors.append(f"after a dtype change: {recv} != {want}")
    # a bitwise op, then the same arrays turned to float: the op's dtype check still runs
    send.dtype = recv.dtype = np.int64
    send[:] = np.arange(n) + r
    comm.allreduce(send, recv, ringworld.BOR)
    send.dtype = recv.dtype = np.float64
    try:
        comm.allreduce(send, recv, ringworld.BOR)
        errors.append("bitwise or of float64 was accepted")
    except TypeError as exc:
        if "bitwise op bor needs an integer" not in str(exc):
            errors.append(f"bitwise or of float64 refused unclearly: {exc}")
    send[:] = np.arange(n) * 0.5 + r
    comm.allreduce(send, recv)
    # a 2-D view of the same memory
    grid = recv.reshape(1, n)
    comm.allreduce(ringworld.IN_PLACE, grid)
    if not np.array_equal(grid.ravel(), want * p):
        errors.append(f"2-D in place: {grid}")
    # recvbuf made read-only: a clear error, on every rank alike
    recv.flags.writeable = False
    try:
        comm.allreduce(send, recv)
        errors.append("a read-only recvbuf was accepted")
    except TypeError as exc:
        if "recvbuf is read-only" not in str(exc):
            errors.append(f"read-only error does not say so: {exc}")
    # a duplicate freed after a repeated call refuses the same call again
    dup = comm.dup()
    small_in, small_out = np.arange(3.0) + r, np.empty(3)
    for _ in range(2):
        dup.allreduce(small_in, small_out)
    dup.free()
    try:
        dup.allreduce(small_in, small_out)
        errors.append("a freed communicator ran a repeated allreduce")
    except ringworld.CommError as exc:
        if "freed" not in str(exc):
            errors.append(f"freed communicator error does not say so: {exc}")
    # freed arrays: new ones (maybe at the same addresses) with another dtype and size
    del send, recv, grid
    gc.collect()
    for k in range(3):
        send32 = (np.arange(n + 2) + r * 100 + k).astype(np.int32)
        recv32 = np.zeros(n + 2, dtype=np.int32)
        comm.allreduce(send32, recv32, ringworld.MAX)
        want32 = (np.arange(n + 2) + (p - 1) * 100 + k).astype(np.int32)
        if not np.array_equal(recv32, want32):
            errors.append(f"new arrays {k}: {recv32}")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeated_small_allreduce(size: int) -> None:
    results = run_processes(size, _repeat, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []
