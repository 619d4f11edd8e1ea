"""Tensors as numpy arrays (zero-copy) and torch's reduce ops as Ringworld ops.

A dense contiguous CPU tensor shares its memory with ``tensor.detach().numpy()``, so the
collectives write straight into the caller's tensors. dtypes numpy lacks (bfloat16, the float8
types) move as same-sized integers; reductions on them go through a float32 copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ringworld.comm import ops
from ringworld.comm.ops import Op

Array = np.ndarray[Any, Any]

_RED = dist.ReduceOp.RedOpType
#: torch's reduce ops and the Ringworld op each runs as (AVG: SUM, then a division).
OPS: dict[Any, Op] = {
    _RED.SUM: ops.SUM,
    _RED.AVG: ops.SUM,
    _RED.PRODUCT: ops.PROD,
    _RED.MIN: ops.MIN,
    _RED.MAX: ops.MAX,
    _RED.BAND: ops.BAND,
    _RED.BOR: ops.BOR,
    _RED.BXOR: ops.BXOR,
}
_INT_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def reduce_op(op: Any) -> tuple[Op, bool]:
    """The Ringworld op for torch's ``op`` (a ReduceOp or its RedOpType), and whether it is AVG.

    Raises:
        ValueError: an op Ringworld cannot run (PREMUL_SUM).
    """
    kind = getattr(op, "op", op)
    found = OPS.get(kind)
    if found is None:
        raise ValueError(f"op={kind}: the ringworld backend supports "
                         f"{', '.join(str(k).split('.')[-1] for k in OPS)}")
    return found, kind == _RED.AVG


def check(t: Any, name: str) -> torch.Tensor:
    """``t`` if it is a dense, contiguous CPU tensor.

    Raises:
        TypeError: not a tensor, or a sparse one.  ValueError: not on the CPU, or not contiguous.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; this operation of the ringworld backend "
                         "takes CPU tensors (CUDA tensors: allreduce, reduce, broadcast, "
                         "allgather, reduce_scatter and alltoall, over NCCL)")
    if t.layout != torch.strided:
        raise TypeError(f"{name} has layout {t.layout}; the ringworld backend needs dense tensors")
    if not t.is_contiguous():
        raise ValueError(f"{name} (shape {tuple(t.shape)}) is not contiguous; pass "
                         f"{name}.contiguous()")
    return t


def has_numpy_dtype(t: torch.Tensor) -> bool:
    """Whether numpy has ``t``'s dtype (bfloat16 and the float8 types it has not)."""
    return t.dtype not in (torch.bfloat16, *_FLOAT8)


_FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                            "float8_e5m2fnuz") if hasattr(torch, n))


def array(t: torch.Tensor, name: str) -> Array:
    """A flat numpy view of ``t`` (checked as by :func:`check`); no copy.

    dtypes numpy lacks come back as integers of the same size, good for moving bytes, not for
    reducing. Cost: a few attribute reads.

    Raises:
        TypeError / ValueError: as :func:`check`, or a lazily conjugated/negated view.
    """
    check(t, name)
    d = t.detach()
    if d.is_conj() or d.is_neg():
        raise ValueError(f"{name} is a lazily conjugated or negated view; pass "
                         f"{name}.resolve_conj().resolve_neg()")
    if not has_numpy_dtype(d):
        d = d.view(_INT_BY_SIZE[d.element_size()])
    flat: Array = d.numpy().reshape(-1)
    return flat


def arrays(ts: Sequence[torch.Tensor], name: str) -> list[Array]:
    """:func:`array` of each tensor of ``ts``."""
    return [array(t, f"{name}[{i}]") for i, t in enumerate(ts)]


def one(ts: Sequence[torch.Tensor], name: str) -> torch.Tensor:
    """The single tensor of ``ts`` (torch passes one tensor per device; CPU is one device).

    Raises:
        ValueError: not exactly one tensor.
    """
    if len(ts) != 1:
        raise ValueError(f"{name} must hold exactly one tensor on the ringworld backend, "
                         f"got {len(ts)}")
    return check(ts[0], f"{name}[0]")


def same_dtype(ts: Sequence[torch.Tensor], dtype: torch.dtype, name: str) -> None:
    """Raise TypeError naming the first tensor of ``ts`` whose dtype is not ``dtype``."""
    for i, t in enumerate(ts):
        if t.dtype != dtype:
            raise TypeError(f"{name}[{i}] has dtype {t.dtype}, expected {dtype}")


def divide(t: torch.Tensor, n: int) -> None:
    """Divide ``t`` by ``n`` in place (AVG): true division for floats, truncating for integers."""
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        t.div_(n, rounding_mode="trunc")


def span(ts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One flat tensor over ``ts`` if they lie back to back in one storage (``chunk``'s
    pieces do), so a collective can fill them in one call without a copy; else None."""
    if not ts:
        return None
    first = ts[0].detach()
    storage = first.untyped_storage().data_ptr()
    pos = first.data_ptr()
    total = 0
    for t in ts:
        if (t.dtype != first.dtype or not t.is_contiguous() or t.device != first.device
                or t.untyped_storage().data_ptr() != storage or t.data_ptr() != pos):
            return None
        pos += t.numel() * t.element_size()
        total += t.numel()
    return first.as_strided((total,), (1,), first.storage_offset())


def unpack(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``outs`` (converting the dtype if needed)."""
    pos = 0
    for t in outs:
        k = t.numel()
        t.detach().copy_(flat[pos:pos + k].view(t.shape))
        pos += k
