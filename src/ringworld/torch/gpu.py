"""The process group's operations on CUDA tensors: Ringworld's NCCL plane underneath.

Each operation checks its tensors on the calling thread, notes the caller's current CUDA stream,
and queues the Ringworld call on the group's worker, where it runs on that stream (so it is
ordered after the work that produced the tensors, as ``ProcessGroupNCCL`` orders it) and
completes when the GPU work is done. Collectives stay in call order with the group's CPU ones
(one worker per group). Reductions are NCCL's (SUM, AVG, PRODUCT, MIN, MAX) in every dtype NCCL
has, bfloat16 and float8 included; copies happen only where torch's lists do not map onto one
buffer (lists of outputs or inputs that are not one tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ringworld.collective.markers import IN_PLACE
from ringworld.device.plane import device_stream
from ringworld.torch import _convert as cv

if TYPE_CHECKING:
    from ringworld.torch.process_group import ProcessGroupRingworld
    from ringworld.torch.work import Work

_RED = dist.ReduceOp.RedOpType
OPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.PRODUCT: "prod", _RED.MIN: "min",
       _RED.MAX: "max"}


def on_gpu(*groups: Iterable[Any]) -> bool:
    """Whether any tensor of ``groups`` (tensors, or lists of them) is a CUDA tensor."""
    for group in groups:
        for t in group:
            if isinstance(t, torch.Tensor):
                if t.is_cuda:
                    return True
            elif isinstance(t, list | tuple) and on_gpu(t):
                return True
    return False


def op_name(opts: Any) -> str:
    """torch's reduce op as NCCL's. Raises: ValueError (BAND, BOR, BXOR, PREMUL_SUM)."""
    op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
    kind = getattr(op, "op", op)
    name = OPS.get(kind)
    if name is None:
        raise ValueError(f"op={kind}: CUDA tensors reduce with NCCL's SUM, AVG, PRODUCT, MIN "
                         "and MAX")
    return name


def _check(ts: Sequence[torch.Tensor], name: str) -> torch.device:
    """The one CUDA device of ``ts`` (dense, contiguous). Raises: TypeError, ValueError."""
    devices = set()
    for i, t in enumerate(ts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda:
            raise TypeError(f"{name}[{i}] is on {t.device} and other tensors of the call are on "
                            "a GPU: one call takes tensors of one device")
        if t.layout != torch.strided or not t.is_contiguous():
            raise ValueError(f"{name}[{i}] must be dense and contiguous (pass .contiguous())")
        if t.requires_grad and t.is_leaf:
            pass  # the collective writes through .detach(): as ProcessGroupNCCL, allowed
        devices.add(t.device)
    if len(devices) != 1:
        raise ValueError(f"{name}: tensors on {sorted(map(str, devices))}; one call's tensors "
                         "must be on one GPU")
    return devices.pop()


def _queue(pg: ProcessGroupRingworld, what: str, outputs: Any, device: torch.device,
           run: Callable[[], None]) -> Work:
    stream = torch.cuda.current_stream(device)

    def body() -> None:
        with torch.cuda.device(device), torch.cuda.stream(stream), \
                device_stream(stream.cuda_stream):
            run()

    return pg._queue(what, outputs, body)


def allreduce(pg: ProcessGroupRingworld, tensors: Sequence[torch.Tensor], opts: Any) -> Work:
    device = _check(tensors, "tensors")
    if len(tensors) != 1:
        raise ValueError(f"tensors must hold one tensor, got {len(tensors)}")
    t, name = tensors[0].detach(), op_name(opts)
    comm, timeout = pg.comm, pg._seconds(opts)
    return _queue(pg, "allreduce", list(tensors), device,
                  lambda: comm.allreduce(IN_PLACE, t, name, timeout=timeout))


def allreduce_coalesced(pg: ProcessGroupRingworld, tensors: Sequence[torch.Tensor],
                        opts: Any) -> Work:
    device = _check(tensors, "tensors")
    if len({t.dtype for t in tensors}) != 1:
        raise TypeError("tensors must have one dtype")
    name, comm, timeout = op_name(opts), pg.comm, pg._seconds(opts)

    def run() -> None:
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        comm.allreduce(IN_PLACE, flat, name, timeout=timeout)
        cv.unpack(flat, tensors)

    return _queue(pg, "allreduce_coalesced", list(tensors), device, run)


def reduce(pg: ProcessGroupRingworld, tensors: Sequence[torch.Tensor], opts: Any) -> Work:
    device = _check(tensors, "tensors")
    t, name = tensors[0].detach(), op_name(opts)
    root = pg._rank(int(opts.rootRank) if opts is not None else 0, "root")
    comm, timeout = pg.comm, pg._seconds(opts)
    send = IN_PLACE if comm.rank == root else t
    return _queue(pg, "reduce", list(tensors), device,
                  lambda: comm.reduce(send, t, name, root, timeout=timeout))


def broadcast(pg: ProcessGroupRingworld, tensors: Sequence[torch.Tensor], opts: Any) -> Work:
    device = _check(tensors, "tensors")
    t = tensors[0].detach()
    root = pg._rank(int(opts.rootRank) if opts is not None else 0, "root")
    comm, timeout = pg.comm, pg._seconds(opts)
    return _queue(pg, "broadcast", list(tensors), device,
                  lambda: comm.bcast(t, root, timeout=timeout))


def all_gather_single(pg: ProcessGroupRingworld, output: torch.Tensor, input_: torch.Tensor,
                      opts: Any) -> Work:
    device = _check([output, input_], "tensors")
    comm, timeout = pg.comm, pg._seconds(opts)
    src, dst = input_.detach(), output.detach()
    return _queue(pg, "all_gather_single", [output], device,
                  lambda: comm.allgather(src, dst, timeout=timeout))


def allgather(pg: ProcessGroupRingworld, outputs: Sequence[torch.Tensor], input_: torch.Tensor,
              opts: Any) -> Work:
    device = _check([*outputs, input_], "tensors")
    comm, timeout = pg.comm, pg._seconds(opts)
    counts = [t.numel() for t in outputs]
    src = input_.detach()

    def run() -> None:
        flat = torch.empty(sum(counts), dtype=input_.dtype, device=device)
        if len(set(counts)) == 1:
            comm.allgather(src, flat, timeout=timeout)
        else:
            comm.allgatherv(src, flat, counts, timeout=timeout)
        cv.unpack(flat, outputs)

    return _queue(pg, "allgather", [list(outputs)], device, run)


def reduce_scatter_single(pg: ProcessGroupRingworld, output: torch.Tensor,
                          input_: torch.Tensor, opts: Any) -> Work:
    device = _check([output, input_], "tensors")
    name, comm, timeout = op_name(opts), pg.comm, pg._seconds(opts)
    src, dst = input_.detach(), output.detach()
    return _queue(pg, "reduce_scatter_single", [output], device,
                  lambda: comm.reduce_scatter_block(src, dst, name, timeout=timeout))


def reduce_scatter(pg: ProcessGroupRingworld, output: torch.Tensor,
                   inputs: Sequence[torch.Tensor], opts: Any) -> Work:
    device = _check([output, *inputs], "tensors")
    name, comm, timeout = op_name(opts), pg.comm, pg._seconds(opts)
    counts = [t.numel() for t in inputs]
    dst = output.detach()

    def run() -> None:
        flat = torch.cat([t.detach().reshape(-1) for t in inputs])
        if len(set(counts)) == 1:
            comm.reduce_scatter_block(flat, dst, name, timeout=timeout)
        else:
            comm.reduce_scatter(flat, dst, counts, name, timeout=timeout)

    return _queue(pg, "reduce_scatter", [output], device, run)


def all_to_all_single(pg: ProcessGroupRingworld, output: torch.Tensor, input_: torch.Tensor,
                      send_counts: list[int] | None, recv_counts: list[int] | None,
                      opts: Any) -> Work:
    """``send_counts``/``recv_counts`` in elements (None: equal blocks)."""
    device = _check([output, input_], "tensors")
    comm, timeout = pg.comm, pg._seconds(opts)
    src, dst = input_.detach(), output.detach()
    if send_counts is None or recv_counts is None:
        return _queue(pg, "all_to_all_single", [output], device,
                      lambda: comm.alltoall(src, dst, timeout=timeout))
    sc, rc = send_counts, recv_counts
    return _queue(pg, "all_to_all_single", [output], device,
                  lambda: comm.alltoallv(src, dst, sc, rc, timeout=timeout))


def alltoall(pg: ProcessGroupRingworld, outputs: Sequence[torch.Tensor],
             inputs: Sequence[torch.Tensor], opts: Any) -> Work:
    device = _check([*outputs, *inputs], "tensors")
    comm, timeout = pg.comm, pg._seconds(opts)
    sends = [t.detach() for t in inputs]
    recvs = [t.detach() for t in outputs]
    return _queue(pg, "alltoall", list(outputs), device,
                  lambda: comm.alltoallw(sends, recvs, timeout=timeout))


def refuse(what: str) -> ValueError:
    """The error for an operation the GPU plane does not run."""
    return ValueError(f"{what} of CUDA tensors is not supported by the ringworld backend yet "
                      "(collectives are): copy the tensors to the CPU for it")

