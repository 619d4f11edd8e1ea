"""Rank side of ``ringworld bench <collective>``: an nccl-tests-style size sweep, three backends.

For each collective and size (bytes of float32 data; for allgather, reduce_scatter, alltoall,
gather and scatter the size is the whole buffer, as in nccl-tests) every rank:

1. fills its send buffer, runs the collective once (set-up), then a warm-up of about a sixth
   of ``--time-per-size`` (at least 2 iterations);
2. agrees with the others on an iteration count that makes the size take ``--time-per-size``
   seconds (or uses ``--iters``);
3. with checking on, runs it once more into a buffer of NaNs and counts the elements that differ
   from a numpy reference computed locally from every rank's (deterministic) send data;
4. after a barrier, times the iterations (topping up with further rounds, each after a barrier,
   while the slowest rank has spent well under the budget); the reported time is the max over
   ranks of the mean time per iteration, algbw = bytes / time and busbw = algbw * the
   nccl-tests factor.

Data are small integers in float32 so every sum is exact: for reductions
``(g * 7919 + (rank + 1) * 104729) % 1021 + 1`` of the global element index ``g``; otherwise
``(g * 40503) % 2**24``, unique per element of the whole job up to 16 Mi elements.

Backends (``--backend``, imported lazily so this file needs only numpy and runs without
Ringworld installed):

``ringworld``  ``ringworld.init()`` under ``ringworld run``
``ringworld-mpi``  the mpi4py backend's calls through ``ringworld.MPI``, under ``ringworld run``
``mpi4py``     ``MPI.COMM_WORLD`` under ``mpiexec``
``gloo``       ``torch.distributed`` with the gloo backend, under ``gloo_launch.py``; its
               reductions are in place only, so they are timed on a buffer of zeros (sums of
               zeros cost the same) and checked on a copy of the send data.
``nccl``       the same with torch's ProcessGroupNCCL (``--device cuda``).

``--device cuda`` puts every buffer on the rank's GPU (torch CUDA tensors; Ringworld's calls then
run on its NCCL plane): data are made and checked on the host and copied over.

Rank 0 writes JSON (rewritten after every size, so a killed job keeps what it measured) and
prints ``@@progress`` lines on stderr. Exit status 3 when any element was wrong.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

COLLECTIVES = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall",
               "gather", "scatter", "barrier", "scan", "allgatherv", "gatherv", "scatterv",
               "alltoallv")
#: The v-variants, each run with equal counts (as OSU's osu_allgatherv and others measure
#: them): the same data and results as the collective named here, through the vector calls.
VECTOR = {"allgatherv": "allgather", "gatherv": "gather", "scatterv": "scatter",
          "alltoallv": "alltoall"}
#: Collectives whose size is the whole buffer (n blocks of ``count`` elements).
WHOLE_BUFFER = frozenset({"allgather", "reduce_scatter", "alltoall", "gather", "scatter",
                          *VECTOR})
#: Collectives that add (their data are the small-integer pattern).
REDUCING = frozenset({"allreduce", "reduce", "reduce_scatter", "scan"})
#: Name of each collective in ``ringworld.algorithms.registry.REGISTRY``.
REGISTRY_NAME = {"reduce_scatter": "reduce_scatter_block"}
ROOT = 0
ITEM = 4  # bytes per float32
ALIGN = 64
REDUCE_MOD = 1021
UNIQUE_MOD = 1 << 24
TAG_OBJ = 0x5EE
PROGRESS = "@@progress"
MAX_ITERS = 1_000_000
WARMUP_SHARE = 1 / 6  # seconds of warm-up after the set-up call, per second of timing
WARMUP_MAX = 200
TIMED_ROUNDS = 4  # timed loops per size at most (each after a barrier), while under budget
TOP_UP_BELOW = 0.6  # another round when the slowest rank spent less than this share of it


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw factor (1 for bcast, reduce and scan; 0 for barrier)."""
    n = nranks
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in WHOLE_BUFFER:
        return (n - 1) / n
    return 0.0 if collective == "barrier" else 1.0


