"""End to end through the launcher: the DDP example and the Gloo comparison benchmark run
under ``ringworld run`` (real interpreters), and the plain ``init_process_group("ringworld")``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch (pip install torch)")

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringworld", "run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def test_ddp_example_matches_gloo() -> None:
    proc = _run("-n", "2", sys.executable, "examples/torch_ddp.py", "--steps", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weights identical: True" in proc.stdout, proc.stdout


def test_allreduce_benchmark_checks_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = _run("-n", "2", sys.executable, "-m", "ringworld.bench.torch_allreduce",
                "--sizes", "4K,1M", "--iters", "3", "--warmup", "1", "--rounds", "1",
                "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [4096, 1 << 20]
    for r in rows:
        assert r["np"] == 2 and r["ringworld_us"] > 0 and r["gloo_us"] > 0
    assert "gloo/ringworld" in proc.stdout


PLAIN = """
import torch
import torch.distributed as dist
import ringworld.torch  # noqa: F401  (registers the backend)

dist.init_process_group(backend="ringworld")  # env:// from the variables the launcher sets
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.arange(4, dtype=torch.float64) + rank
dist.all_reduce(t)
expect = torch.arange(4, dtype=torch.float64) * size + sum(range(size))
gloo = dist.new_group(backend="gloo")  # the torchrun variables serve gloo too
u = torch.full((2,), float(rank))
dist.all_reduce(u, group=gloo)
print(f"rank {rank} of {size}: {bool((t == expect).all())} {u.tolist()}", flush=True)
dist.destroy_process_group()
"""


def test_plain_init_process_group_under_the_launcher(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text(PLAIN)
    proc = _run("-n", "3", sys.executable, str(prog))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(proc.stdout.split("\n")[:3])
    assert lines == [f"rank {r} of 3: True [3.0, 3.0]" for r in range(3)], proc.stdout
