"""Parsing of mpi4py buffer specifications into a byte view, a count and a datatype.

Accepted forms, as in mpi4py (``buf`` is anything with the buffer protocol; ``datatype`` is an
``MPI.Datatype`` or a type code such as ``"d"``)::

    buf                              datatype inferred from the buffer's format
    [buf, datatype]                  count = buffer bytes // datatype size
    [buf, count]                     datatype inferred
    [buf, count, datatype]
    [buf, (count, displ), datatype]  displ in elements from the start of buf
    [buf, count, displ, datatype]

In a list, ``buf`` may be None for an empty buffer. A datatype given explicitly reinterprets
the bytes (``[float64_array, MPI.BYTE]`` is fine), as in mpi4py; a numpy dtype is accepted as a
datatype too. Bad specs raise ``TypeError`` / ``ValueError`` naming the operation and argument.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringworld.mpi._datatype import Datatype, from_buffer_format, from_code, from_numpy_dtype

_FORMS = (
    "buf, [buf, datatype], [buf, count], [buf, count, datatype], "
    "[buf, (count, displ), datatype] or [buf, count, displ, datatype]"
)


@dataclass(frozen=True, slots=True)
class Message:
    """A validated buffer: exactly ``count`` elements of ``datatype`` as flat bytes."""

    view: memoryview
    count: int
    datatype: Datatype


def send_message(spec: Any, where: str) -> Message:
    """Validate a send buffer spec; ``where`` names it in errors (e.g. ``"Send(buf)"``)."""
    return _message(spec, where, writable=False)


def recv_message(spec: Any, where: str) -> Message:
    """Validate a receive buffer spec (it must also be writable)."""
    return _message(spec, where, writable=True)


def _message(spec: Any, where: str, *, writable: bool) -> Message:
    count: int | None = None
    displ = 0
    datatype: Datatype | None = None
    if isinstance(spec, list | tuple):
        buf, count, displ, datatype = _unpack(spec, where)
        if buf is None:  # [None, count, datatype]: no memory, as MPI_BOTTOM with no data
            buf = bytearray()
    else:
        buf = spec
    raw, fmt, itemsize = _flat_bytes(buf, where, writable=writable)
    if datatype is None:
        datatype = _infer(fmt, itemsize, where)
    size = datatype.Get_size()
    if count is None:
        if raw.nbytes % size:
            raise ValueError(
                f"{where}: buffer of {raw.nbytes} bytes is not a whole number of "
                f"{datatype.name} elements ({size} bytes each); give a count or another datatype"
            )
        count = raw.nbytes // size
    start = displ * size
    stop = start + count * size
    if stop > raw.nbytes:
        at = f" at displacement {displ}" if displ else ""
        raise ValueError(
            f"{where}: count {count} of {datatype.name}{at} needs {stop} bytes but the buffer "
            f"has only {raw.nbytes}"
        )
    return Message(raw[start:stop], count, datatype)


def _unpack(spec: list[Any] | tuple[Any, ...], where: str) -> tuple[Any, int | None, int, Any]:
    """Split a list/tuple spec into (buf, count, displ, datatype)."""
    n = len(spec)
    count: int | None = None
    displ = 0
    datatype: Datatype | None = None
    if n == 2:
        buf, second = spec
        if isinstance(second, list | tuple) or hasattr(second, "__index__"):
            count, displ = _count_displ(second, where)
        else:
            datatype = _datatype(second, where)
    elif n == 3:
        buf, second, third = spec
        count, displ = _count_displ(second, where)
        datatype = _datatype(third, where)
    elif n == 4:
        buf, second, third, fourth = spec
        count = _nonneg(second, "count", where)
        displ = _nonneg(third, "displacement", where)
        datatype = _datatype(fourth, where)
    else:
        raise TypeError(f"{where}: a buffer spec must be {_FORMS}; got a {n}-item sequence")
    return buf, count, displ, datatype


def _count_displ(value: Any, where: str) -> tuple[int, int]:
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise TypeError(f"{where}: (count, displ) must have 2 items, got {value!r}")
        return _nonneg(value[0], "count", where), _nonneg(value[1], "displacement", where)
    return _nonneg(value, "count", where), 0


def _nonneg(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{where}: {what} must be an int, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{where}: {what} must be an int, got {type(value).__name__} {value!r} "
            f"(buffer spec forms: {_FORMS})"
        ) from None
    if number < 0:
        raise ValueError(f"{where}: {what} must be >= 0, got {number}")
    return number


def _datatype(value: Any, where: str) -> Datatype:
    if isinstance(value, Datatype):
        return value
    try:
        if isinstance(value, str):
            return from_code(value)
        if isinstance(value, np.dtype):
            return from_numpy_dtype(value)
        if isinstance(value, type) and issubclass(value, np.generic):
            return from_numpy_dtype(value)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    raise TypeError(
        f"{where}: datatype must be an MPI.Datatype (e.g. MPI.DOUBLE), a type code or a numpy "
        f"dtype; got {type(value).__name__} {value!r} (buffer spec forms: {_FORMS})"
    )


def _flat_bytes(buf: Any, where: str, *, writable: bool) -> tuple[memoryview, str, int]:
    """Return (flat unsigned-byte view, item format, item size) of a contiguous buffer."""
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"{where}: expected a buffer (numpy array, bytes, bytearray, memoryview, ...) or a "
            f"buffer spec ({_FORMS}); got {type(buf).__name__}"
        ) from None
    if writable and view.readonly:
        raise TypeError(
            f"{where}: the receive buffer ({type(buf).__name__}) is read-only; "
            "receive into a writable buffer such as a numpy array or bytearray"
        )
    if view.c_contiguous:
        flat = view.cast("B")
    elif view.f_contiguous:
        # Fortran order is one contiguous block too; its transpose is C-contiguous.
        flat = np.asarray(view).T.data.cast("B")
    else:
        raise ValueError(
            f"{where}: buffer is not contiguous (shape {view.shape}, strides {view.strides}); "
            "send numpy.ascontiguousarray(buf) instead, or receive into a contiguous buffer"
        )
    return flat, view.format, view.itemsize


def _infer(fmt: str, itemsize: int, where: str) -> Datatype:
    found = from_buffer_format(fmt, itemsize)
    if found is None:
        raise TypeError(
            f"{where}: cannot infer an MPI datatype from buffer format {fmt!r}; "
            "give one explicitly, e.g. [buf, MPI.BYTE]"
        )
    return found
