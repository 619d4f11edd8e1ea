"""torch.distributed as torch users start it, without ``ringworld run``: the ranks meet
through the store torch hands the backend (``mp.spawn`` with ``file://`` and ``tcp://``), a
subgroup works, the group is destroyed and made again in the same processes, nothing is left
in /dev/shm, and a killed rank is named by the others' next call within seconds, as torch's
DistBackendError. The modern surface runs on it as on Gloo: DeviceMesh, DTensor, a compiled
functional all_reduce, the profiler's events, and FSDP2 to Gloo's losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch (pip install torch)")

PROGRAM = Path(__file__).with_name("spawn_programs.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def _run(*args: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env["PYTHONPATH"] = str(SRC)
    proc = subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True,
                          text=True, timeout=150, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads(line[7:]) for line in proc.stdout.splitlines()
            if line.startswith("RESULT ")]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("method", "size"), [("file", 2), ("tcp", 3)])
def test_mp_spawn_init_destroy_init(method: str, size: int) -> None:
    results = sorted(_run(method, str(size)), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == list(range(size))
    for r in results:
        want = [[sum(10.0 * q + k + i for q in range(size)) for i in range(4)]
                for k in range(2)]  # job k: every rank's arange(4) + 10 * rank + k
        assert r["sums"] == want, r
        # the subgroup of ranks 0 and size-1 sums their rank + 1; the others keep their own
        own = float(size + 1 if r["rank"] in (0, size - 1) else r["rank"] + 1)
        assert r["group"] == [[own] * 2] * 2, r
        assert r["shm"] == [], r  # every segment was unlinked


@pytest.mark.timeout(200)
def test_a_killed_rank_is_named_by_the_others() -> None:
    results = _run("killed", "3")
    assert sorted(r["rank"] for r in results) == [0, 2]
    for r in results:
        assert r["error"] is not None and "rank 1" in r["error"], r
        assert r["error"].startswith("DistBackendError: ringworld allreduce: PeerFailure"), r
        assert r["seconds"] < 10, r


@pytest.mark.timeout(300)
def test_device_mesh_dtensor_compile_profiler_and_fsdp2_as_on_gloo() -> None:
    ours = sorted(_run("modern-ringworld", "2"), key=lambda r: r["rank"])
    gloo = sorted(_run("modern-gloo", "2"), key=lambda r: r["rank"])
    for r, g in zip(ours, gloo, strict=True):
        assert r["redistributed"] and r["compiled"] == g["compiled"], (r, g)
        assert r["compiled"] == [2.0 * (2 * i + 1) + 1 for i in range(3)], r
        assert r["events"] == ["ringworld:allreduce"], r
        assert r["losses"] == g["losses"] and len(set(r["losses"])) > 1, (r, g)
