"""DistributedDataParallel trains on the ringworld backend exactly as on Gloo: the same model
from the same seed, trained on both in the same forked ranks, ends with identical weights."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch (pip install torch)")

import torch_support as ts

from ringworld.testing import run_processes

STEPS = 6


def test_ddp_identical_to_gloo_at_two_ranks() -> None:
    """Two ranks: each gradient element is one float addition, so the weights match bitwise."""
    results = run_processes(2, ts.ddp_job, STEPS, timeout=100)
    for rank, r in enumerate(results):
        assert r["moved"] > 0, f"rank {rank}: training did not change the weights"
        assert r["identical"], f"rank {rank}: largest difference {r['max_diff']}"
    assert results[0]["weights"] == results[1]["weights"], "ranks disagree on the weights"


def test_ddp_matches_gloo_at_three_ranks() -> None:
    """Three ranks: Gloo adds the three gradients in another order, so allow rounding."""
    results = run_processes(3, ts.ddp_job, STEPS, timeout=100)
    for rank, r in enumerate(results):
        assert r["moved"] > 0, f"rank {rank}: training did not change the weights"
        assert r["max_diff"] < 1e-6, f"rank {rank}: largest difference {r['max_diff']}"
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]


def test_ddp_with_a_compressing_comm_hook() -> None:
    """fp16_compress_hook: DDP's futures chained with then() (decompress on completion)."""
    results = run_processes(2, ts.ddp_job, STEPS, "fp16_compress_hook", timeout=100)
    for rank, r in enumerate(results):
        assert r["moved"] > 0, f"rank {rank}: training did not change the weights"
        assert r["identical"], f"rank {rank}: largest difference {r['max_diff']}"
