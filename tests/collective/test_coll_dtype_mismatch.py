"""A broadcast whose ranks pass arrays of different dtypes (the same number of bytes) is a
disagreement: over the shared windows it used to copy the root's bytes into the others' arrays,
read there as another type (float32 bits as int32, or byte-swapped), where TCP's message path
failed with MismatchError. Both fail it now: every rank but the root raises, none returns the
root's bytes read as its own type, and the root, which does not wait for its receivers, fails by
its next call. (Every other collective's windows already sign the dtype.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(120)


def _outcome(call: Any) -> str:
    try:
        call()
    except Exception as exc:  # the outcome is the point
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _bcast_other_dtype(comm: Any, n: int, other: str, repeats: int) -> tuple[str, str]:
    mine = np.arange(n, dtype="<f4")
    for _ in range(repeats):  # (matched calls first: the repeat paths keep their signature)
        comm.bcast(mine, 0)
    buf = (np.arange(n) + 1).astype("<f4" if comm.rank == 0 else other)
    first = _outcome(lambda: comm.bcast(buf, 0, timeout=30))
    if first == "ok":
        first = f"ok {buf[:3].tolist()}"
    return first, _outcome(lambda: comm.allreduce(np.ones(2), np.empty(2), timeout=30))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [4, 65536])
@pytest.mark.parametrize("other", [">f4", "<i4"])
@pytest.mark.parametrize("repeats", [0, 3])
def test_a_broadcast_of_another_dtype_fails_every_receiver(transport: str, n: int, other: str,
                                                           repeats: int) -> None:
    results = run_processes(3, _bcast_other_dtype, n, other, repeats, transport=transport,
                            timeout=90)
    root, root_next = results[0]
    assert root.startswith("MismatchError") or (
        root == "ok [1.0, 2.0, 3.0]" and root_next.startswith("MismatchError")), results[0]
    for rank, (outcome, _) in enumerate(results[1:], start=1):
        assert outcome.startswith("MismatchError"), f"rank {rank}: {outcome}"
