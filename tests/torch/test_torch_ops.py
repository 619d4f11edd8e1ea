"""The ringworld torch.distributed backend, op by op, at world sizes 1, 2 and 3 (forked ranks
through ``run_processes``, each job bounded by a hard timeout)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch (pip install torch)")

import torch_support as ts

from ringworld.testing import run_processes

SIZES = [1, 2, 3]
JOB_TIMEOUT = 100.0


def _no_failures(results: list[list[str]]) -> None:
    failures = [line for rank_failures in results for line in rank_failures]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("size", SIZES)
def test_reductions(size: int) -> None:
    _no_failures(run_processes(size, ts.reductions_job, timeout=JOB_TIMEOUT))


@pytest.mark.parametrize("size", SIZES)
def test_data_movement(size: int) -> None:
    _no_failures(run_processes(size, ts.movement_job, timeout=JOB_TIMEOUT))


@pytest.mark.parametrize("size", SIZES)
def test_futures_and_work(size: int) -> None:
    _no_failures(run_processes(size, ts.futures_job, timeout=JOB_TIMEOUT))


@pytest.mark.parametrize("size", [2, 3])
def test_send_recv(size: int) -> None:
    _no_failures(run_processes(size, ts.p2p_job, timeout=JOB_TIMEOUT))


def test_subgroups_and_gloo_beside() -> None:
    _no_failures(run_processes(3, ts.subgroup_job, timeout=JOB_TIMEOUT))


def test_world_size_must_match_ringworld() -> None:
    messages = run_processes(2, ts.mismatch_job, 3, timeout=JOB_TIMEOUT)
    for text in messages:
        assert "world_size=3" in text and "world of 2" in text, text


def test_a_rank_that_leaves_fails_the_others_collective() -> None:
    results = run_processes(3, ts.leaver_job, timeout=JOB_TIMEOUT)
    assert results[2] == "left"
    for text in results[:2]:
        # torch's error type, with Ringworld's message naming the rank
        assert text.startswith("DistBackendError: ringworld") and "PeerFailure" in text, text
        assert "rank 2" in text, text
