"""A collective call that fails as it starts (its first send goes to a rank known dead) has
taken its call number: the messages its peers still send for it are no strays, and the exit
check must not report a mismatch for them (it did: a recovered elastic job exited 1). They
are taken and dropped as they come, not kept. Ranks as threads; the dead rank leaves by
closing its in-process endpoint."""

from __future__ import annotations

import threading
import time

import numpy as np

import ringworld
from ringworld import Communicator
from ringworld.testing import run_threads

N = 4


def _job(comm: Communicator, sent: threading.Event) -> tuple[str, str | None]:
    e = comm._engine
    r = comm.rank
    dropped: list[int] = []  # tags of the messages this rank took and dropped
    drop = e._drop
    e._drop = lambda inc: (dropped.append(inc.tag), drop(inc))[1]  # type: ignore[method-assign]
    if r == 2:
        e.transports[0].close()  # gone: its peers get a PeerFailure naming it
        return "left", None
    deadline = time.monotonic() + 10
    while 2 not in e.dead:  # every survivor knows before it calls
        e.progress()
        time.sleep(0.001)
        assert time.monotonic() < deadline
    # recursive doubling on 4: (0,1) then (0,2); (2,3) then (1,3). Rank 3's first send goes
    # to rank 2 (raises as the call starts); rank 1's second goes to rank 3, after that.
    try:
        comm.allreduce(np.ones(N), np.empty(N), algorithm="recursive_doubling", timeout=20)
        outcome = "returned"
    except ringworld.PeerFailure as exc:
        assert exc.rank == 2, exc
        outcome = type(exc).__name__
    if r == 1:
        sent.set()  # its message to rank 3 is on its way
        return outcome, None
    if r == 3:
        assert sent.wait(20)
        deadline = time.monotonic() + 5
        while not dropped and time.monotonic() < deadline:
            e.progress()
        assert dropped, "rank 1's message never arrived"
        assert not e.unexpected.get(comm.coll_context), "kept after the call was given up"
    return outcome, e.exit_check()


def test_late_messages_of_a_call_that_failed_as_it_started_are_no_mismatch() -> None:
    out = run_threads(4, _job, threading.Event())  # the exit check of every rank runs too
    # rank 1 waits for rank 3, which left the call because rank 2 died: it fails at once,
    # naming rank 2, rather than at its timeout
    assert [o for o, _ in out] == ["PeerFailure", "PeerFailure", "left", "PeerFailure"], out
    assert [problem for _, problem in out] == [None] * 4
