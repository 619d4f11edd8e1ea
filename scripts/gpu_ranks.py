"""The rank programs of scripts/gpu_check.py (each case runs under ``ringworld run`` there).

``python scripts/gpu_ranks.py CASE``: every rank prints one line ``RESULT {json}`` with what it
found; the check script collects them. Needs a GPU, torch with CUDA (and CuPy for the stream
case), nccl4py and an NCCL library. All ranks share GPU 0 when the machine has one GPU (NCCL 2.30+
with NCCL_MULTI_RANK_GPU_ENABLE=1).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ringworld

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
          "int8": torch.int8, "uint8": torch.uint8}


def report(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields, default=str), flush=True)


def data(rank: int, n: int, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """Unique per element and rank, exact in every dtype (small integers)."""
    base = (torch.arange(n, dtype=torch.float64) % 13) + 3 * rank + 1
    return base.to(dtype).to(dev)


def expected_reduce(p: int, n: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    parts = torch.stack([data(r, n, dtype, torch.device("cpu")).double() for r in range(p)])
    out = {"sum": parts.sum(0), "prod": parts.prod(0), "max": parts.max(0).values,
           "min": parts.min(0).values, "avg": parts.mean(0)}[op]
    return out.to(dtype).double()


def collectives(comm: ringworld.Communicator, dev: torch.device) -> list[str]:
    """Every collective of the device table on torch CUDA tensors, checked against values
    computed on the CPU; returns the failures."""
    p, r = comm.size, comm.rank
    bad: list[str] = []

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        g = got.detach().double().cpu()
        if g.shape != want.shape or not torch.allclose(g, want.double(), rtol=1e-2, atol=1e-2):
            bad.append(f"{what}: got {g[:6].tolist()} want {want[:6].tolist()}")

    for name, dt in DTYPES.items():
        for n in (0, 1, 1000 + p):  # counts 0, 1 and not divisible by the size
            ops = ["sum", "max", "min"] + (["avg"] if dt.is_floating_point else []) + (
                ["prod"] if n < 50 else [])
            for op in ops:
                if name in ("int8", "uint8") and op in ("sum", "prod", "avg"):
                    continue  # overflow: the check would be of wrapping, not of the library
                x = data(r, n, dt, dev)
                out = torch.empty_like(x)
                comm.allreduce(x, out, op)
                check(f"allreduce {name} n={n} {op}", out, expected_reduce(p, n, dt, op))
                y = data(r, n, dt, dev)
                comm.allreduce(ringworld.IN_PLACE, y, op)
                check(f"allreduce in place {name} n={n} {op}", y, expected_reduce(p, n, dt, op))
            b = data(r, n, dt, dev)
            comm.bcast(b, root=p - 1)
            check(f"bcast {name} n={n}", b, data(p - 1, n, dt, torch.device("cpu")).double())
            g = torch.empty(p * n, dtype=dt, device=dev)
            comm.allgather(data(r, n, dt, dev), g)
            want = torch.cat([data(i, n, dt, torch.device("cpu")) for i in range(p)]).double()
            check(f"allgather {name} n={n}", g, want)
            a2a_in = torch.cat([data(r * p + j, n, dt, dev) for j in range(p)])
            a2a_out = torch.empty_like(a2a_in)
            comm.alltoall(a2a_in, a2a_out)
            want = torch.cat([data(i * p + r, n, dt, torch.device("cpu")) for i in range(p)])
            check(f"alltoall {name} n={n}", a2a_out, want.double())
            if dt.is_floating_point or name in ("int32", "int64"):
                rs_in = torch.cat([data(r, n, dt, dev) + j for j in range(p)]) if n else \
                    torch.empty(0, dtype=dt, device=dev)
                rs_out = torch.empty(n, dtype=dt, device=dev)
                comm.reduce_scatter_block(rs_in, rs_out, "sum")
                want = sum(data(i, n, dt, torch.device("cpu")).double() + r for i in range(p))
                check(f"reduce_scatter_block {name} n={n}", rs_out,
                      want if n else torch.empty(0, dtype=torch.float64))
                red = torch.zeros(n, dtype=dt, device=dev)
                comm.reduce(data(r, n, dt, dev), red, "sum", root=0)
                if r == 0:
                    check(f"reduce {name} n={n}", red, expected_reduce(p, n, dt, "sum"))
            gat = torch.zeros(p * n, dtype=dt, device=dev) if r == 0 else None
            comm.gather(data(r, n, dt, dev), gat, root=0)
            if r == 0 and gat is not None:
                want = torch.cat([data(i, n, dt, torch.device("cpu")) for i in range(p)])
                check(f"gather {name} n={n}", gat, want.double())
            sc_in = torch.cat([data(j, n, dt, dev) for j in range(p)]) if r == 0 else None
            sc_out = torch.zeros(n, dtype=dt, device=dev)
            comm.scatter(sc_in, sc_out, root=0)
            check(f"scatter {name} n={n}", sc_out, data(r, n, dt, torch.device("cpu")).double())
    counts = [i + 1 for i in range(p)]
    v = torch.empty(sum(counts), dtype=torch.float32, device=dev)
    comm.allgatherv(data(r, counts[r], torch.float32, dev), v, counts)
    want = torch.cat([data(i, counts[i], torch.float32, torch.device("cpu")) for i in range(p)])
    check("allgatherv", v, want.double())
    for op in ("sum", "max"):
        cpu = torch.device("cpu")
        parts = torch.stack([data(i, 100, torch.float32, cpu) for i in range(p)])
        sc = torch.zeros(100, device=dev)
        comm.scan(data(r, 100, torch.float32, dev), sc, op)
        want = parts[: r + 1].sum(0) if op == "sum" else parts[: r + 1].amax(0)
        check(f"scan {op}", sc, want.double())
        ex = torch.zeros(100, device=dev)
        comm.exscan(data(r, 100, torch.float32, dev), ex, op)
        if r > 0:
            want = parts[:r].sum(0) if op == "sum" else parts[:r].amax(0)
            check(f"exscan {op}", ex, want.double())
    req = comm.iallreduce(ringworld.IN_PLACE, x := data(r, 4096, torch.float32, dev), "sum")
    polls = 0
    while not req.test():
        polls += 1
    req.wait()
    check(f"iallreduce (test() polled {polls} times)", x,
          expected_reduce(p, 4096, torch.float32, "sum"))
    return bad


def case_collectives() -> None:
    comm = ringworld.init()
    dev = torch.device("cuda", ringworld.local_device())
    t0 = time.perf_counter()
    bad = collectives(comm, dev)
    report(rank=comm.rank, size=comm.size, failures=bad[:20], n_failures=len(bad),
           seconds=round(time.perf_counter() - t0, 2), nccl=comm.last_algorithm)


def case_cupy_stream() -> None:
    import cupy as cp

    comm = ringworld.init()
    dev = ringworld.local_device()
    with cp.cuda.Device(dev):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.arange(1 << 20, dtype=cp.float32) + comm.rank
            comm.allreduce(ringworld.IN_PLACE, x, "sum")  # CuPy's current stream: s
        with ringworld.device_stream(s):
            y = cp.ones(1 << 20, dtype=cp.float64)
            req = comm.iallreduce(ringworld.IN_PLACE, y, "max")
            req.wait(timeout=30)
        want = comm.size * cp.arange(1 << 20, dtype=cp.float32) + sum(range(comm.size))
        report(rank=comm.rank, ok=bool(cp.all(x == want)) and bool(cp.all(y == 1)),
               stream=int(s.ptr))


def case_p2p() -> None:
    """Device send/recv: a ring with sendrecv, tags, a truncated message (TruncationError),
    and two messages received in the reverse of the order sent (each gets its own bytes)."""
    comm = ringworld.init()
    dev = torch.device("cuda", ringworld.local_device())
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    out = data(r, 1 << 16, torch.float32, dev)
    got = torch.zeros_like(out)
    st = comm.sendrecv(out, right, got, left, sendtag=5, recvtag=5)
    ring_ok = bool(torch.equal(got.cpu(), data(left, 1 << 16, torch.float32,
                                               torch.device("cpu")))) and st.source == left
    truncated = order = None
    if r == 0:
        comm.send(torch.ones(100, device=dev), 1, tag=7)
        reqs = [comm.isend(torch.full((8,), 8.0, device=dev), 1, tag=8),
                comm.isend(torch.full((8,), 9.0, device=dev), 1, tag=9)]
        ringworld.wait_all(reqs, timeout=20)
    elif r == 1:
        try:
            comm.recv(torch.zeros(10, device=dev), 0, tag=7)
        except Exception as exc:
            truncated = f"{type(exc).__name__}: {exc}"[:200]
        # posted (and waited) in the reverse of the order sent: each still gets its own
        nine, eight = torch.zeros(8, device=dev), torch.zeros(8, device=dev)
        q9 = comm.irecv(nine, 0, tag=9)
        q8 = comm.irecv(eight, 0, tag=8)
        q9.wait(timeout=20)
        q8.wait(timeout=20)
        order = bool(torch.all(nine == 9)) and bool(torch.all(eight == 8))
    report(rank=r, ring_ok=ring_ok, truncated=truncated, reverse_order_ok=order)


def case_kill() -> None:
    """Rank 1 dies (SIGKILL) while rank 0 waits in a 64 MiB allreduce: rank 0 must raise
    PeerFailure naming rank 1 within about 2 s."""
    comm = ringworld.init()
    dev = torch.device("cuda", ringworld.local_device())
    x = torch.ones(16 << 20, device=dev)
    comm.allreduce(ringworld.IN_PLACE, x)  # the NCCL communicator is up
    stamp = "/tmp/ringworld-gpu-kill-at"
    if comm.rank == 1:
        time.sleep(0.5)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.allreduce(ringworld.IN_PLACE, x, timeout=60)
        report(rank=comm.rank, raised=None)
    except Exception as exc:
        now = time.time()
        killed = float(Path(stamp).read_text()) if os.path.exists(stamp) else now
        report(rank=comm.rank, raised=type(exc).__name__, message=str(exc)[:300],
               names_rank_1=getattr(exc, "rank", None) == 1,
               seconds_after_kill=round(now - killed, 3))


def case_timeout() -> None:
    """Rank 1 comes 6 s late: rank 0's allreduce(timeout=1) must raise Timeout in ~1 s."""
    comm = ringworld.init()
    dev = torch.device("cuda", ringworld.local_device())
    x = torch.ones(1 << 20, device=dev)
    comm.allreduce(ringworld.IN_PLACE, x)
    if comm.rank == 1:
        time.sleep(6)
    t0 = time.perf_counter()
    try:
        comm.allreduce(ringworld.IN_PLACE, x, timeout=1.0)
        report(rank=comm.rank, raised=None, seconds=round(time.perf_counter() - t0, 3))
    except Exception as exc:
        report(rank=comm.rank, raised=type(exc).__name__, message=str(exc)[:300],
               seconds=round(time.perf_counter() - t0, 3))


