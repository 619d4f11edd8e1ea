"""A rank that leaves a collective with an error, or that is in another collective than its
peers, never makes them return wrong data or wait for good: every rank raises, naming the cause.

Found by fault injection (issue 20): on shared memory a rank that left a call with an error
reached the same sync count in its next call, so its peers summed its next call's input into
theirs (204 instead of 6) or returned half-reduced vectors; a shared-memory Reduce met by a
message-path Reduce_scatter, and a user op raising on one rank over TCP, hung. No call here
passes ``timeout=`` unless the case is about timeouts: a hang fails the test by the harness's
timeout, and a Timeout result names the hang.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ringworld
from ringworld import Communicator
from ringworld.testing import run_processes

pytestmark = pytest.mark.timeout(180)

#: Each rank's job must end well within this (seconds); a hang fails the test.
JOB = 60.0


def _outcome(fn: object) -> str:
    """Run ``fn()``; 'ok <value>' or the error's class name and text."""
    try:
        value = fn()  # type: ignore[operator]
    except ringworld.RingworldError as exc:
        return f"{type(exc).__name__}: {exc}"
    except ValueError as exc:
        return f"ValueError: {exc}"
    return f"ok {value}"


def _warm(comm: Communicator) -> None:
    comm.allreduce(np.ones(2), np.empty(2))


# ------------------------------------------------------------- 1: a mismatch, then a next call
def _mismatch_then_next(comm: Communicator, warm: bool) -> list[str]:
    """Rank 1 broadcasts while the others allreduce; then every rank allreduces again."""
    if warm:
        _warm(comm)
    r = comm.rank

    def first() -> float:
        got = np.full(1, -1.0)
        if r == 1:
            comm.bcast(got, root=0)
        else:
            comm.allreduce(np.array([r + 1.0]), got)
        return float(got[0])

    def second() -> float:
        got = np.full(1, -1.0)
        comm.allreduce(np.array([100.0 * (r + 1)]), got)
        return float(got[0])

    return [_outcome(first), _outcome(second)]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_mismatch_fails_every_rank_and_every_later_call(transport: str, warm: bool) -> None:
    out = run_processes(3, _mismatch_then_next, warm, transport=transport, timeout=JOB)
    for rank, (first, second) in enumerate(out):
        assert first.startswith("MismatchError: "), (rank, out)
        assert second.startswith("MismatchError: "), (rank, out)  # never 204 (or 600)


