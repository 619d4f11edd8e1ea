"""Ranks that make different calls at one shared-memory sync: every rank's MismatchError names
every rank's call (collective, dtype, op, bytes), not only its own, and the communicator
stays usable afterwards."""

from __future__ import annotations

import numpy as np
import pytest

import ringworld
from ringworld.testing import run_processes


def _differ(comm: ringworld.Communicator, kind: str) -> list[str]:
    p, r = comm.size, comm.rank
    odd = r == p - 1  # the last rank calls differently
    x, y = np.ones(4 * p), np.empty(4 * p)
    for _ in range(2):  # the windows mapped, the calls kept
        comm.allreduce(x, y, timeout=30)
    last = p - 1
    want = {i: f"rank {i}: allreduce float64 sum, {x.nbytes} bytes" for i in range(last)}
    want[last] = {"collective": f"rank {last}: allgather float64, ",
                  "op": f"rank {last}: allreduce float64 max, {x.nbytes} bytes",
                  "size": f"rank {last}: allreduce float64 sum, {x.nbytes - 8} bytes",
                  "dtype": f"rank {last}: allreduce float32 sum, {x.nbytes // 2} bytes"}[kind]
    try:
        if not odd:
            comm.allreduce(x, y, timeout=30)
        elif kind == "collective":
            comm.allgather(x[:4], y, timeout=30)
        elif kind == "op":
            comm.allreduce(x, y, ringworld.MAX, timeout=30)
        elif kind == "size":
            comm.allreduce(x[:-1], y[:-1], timeout=30)
        else:
            comm.allreduce(x.astype(np.float32), y.astype(np.float32), timeout=30)
    except ringworld.MismatchError as exc:
        text = str(exc)
    else:
        return ["the calls that differ were accepted"]
    errors = [f"rank {r}'s error lacks {w!r}: {text}" for w in want.values() if w not in text]
    comm.allreduce(x, y, timeout=30)  # still usable, and right
    if not np.array_equal(y, np.full(4 * p, float(p))):
        errors.append(f"the allreduce after the mismatch gave {y}")
    return errors


@pytest.mark.parametrize("kind", ["collective", "op", "size", "dtype"])
@pytest.mark.parametrize("size", [2, 3])
def test_a_mismatch_names_every_ranks_call(size: int, kind: str) -> None:
    results = run_processes(size, _differ, kind, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []
