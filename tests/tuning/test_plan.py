"""Every "which path" decision in one place: the registry's kinds, Selector.plan and
use_hierarchy, and Communicator.plan agreeing with what calls then run (ranks as threads)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ringworld import Communicator
from ringworld.algorithms.registry import (
    ALGORITHMS,
    COMPOSITE,
    DIRECT,
    DIRECT_COLLECTIVES,
    REGISTRY,
    SCHEDULE,
    VECTOR_DIRECT,
    lookup,
)
from ringworld.testing import run_threads
from ringworld.tuning import constants
from ringworld.tuning.cost import SHM_MODELS
from ringworld.tuning.select import Selector


def test_every_algorithm_is_a_registry_entry_with_its_kind() -> None:
    assert set(ALGORITHMS) == set(REGISTRY)
    for coll, algos in ALGORITHMS.items():
        for name, algo in algos.items():
            assert algo.name == name and algo.kind in (SCHEDULE, DIRECT, COMPOSITE)
            assert (algo.kind == SCHEDULE) == (name in REGISTRY[coll])
            assert algo.blocking_only == (algo.kind != SCHEDULE)
    assert ({c for c, a in ALGORITHMS.items() if "shm" in a}
            == set(DIRECT_COLLECTIVES) | set(VECTOR_DIRECT))
    assert set(DIRECT_COLLECTIVES) == set(SHM_MODELS)  # the cost model knows each one
    assert [c for c, a in ALGORITHMS.items() if any(x.kind == COMPOSITE for x in a.values())
            ] == ["allreduce"]
    assert lookup("allreduce", "hierarchical").commutative_only
    with pytest.raises(ValueError, match=r"choose one of .*shm.*hierarchical"):
        lookup("allreduce", "nope")
    with pytest.raises(TypeError, match="only schedule algorithms"):
        lookup("bcast", "shm").build(None)  # type: ignore[arg-type]


def test_plan_names_the_choice_its_kind_and_why() -> None:
    s = Selector(constants.DEFAULTS)
    plan = s.plan("allreduce", 4, 8, "shm", shm=True)
    assert plan.algorithm == s.choose("allreduce", 4, 8, "shm", shm=True) == "shm"
    assert plan.kind == DIRECT and plan.why.startswith("cheapest predicted (formula costs")
    times = [t for _, t in plan.costs]
    assert times == sorted(times) and plan.costs[0][0] == plan.algorithm
    assert {n for n, _ in plan.costs} == set(REGISTRY["allreduce"]) | {"shm"}
    assert "shm (direct)" in str(plan) and "recursive_doubling" in str(plan)
    over_tcp = s.plan("allreduce", 4, 8, "tcp")
    assert over_tcp.kind == SCHEDULE and "shm" not in dict(over_tcp.costs)
    asked = s.plan("allreduce", 4, 8, "shm", "ring", shm=True)
    assert (asked.algorithm, asked.why) == ("ring", "asked for in the call")
    assert s.plan("allreduce", 1, 8, "self").why == "the only algorithm that can run this call"
    forced = Selector(constants.DEFAULTS, (("allreduce", "ring"), ("bcast", "shm")))
    assert forced.plan("allreduce", 4, 8, "tcp").why == "forced by RINGWORLD_ALGORITHMS"
    # forced but unable to run this call (ring is commutative only): chosen freely, and said
    free = forced.plan("allreduce", 4, 8, "tcp", commutative=False)
    assert free.algorithm != "ring" and "'ring' cannot run this call" in free.why
    assert forced.plan("bcast", 4, 8, "tcp").algorithm != "shm"  # no shared memory there
    with pytest.raises(ValueError, match="only for blocking allreduce"):
        s.plan("allreduce", 4, 8, "shm", "hierarchical")  # not decided hierarchical
    with pytest.raises(ValueError, match="not an algorithm of bcast"):
        s.plan("bcast", 4, 8, "shm", "hierarchical")


def test_use_hierarchy_is_decided_by_the_selector() -> None:
    s = Selector(constants.DEFAULTS)
    measured: list[int] = []

    def link(bw: float) -> float:
        measured.append(1)
        return bw

    assert s.use_hierarchy([4], 1 << 20, None, lambda: link(1e9)) is False  # one host
    assert s.use_hierarchy([1, 1, 1], 1 << 20, None, lambda: link(1e9)) is False  # 1 per host
    assert not measured  # neither needed the link
    assert s.use_hierarchy([2, 2], 8, "hierarchical", lambda: link(1e9)) is True
    assert s.use_hierarchy([2, 2], 8, "ring", lambda: link(1e9)) is False
    assert not measured
    # a slow link between hosts: the hierarchy moves fewer bytes across it and wins
    assert s.use_hierarchy([4, 4], 16 << 20, None, lambda: link(1e7)) is True
    assert measured == [1]
    flat, hier = s.hierarchical([4, 4], 16 << 20, 1e7)
    assert hier < flat
    forced = Selector(constants.DEFAULTS, (("allreduce", "hierarchical"),))
    assert forced.use_hierarchy([1, 1], 8, None, lambda: math.inf) is True
    plan = forced.plan("allreduce", 2, 8, "tcp", hierarchical=True)
    assert (plan.algorithm, plan.kind) == ("hierarchical", COMPOSITE)
    assert plan.why == "forced by RINGWORLD_ALGORITHMS"


CALLS = [("allreduce", 8), ("allreduce", 40_000), ("bcast", 8), ("bcast", 3 << 20),
         ("alltoall", 64), ("allgather", 80_000), ("reduce", 8), ("barrier", 0)]


def _plans_and_calls(c: Communicator) -> list[tuple[str, str, str]]:
    """Each call's plan, asked just before it runs, and the algorithm the call then took."""
    out = []
    p = c.size
    for coll, n in CALLS:
        plan = c.plan(coll, n)
        k = max(n // 8, 1)
        if coll == "allreduce":
            c.allreduce(np.ones(k), np.empty(k))
        elif coll == "bcast":
            c.bcast(np.ones(k), root=0)
        elif coll == "alltoall":
            c.alltoall(np.ones(k * p), np.empty(k * p))
        elif coll == "allgather":
            c.allgather(np.ones(k), np.empty(k * p))
        elif coll == "reduce":
            c.reduce(np.ones(k), np.empty(k), root=0)
        else:
            c.barrier()
        out.append((coll, plan.algorithm, c.last_algorithm))
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_a_live_plan_is_what_the_call_runs(size: int) -> None:
    for rank_out in run_threads(size, _plans_and_calls):
        for coll, planned, ran in rank_out:
            assert planned == ran, (coll, planned, ran)


def test_ringworld_plan_explain_prints_the_decision_a_call_takes() -> None:
    import os
    import subprocess
    import sys

    def explain(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringworld", "plan", *args],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "RINGWORLD_TUNER": "formula", **env})

    r = explain("--explain", "--collective", "allreduce", "--size", "8", "--ranks", "4")
    assert r.returncode == 0, r.stderr
    want = Selector(constants.DEFAULTS).plan("allreduce", 4, 8, "shm", shm=True)
    assert str(want) in r.stdout and "on 4 ranks of one host over shm" in r.stdout
    r = explain("--explain", "--size", "1MiB", "--transport", "tcp",
                RINGWORLD_ALGORITHMS="allreduce:ring")
    assert r.returncode == 0 and "ring (schedule): forced by RINGWORLD_ALGORITHMS" in r.stdout
    r = explain("--explain", "--collective", "alltoallw", "--algorithm", "shm")
    assert r.returncode == 2 and "not an algorithm of alltoallw" in r.stderr
    r = explain("--explain", "--collective", "allgatherv")
    assert r.returncode == 0 and "shm (direct): the ranks share memory" in r.stdout, r.stdout
    r = explain()
    assert r.returncode == 2 and "--topology is required (or --explain)" in r.stderr
