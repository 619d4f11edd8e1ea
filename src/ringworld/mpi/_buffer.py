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

Collectives add two kinds (mpi4py's ``BufSpecV`` and ``BufSpecW``)::

    buf | [buf, counts] | [buf, (counts, displs)] | [buf, counts, datatype]
    [buf, (counts, displs), datatype] | [buf, counts, displs, datatype]     (vector)
    [buf, datatypes] | [buf, (counts, displs), datatypes]
    [buf, counts, displs, datatypes]                                        (Alltoallw)

Vector counts and displacements count elements; each may be None (counts: the buffer split as
evenly as possible; displs: packed), one int (the same count; displs ``i * d``) or one entry
per process. Alltoallw displacements are in bytes; without counts every block is one element
at offset 0.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringworld.comm import foreign
from ringworld.comm.point_to_point import holds_objects
from ringworld.mpi._datatype import (
    DATATYPES,
    Datatype,
    from_buffer_format,
    from_code,
    from_numpy_dtype,
)

_FORMS = (
    "buf, [buf, datatype], [buf, count], [buf, count, datatype], "
    "[buf, (count, displ), datatype] or [buf, count, displ, datatype]"
)


Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class Message:
    """A validated buffer: ``count`` elements of ``datatype`` (per block) as flat bytes."""

    view: memoryview
    count: int
    datatype: Datatype

    def bytes(self) -> Array:
        """The bytes as a flat uint8 array sharing the buffer's memory."""
        return np.asarray(self.view)

    def array(self) -> Array:
        """The elements as a flat array of the datatype's numpy dtype, sharing memory."""
        return np.asarray(self.view).view(self.datatype.dtype)


@dataclass(frozen=True, slots=True)
class VectorMessage:
    """A validated vector buffer: block i is ``counts[i]`` elements at ``displs[i]``."""

    raw: memoryview
    counts: tuple[int, ...]
    displs: tuple[int, ...]
    datatype: Datatype

    def bytes(self) -> Array:
        """The whole buffer as a flat uint8 array sharing its memory."""
        return np.asarray(self.raw)

    def byte_counts(self) -> tuple[int, ...]:
        """The counts in bytes."""
        return tuple(c * self.datatype.extent for c in self.counts)

    def byte_displs(self) -> tuple[int, ...]:
        """The displacements in bytes."""
        return tuple(d * self.datatype.extent for d in self.displs)


def _plain_dtypes() -> frozenset[np.dtype[Any]]:
    """The numpy dtypes whose arrays :func:`_message` reads as elements of a datatype of that
    very dtype (found by asking the inference itself, as it reads each array's format)."""
    found = set()
    for code in "?bBhHiIlLqQefdgFDG":
        view = np.zeros(1, np.dtype(code)).data
        datatype = from_buffer_format(view.format, view.itemsize)
        if datatype is not None and datatype.dtype == np.dtype(code) \
                and datatype.extent == datatype.dtype.itemsize:
            found.add(np.dtype(code))
    return frozenset(found)


#: dtypes whose 1-D contiguous arrays validate to themselves (see plain_array)
PLAIN_DTYPES = _plain_dtypes()
#: id of each predefined datatype of one plain element -> its dtype (``[array, datatype]``)
SIMPLE_DTYPES = {id(d): d.dtype for d in DATATYPES
           if d.dtype in PLAIN_DTYPES and d.extent == d.dtype.itemsize}


def plain_array(spec: Any, writable: bool) -> Array | None:
    """``spec``'s array where validating it would give back the same array: a 1-D
    C-contiguous numpy array of a dtype in :data:`PLAIN_DTYPES` (writable if asked), alone or
    as ``[array, datatype]`` with a predefined datatype of that dtype; else None (then
    validate). The fast path of the common call. Cost: a few attribute reads."""
    if type(spec) is np.ndarray:
        arr = spec
        if arr.ndim != 1 or arr.dtype not in PLAIN_DTYPES:
            return None
    elif (type(spec) is list or type(spec) is tuple) and len(spec) == 2 \
            and type(spec[0]) is np.ndarray:
        arr = spec[0]
        # (numpy's dtypes of one kind are one object: another is never plain; and numpy
        # reads None as float64, so no comparison with ==)
        if SIMPLE_DTYPES.get(id(spec[1])) is not arr.dtype or arr.ndim != 1:
            return None
    else:
        return None
    flags = arr.flags
    if not flags.c_contiguous or (writable and not flags.writeable):
        return None
    return arr


def send_message(spec: Any, where: str) -> Message:
    """Validate a send buffer spec; ``where`` names it in errors (e.g. ``"Send(buf)"``)."""
    return _message(spec, where, writable=False)


def recv_message(spec: Any, where: str) -> Message:
    """Validate a receive buffer spec (it must also be writable)."""
    return _message(spec, where, writable=True)


def block_message(spec: Any, where: str, *, writable: bool, blocks: int) -> Message:
    """Validate a spec holding ``blocks`` blocks (one per process) of ``count`` elements each.

    Without an explicit count the buffer must split into ``blocks`` equal blocks; the message's
    view covers all of them and its ``count`` is the count of one block.
    """
    return _message(spec, where, writable=writable, blocks=blocks)


def _message(spec: Any, where: str, *, writable: bool, blocks: int = 1) -> Message:
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
    size = datatype.extent
    if count is None:
        if raw.nbytes % size:
            raise ValueError(
                f"{where}: buffer of {raw.nbytes} bytes is not a whole number of "
                f"{datatype.name} elements ({size} bytes each); give a count or another datatype"
            )
        count = max(0, raw.nbytes // size - displ)
        if blocks > 1:
            if count % blocks:
                raise ValueError(
                    f"{where}: {count} elements do not split into {blocks} equal blocks "
                    "(one per process); give a count per block or resize the buffer"
                )
            count //= blocks
    start = displ * size
    stop = start + count * max(blocks, 1) * size
    if stop > raw.nbytes:
        at = f" at displacement {displ}" if displ else ""
        raise ValueError(
            f"{where}: count {count} of {datatype.name}{at} needs {stop} bytes but the buffer "
            f"has only {raw.nbytes}"
        )
    return Message(raw[start:stop], count, datatype)


def vector_message(spec: Any, where: str, *, writable: bool, blocks: int) -> VectorMessage:
    """Validate a vector spec of ``blocks`` blocks (mpi4py's ``BufSpecV``)."""
    counts: Any = None
    displs: Any = None
    datatype: Datatype | None = None
    if isinstance(spec, list | tuple):
        n = len(spec)
        if n == 2:
            buf, second = spec
            if _is_datatype(second):
                datatype = _datatype(second, where)
            elif isinstance(second, tuple):
                counts, displs = _counts_displs(second, where)
            else:
                counts = second
        elif n == 3:
            buf, counts, third = spec
            if isinstance(counts, tuple):
                counts, displs = _counts_displs(counts, where)
            datatype = _datatype(third, where)
        elif n == 4:
            buf, counts, displs, fourth = spec
            datatype = _datatype(fourth, where)
        else:
            raise TypeError(f"{where}: a vector buffer spec must be buf, [buf, counts], "
                            f"[buf, (counts, displs)] or [buf, counts, displs, datatype]; "
                            f"got a {n}-item sequence")
        if buf is None:
            buf = bytearray()
    else:
        buf = spec
    raw, fmt, itemsize = _flat_bytes(buf, where, writable=writable)
    if datatype is None:
        datatype = _infer(fmt, itemsize, where)
    ext = datatype.extent
    if counts is None:
        if raw.nbytes % ext:
            raise ValueError(f"{where}: buffer of {raw.nbytes} bytes is not a whole number of "
                             f"{datatype.name} elements ({ext} bytes each)")
        total = raw.nbytes // ext
        c = tuple(total // blocks + (total % blocks > i) for i in range(blocks))
    else:
        c = _per_block(counts, blocks, "counts", where)
    if displs is None:
        d = tuple(sum(c[:i]) for i in range(blocks))
    elif _is_int(displs):
        step = _nonneg(displs, "displacement", where)
        d = tuple(step * i for i in range(blocks))
    else:
        d = _per_block(displs, blocks, "displs", where)
    for i, (ci, di) in enumerate(zip(c, d, strict=True)):
        if (ci + di) * ext > raw.nbytes:
            raise ValueError(f"{where}: block {i} ({ci} elements at displacement {di}) lies "
                             f"outside the buffer of {raw.nbytes // ext} {datatype.name} elements")
    return VectorMessage(raw, c, d, datatype)


def w_blocks(spec: Any, where: str, *, writable: bool, blocks: int) -> list[Array]:
    """Split an Alltoallw spec (mpi4py's ``BufSpecW``) into one uint8 array per process."""
    if not isinstance(spec, list | tuple) or not 2 <= len(spec) <= 4:
        raise TypeError(f"{where}: expected [buf, datatypes], [buf, (counts, displs), "
                        "datatypes] or [buf, counts, displs, datatypes]")
    counts: Any = None
    displs: Any = None
    if len(spec) == 2:
        buf, types = spec
    elif len(spec) == 3:
        buf, pair, types = spec
        counts, displs = _counts_displs(pair, where)
    else:
        buf, counts, displs, types = spec
    raw, _, _ = _flat_bytes(bytearray() if buf is None else buf, where, writable=writable)
    if isinstance(types, Datatype | str):
        dts = [_datatype(types, where)] * blocks
    else:
        dts = [_datatype(t, where) for t in _items(types, blocks, "datatypes", where)]
    if counts is None and displs is None:
        c, d = (1,) * blocks, (0,) * blocks
    else:
        c = _per_block(counts, blocks, "counts", where)
        d = _per_block(displs, blocks, "displs", where)
    out = []
    data = np.asarray(raw)
    for i in range(blocks):
        stop = d[i] + c[i] * dts[i].extent
        if stop > raw.nbytes:
            raise ValueError(f"{where}: block {i} ({c[i]} x {dts[i].name} at byte {d[i]}) "
                             f"lies outside the buffer of {raw.nbytes} bytes")
        out.append(data[d[i] : stop])
    return out


def _is_datatype(value: Any) -> bool:
    return isinstance(value, Datatype | str | np.dtype) or (
        isinstance(value, type) and issubclass(value, np.generic))


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and hasattr(value, "__index__")


def _counts_displs(pair: Any, where: str) -> tuple[Any, Any]:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise TypeError(f"{where}: (counts, displs) must have 2 items, got {pair!r}")
    return pair[0], pair[1]


def _items(values: Any, blocks: int, what: str, where: str) -> Sequence[Any]:
    try:
        out = list(values)
    except TypeError:
        raise TypeError(f"{where}: {what} must be a sequence of {blocks} items, got "
                        f"{type(values).__name__}") from None
    if len(out) != blocks:
        raise ValueError(f"{where}: {what} has {len(out)} items; the communicator has {blocks} "
                         "processes")
    return out


def _per_block(values: Any, blocks: int, what: str, where: str) -> tuple[int, ...]:
    if _is_int(values):
        return (_nonneg(values, what, where),) * blocks
    return tuple(_nonneg(v, what, where) for v in _items(values, blocks, what, where))


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
        adopted = foreign.host_array(buf, where)  # a DLPack object (torch tensor), as mpi4py 4
        if adopted is None:
            raise TypeError(
                f"{where}: expected a buffer (numpy array, bytes, bytearray, memoryview, a "
                f"host tensor with DLPack, ...) or a buffer spec ({_FORMS}); got "
                f"{type(buf).__name__}"
            ) from None
        view = memoryview(adopted)
    if holds_objects(view.format):  # (MPI moves bytes: an object array's are pointers)
        raise TypeError(
            f"{where}: the buffer holds Python objects (format {view.format!r}), whose bytes "
            "mean nothing in another process; use the lowercase methods (send, recv, bcast, "
            "...) for Python objects"
        )
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
