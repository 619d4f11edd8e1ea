"""After ``ringworld.finalize()`` every communication of the rank raises CommBroken saying
so, through the repeat paths too, and ``ringworld.MPI`` says the same of its calls. (A send
found no route there and landed in the rank's own queue; a repeated collective ran on in the
shared windows, which stay mapped.)"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import ringworld
from ringworld.errors import CommBroken
from ringworld.testing import run_processes

WORDS = "ringworld.finalize() has run here"


def _after(comm: ringworld.Communicator) -> list[str]:
    r, p = comm.rank, comm.size
    peer = (r + 1) % p
    dup = comm.dup()
    x = np.arange(3, dtype=np.float64) + r
    y = np.empty(3)
    block = np.empty(1)
    for _ in range(4):  # kept: the next calls take the repeat paths
        comm.allreduce(x, y)
        dup.allreduce(x, y)
        comm.bcast(y, root=0)
        comm.barrier()
        comm.allgatherv(x[:1], np.empty(p), [1] * p, list(range(p)))
        comm.scatter(np.arange(p, dtype=np.float64), block, 0)
    from ringworld import MPI

    w = MPI.COMM_WORLD
    w.Allreduce(x, y)
    mdup = w.Dup()
    mdup.Allreduce(x, y)
    ringworld.finalize()
    calls: dict[str, Callable[[], object]] = {
        "allreduce": lambda: comm.allreduce(x, y),
        "allreduce on a dup": lambda: dup.allreduce(x, y),
        "bcast": lambda: comm.bcast(y, root=0),
        "barrier": comm.barrier,
        "allgatherv": lambda: comm.allgatherv(x[:1], np.empty(p), [1] * p, list(range(p))),
        "scatter": lambda: comm.scatter(np.arange(p, dtype=np.float64), block, 0),
        "send": lambda: comm.send(x, peer),
        "isend": lambda: comm.isend(x, peer).wait(),
        "recv": lambda: comm.recv(y, peer, timeout=5),
        "bcast_obj": lambda: comm.bcast_obj({"a": 1}, root=0),
        "dup": comm.dup,
        "MPI dup's Allreduce": lambda: mdup.Allreduce(x, y),
        "MPI.COMM_WORLD.Allreduce": lambda: w.Allreduce(x, y),  # (its native one, kept)
    }
    errors = []
    for name, call in calls.items():
        try:
            call()
        except CommBroken as exc:
            if WORDS not in str(exc) or f"rank {r}" not in str(exc):
                errors.append(f"rank {r}, {name}: {exc}")
        except Exception as exc:  # (any other kind is the failure reported)
            errors.append(f"rank {r}, {name}: {type(exc).__name__}: {exc}")
        else:
            errors.append(f"rank {r}, {name}: no error after finalize()")
    try:  # a communicator first used now: no native one to keep
        MPI.COMM_SELF.Allreduce(x, y)
        errors.append(f"rank {r}, MPI.COMM_SELF.Allreduce: no error after finalize()")
    except RuntimeError as exc:
        if "MPI.Finalize() (or ringworld.finalize()) has run" not in str(exc):
            errors.append(f"rank {r}, MPI.COMM_SELF.Allreduce: {exc}")
    return errors


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_every_call_after_finalize_raises_saying_so(size: int) -> None:
    assert run_processes(size, _after, timeout=60) == [[]] * size
