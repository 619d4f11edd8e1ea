"""Alltoalls whose blocks take the slots' split steps (from ``shm_policy.OWN_APART`` bytes a
block: the others' blocks into this rank's slot, its own straight across while the others copy
theirs in), on the first call and on the runner of its repeats, beside blocks just below that
size: right data for every rank, in place too, and a rank with another block size fails every
rank with a MismatchError while the communicator stays usable."""

from __future__ import annotations

import numpy as np
import pytest

import ringworld
from ringworld.algorithms.shm_policy import OWN_APART, SLOT
from ringworld.testing import run_processes


def _blocks(p: int, r: int, n: int, dtype: type, k: int) -> np.ndarray:
    """Rank r's send buffer of call k: p blocks of n, unique per element, rank and call."""
    base = np.arange(p * n, dtype=np.int64) * 3 + r * 1_000_003 + k * 17
    return (base % 251).astype(dtype) if np.dtype(dtype).itemsize == 1 else base.astype(dtype)


def _want(p: int, r: int, n: int, dtype: type, k: int) -> np.ndarray:
    return np.concatenate([_blocks(p, i, n, dtype, k)[r * n : (r + 1) * n] for i in range(p)])


def _split(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    for dtype in (np.uint8, np.float64):
        size = np.dtype(dtype).itemsize
        top = SLOT // p // size  # the largest block that still fits the slots
        for n in (OWN_APART // size - 1, OWN_APART // size, top):
            send = np.empty(p * n, dtype=dtype)
            recv = np.empty(p * n, dtype=dtype)
            for k in range(4):  # the first call's steps, then the runner's
                send[:] = _blocks(p, r, n, dtype, k)
                recv[:] = 0
                comm.alltoall(send, recv)
                if not np.array_equal(recv, _want(p, r, n, dtype, k)):
                    bad = int(np.flatnonzero(recv != _want(p, r, n, dtype, k))[0])
                    errors.append(f"{dtype.__name__} blocks of {n}, call {k}: element {bad}")
            if comm.last_algorithm != "shm":
                errors.append(f"blocks of {n} ran {comm.last_algorithm}, not shm")
            for k in range(4, 6):  # in place: the same buffer sends and receives
                recv[:] = _blocks(p, r, n, dtype, k)
                comm.alltoall(ringworld.IN_PLACE, recv)
                if not np.array_equal(recv, _want(p, r, n, dtype, k)):
                    errors.append(f"{dtype.__name__} blocks of {n} in place, call {k}")
    # another block size on the last rank: every rank fails, naming the disagreement
    n = OWN_APART // 8
    m = n if r != p - 1 else n + 1
    try:
        comm.alltoall(np.zeros(p * m), np.zeros(p * m), timeout=30)
        errors.append("alltoall with another block size on one rank was accepted")
    except ringworld.MismatchError:
        pass
    except ringworld.CommError as exc:  # (a sibling of the mismatch: it still names it)
        if "mismatch" not in str(exc).lower() and "differ" not in str(exc):
            errors.append(f"block sizes that differ failed unclearly: {exc!r}")
    send = _blocks(p, r, n, np.float64, 9)
    recv = np.empty(p * n)
    comm.alltoall(send, recv, timeout=30)
    if not np.array_equal(recv, _want(p, r, n, np.float64, 9)):
        errors.append("alltoall after the mismatch: wrong data")
    return errors


@pytest.mark.parametrize("size", [2, 3])
def test_alltoall_split_through_the_slots(size: int) -> None:
    results = run_processes(size, _split, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []
