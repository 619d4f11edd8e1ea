"""Torch jobs started without ``ringworld run``, as torch users start them (run as a program by
``test_torch_spawn.py``): ``mp.spawn`` with ``file://`` or ``tcp://``, plain processes for a
killed rank. The parent prints one ``RESULT <json>`` line per rank."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    """A port free now and below the kernel's ephemeral range: the jobs' own listeners bind
    port 0, and one drew a port picked from that range before torch's store bound it
    (EADDRINUSE, once in CI)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)  # (Linux's ephemeral ports start at 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found below 32000")


def _init(method: str, rank: int, size: int) -> None:
    _init_backend(method, rank, size, "ringworld")


def _init_backend(method: str, rank: int, size: int, backend: str) -> None:
    import ringworld.torch  # noqa: F401 (registers the backend)

    dist.init_process_group(backend, init_method=method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))


def spawned(rank: int, size: int, methods: list[str], out: Any) -> None:
    """Two jobs one after the other in this process: all_reduce, a subgroup, destroy (the
    process also holds a Ringworld singleton world, as a program using the native API alone
    would: torch's group is met through torch's store all the same)."""
    import ringworld

    ringworld.init()  # outside ringworld run: a world of 1
    sums, group = [], []
    for k, method in enumerate(methods):
        _init(method, rank, size)
        t = (torch.arange(4, dtype=torch.float64) + 10 * rank + k)
        dist.all_reduce(t)
        sums.append(t.tolist())
        g = dist.new_group([0, size - 1])
        u = torch.full((2,), float(rank + 1))
        if rank in (0, size - 1):
            dist.all_reduce(u, group=g)
        group.append(u.tolist())
        dist.barrier()
        dist.destroy_process_group()
    out.put({"rank": rank, "sums": sums, "group": group,
             "shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("ringworld"))})


def killed(rank: int, size: int, method: str, out: Any) -> None:
    """Rank 1 is killed after a first all_reduce; the others' next one must fail, naming it."""
    _init(method, rank, size)
    t = torch.ones(3)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        out.put({"rank": rank, "error": None})
    except Exception as exc:  # what torch users catch
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:400],
                 "seconds": time.monotonic() - start})


def modern(rank: int, size: int, method: str, backend: str, out: Any) -> None:
    """DeviceMesh, DTensor, torch.compile of a functional collective, the profiler, FSDP2."""
    _init_backend(method, rank, size, backend)
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (size,))
    whole = torch.arange(4.0 * size * 3).reshape(4 * size, 3)
    spread = distribute_tensor(whole, mesh, [Shard(0)])
    redistributed = bool(torch.equal(spread.redistribute(mesh, [Replicate()]).to_local(), whole))

    @torch.compile(backend="eager")
    def twice_summed(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x * 2, "sum", mesh) + 1

    compiled = twice_summed(torch.arange(3.0) + rank).tolist()
    from torch.profiler import profile

    with profile() as prof:
        dist.all_reduce(torch.ones(4))
    events = sorted({e.key for e in prof.key_averages() if "all_reduce" in e.key
                     or "allreduce" in e.key})
    out.put({"rank": rank, "redistributed": redistributed, "compiled": compiled,
             "events": events, "losses": _fsdp2_losses(rank, mesh),
             "tensor_parallel": _tensor_parallel(mesh)})
    dist.destroy_process_group()


def _tensor_parallel(mesh: Any) -> list[float]:
    """A column- then row-parallel pair of layers (tensor parallel over the mesh)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out: torch.Tensor = model(torch.arange(12.0).reshape(2, 6) / 10)
    return [round(v, 5) for v in out.detach().reshape(-1).tolist()]


def stalled(rank: int, size: int, method: str, out: Any) -> None:
    """A group with a 2 s timeout (passed with store=); rank 1 does not come to the second
    all_reduce: the others' must fail as the group's timeout says, not hang."""
    import ringworld.torch  # noqa: F401

    store = dist.FileStore(method[len("file://"):], size)
    dist.init_process_group("ringworld", store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=2))
    t = torch.ones(3)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(12)
        return
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        out.put({"rank": rank, "error": None})
    except Exception as exc:
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:400],
                 "seconds": time.monotonic() - start})


def _fsdp2_losses(rank: int, mesh: Any) -> list[float]:
    """A few steps of a small model under fully_shard; the loss averaged over ranks."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(4):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item())
    return losses


def main() -> None:
    kind, size = sys.argv[1], int(sys.argv[2])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()  # the ranks' results, printed here one line each (rank prints interleave)
    if kind in ("killed", "stalled"):
        method = "file://" + tempfile.mktemp(prefix="ringworld-test-")
        body = killed if kind == "killed" else stalled
        procs = [ctx.Process(target=body, args=(r, size, method, out)) for r in range(size)]
        for p in procs:
            p.start()
        for _ in range(size - 1):
            print("RESULT " + json.dumps(out.get(timeout=60)), flush=True)
        for p in procs:
            p.join(30)
        return
    if kind.startswith("modern-"):
        method = "file://" + tempfile.mktemp(prefix="ringworld-test-")
        mp.spawn(modern, args=(size, method, kind[7:], out), nprocs=size, join=True)
        for _ in range(size):
            print("RESULT " + json.dumps(out.get(timeout=30)), flush=True)
        return
    if kind == "file":
        methods = ["file://" + tempfile.mktemp(prefix="ringworld-test-") for _ in range(2)]
    else:
        methods = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(2)]
    mp.spawn(spawned, args=(size, methods, out), nprocs=size, join=True)
    for _ in range(size):
        print("RESULT " + json.dumps(out.get(timeout=30)), flush=True)


if __name__ == "__main__":
    main()
