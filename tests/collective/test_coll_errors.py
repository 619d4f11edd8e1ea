"""Errors of the collective API over real processes.

Bad arguments raise ValueError / TypeError naming the argument (on every rank alike, before
anything is sent, so later collectives still match up); ``RINGWORLD_ALGORITHMS`` is honoured
and checked; a collective that some rank never joins raises ``ringworld.Timeout`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from coll_support import AFFINE, AFFINE_OP, WAIT, values

import ringworld
from ringworld import IN_PLACE, Communicator, runtime
from ringworld.algorithms.registry import REGISTRY
from ringworld.testing import RankFailed, run_processes

I64 = np.dtype(np.int64)


def _bad_calls(comm: Communicator) -> list[tuple[str, Callable[[], Any], type, tuple[str, ...]]]:
    """(what, call, exception type, words the message must contain)."""
    p = comm.size
    x = np.arange(p * 2, dtype=np.int64)
    ro = np.empty(p * 2, np.int64)
    ro.flags.writeable = False
    algos = tuple(REGISTRY["allreduce"])
    e = np.empty
    own2 = [2 if i == comm.rank else 1 for i in range(p)]
    return [
        ("allreduce: recvbuf too short", lambda: comm.allreduce(x, e(p * 2 - 1, np.int64)),
         ValueError, ("recvbuf",)),
        ("iallreduce: recvbuf too long", lambda: comm.iallreduce(x, e(p * 2 + 1, np.int64)),
         ValueError, ("recvbuf",)),
        ("allreduce: dtypes differ", lambda: comm.allreduce(x, e(p * 2, np.float64)),
         TypeError, ("sendbuf", "recvbuf")),
        ("allreduce: read-only recvbuf", lambda: comm.allreduce(x, ro), TypeError,
         ("recvbuf",)),
        ("allreduce: strided recvbuf", lambda: comm.allreduce(x, e(p * 4, np.int64)[::2]),
         ValueError, ("recvbuf",)),
        ("allreduce: object dtype", lambda: comm.allreduce(x.astype(object),
                                                           e(p * 2, object)),
         TypeError, ("object",)),
        ("allreduce: unknown algorithm", lambda: comm.allreduce(x, e(p * 2, np.int64),
                                                                algorithm="nope"),
         ValueError, ("nope", *algos)),
        ("iallreduce: unknown algorithm", lambda: comm.iallreduce(x, e(p * 2, np.int64),
                                                                  algorithm="bruck"),
         ValueError, ("bruck", *algos)),
        ("allgatherv: an allgather-only algorithm", lambda: comm.allgatherv(
            x[:1], e(p, np.int64), [1] * p, algorithm="bruck"), ValueError, ("bruck",)),
        ("allreduce: unknown op name", lambda: comm.allreduce(x, e(p * 2, np.int64), "nope"),
         ValueError, ("nope",)),
        ("allreduce: op of a wrong type", lambda: comm.allreduce(x, e(p * 2, np.int64), 3),
         TypeError, ("op",)),
        ("allreduce: BAND on floats", lambda: comm.allreduce(
            x.astype(np.float64), e(p * 2, np.float64), ringworld.BAND), TypeError,
         ("band", "integer or bool dtype, not float64")),
        ("allreduce: MAX on complex", lambda: comm.allreduce(
            x.astype(np.complex64), e(p * 2, np.complex64), ringworld.MAX), TypeError,
         ("max", "not defined for complex numbers, as complex64")),
        ("allreduce: MAXLOC on int64", lambda: comm.allreduce(
            x, e(p * 2, np.int64), ringworld.MAXLOC), TypeError, ("maxloc",)),
        ("allreduce: ring with a non-commutative op", lambda: comm.allreduce(
            values(0, 4, AFFINE), e(4, AFFINE), AFFINE_OP, algorithm="ring"), ValueError,
         ("ring",)),
        ("bcast: root = size", lambda: comm.bcast(e(3, np.int64), p), ValueError, ("root",)),
        ("reduce: root = -1", lambda: comm.reduce(x, e(p * 2, np.int64), root=-1), ValueError,
         ("root",)),
        ("gather: root not an int", lambda: comm.gather(x, e(p * p * 2, np.int64), root="0"),
         TypeError, ("root",)),
        ("ibcast: root = size + 3", lambda: comm.ibcast(e(3, np.int64), p + 3), ValueError,
         ("root",)),
        ("allgather: recvbuf not size blocks", lambda: comm.allgather(
            x, e(p * 2 * p + 1, np.int64)), ValueError, ("recvbuf",)),
        ("allgather: sendbuf does not match", lambda: comm.allgather(
            x, e(p * (p * 2 + 1), np.int64)), ValueError, ("sendbuf",)),
        ("alltoall: sendbuf size", lambda: comm.alltoall(x[:-1], e(p * 2, np.int64)),
         ValueError, ("sendbuf",)),
        ("alltoall: dtypes differ", lambda: comm.alltoall(x, e(p * 2, np.int32)),
         TypeError, ("sendbuf", "recvbuf")),
        ("allgatherv: counts of the wrong length", lambda: comm.allgatherv(
            x[:1], e(p + 1, np.int64), [1] * (p + 1)), ValueError, ("counts",)),
        ("allgatherv: negative count", lambda: comm.allgatherv(
            x[:1], e(p, np.int64), [1] * (p - 1) + [-1]), ValueError, ("counts",)),
        ("allgatherv: block outside recvbuf", lambda: comm.allgatherv(
            x[:1], e(p, np.int64), [1] * p, [0] * (p - 1) + [p]), ValueError,
         ("displs", "recvbuf")),
        ("alltoallv: own block sizes differ", lambda: comm.alltoallv(
            x[:p], e(p + 1, np.int64), [1] * p, own2), ValueError, ("sendcounts", "recvcounts")),
        ("alltoallw: too few buffers", lambda: comm.alltoallw([x] * (p + 1), [x] * (p + 1)),
         ValueError, ("sendbufs",)),
        ("reduce_scatter: sendbuf is not the sum of counts", lambda: comm.reduce_scatter(
            x, e(3, np.int64), [3] * p), ValueError, ("sendbuf",)),
        ("scan: recvbuf too short", lambda: comm.scan(x, e(1, np.int64)), ValueError,
         ("recvbuf",)),
        ("exscan: dtypes differ", lambda: comm.exscan(x, e(p * 2, np.uint64)), TypeError,
         ("sendbuf", "recvbuf")),
        ("gatherv: counts missing at the root", lambda: comm.gatherv(
            x, e(p * p * 2, np.int64), None, root=comm.rank), TypeError, ("counts",)),
        # (every rank its root, so every rank refuses: where ranks share cores, all of them
        # in the eager rings' refusal, which must see the others refusing too)
        ("gather: recvbuf too short at the root", lambda: comm.gather(
            x, e(p * 2 * p - 1, np.int64), root=comm.rank), ValueError, ("recvbuf",)),
        ("split: negative color", lambda: comm.split(-5), ValueError, ("color",)),
        ("split: key not an int", lambda: comm.split(0, key=1.5), TypeError, ("key",)),
        ("create: duplicate ranks", lambda: comm.create([0, 0]), ValueError, ("ranks",)),
        ("alltoall_obj: wrong number of items", lambda: comm.alltoall_obj([1] * (p + 1)),
         ValueError, ("objs",)),
        # the shared-memory algorithm: blocking calls of some collectives, shm transport only
        ("iallreduce: algorithm shm", lambda: comm.iallreduce(x, e(p * 2, np.int64),
                                                              algorithm="shm"),
         ValueError, ("shm", "blocking")),
        ("iallgatherv: algorithm shm", lambda: comm.iallgatherv(
            x[:1], e(p, np.int64), [1] * p, algorithm="shm"), ValueError, ("shm", "blocking")),
        ("ireduce_scatter: algorithm shm", lambda: comm.ireduce_scatter(
            x, e(2, np.int64), [2] * p, algorithm="shm"), ValueError, ("shm", "blocking")),
    ] + ([] if p == 1 else [  # in a world of one every length is a multiple of the size
        ("reduce_scatter_block: IN_PLACE recvbuf not size blocks", lambda:
            comm.reduce_scatter_block(IN_PLACE, e(p * 2 + 1, np.int64)), ValueError,
         ("recvbuf",)),
    ]) + ([] if comm.transport == "shm" else [
        ("allreduce: algorithm shm without shared memory", lambda: comm.allreduce(
            x, e(p * 2, np.int64), algorithm="shm"), ValueError, ("shm",)),
        ("allgatherv: algorithm shm without shared memory", lambda: comm.allgatherv(
            x[:1], e(p, np.int64), [1] * p, algorithm="shm"), ValueError, ("shm", "memory")),
        ("reduce_scatter: algorithm shm without shared memory", lambda: comm.reduce_scatter(
            x, e(2, np.int64), [2] * p, algorithm="shm"), ValueError, ("shm", "memory")),
    ])


def _bad_arguments(comm: Communicator) -> list[str]:
    fails = []
    for what, call, exc_type, words in _bad_calls(comm):
        try:
            call()
        except exc_type as exc:
            missing = [w for w in words if w.lower() not in str(exc).lower()]
            if missing:
                fails.append(f"{what}: message {str(exc)!r} does not mention {missing}")
        except Exception as exc:
            fails.append(f"{what}: raised {exc!r}, want {exc_type.__name__}")
        else:
            fails.append(f"{what}: did not raise {exc_type.__name__}")
    # nothing was sent or numbered: collectives still match up
    out = np.empty(2, np.int64)
    comm.allreduce(np.array([comm.rank, 1]), out, timeout=WAIT)
    if out.tolist() != [comm.size * (comm.size - 1) // 2, comm.size]:
        fails.append(f"allreduce after the bad calls: {out}")
    return fails


@pytest.mark.parametrize(("transport", "size", "crowded"), [
    ("shm", 1, False), ("shm", 3, False), ("shm", 3, True), ("tcp", 2, False)])
def test_bad_arguments_name_the_argument(transport: str, size: int, crowded: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # (ranks sharing cores take the eager rings for gathers: both, on any machine)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    out = run_processes(size, _bad_arguments, transport=transport, timeout=60)
    failures = sorted({f for fails in out for f in fails})
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ RINGWORLD_ALGORITHMS
def _env_forced(comm: Communicator) -> tuple[str, ...]:
    p = comm.size
    x = np.arange(5, dtype=np.int64) + comm.rank
    out = np.empty(5, np.int64)
    comm.allreduce(x, out, timeout=WAIT)
    first = comm.last_algorithm
    assert out.tolist() == (np.arange(5) * p + p * (p - 1) // 2).tolist()
    comm.iallreduce(x, out).wait(WAIT)
    second = comm.last_algorithm
    comm.allreduce(x, out, algorithm="linear", timeout=WAIT)  # the argument wins over the env
    third = comm.last_algorithm
    comm.bcast(out, 0, timeout=WAIT)
    fourth = comm.last_algorithm
    d = comm.dup()  # communicators derived from the world keep the forced choice
    d.allreduce(x, out, timeout=WAIT)
    return first, second, third, fourth, d.last_algorithm


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_env_forces_algorithm(transport: str) -> None:
    env = {"RINGWORLD_ALGORITHMS": "allreduce:ring,bcast:linear"}
    out = run_processes(3, _env_forced, transport=transport, timeout=60, env=env)
    assert out == [("ring", "ring", "linear", "linear", "ring")] * 3


def _env_shm(comm: Communicator) -> tuple[str, str, str]:
    x = np.arange(5, dtype=np.int64) + comm.rank
    out = np.empty(5, np.int64)
    comm.allreduce(x, out, timeout=WAIT)
    blocking = comm.last_algorithm
    comm.iallreduce(x, out).wait(WAIT)  # impossible for shm: the cost model chooses
    nonblocking = comm.last_algorithm
    want = (np.arange(5) * comm.size + comm.size * (comm.size - 1) // 2).tolist()
    return blocking, nonblocking, "ok" if out.tolist() == want else f"wrong: {out}"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_env_forces_shm_where_possible(transport: str) -> None:
    env = {"RINGWORLD_ALGORITHMS": "allreduce:shm"}
    out = run_processes(3, _env_shm, transport=transport, timeout=60, env=env)
    for blocking, nonblocking, ok in out:
        assert ok == "ok"
        assert nonblocking in REGISTRY["allreduce"]
        assert (blocking == "shm") == (transport == "shm"), blocking


def test_env_unknown_algorithm_is_a_config_error() -> None:
    env = {"RINGWORLD_ALGORITHMS": "allreduce:nope"}
    with pytest.raises(RankFailed, match=r"ConfigError(.|\n)*nope"):
        run_processes(2, _env_forced, timeout=60, env=env)


# ------------------------------------------------------------------ timeouts
def _lonely(comm: Communicator, form: str) -> str:
    """Rank 0 runs a collective nobody else joins; the others wait for its word, then leave
    (their exit must not turn rank 0's Timeout into a PeerFailure)."""
    x = np.arange(4, dtype=np.int64)
    out = np.empty(4, np.int64)
    if form == "second_allreduce":  # e.g. shared-memory windows already mapped
        comm.allreduce(x, out, timeout=WAIT)
    if comm.rank != 0:
        return str(comm.recv_obj(0, tag=5, timeout=WAIT))
    try:
        if form in ("allreduce", "second_allreduce"):
            comm.allreduce(x, out, timeout=1.0)
        elif form == "iallreduce":
            comm.iallreduce(x, out, algorithm="ring").wait(1.0)
        elif form == "bcast":
            comm.bcast(out, root=1, timeout=1.0)
        elif form == "bcast_obj":
            comm.bcast_obj(None, root=1, timeout=1.0)
        elif form == "allreduce_obj":
            comm.allreduce_obj(1, timeout=1.0)
        else:
            raise AssertionError(form)
    except ringworld.Timeout as exc:
        result = str(exc)
        assert isinstance(exc, TimeoutError)
    else:
        result = "no Timeout"
    for dest in range(1, comm.size):
        comm.send_obj("done", dest, tag=5)
    return result


@pytest.mark.parametrize("form", ["allreduce", "second_allreduce", "iallreduce",
                                  "bcast"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_timeout_names_the_collective(transport: str, form: str) -> None:
    out = run_processes(3, _lonely, form, transport=transport, timeout=60)
    assert out[1:] == ["done", "done"]
    name = "bcast" if "bcast" in form else "allreduce"
    assert name in out[0], f"the Timeout does not name {name}: {out[0]!r}"
    assert "1 s" in out[0], out[0]


@pytest.mark.parametrize("form", ["bcast_obj", "allreduce_obj"])
def test_object_collective_timeout_names_the_collective(form: str) -> None:
    out = run_processes(2, _lonely, form, timeout=60)
    assert out[1:] == ["done"]
    assert out[0] != "no Timeout"
    assert form in out[0], f"the Timeout does not name {form}: {out[0]!r}"
