"""The cost model, the algorithm choice and ``ringworld tune``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringworld.algorithms.registry import REGISTRY
from ringworld.errors import ConfigError
from ringworld.tuning import constants
from ringworld.tuning.cost import SHM_MODELS, Constants, model, predict
from ringworld.tuning.select import Selector


def test_every_algorithm_with_a_model_predicts_a_finite_growing_time() -> None:
    c = constants.DEFAULTS["shm"]
    for coll, algos in REGISTRY.items():
        for name in algos:
            if model(coll, name) is None:
                continue
            for p in (2, 3, 8, 17):
                small = predict(coll, name, p, 8, c, 1 << 20)
                large = predict(coll, name, p, 64 << 20, c, 1 << 20)
                assert 0 <= small < math.inf, (coll, name, p)
                assert large >= small, (coll, name, p)


def test_choice_follows_the_model() -> None:
    s = Selector(constants.DEFAULTS)
    # messages: few steps for tiny vectors, bandwidth-optimal schedules for large ones
    assert s.choose("allreduce", 4, 8, "tcp") == "recursive_doubling"
    assert s.choose("allreduce", 4, 64 << 20, "tcp") in ("ring", "rabenseifner")
    assert s.choose("allreduce", 5, 64 << 20, "tcp") in ("ring", "rabenseifner")
    # shared memory wins on one host when the call may use it
    assert s.choose("allreduce", 2, 8, "shm", shm=True) == "shm"
    assert s.choose("allreduce", 2, 8, "shm", shm=False) != "shm"
    table = s.explain("allreduce", 4, 1 << 20, "tcp")
    assert [t for _, t in table] == sorted(t for _, t in table)
    assert {name for name, _ in table} == set(REGISTRY["allreduce"])


def test_non_commutative_ops_never_get_out_of_order_algorithms() -> None:
    s = Selector(constants.DEFAULTS)
    for p in (2, 3, 4, 8):
        for n in (8, 1 << 20, 64 << 20):
            algo = s.choose("allreduce", p, n, "tcp", commutative=False)
            assert not REGISTRY["allreduce"][algo].commutative_only, (p, n, algo)
    with pytest.raises(ValueError, match="non-commutative"):
        s.choose("allreduce", 4, 64, "tcp", "ring", commutative=False)


def test_forced_choices_and_their_errors() -> None:
    s = Selector(constants.DEFAULTS, (("allreduce", "ring"), ("bcast", "shm")))
    assert s.choose("allreduce", 4, 8, "tcp") == "ring"
    assert s.choose("allreduce", 4, 8, "tcp", commutative=False) != "ring"  # falls back
    assert s.choose("bcast", 4, 8, "shm", shm=True) == "shm"
    assert s.choose("bcast", 4, 8, "tcp") != "shm"  # impossible here: chosen freely
    with pytest.raises(ConfigError, match="RINGWORLD_ALGORITHMS"):
        Selector(constants.DEFAULTS, (("allreduce", "nonsense"),))
    with pytest.raises(ValueError, match="shm"):
        s.choose("allreduce", 4, 8, "tcp", "shm")
    with pytest.raises(ValueError, match="not an algorithm of alltoallw; choose one of"):
        s.choose("alltoallw", 4, 8, "shm", "shm", shm=True)
    # the v-variants take the windows at every size where ranks share memory (sizes differ by
    # rank: no cost could choose alike), unless a schedule is asked for
    for n in (8, 1 << 30):
        assert s.choose("allgatherv", 4, n, "shm", shm=True, equal_blocks=False) == "shm"
        assert s.choose("alltoallv", 4, n, "shm", "pairwise", shm=True) == "pairwise"
        assert s.choose("gatherv", 4, n, "shm", shm=False) == "linear"
    assert s.choose("scatterv", 4, 8, "shm", "shm", shm=True, equal_blocks=False) == "shm"
    assert s.choose("reduce_scatter", 4, 8, "shm", shm=True, equal_blocks=False) == "shm"
    assert set(SHM_MODELS) <= set(REGISTRY)


def test_constants_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"constants": {"tcp": {
        "step": 1e-4, "message": 2e-5, "bandwidth": 1e9, "reduce_rate": 2e9, "copy_rate": 3e9}}}))
    table = constants.load(str(path))
    assert table["tcp"] == Constants(1e-4, 2e-5, 1e9, 2e9, 3e9)
    assert table["shm"] == constants.DEFAULTS["shm"]
    path.write_text("{}")
    with pytest.raises(ConfigError, match="ringworld tune"):
        constants.load(str(path))


def test_ringworld_tune_measures_and_saves(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    proc = subprocess.run([sys.executable, "-m", "ringworld", "tune", "--transport", "shm",
                           "--save", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "step" in proc.stdout and "saved to" in proc.stdout
    table = constants.load(str(out))
    c = table["shm"]
    assert 0 < c.step < 1 and 0 < c.sync < 1 and c.bandwidth > 1e7 and c.copy_rate > 1e7


def test_small_broadcasts_take_shared_memory() -> None:
    host = (0, 0, 0, 0)  # simulated on a job-built host, not this machine's /sys
    for s in (Selector(constants.DEFAULTS), Selector(constants.DEFAULTS, simulate=True)):
        for coll, nbytes in (("bcast", 1024), ("bcast", 1 << 14), ("bcast", 1 << 20),
                             ("allreduce", 1024)):
            assert s.choose(coll, 4, nbytes, "shm", shm=True, layout=host) == "shm", coll
        assert s.choose("bcast", 4, 1024, "shm", "binomial", shm=True) == "binomial"


def test_shared_memory_model_follows_the_algorithms_sizes() -> None:
    from ringworld.algorithms import shm_collectives as shm
    from ringworld.tuning import shm_paths
    from ringworld.tuning.cost import SHM_CHUNK, SHM_DIRECT, SHM_RACE, SHM_RACE_MAX, SHM_SLOT

    assert (SHM_CHUNK, SHM_SLOT) == (shm.CHUNK, shm.SLOT)
    # the model predicts the policy every communicator's arena is handed by default
    policy = Selector(constants.DEFAULTS).shm_policy
    assert policy is shm_paths.DEFAULT
    # the slots: copies up to their size; an allreduce while p vectors fit COMBINE_ALL, and
    # SMALL at any p; a policy may take less of them, never more
    assert policy.small("alltoall", 64) == policy.small("allgather", 2) == shm.SLOT
    assert policy.small("allreduce", 2) == shm.SLOT and policy.small("reduce", 4) == shm.SLOT / 2
    assert policy.small("allreduce", 200) == shm.SMALL
    assert policy.small("bcast", 3) == shm.EAGER_MAX  # the eager ring's, not the slots'
    low = dataclasses.replace(policy, slot_max=1000)
    assert low.small("allgather", 2) == low.small("allreduce", 2) == 1000
    assert dataclasses.replace(policy, slot_max=1 << 30).small("alltoall", 2) == shm.SLOT
    assert dict(policy.direct) == SHM_DIRECT and set(SHM_DIRECT) == set(shm.DIRECT)
    assert dict(policy.race_min) == SHM_RACE and policy.race_max == SHM_RACE_MAX
    # from the direct-read size on (or where the paths race), bytes move by kernel reads
    # (counted as read, at read_rate) instead of through the windows (counted as copied)
    c = Constants(step=0, message=0, bandwidth=4e9, reduce_rate=1e20, copy_rate=1e20, sync=0)
    for coll, direct in SHM_DIRECT.items():
        size = min(direct, SHM_RACE.get(coll, direct))
        n = size // 2 if coll == "alltoall" else size  # alltoall: the send buffer of 2 ranks
        m = model(coll, "shm")
        assert m is not None
        # calls that fit the slots take them (one sync) whatever the policy: the direct path
        # starts past them (the slots hold the send buffer's 2 blocks of n where it has them;
        # scatter's eager ring, the root's)
        per_n = 2 if coll in ("alltoall", "reduce_scatter_block", "scatter") else 1
        slots = int(policy.small(coll, 2)) // per_n
        if n <= slots and coll not in ("bcast", "gather"):  # (direct before ring and slots)
            assert m(2, n, 0).read == 0 and m(2, n, 0).syncs == 1, coll
            n = slots + 64
        below, at = m(2, n - 64, 0), m(2, n, 0)
        assert below.read == 0 and below.moved == 0 and at.read >= n / 2, (coll, below, at)
        if coll in SHM_RACE:  # raced: the faster of the direct reads and the windows
            assert at.alt is not None and at.alt.read == 0 and at.alt.copied > 0
            top = SHM_RACE_MAX // 2 if coll == "alltoall" else SHM_RACE_MAX
            assert m(2, top - 64, 0).alt is not None and m(2, top, 0).alt is None, coll
            slow = c._replace(copy_rate=1e8)
            assert at.time(slow) == pytest.approx(at._replace(alt=None).time(slow))
            assert at.time(c) == pytest.approx(at.alt.time(c))
            at = at._replace(alt=None)
        # an unfitted read rate is half the bandwidth (which counts both ends of a message)
        assert at.time(c) == pytest.approx(at.read / 2e9)
        assert at.time(c._replace(read_rate=8e9)) == pytest.approx(at.read / 8e9)
    # ranks that share cores: later direct paths (never for reduce_scatter_block), no race
    from ringworld.tuning.cost import SHM_DIRECT_CROWDED

    assert {c: policy.direct_from(c, True) for c in shm.DIRECT} == SHM_DIRECT_CROWDED
    assert SHM_DIRECT_CROWDED["reduce_scatter_block"] == math.inf  # never
    assert all(not policy.races(c, int(SHM_RACE[c]), crowded=True) for c in SHM_RACE)
    for coll, direct in SHM_DIRECT.items():
        size = int(min(SHM_DIRECT_CROWDED.get(coll, direct), 1 << 30))
        n = size // 4 if coll == "alltoall" else size  # alltoall: the send buffer of 4 ranks
        per_n = 4 if coll in ("alltoall", "reduce_scatter_block", "scatter") else 1
        n = max(n, int(policy.small(coll, 4)) // per_n + 64)  # (past the slots, as above)
        m = model(coll, "shm", crowded=True)
        assert m is not None
        below, at = m(4, n - 64, 0), m(4, n, 0)
        assert below.read == 0 and below.alt is None, coll
        if coll == "reduce_scatter_block":
            assert at.read == 0
        else:
            assert at.read > 0 and at.alt is None, coll


AFFINITY_JOB = """
import os
if os.environ["RINGWORLD_RANK"] == "0":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this rank counts one core
import ringworld
comm = ringworld.init()
print("crowded", comm.rank, comm.oversubscribed, flush=True)
ringworld.finalize()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_ranks_with_different_affinity_agree_on_crowding(tmp_path: Path) -> None:
    """Rank 0 may run on one core, rank 1 on all: both must call the job crowded (algorithm
    choices and shared-memory paths depend on it, and every rank must make the same)."""
    prog = tmp_path / "affinity.py"
    prog.write_text(AFFINITY_JOB)
    proc = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", sys.executable,
                           str(prog)], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = sorted(line.split()[1:] for line in proc.stdout.splitlines()
                  if line.startswith("crowded"))
    assert seen == [["0", "True"], ["1", "True"]], proc.stdout
