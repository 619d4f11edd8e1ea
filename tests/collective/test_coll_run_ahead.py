"""A root running many calls ahead: its messages queue on the receiver, and the receiver's
per-call bookkeeping must neither slow down with the queue nor leak once it drains."""

from __future__ import annotations

import time

import numpy as np
import pytest
from coll_support import WAIT

from ringworld import Communicator, MismatchError, RingworldError
from ringworld.testing import run_processes

CALLS = 400


def _run_ahead(comm: Communicator) -> tuple[int, int, int]:
    engine = comm._engine
    ctx = comm.coll_context
    x = np.zeros(16, dtype=np.int64)
    if comm.rank == 1:
        time.sleep(0.5)  # the root's eager messages pile up here meanwhile
        for _ in range(10):
            engine.progress()  # drained from the transport into the unexpected queue
    queued = len(engine.unexpected.get(ctx, ()))
    wrong = 0
    for i in range(CALLS):
        if comm.rank == 0:
            x[:] = np.arange(16) + 1000 * i
        comm.bcast(x, 0, algorithm="binomial", timeout=WAIT)
        wrong += int((x != np.arange(16) + 1000 * i).sum())
    comm.barrier(timeout=WAIT)
    return queued, wrong, len(engine._signed.get(ctx, {}))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_root_far_ahead_is_matched_in_order_and_leaves_no_bookkeeping(transport: str) -> None:
    out = run_processes(2, _run_ahead, transport=transport, timeout=60)
    assert out[1][0] > CALLS // 2  # the scenario happened: most calls waited queued
    assert [w for _, w, _ in out] == [0, 0]
    assert [s for _, _, s in out] == [0, 0]


def _late_mismatch(comm: Communicator) -> str:
    x = np.zeros(4, dtype=np.int64)
    y = np.zeros(4, dtype=np.float64)
    try:
        for _ in range(50):
            comm.bcast(x, 0, algorithm="binomial", timeout=WAIT)
        if comm.rank == 1:
            time.sleep(0.3)  # the root's differing call waits in the unexpected queue
            for _ in range(10):
                comm._engine.progress()
        comm.bcast(x if comm.rank == 0 else y, 0, algorithm="binomial", timeout=WAIT)
        comm.barrier(timeout=WAIT)
    except MismatchError as exc:
        return "mismatch: " + str(exc)
    except RingworldError as exc:  # the root only sends: it may learn of it as a failure
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_differing_call_behind_a_run_ahead_is_still_a_mismatch() -> None:
    out = run_processes(2, _late_mismatch, transport="shm", timeout=60)
    assert out[1].startswith("mismatch"), out