def case_mismatch() -> None:
    """Ranks disagree on the count: MismatchError on every rank; then the communicator works."""
    comm = ringworld.init()
    dev = torch.device("cuda", ringworld.local_device())
    comm.allreduce(ringworld.IN_PLACE, torch.ones(8, device=dev))
    x = torch.ones(1024 * (comm.rank + 1), device=dev)
    t0 = time.perf_counter()
    try:
        comm.allreduce(ringworld.IN_PLACE, x, timeout=20)
        first = None
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}"[:300]
    after = torch.ones(64, device=dev)
    comm.allreduce(ringworld.IN_PLACE, after)
    report(rank=comm.rank, first=first, seconds=round(time.perf_counter() - t0, 3),
           usable_after=bool(torch.all(after == comm.size)))


def case_torch() -> None:
    """torch.distributed with backend "ringworld" on CUDA tensors beside "nccl": collectives and
    a few DDP steps with equal losses."""
    import torch.distributed as dist

    import ringworld.torch  # registers the backend

    dev = torch.device("cuda", ringworld.local_device())
    dist.init_process_group("ringworld", device_id=None)
    rw = dist.group.WORLD
    nc = dist.new_group(backend="nccl")
    r, p = dist.get_rank(), dist.get_world_size()
    x = torch.arange(1000, dtype=torch.bfloat16, device=dev) + r
    y = x.clone()
    dist.all_reduce(x, group=rw)
    dist.all_reduce(y, group=nc)
    same_allreduce = bool(torch.equal(x, y))
    z = torch.full((4,), float(r), device=dev)
    dist.all_reduce(z, op=dist.ReduceOp.AVG, group=rw)
    out = torch.empty(p * 4, device=dev)
    dist.all_gather_into_tensor(out, torch.full((4,), float(r), device=dev), group=rw)
    losses: dict[str, list[float]] = {}
    for name, group in (("ringworld", rw), ("nccl", nc)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8)).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index],
                                                        process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator(device="cpu").manual_seed(100 + r)
        losses[name] = []
        for _ in range(5):
            xb = torch.randn(32, 64, generator=g).to(dev)
            loss = ddp(xb).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(round(float(loss), 6))
    report(rank=r, same_allreduce=same_allreduce, avg_ok=bool(torch.allclose(
        z, torch.full((4,), (p - 1) / 2, device=dev))),
        allgather_ok=bool(torch.equal(out.cpu(), torch.arange(p).repeat_interleave(4).float())),
        losses=losses, ddp_equal=losses["ringworld"] == losses["nccl"])
    dist.destroy_process_group()


def main() -> None:
    cases: dict[str, Callable[[], None]] = {
        "collectives": case_collectives, "cupy_stream": case_cupy_stream, "p2p": case_p2p,
        "kill": case_kill,
        "timeout": case_timeout, "mismatch": case_mismatch, "torch": case_torch}
    try:
        cases[sys.argv[1]]()
    except Exception as exc:
        report(rank=int(os.environ.get("RANK", "-1")), crashed=f"{type(exc).__name__}: {exc}",
               trace=traceback.format_exc()[-2000:])
        raise


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