def block_count(collective: str, nbytes: int, nranks: int) -> int:
    """Elements per block for a requested size: at least 1, rounded down like nccl-tests."""
    if collective == "barrier":
        return 0
    per = ITEM * nranks if collective in WHOLE_BUFFER else ITEM
    return max(1, nbytes // per)


def actual_bytes(collective: str, count: int, nranks: int) -> int:
    """The bytes a sweep row reports for ``count`` elements per block."""
    return ITEM * count * (nranks if collective in WHOLE_BUFFER else 1)


# --------------------------------------------------------------------------------------------
# Data and the reference


def aligned(count: int) -> F32:
    """An uninitialised float32 array of ``count`` elements on an ``ALIGN``-byte boundary."""
    raw = np.empty(count * ITEM + ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGN
    return raw[offset : offset + count * ITEM].view(np.float32)


def reduce_values(count: int, offset: int, rank: int) -> F32:
    """Rank ``rank``'s contribution to a reduction at global indices ``offset..offset+count``."""
    g = np.arange(offset, offset + count, dtype=np.int64)
    g *= 7919
    g += (rank + 1) * 104729
    g %= REDUCE_MOD
    g += 1
    return g.astype(np.float32)


def unique_values(count: int, offset: int) -> F32:
    """Values unique per global index ``offset..offset+count`` (modulo 2**24)."""
    g = np.arange(offset, offset + count, dtype=np.int64)
    g *= 40503
    g %= UNIQUE_MOD
    return g.astype(np.float32)


def _sum_over(ranks: range, count: int, offset: int) -> F32:
    total = np.zeros(count, dtype=np.float32)
    for q in ranks:
        total += reduce_values(count, offset, q)
    return total


def send_data(collective: str, rank: int, nranks: int, count: int) -> F32:
    """What ``rank`` sends (for bcast and scatter only the root's matters)."""
    n, c = nranks, count
    collective = VECTOR.get(collective, collective)
    if collective in ("allreduce", "reduce", "scan"):
        return reduce_values(c, 0, rank)
    if collective == "reduce_scatter":
        return reduce_values(n * c, 0, rank)
    if collective == "bcast":
        return unique_values(c, 0)
    if collective in ("allgather", "gather"):
        return unique_values(c, rank * c)
    if collective == "alltoall":
        return unique_values(n * c, rank * n * c)
    if collective == "scatter":
        return unique_values(n * c, 0)
    raise ValueError(f"no data for {collective!r}")


def expected(collective: str, rank: int, nranks: int, count: int) -> F32 | None:
    """What ``rank`` must hold afterwards, or None where nothing is defined (non-root reduce)."""
    n, c = nranks, count
    collective = VECTOR.get(collective, collective)
    if collective == "allreduce" or (collective == "reduce" and rank == ROOT):
        return _sum_over(range(n), c, 0)
    if collective == "scan":
        return _sum_over(range(rank + 1), c, 0)
    if collective == "reduce_scatter":
        return _sum_over(range(n), c, rank * c)
    if collective == "bcast":
        return unique_values(c, 0)
    if collective == "allgather" or (collective == "gather" and rank == ROOT):
        return unique_values(n * c, 0)
    if collective == "alltoall":
        return np.concatenate([unique_values(c, q * n * c + rank * c) for q in range(n)])
    if collective == "scatter":
        return unique_values(c, rank * c)
    return None


def count_wrong(got: F32, want: F32 | None) -> tuple[int, int]:
    """(wrong elements, checked elements); NaN (never written) counts as wrong."""
    if want is None:
        return 0, 0
    if got.shape != want.shape:
        return max(got.size, want.size), max(got.size, want.size)
    return int(np.count_nonzero(got != want)), int(want.size)


@dataclass(slots=True)
class Buffers:
    """One size's buffers; for bcast ``recv`` is the one buffer broadcast in place."""

    send: F32
    recv: F32


def make_buffers(collective: str, rank: int, nranks: int, count: int) -> Buffers:
    """Allocate (aligned) and fill the send buffer; the receive buffer is left for a reset."""
    n, c = nranks, count
    if collective == "barrier":
        return Buffers(aligned(0), aligned(0))
    send = send_data(collective, rank, n, c)
    sbuf = aligned(send.size)
    sbuf[:] = send
    recv_count = {"allgather": n * c, "gather": n * c, "alltoall": n * c}.get(
        VECTOR.get(collective, collective), c)
    return Buffers(sbuf, aligned(recv_count))


# --------------------------------------------------------------------------------------------
# Backends


Op = Callable[[], object]


@dataclass(frozen=True, slots=True)
class Backend:
    """What the sweep needs from a library."""

    library: str
    rank: int
    size: int
    barrier: Callable[[], object]
    allgather_obj: Callable[[Any], list[Any]]
    make_op: Callable[[str, Buffers], Op]  # raises NotImplementedError when unsupported
    algorithm: Callable[[], str]
    close: Callable[[], object]
    inplace_reductions: bool = False  # allreduce/reduce reduce ``recv`` in place


def ringworld_backend(algorithm: str | None, device: str = "cpu") -> Backend:
    """The native API over ``ringworld.init()`` (started by ``ringworld run``); ``device``
    "cuda": the buffers are torch CUDA tensors on this rank's GPU (the NCCL plane)."""
    from importlib.metadata import version

    import ringworld

    comm: Any = ringworld.init()
    if device == "cuda":
        ringworld.local_device()
    rank, size = comm.rank, comm.size
    kw: dict[str, Any] = {} if algorithm is None else {"algorithm": algorithm}

    def allgather_obj(obj: Any) -> list[Any]:
        if rank == 0:
            items = [obj, *(comm.recv_obj(source=q, tag=TAG_OBJ) for q in range(1, size))]
            for q in range(1, size):
                comm.send_obj(items, q, TAG_OBJ)
            return items
        comm.send_obj(obj, 0, TAG_OBJ)
        result: list[Any] = comm.recv_obj(source=0, tag=TAG_OBJ)
        return result

    def make_op(collective: str, b: Buffers) -> Op:
        s, r = b.send, b.recv
        ops: dict[str, Op] = {
            "allreduce": lambda: comm.allreduce(s, r, "sum", **kw),
            "bcast": lambda: comm.bcast(r, ROOT, **kw),
            "reduce": lambda: comm.reduce(s, r, "sum", ROOT, **kw),
            "allgather": lambda: comm.allgather(s, r, **kw),
            "reduce_scatter": lambda: comm.reduce_scatter_block(s, r, "sum", **kw),
            "alltoall": lambda: comm.alltoall(s, r, **kw),
            "gather": lambda: comm.gather(s, r, ROOT, **kw),
            "scatter": lambda: comm.scatter(s, r, ROOT, **kw),
            "scan": lambda: comm.scan(s, r, "sum", **kw),
            "barrier": lambda: comm.barrier(**kw),
        }
        if collective in VECTOR:  # equal counts, in elements
            counts, displs = _equal_counts(collective, b, size)
            ops.update({
                "allgatherv": lambda: comm.allgatherv(s, r, counts, displs, **kw),
                "gatherv": lambda: comm.gatherv(s, r, counts, displs, ROOT, **kw),
                "scatterv": lambda: comm.scatterv(s, r, counts, displs, ROOT, **kw),
                "alltoallv": lambda: comm.alltoallv(s, r, counts, counts, displs, displs,
                                                    **kw),
            })
        name = "reduce_scatter_block" if collective == "reduce_scatter" else collective
        if not callable(getattr(comm, name, None)):
            raise NotImplementedError(f"this Ringworld has no Communicator.{name}")
        return ops[collective]

    return Backend(
        library=f"ringworld {version('ringworld')}",
        rank=rank,
        size=size,
        barrier=comm.barrier,
        allgather_obj=allgather_obj,
        make_op=make_op,
        algorithm=lambda: str(getattr(comm, "last_algorithm", "?")),
        close=ringworld.finalize,
    )


def mpi4py_backend(through_ringworld: bool = False) -> Backend:
    """mpi4py's ``COMM_WORLD`` (started by ``mpiexec``), or the same calls through
    ``ringworld.MPI`` (``through_ringworld``: started by ``ringworld run``), the layer ported
    mpi4py programs use."""
    import importlib
    from importlib.metadata import version

    MPI: Any = importlib.import_module(  # noqa: N806 (the name mpi4py programs use)
        "ringworld.MPI" if through_ringworld else "mpi4py.MPI")
    if through_ringworld:
        library = f"ringworld {version('ringworld')} (ringworld.MPI)"
    else:
        first = " ".join(MPI.Get_library_version().splitlines()[0].split())
        library = f"{first} (mpi4py {importlib.import_module('mpi4py').__version__})"
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def make_op(collective: str, b: Buffers) -> Op:
        s, r, f = b.send, b.recv, MPI.FLOAT
        ops: dict[str, Op] = {
            "allreduce": lambda: comm.Allreduce([s, f], [r, f], MPI.SUM),
            "bcast": lambda: comm.Bcast([r, f], ROOT),
            "reduce": lambda: comm.Reduce([s, f], [r, f], MPI.SUM, ROOT),
            "allgather": lambda: comm.Allgather([s, f], [r, f]),
            "reduce_scatter": lambda: comm.Reduce_scatter_block([s, f], [r, f], MPI.SUM),
            "alltoall": lambda: comm.Alltoall([s, f], [r, f]),
            "gather": lambda: comm.Gather([s, f], [r, f], ROOT),
            "scatter": lambda: comm.Scatter([s, f], [r, f], ROOT),
            "scan": lambda: comm.Scan([s, f], [r, f], MPI.SUM),
            "barrier": comm.Barrier,
        }
        if collective in VECTOR:  # equal counts, as [buf, (counts, displs), datatype]
            cd = _equal_counts(collective, b, comm.Get_size())
            ops.update({
                "allgatherv": lambda: comm.Allgatherv([s, f], [r, cd, f]),
                "gatherv": lambda: comm.Gatherv([s, f], [r, cd, f], ROOT),
                "scatterv": lambda: comm.Scatterv([s, cd, f], [r, f], ROOT),
                "alltoallv": lambda: comm.Alltoallv([s, cd, f], [r, cd, f]),
            })
        return ops[collective]

    return Backend(
        library=library,
        rank=rank,
        size=comm.Get_size(),
        barrier=comm.Barrier,
        allgather_obj=comm.allgather,
        make_op=make_op,
        algorithm=lambda: "ringworld.MPI" if through_ringworld else "mpi",
        close=lambda: None,
    )


def gloo_backend(timeout_s: float, name: str = "gloo") -> Backend:
    """``torch.distributed`` over gloo, or over NCCL (``name`` "nccl": CUDA tensors on the
    local rank's GPU, each call followed by a stream synchronisation, as Ringworld's blocking
    device calls end when the GPU work has); environment from ``gloo_launch.py``."""
    import torch
    import torch.distributed as dist

    kw: dict[str, Any] = {}
    if name == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())
        torch.cuda.set_device(local)
        kw["device_id"] = torch.device("cuda", local)
    dist.init_process_group(name, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    rank, size = dist.get_rank(), dist.get_world_size()

    def allgather_obj(obj: Any) -> list[Any]:
        out: list[Any] = [None] * size
        dist.all_gather_object(out, obj)
        return out

    def make_op(collective: str, b: Buffers) -> Op:
        op = _torch_op(collective, b)
        if name != "nccl":
            return op
        sync = torch.cuda.current_stream().synchronize

        def synced() -> None:
            op()
            sync()
        return synced

    def _torch_op(collective: str, b: Buffers) -> Op:
        s, r = _tensor(b.send), _tensor(b.recv)
        if collective == "scan" or collective in VECTOR:
            raise NotImplementedError(f"torch.distributed has no {collective}")
        if collective == "allgather":  # all_gather_single: torch >= 2.13's name
            allgather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
            return lambda: allgather(r, s)
        if collective == "reduce_scatter":
            reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
            return lambda: reduce_scatter(r, s)
        if collective == "gather":
            parts = list(r.chunk(size)) if rank == ROOT else None
            return lambda: dist.gather(s, parts, dst=ROOT)
        if collective == "scatter":
            parts = list(s.chunk(size)) if rank == ROOT else None
            return lambda: dist.scatter(r, parts, src=ROOT)
        ops: dict[str, Op] = {
            "allreduce": lambda: dist.all_reduce(r),
            "bcast": lambda: dist.broadcast(r, ROOT),
            "reduce": lambda: dist.reduce(r, ROOT),
            "alltoall": lambda: dist.all_to_all_single(r, s),
            "barrier": dist.barrier,
        }
        return ops[collective]

    return Backend(
        library=f"torch {torch.__version__} {name}",
        rank=rank,
        size=size,
        barrier=dist.barrier,
        allgather_obj=allgather_obj,
        make_op=make_op,
        algorithm=lambda: name,
        close=dist.destroy_process_group,
        inplace_reductions=True,
    )


def _equal_counts(collective: str, b: Buffers, size: int) -> tuple[list[int], list[int]]:
    """A v-variant's counts and displacements (elements) for equal blocks of ``b``."""
    c = {"scatterv": b.recv.size, "alltoallv": b.send.size // max(1, size)}.get(
        collective, b.send.size)
    return [c] * size, [i * c for i in range(size)]


def _tensor(a: Any) -> Any:
    """A torch tensor of ``a``: the device buffers already are; numpy arrays are shared."""
    import torch

    return a if isinstance(a, torch.Tensor) else torch.from_numpy(a)


def _on_device(b: Buffers) -> Buffers:
    """CUDA twins of ``b``'s arrays (torch tensors on the current device)."""
    import torch

    return Buffers(torch.from_numpy(b.send).cuda(), torch.from_numpy(b.recv).cuda())


def _upload(host: Buffers, dev: Buffers | None) -> None:
    if dev is not None:
        import torch

        dev.send.copy_(torch.from_numpy(host.send))  # type: ignore[attr-defined]
        dev.recv.copy_(torch.from_numpy(host.recv))  # type: ignore[attr-defined]
        torch.cuda.synchronize()


def _download(dev: Buffers | None, host: Buffers) -> None:
    if dev is not None:
        host.recv[:] = dev.recv.cpu().numpy()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# The sweep


def _reset_for_timing(collective: str, be: Backend, b: Buffers) -> None:
    """Buffers as the timed loop uses them (zeros for in-place reductions, data for bcast)."""
    if collective == "bcast":
        if be.rank == ROOT:
            b.recv[:] = b.send
    elif be.inplace_reductions and collective in ("allreduce", "reduce"):
        b.recv.fill(0.0)


def _reset_for_check(collective: str, be: Backend, b: Buffers) -> None:
    """Receive buffers full of NaN (or the send data where the library reduces in place)."""
    root_bcast = collective == "bcast" and be.rank == ROOT
    if root_bcast or (be.inplace_reductions and collective in ("allreduce", "reduce")):
        b.recv[:] = b.send
    else:
        b.recv.fill(np.nan)


def _loop(op: Op, iters: int) -> float:
    """Seconds for ``iters`` calls of ``op``."""
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    return time.perf_counter() - t0


def plan_iters(per_iter_s: float, time_per_size: float) -> int:
    """Iterations for about ``time_per_size`` seconds at ``per_iter_s`` each."""
    if per_iter_s <= 0:
        return MAX_ITERS
    return max(1, min(MAX_ITERS, round(time_per_size / per_iter_s)))


def measure_size(be: Backend, collective: str, nbytes: int, args: argparse.Namespace
                 ) -> dict[str, Any]:
    """One row of the sweep (identical on every rank; rank 0 writes it)."""
    n = be.size
    count = block_count(collective, nbytes, n)
    bufs = make_buffers(collective, be.rank, n, count)
    dev = _on_device(bufs) if args.device == "cuda" else None
    op = be.make_op(collective, bufs if dev is None else dev)
    _reset_for_timing(collective, be, bufs)
    _upload(bufs, dev)
    be.barrier()
    first = max(be.allgather_obj(_loop(op, 1)))
    warmup_s = args.time_per_size * WARMUP_SHARE
    warmup = max(2, min(WARMUP_MAX, round(warmup_s / max(first, 1e-9))))
    est = max(be.allgather_obj(_loop(op, warmup) / warmup))
    iters = args.iters if args.iters else plan_iters(est, args.time_per_size)
    wrong = checked = 0
    if args.check and collective != "barrier":
        _reset_for_check(collective, be, bufs)
        _upload(bufs, dev)
        op()
        _download(dev, bufs)
        wrong, checked = count_wrong(bufs.recv, expected(collective, be.rank, n, count))
        _reset_for_timing(collective, be, bufs)
        _upload(bufs, dev)
    spent, done = 0.0, 0
    for round_ in range(TIMED_ROUNDS):
        be.barrier()
        spent += _loop(op, iters)
        done += iters
        if args.iters or round_ == TIMED_ROUNDS - 1:
            break
        # The warm-up may have over-estimated (a busy machine): top up to the time budget.
        slowest = max(be.allgather_obj(spent))
        if slowest >= TOP_UP_BELOW * args.time_per_size:
            break
        iters = plan_iters(slowest / done, args.time_per_size - slowest)
    mean = spent / done
    algorithm = be.algorithm()
    per_rank = be.allgather_obj((mean, wrong, checked, algorithm))
    times = [p[0] for p in per_rank]
    t = max(times)
    size = actual_bytes(collective, count, n)
    algbw = size / t / 1e9 if t > 0 else 0.0
    return {
        "collective": collective,
        "size": size,
        "requested": nbytes,
        "count": count,
        "iters": done,
        "warmup": warmup + 1,
        "first_us": first * 1e6,
        "time_us": t * 1e6,
        "time_us_min_rank": min(times) * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(collective, n),
        "wrong": sum(p[1] for p in per_rank),
        "checked": sum(p[2] for p in per_rank),
        "algorithm": str(per_rank[0][3]),
        "algorithms": sorted({str(p[3]) for p in per_rank}),
    }


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    """Write (atomically) or print the results."""
    text = json.dumps(doc, indent=1)
    if path is None:
        print(text)
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _progress(text: str) -> None:
    print(f"{PROGRESS} {text}", file=sys.stderr, flush=True)


def _fmt_time(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def sweep(be: Backend, args: argparse.Namespace) -> dict[str, Any]:
    """Run every collective over every size; rank 0 returns (and keeps writing) the results."""
    doc: dict[str, Any] = {"library": be.library, "nranks": be.size, "check": args.check,
                           "algorithm_requested": args.algorithm, "rows": [],
                           "unsupported": {}}
    for collective in args.collective:
        sizes = [0] if collective == "barrier" else args.sizes
        for nbytes in sizes:
            try:
                row = measure_size(be, collective, nbytes, args)
            except NotImplementedError as exc:
                doc["unsupported"][collective] = str(exc)
                break
            doc["rows"].append(row)
            if be.rank == 0:
                if args.out is not None:
                    _write(args.out, doc)
                _progress(f"{collective} {row['size']} B: {_fmt_time(row['time_us'])} "
                          f"x {row['iters']}, {row['wrong']} wrong")
    return doc


def _sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if not sizes or any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be >= 0: {text!r}")
    return sizes


def parse_collectives(text: str) -> list[str]:
    """``allreduce,bcast`` or ``all``."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    if names == ["all"]:
        return list(COLLECTIVES)
    unknown = sorted(set(names) - set(COLLECTIVES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown collectives {unknown}; known: {COLLECTIVES}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Arguments of the rank program (``ringworld bench <collective>`` fills them in)."""
    p = argparse.ArgumentParser(prog="sweep_rank", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("ringworld", "ringworld-mpi", "mpi4py", "gloo", "nccl"),
                   default="ringworld")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the buffers are (cuda: torch CUDA tensors)")
    p.add_argument("--collective", type=parse_collectives, default=["allreduce"],
                   help="comma-separated, or all")
    p.add_argument("--sizes", type=_sizes, default=[4, 1024, 1 << 20])
    p.add_argument("--iters", type=int, default=0, help="timed iterations (0: adapt to size)")
    p.add_argument("--time-per-size", type=float, default=0.3,
                   help="seconds of timed iterations per size when --iters is 0")
    p.add_argument("--algorithm", default=None, help="Ringworld algorithm name")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--timeout", type=float, default=300.0, help="gloo's collective timeout")
    p.add_argument("--out", type=Path, default=None, help="JSON results (default: stdout)")
    args = p.parse_args(argv)
    if args.iters < 0 or args.time_per_size <= 0:
        p.error("--iters must be >= 0 and --time-per-size > 0")
    return args


def make_backend(args: argparse.Namespace) -> Backend:
    """Start the chosen library."""
    if args.backend == "ringworld":
        return ringworld_backend(args.algorithm, args.device)
    if args.backend in ("mpi4py", "ringworld-mpi"):
        return mpi4py_backend(args.backend == "ringworld-mpi")
    return gloo_backend(args.timeout, args.backend)


def main(argv: list[str] | None = None) -> int:
    """Sweep; rank 0 writes JSON; exit status 3 when any element was wrong."""
    args = parse_args(argv)
    be = make_backend(args)
    doc = sweep(be, args)
    be.barrier()
    status = 0
    if be.rank == 0:
        _write(args.out, {**doc, "complete": True})
        wrong = sum(r["wrong"] for r in doc["rows"])
        if wrong:
            print(f"sweep_rank: {wrong} wrong elements", file=sys.stderr)
            status = 3
    be.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