# ------------------------------------------------------------- 2: a user op raising on one rank
def _raising_op(comm: Communicator, n: int, warm: bool) -> list[str]:
    if warm:
        _warm(comm)

    def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if comm.rank == 1:
            raise ValueError("the op failed on rank 1")
        return a + b

    op = ringworld.Op.create(add, commutative=True, name="fragile")
    send = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    got = np.full(n, -1.0)

    def reduce() -> str:
        comm.allreduce(send, got, op)
        want = np.arange(n, dtype=np.float64) * (comm.size * (comm.size + 1) // 2)
        wrong = int(np.count_nonzero(got != want))
        return "right" if wrong == 0 else f"{wrong} of {n} elements wrong"

    def after() -> str:
        comm.barrier()
        return "barrier"

    return [_outcome(reduce), _outcome(after)]


@pytest.mark.parametrize("n", [8, 65536])
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_user_op_raising_on_one_rank_is_never_a_wrong_result(transport: str, size: int,
                                                                n: int) -> None:
    out = run_processes(size, _raising_op, n, True, transport=transport, timeout=JOB)
    assert out[1][0].startswith("ValueError: the op failed on rank 1"), out
    for rank, (result, after) in enumerate(out):
        # a rank that had every input before rank 1 failed may finish with the right result;
        # any other must raise, naming rank 1 (and none waits for good: no Timeout, no hang)
        assert result in ("ok right", ) or result.startswith(("CommBroken: ", "ValueError: ")), (
            rank, out)
        if result.startswith("CommBroken: "):
            assert "world rank 1 left" in result and "the op failed on rank 1" in result, out
        assert after == "ok barrier" or after.startswith("CommBroken: "), (rank, out)
    if transport == "shm" and n > 8:  # the others wait in a second sync for rank 1's part
        assert all(res.startswith("CommBroken: ") for res, _ in out[:1] + out[2:]), out


# ------------------------------------------------------------- 6: different collectives, any path
def _stay(comm: Communicator) -> None:
    """Keep every rank alive until all are done (point-to-point still works): a peer's exit
    must not stand in for the error under test."""
    if comm.rank == 0:
        for src in range(1, comm.size):
            comm.recv_obj(src, tag=99)
        for dest in range(1, comm.size):
            comm.send_obj("bye", dest, tag=98)
    else:
        comm.send_obj("done", 0, tag=99)
        comm.recv_obj(0, tag=98)


def _different_collectives(comm: Communicator, kind: str, warm: bool) -> list[str]:
    if warm:
        _warm(comm)
    r, p = comm.rank, comm.size
    x = np.arange(4.0 * p) + r

    def call() -> None:
        if kind == "reduce-vs-reduce_scatter":  # mpi4py's testReduce with another rank off
            if r == 0:
                comm.reduce(x, np.empty_like(x), root=1)
            else:
                comm.reduce_scatter(x, np.empty(4), [4] * p)
        elif kind == "shm-vs-receiving-root":  # nobody sends anybody anything
            if r == 0:
                comm.allreduce(x, np.empty_like(x))
            else:
                comm.reduce(x, np.empty_like(x), root=1, algorithm="binomial")
        elif kind == "bcast-roots":  # both think they are the root: both only send
            comm.bcast(np.full(1 << 18, r + 1.0), root=r)
            comm.allreduce(x, np.empty_like(x))
        else:
            raise AssertionError(kind)

    out = [_outcome(call), _outcome(comm.barrier)]
    _stay(comm)
    return out


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("kind", ["reduce-vs-reduce_scatter", "shm-vs-receiving-root",
                                  "bcast-roots"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_ranks_in_different_collectives_all_fail_without_a_timeout(transport: str, kind: str,
                                                                  warm: bool) -> None:
    out = run_processes(2, _different_collectives, kind, warm, transport=transport, timeout=JOB)
    assert any(first.startswith("MismatchError: ") for first, _ in out), out
    # found by every rank at once, in the same shared-memory sync, the communicator stays
    # usable; otherwise its collective sequence is broken there, on every rank
    in_step = all("ranks called it differently" in first for first, _ in out)
    for rank, (first, after) in enumerate(out):
        # a rank whose part was only to send may finish it; then its next call fails
        assert first.startswith("MismatchError: ") or first == "ok None", (rank, out)
        assert after.startswith("MismatchError: ") or (in_step and after == "ok None"), (
            rank, out)


# ------------------------------------------------------------- 7: timeouts that are no timeouts
def _timeouts(comm: Communicator) -> list[str]:
    x, got = np.ones(4), np.empty(4)
    out = []
    for t in (math.nan, -1.0):
        out.append(_outcome(lambda t=t: comm.allreduce(x, got, timeout=t)))
        out.append(_outcome(lambda t=t: comm.irecv(got, 0).wait(timeout=t)))
    # refused before the call starts: the communicator still works, on every rank
    out.append(_outcome(lambda: comm.allreduce(x, got, timeout=math.inf)))
    out.append(_outcome(lambda: comm.bcast(got, root=0, timeout=math.inf)))
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_nan_and_negative_timeouts_are_refused_and_inf_means_none(transport: str) -> None:
    out = run_processes(2, _timeouts, transport=transport, timeout=JOB)
    for rank, res in enumerate(out):
        for r in res[:4]:
            assert r.startswith("ValueError: timeout=") and ">= 0" in r, (rank, res)
        assert res[4:] == ["ok None", "ok None"], (rank, res)


def test_a_nan_default_timeout_is_refused() -> None:
    with pytest.raises(ringworld.RingworldError, match="RINGWORLD_TIMEOUT"):
        from ringworld import config

        config.from_env({"RINGWORLD_TIMEOUT": "nan"})


# ------------------------------------------------------------- 3: synchronous sends
def _poll_undone(req: ringworld.Request, comm: Communicator, seconds: float) -> bool:
    """Whether ``req`` stays incomplete while this rank keeps polling for ``seconds``."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if req.test():
            return False
        comm.iprobe()  # progress
    return True


def _synchronous(comm: Communicator, form: str) -> list[str]:
    """Rank 0 starts a synchronous send; rank 1 posts its receive only once rank 0, having
    seen the send stay incomplete, says "go" (a standard send completes at once here)."""
    r = comm.rank
    out: list[str] = []
    if r == 0:
        if form == "buffer":
            req = comm.issend(np.arange(4.0), 1, tag=3)
        else:
            req = comm.issend_obj({"x": 1}, 1, tag=3)
        out.append(f"pending before the receive: {_poll_undone(req, comm, 0.3)}")
        comm.send_obj("go", 1, tag=9)
        if form == "probe":  # rank 1 probes first: a probe is no match
            comm.recv_obj(1, tag=10)
            out.append(f"pending after a probe: {_poll_undone(req, comm, 0.3)}")
            comm.send_obj("receive", 1, tag=11)
        req.wait(timeout=JOB / 2)
        out.append("done after the receive")
        # blocking forms, and a synchronous send to oneself
        comm.ssend(np.arange(3.0), 1, tag=4, timeout=JOB / 2)
        comm.ssend_obj("obj", 1, tag=5, timeout=JOB / 2)
        me = comm.issend(np.ones(2), 0, tag=6)
        got = np.empty(2)
        comm.recv(got, 0, tag=6)
        me.wait(timeout=5)
        out.append("self ok")
    else:
        assert comm.recv_obj(0, tag=9) == "go"
        if form == "probe":
            comm.probe(0, tag=3)
            comm.send_obj("probed", 0, tag=10)
            comm.recv_obj(0, tag=11)
        if form == "buffer":
            got = np.empty(4)
            comm.recv(got, ringworld.ANY_SOURCE, tag=ringworld.ANY_TAG)
            out.append(f"got {got.tolist()}")
        else:
            out.append(f"got {comm.recv_obj(0, tag=3)}")
        comm.recv(np.empty(3), 0, tag=4)
        out.append(f"got {comm.recv_obj(0, tag=5)}")
    return out


@pytest.mark.parametrize("form", ["buffer", "object", "probe"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_synchronous_sends_complete_only_once_received(transport: str, form: str) -> None:
    out = run_processes(2, _synchronous, form, transport=transport, timeout=JOB)
    assert out[0][0] == "pending before the receive: True", out
    if form == "probe":
        assert out[0][1] == "pending after a probe: True", out
    assert out[0][-2:] == ["done after the receive", "self ok"], out
    assert out[1][-1] == "got obj", out


def _consensus(comm: Communicator, rounds: int) -> list[int]:
    """The nonblocking-consensus sparse exchange through ringworld.MPI (issend to each
    neighbour, ibarrier once they complete, probe and receive until it completes): with
    synchronous sends no message is left unreceived when the barrier completes."""
    from ringworld import MPI

    c = MPI.COMM_WORLD
    r, p = c.Get_rank(), c.Get_size()
    got: list[int] = []
    for k in range(rounds):
        targets = [(r + d) % p for d in (1, 2) if (r + d) % p != r]
        reqs = [c.issend(r * 1000 + k, t, tag=7) for t in targets]
        barrier = None
        while True:
            st = MPI.Status()
            if c.Iprobe(MPI.ANY_SOURCE, 7, st):
                got.append(c.recv(source=st.Get_source(), tag=7))
            if barrier is None:
                if MPI.Request.Testall(reqs):
                    barrier = c.Ibarrier()
            elif barrier.Test():
                break
    return sorted(got)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_nonblocking_consensus_exchange_loses_no_message(transport: str) -> None:
    p, rounds = 4, 20
    out = run_processes(p, _consensus, rounds, transport=transport, timeout=JOB)
    for r, got in enumerate(out):
        senders = [(r - d) % p for d in (1, 2)]
        assert got == sorted(s * 1000 + k for s in senders for k in range(rounds)), (r, got)


# ------------------------------------------------------------- 8: arguments only the root checks
def _root_refuses(comm: Communicator, kind: str) -> list[str]:
    """The root's arguments are wrong in a way only it can see; then the communicator must
    work on every rank."""
    r, p = comm.rank, comm.size
    root = p - 1
    x = np.arange(9.0) + r
    big = np.zeros(9 * p)

    def call() -> None:
        if kind == "gatherv":
            comm.gatherv(x, big if r == root else None, [-1] + [9] * (p - 1), root=root)
        elif kind == "scatterv":
            comm.scatterv(big if r == root else None, np.empty(9), [9] * (p - 1) + [10 ** 6],
                          root=root)
        elif kind == "scatter":
            comm.scatter(np.zeros(9 * p + 1) if r == root else None, np.empty(9), root=root)
        elif kind == "gather":
            comm.gather(x, np.zeros(9 * p - 1) if r == root else None, root=root)
        elif kind == "reduce":
            comm.reduce(x, np.zeros(8) if r == root else None, root=root)
        else:
            raise AssertionError(kind)

    out = [_outcome(call)]
    # the communicator still works, on every path
    got = np.empty(9)
    comm.allreduce(x, got)
    ok = np.array_equal(got, np.arange(9.0) * p + p * (p - 1) / 2)
    g = np.zeros(9 * p)
    comm.gatherv(x, g if r == root else None, [9] * p, root=root)
    ok = ok and (r != root or np.array_equal(g, np.concatenate([np.arange(9.0) + i
                                                                  for i in range(p)])))
    s = np.empty(9)
    comm.scatter(np.arange(9.0 * p) if r == root else None, s, root=root)
    ok = ok and np.array_equal(s, np.arange(9.0) + 9 * r)
    red = np.zeros(9)
    comm.reduce(x, red if r == root else None, root=root)
    ok = ok and (r != root or np.array_equal(red, got))
    out.append(f"usable: {ok}")
    out.append(f"crowded: {comm.oversubscribed}")
    _stay(comm)
    return out


@pytest.mark.parametrize("kind", ["gatherv", "scatterv", "scatter", "gather", "reduce"])
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_argument_only_the_root_checks_fails_every_waiting_rank(transport: str, size: int,
                                                                   kind: str) -> None:
    out = run_processes(size, _root_refuses, kind, transport=transport, timeout=JOB)
    root = size - 1
    assert out[root][0].startswith("ValueError: "), out
    for rank, (first, after, crowded) in enumerate(out):
        assert after == "usable: True", (rank, out)
        if rank == root:
            continue
        # (a small reduce of ranks that share cores goes through the eager rings, as a small
        # gather: the others' part is to send)
        receives = kind.startswith("scatter") or (
            kind == "reduce" and transport == "shm" and crowded == "crowded: False")
        if receives:  # it waits for the root: it gets the root's error, naming it
            assert first.startswith("ValueError: ") and f"world rank {root}" in first, out
            assert "refused its arguments" in first, out
        else:  # its part was to send: done, with no result to be wrong
            assert first == "ok None" or first.startswith("ValueError: "), out


def _late_part(comm: Communicator) -> list[str]:
    """Rank 0 gives up a ring allgather (a 0.3 s timeout) that rank 1 enters 1 s late; rank
    1's part of it comes after. Then allreduces on the message path, and what rank 0 still
    holds of that call: its late messages are taken and dropped, not kept for good."""
    import time

    r = comm.rank
    out = []
    got = np.empty(2 * comm.size)
    if r == 1:
        time.sleep(1.0)
    out.append(_outcome(lambda: comm.allgather(np.ones(2), got, algorithm="ring",
                                               timeout=0.3 if r == 0 else JOB)))
    time.sleep(0.5)  # (rank 1's part has landed on rank 0)
    for _ in range(3):
        x = np.empty(1)
        out.append(_outcome(lambda x=x: comm.allreduce(np.ones(1), x, algorithm="ring")))
    ctx = comm._chan.coll_context
    out.append(f"queued {len(comm._engine.unexpected.get(ctx, ()))}")
    return out


def test_a_call_given_up_keeps_none_of_its_late_messages() -> None:
    out = run_processes(2, _late_part, transport="tcp", timeout=JOB)
    assert out[0][0].startswith("Timeout: allgather"), out
    assert out[1][0] == "ok None", out  # (rank 0's part came before it gave up)
    for rank in (0, 1):
        assert out[rank][1:] == ["ok None"] * 3 + ["queued 0"], out
