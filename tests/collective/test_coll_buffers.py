"""Buffer collectives: every collective x algorithm x world size, with ranks as threads over the
in-process transport (world sizes 1, 2, 4, 6, 7, 8: the shared-memory algorithms run there too)
and as processes over both real transports (world sizes 3 and 5).

One job per (transport, world size, group of collectives) runs, inside its ranks, every
algorithm of every collective of the group (forced with ``algorithm=``) on int64 and float64
data at counts 0, 1, p+1 and large (past the 128 KiB eager limit), in-place and out-of-place,
at several roots and v-layouts (packed, and reversed with gaps that must stay untouched),
blocking and nonblocking (batches of nonblocking calls in flight together, waited newest
first, with blocking calls run among them); then the dtype x op matrix (see
:func:`coll_support.profile_for`: the full matrix at sizes 3 and 5 over shm, subsets
elsewhere). Failures come back as one line per (case, rank).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from coll_support import (
    AFFINE,
    AFFINE_OP,
    GROUPS,
    LARGE_VEC,
    REDUCTIONS,
    WAIT,
    Runner,
    algorithms_for,
    core_cases,
    matrix_cases,
    profile_for,
    same_on_every_rank,
    values,
)

from ringworld import Communicator
from ringworld.algorithms.registry import REGISTRY
from ringworld.testing import run_ranks

#: (world, size): the world's kind as run_ranks takes it; threads run the shm profile
WORLDS = [("threads", p) for p in (1, 2, 4, 6, 7, 8)] + [(t, p) for t in ("shm", "tcp")
                                                          for p in (3, 5)]


def _rejects_non_commutative(comm: Communicator, runner: Runner) -> None:
    """Forcing a commutative-only algorithm with a non-commutative op raises ValueError on
    every rank before anything is sent (so later collectives still match up)."""
    p = comm.size
    for coll in sorted(REDUCTIONS):
        for name, algo in REGISTRY[coll].items():
            if not algo.commutative_only:
                continue
            n = p * 2
            x = values(comm.rank, n, AFFINE, "affine")
            out = np.empty(n, AFFINE)
            args: tuple[object, ...]
            if coll == "reduce":
                args = (x, out, AFFINE_OP, 0)
            elif coll == "reduce_scatter":
                args = (x, np.empty(2, AFFINE), [2] * p, AFFINE_OP)
            elif coll == "reduce_scatter_block":
                args = (x, np.empty(2, AFFINE), AFFINE_OP)
            else:
                args = (x, out, AFFINE_OP)
            for form in (coll, "i" + coll):
                what = f"{form}[{name}] with a non-commutative op"
                try:
                    getattr(comm, form)(*args, algorithm=name)
                except ValueError as exc:
                    if name not in str(exc):
                        runner.fail(what, f"ValueError does not name the algorithm: {exc}")
                else:
                    runner.fail(what, "did not raise ValueError")
    # the sequence numbers are still in step
    got = np.empty(3, np.int64)
    comm.allreduce(np.full(3, comm.rank + 1, np.int64), got, timeout=WAIT)
    if not np.array_equal(got, np.full(3, p * (p + 1) // 2)):
        runner.fail("allreduce after the rejected calls", f"got {got}")


def _bitwise_identical(comm: Communicator, runner: Runner, transport: str) -> None:
    """Every allreduce algorithm gives bitwise identical float64 sums of random data (whose
    sum depends on the order of additions) on every rank, close to the exact sum."""
    p, r = comm.size, comm.rank
    for n in (p + 1, 1001, LARGE_VEC):
        def data(rank: int, n: int = n) -> np.ndarray:
            rng = np.random.default_rng([rank, n])
            return rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
        parts = np.stack([data(i) for i in range(p)])
        want, scale = parts.sum(axis=0), np.abs(parts).sum(axis=0).max(initial=0)
        mine = parts[r].copy()
        del parts
        for name in algorithms_for("allreduce", p, transport):
            out = np.empty(n)
            comm.allreduce(mine, out, algorithm=name, timeout=WAIT)
            what = f"allreduce[{name}] float64 random n={n}"
            differs = same_on_every_rank(comm, out, what)
            if differs:
                runner.fail(what, differs)
            if not np.allclose(out, want, rtol=0, atol=1e-12 * scale):
                runner.fail(what, "not the sum of the inputs")


def _barrier_separates(comm: Communicator, runner: Runner) -> None:
    """No rank leaves a barrier before the last one enters it (rank 0 enters late)."""
    for form in ("barrier", "ibarrier"):
        if comm.rank == 0:
            time.sleep(0.1)
        enter = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        if form == "barrier":
            comm.barrier(timeout=WAIT)
        else:
            comm.ibarrier().wait(WAIT)
        times = np.array([enter, time.monotonic()])
        table = np.empty(2 * comm.size)
        comm.allgather(times, table, timeout=WAIT)
        enters, exits = table[0::2], table[1::2]
        if exits.min() < enters.max():
            runner.fail(form, f"a rank left at {exits.min():.6f} before the last entered at "
                              f"{enters.max():.6f}")


def _job(comm: Communicator, group: str, transport: str) -> tuple[list[str], int]:
    runner = Runner(comm)
    profile = profile_for(comm.size, transport)
    for coll in GROUPS[group]:
        runner.add_all(core_cases(coll, comm.size, transport))
        runner.add_all(matrix_cases(coll, comm.size, transport, profile))
    if group == "reductions":
        _rejects_non_commutative(comm, runner)
        _bitwise_identical(comm, runner, transport)
    if group == "exchange":
        _barrier_separates(comm, runner)
    return runner.failures, runner.ran


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize(("world", "size"), WORLDS, ids=[f"{w}-p{p}" for w, p in WORLDS])
def test_buffer_collectives(world: str, size: int, group: str) -> None:
    transport = "shm" if world == "threads" else world  # the profile: threads share memory
    out = run_ranks(size, _job, group, transport, transport=world, timeout=110)
    failures = [f for fails, _ in out for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:60])
    assert len({ran for _, ran in out}) == 1  # every rank ran the same cases
    assert out[0][1] > 50

