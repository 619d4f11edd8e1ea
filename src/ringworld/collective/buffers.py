"""Argument checking for collective calls: buffers as flat numpy arrays, counts, displacements."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np

from ringworld.collective.markers import IN_PLACE
from ringworld.comm import foreign
from ringworld.comm.point_to_point import arrays_overlap

Array = np.ndarray[Any, Any]


EMPTY_U8: Final[Array] = np.empty(0, dtype=np.uint8)


class Sized(Protocol):
    """What the count checks read of a buffer (a numpy array, a device array's description)."""

    @property
    def size(self) -> int: ...

    @property
    def dtype(self) -> Any: ...


def as_array(buf: Any, name: str, *, writable: bool = False) -> Array:
    """``buf`` as a flat numpy array sharing its memory (no copy): a numpy array, a host
    tensor of another library (see :mod:`ringworld.comm.foreign`) or a buffer-protocol object.

    Raises:
        TypeError: not a buffer, read-only when ``writable``, or an object dtype;
            :class:`~ringworld.comm.foreign.DeviceBuffer` for device memory.
        ValueError: not C-contiguous.
    """
    if type(buf) is np.ndarray:
        flags = buf.flags
        if buf.ndim == 1 and flags.c_contiguous and (flags.writeable or not writable) \
                and not buf.dtype.hasobject:
            return buf  # the common case, checked cheaply
        a = buf
    elif isinstance(buf, np.ndarray):
        a = buf
    else:
        if buf is None or buf is IN_PLACE:
            raise TypeError(f"{name} is required here (got {buf!r})")
        adopted = foreign.host_array(buf, name)  # a torch tensor, a DLPack object, ...
        if adopted is not None:
            a = adopted
        else:
            try:
                a = np.asarray(memoryview(buf))
            except TypeError:
                raise TypeError(f"{name} must be a numpy array, a host tensor (DLPack) or "
                                f"support the buffer protocol, got {type(buf).__name__}"
                                ) from None
    if a.dtype.hasobject:
        raise TypeError(f"{name} has dtype object; use the *_obj methods for Python values")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got a strided array of shape {a.shape})")
    if writable and not a.flags.writeable:
        raise TypeError(f"{name} is read-only; pass a writable buffer such as a numpy array")
    return a.reshape(-1)


def apart(sb: Array, rb: Array, *, same_ok: bool = False) -> tuple[Array, bool]:
    """``(sb, False)``, or ``(a copy of sb, True)`` where the send buffer ``sb`` shares memory
    with the receive buffer ``rb`` (passed apart, not as ``IN_PLACE``: an algorithm may write
    ``rb`` before it has read all of ``sb``, so each call reads a copy). ``same_ok``: the very
    same array as ``rb`` is what ``IN_PLACE`` gives this call's algorithms (allreduce, scan,
    reduce), so it stays. Cost: an identity test and two attribute reads; a bounds test
    (exact for contiguous arrays) where either is a view."""
    if sb is rb:
        return (sb, False) if same_ok else (sb.copy(), True)
    return (sb.copy(), True) if arrays_overlap(sb, rb) else (sb, False)


def apart_all(sends: Sequence[Array], recvs: Sequence[Array]) -> list[Array]:
    """``sends`` (alltoallw's checked send arrays), each one that shares memory with one of
    ``recvs`` replaced by a copy, as :func:`apart` does for one pair. Cost: an ownership
    test per buffer; where any is a view, a bounds test per pair."""
    if all(a.base is None for a in sends) and all(b.base is None for b in recvs):
        same = {id(b) for b in recvs}  # (arrays that own their memory overlap only as one)
        return [a.copy() if id(a) in same else a for a in sends]
    return [a.copy() if any(arrays_overlap(a, b) for b in recvs) else a for a in sends]


def same_dtype(a: Sized, b: Sized, an: str, bn: str) -> None:
    """Raise TypeError unless ``a`` and ``b`` have the same dtype."""
    if a.dtype != b.dtype:
        raise TypeError(f"{an} has dtype {a.dtype} but {bn} has dtype {b.dtype}; they must match")


def int_list(values: Any, size: int, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of ``size`` non-negative ints.

    Raises:
        TypeError / ValueError: naming ``name``.
    """
    try:
        out = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {size} ints") from None
    if len(out) != size:
        raise ValueError(f"{name} has {len(out)} entries; the communicator has {size} ranks")
    if any(v < 0 for v in out):
        raise ValueError(f"{name} must not be negative: {list(out)}")
    return out


def layout(counts: Any, displs: Any, size: int, buf: Sized, cname: str, dname: str,
           bname: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Checked (counts, displs) for a v-collective; displs default to packed.

    Raises:
        ValueError: a block lies outside ``buf``.
    """
    c = int_list(counts, size, cname)
    if displs is None:
        d = []
        at = 0
        for v in c:
            d.append(at)
            at += v
        dd = tuple(d)
    else:
        dd = int_list(displs, size, dname)
    for i, (ci, di) in enumerate(zip(c, dd, strict=True)):
        if di + ci > buf.size:
            raise ValueError(f"block {i} ({cname}[{i}]={ci} at {dname}[{i}]={di}) lies outside "
                             f"{bname} of {buf.size} elements")
    return c, dd


def blocks_of(buf: Sized, size: int, name: str) -> int:
    """Elements per rank of a buffer holding one block per rank.

    Raises:
        ValueError: its size is not a multiple of the communicator size.
    """
    if buf.size % size:
        raise ValueError(f"{name} has {buf.size} elements, not a multiple of the communicator "
                         f"size {size}")
    return buf.size // size


def check_len(buf: Sized, expected: int, name: str, why: str) -> None:
    """Raise ValueError unless ``buf`` has ``expected`` elements."""
    if buf.size != expected:
        raise ValueError(f"{name} has {buf.size} elements but {expected} are needed ({why})")


def check_own_block(sendcounts: Sequence[int], recvcounts: Sequence[int], rank: int) -> None:
    """Raise ValueError unless an alltoallv's block from ``rank`` to itself has one size."""
    if sendcounts[rank] != recvcounts[rank]:
        raise ValueError(f"sendcounts[{rank}]={sendcounts[rank]} but recvcounts[{rank}]="
                         f"{recvcounts[rank]}: this rank's block to itself must have one size")


def seq(values: Any, size: int, name: str) -> Sequence[Any]:
    """``values`` as a list of exactly ``size`` items.

    Raises:
        TypeError / ValueError: naming ``name``.
    """
    try:
        out = list(values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {size} items") from None
    if len(out) != size:
        raise ValueError(f"{name} has {len(out)} items; the communicator has {size} ranks")
    return out
