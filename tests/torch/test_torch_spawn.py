"""torch.distributed as torch users start it, without ``ringworld run``: the ranks meet
through the store torch hands the backend (``mp.spawn`` with ``file://`` and ``tcp://``), a
subgroup works, the group is destroyed and made again in the same processes, nothing is left
in /dev/shm, and a killed rank is named by the others' next call within seconds, as torch's
DistBackendError. The modern surface runs on it as on Gloo: DeviceMesh, DTensor, a compiled
functional all_reduce, the profiler's events, and FSDP2 to Gloo's losses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch (pip install torch)")

PROGRAM = Path(__file__).with_name("spawn_programs.py")
ELASTIC = Path(__file__).with_name("elastic_program.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env["PYTHONPATH"] = str(SRC)
    return env


def _run(*args: str, reference: bool = False) -> list[dict[str, Any]]:
    """The program's RESULT lines. ``reference``: a run of torch's own Gloo, tried once more
    when a rank died of a signal (Gloo's threads sometimes abort the process at teardown under
    load, "terminate called without an active exception": torch's crash, not ours)."""
    env = _env()
    for attempt in (1, 2):
        proc = subprocess.run([sys.executable, str(PROGRAM), *args], env=env,
                              capture_output=True, text=True, timeout=150, check=False,
                              stdin=subprocess.DEVNULL)
        if not (reference and attempt == 1 and "terminated with signal" in proc.stderr):
            break
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
    gloo = sorted(_run("modern-gloo", "2", reference=True), key=lambda r: r["rank"])
    for r, g in zip(ours, gloo, strict=True):
        assert r["redistributed"] and r["compiled"] == g["compiled"], (r, g)
        assert r["compiled"] == [2.0 * (2 * i + 1) + 1 for i in range(3)], r
        assert r["events"] == ["ringworld:allreduce"], r
        assert r["losses"] == g["losses"] and len(set(r["losses"])) > 1, (r, g)
        assert r["tensor_parallel"] == g["tensor_parallel"], (r, g)


@pytest.mark.timeout(200)
def test_the_group_timeout_bounds_a_call_a_rank_never_joins() -> None:
    results = _run("stalled", "2")
    assert [r["rank"] for r in results] == [0]
    r = results[0]
    assert r["error"] is not None and r["error"].startswith("DistBackendError"), r
    assert "Timeout" in r["error"] and 1.5 < r["seconds"] < 8, r


def _torchrun(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--max-restarts",
                             "1", "--monitor-interval", "0.2", *args, str(ELASTIC)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, stdin=subprocess.DEVNULL)


def _finished(procs: list[subprocess.Popen[str]]) -> str:
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=150)
            out.append(text)
        for p in procs:
            assert p.returncode == 0, "\n---\n".join(t[-4000:] for t in out)
    finally:
        for p in procs:
            p.kill()
            p.communicate()  # closes its pipe (a failed run must leave no open file behind)
    return "".join(out)


@pytest.mark.timeout(200)
def test_torchrun_elastic_restart_after_a_rank_is_killed() -> None:
    text = _finished([_torchrun("--nproc-per-node", "2")])
    for rank in (0, 1):
        assert f"rank {rank} restart 1: [6.0, 6.0, 6.0]" in text, text[-3000:]


#: torchrun's own failures of a two-agent restart on a loaded 2-core host: the same job over
#: gloo, with no Ringworld in it, failed 2 of 3 runs here with these (an agent's rendezvous
#: closed or lost its store while the other restarted), so such a run is tried again
TORCH_RENDEZVOUS_FLAKES = ("RendezvousClosedError", "RendezvousConnectionError",
                           "RendezvousTimeoutError")


@pytest.mark.timeout(400)
def test_torchrun_two_nodes_restart_through_the_agents_store() -> None:
    for attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"rw{port}"]
        try:
            text = _finished([_torchrun(*rdzv), _torchrun(*rdzv)])
            break
        except AssertionError as exc:
            if attempt == 2 or not any(f in str(exc) for f in TORCH_RENDEZVOUS_FLAKES):
                raise
    for rank in (0, 1):
        assert f"rank {rank} restart 1: [6.0, 6.0, 6.0]" in text, text[-3000:]


NATIVE = ("import numpy as np, ringworld\nc = ringworld.init()\n"
          "c.allreduce(np.ones(3), np.empty(3))\n")
TORCH = ("import torch, torch.distributed as dist, ringworld.torch\n"
         "dist.init_process_group('ringworld')\ndist.all_reduce(torch.ones(3))\n"
         "dist.destroy_process_group()\n")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("program", ["native", "torch"])
def test_traces_under_torchrun_are_merged_at_the_end(program: str, tmp_path: Path) -> None:
    script = tmp_path / "traced.py"
    script.write_text(NATIVE if program == "native" else TORCH)
    out = tmp_path / "trace.json"
    env = {**_env(), "RINGWORLD_TRACE": str(out)}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(script)], env=env, capture_output=True, text=True, timeout=150,
                       check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["otherData"]["ranks"] == 2
    assert not list(tmp_path.glob("trace.json.rank*")), "the parts are merged away"
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert any(n.startswith("allreduce ") for n in names), names
