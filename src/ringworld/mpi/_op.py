"""``MPI.Op``: reduction operations, mapped onto Ringworld's native :class:`ringworld.Op`.

Predefined operations map to the native ones (``MPI.SUM`` -> ``ringworld.SUM``, ...). A user
operation ``Op.Create(function, commute)`` follows mpi4py:

* buffers: ``function(invec, inoutvec, datatype)`` must leave ``invec op inoutvec`` in
  ``inoutvec``, where ``invec`` holds the contribution of lower ranks. Both are the raw bytes
  of the operands, like mpi4py's ``MPI.buffer``: use ``numpy.frombuffer(inoutvec, dtype)`` for
  typed access (``datatype.dtype`` is the numpy dtype); assigning a buffer to a slice copies
  its bytes.
* Python objects (``reduce``, ``allreduce``, ...) and ``op(x, y)``: ``function(x, y, None)``
  returns the result.

A non-commutative operation is applied in rank order by every algorithm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from ringworld.comm import ops
from ringworld.mpi._datatype import Datatype
from ringworld.mpi._exception import ERR_OP, Exception

Array = np.ndarray[Any, Any]


def _maxloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    if u > v:
        return u, i
    if v > u or j < i:
        return v, j
    return u, i


def _minloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    if u < v:
        return u, i
    if v < u or j < i:
        return v, j
    return u, i


#: mpi4py's Python semantics of each predefined operation (``op(x, y)``, object reductions).
_PY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "MPI_SUM": lambda x, y: x + y,
    "MPI_PROD": lambda x, y: x * y,
    "MPI_MAX": lambda x, y: y if y > x else x,
    "MPI_MIN": lambda x, y: y if y < x else x,
    "MPI_LAND": lambda x, y: bool(x) & bool(y),
    "MPI_LOR": lambda x, y: bool(x) | bool(y),
    "MPI_LXOR": lambda x, y: bool(x) ^ bool(y),
    "MPI_BAND": lambda x, y: x & y,
    "MPI_BOR": lambda x, y: x | y,
    "MPI_BXOR": lambda x, y: x ^ y,
    "MPI_MAXLOC": _maxloc,
    "MPI_MINLOC": _minloc,
}

_NATIVE: Final[dict[str, ops.Op]] = {
    "MPI_SUM": ops.SUM, "MPI_PROD": ops.PROD, "MPI_MAX": ops.MAX, "MPI_MIN": ops.MIN,
    "MPI_LAND": ops.LAND, "MPI_LOR": ops.LOR, "MPI_LXOR": ops.LXOR, "MPI_BAND": ops.BAND,
    "MPI_BOR": ops.BOR, "MPI_BXOR": ops.BXOR, "MPI_MAXLOC": ops.MAXLOC, "MPI_MINLOC": ops.MINLOC,
}  # fmt: skip


class _Memory(np.ndarray[Any, np.dtype[np.uint8]]):
    """The bytes of a reduction operand, handed to user functions like mpi4py's ``MPI.buffer``.

    Assigning a buffer (an array of any dtype, ``array.array``, bytes) to a slice copies its
    bytes, as mpi4py's buffer does; other values assign as numpy does.
    """

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, int | float):
            with contextlib.suppress(TypeError):  # not a buffer: assign as numpy does
                value = np.frombuffer(memoryview(value).tobytes(), dtype=np.uint8)
        super().__setitem__(key, value)


def _memory(a: Array) -> _Memory:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).view(_Memory)


class _BufferFunction:
    """Native ``fn(left, right)`` calling ``function(left, copy of right, datatype)``."""

    __slots__ = ("datatype", "function")

    def __init__(self, function: Callable[..., Any], datatype: Datatype) -> None:
        self.function = function
        self.datatype = datatype

    def __call__(self, left: Array, right: Array) -> Array:
        out = np.array(right, copy=True)
        self.function(_memory(left), _memory(out), self.datatype)
        return out


class Op:
    """A reduction operation: a predefined one (``MPI.SUM``) or a user function."""

    __slots__ = ("_buffer_ops", "_commute", "_function", "_name", "_predefined")

    def __init__(self) -> None:
        self._name = "MPI_OP_NULL"
        self._function: Callable[..., Any] | None = None
        self._commute = False
        self._predefined = False
        self._buffer_ops: dict[Datatype, ops.Op] = {}

    @classmethod
    def _named(cls, name: str) -> Op:
        op = cls()
        op._name = name
        op._commute = True
        op._predefined = True
        return op

    @classmethod
    def Create(cls, function: Callable[..., Any], commute: bool = False) -> Op:
        """Create a user operation from ``function(inbuf, inoutbuf, datatype)``."""
        if not callable(function):
            raise TypeError(f"Op.Create: function must be callable, got {function!r}")
        op = cls()
        op._name = getattr(function, "__name__", "user_op")
        op._function = function
        op._commute = bool(commute)
        return op

    def __repr__(self) -> str:
        return f"<MPI.Op {self._name}>"

    def __bool__(self) -> bool:
        return self._predefined or self._function is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self is other or (not self and not other)  # all null operations are equal

    __hash__ = None  # type: ignore[assignment]  # a mutable handle, unhashable as in mpi4py

    def __call__(self, x: Any, y: Any) -> Any:
        """Apply the operation to two Python values, as mpi4py does (``MPI.SUM(1, 2) == 3``)."""
        if self._predefined:
            return _PY[self._name](x, y)
        if self._function is None:
            raise Exception(ERR_OP, "cannot call the null operation")
        return self._function(x, y, None)

    @property
    def name(self) -> str:
        """``"MPI_SUM"`` etc. for predefined operations, the function's name otherwise."""
        return self._name

    @property
    def function(self) -> Callable[..., Any] | None:
        """The user function (None for predefined operations)."""
        return self._function

    def Is_commutative(self) -> bool:
        """Return whether the operation is commutative."""
        return self._commute

    @property
    def is_commutative(self) -> bool:
        """Whether the operation is commutative."""
        return self._commute

    @property
    def is_predefined(self) -> bool:
        """Whether this is a predefined operation."""
        return self._predefined

    def Free(self) -> None:
        """Free a user operation, which becomes null; predefined ones cannot be freed."""
        if self._predefined or self._function is None:
            raise Exception(ERR_OP, f"cannot free the operation {self._name}")
        self._function = None
        self._buffer_ops = {}
        self._name = "MPI_OP_NULL"

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:
        """Set ``inoutbuf`` to ``inbuf op inoutbuf`` elementwise (no communication)."""
        from ringworld.mpi._buffer import recv_message, send_message

        inout = recv_message(inoutbuf, "Reduce_local(inoutbuf)")
        src = send_message(inbuf, "Reduce_local(inbuf)").array()
        dst = inout.array()
        if src.dtype != dst.dtype or src.size != dst.size:
            raise ValueError(f"Reduce_local: inbuf ({src.size} x {src.dtype}) and inoutbuf "
                             f"({dst.size} x {dst.dtype}) must match")
        native = self._for_buffers(inout.datatype)
        if dst.size:
            native.check_dtype(dst.dtype, "inoutbuf")
        native.reduce_into(dst, src, src_left=True)

    # -- native forms ---------------------------------------------------------------------

    def _for_buffers(self, datatype: Datatype) -> ops.Op:
        """The native operation that reduces arrays of ``datatype``."""
        if self._predefined:
            return _NATIVE[self._name]
        if self._function is None:
            raise Exception(ERR_OP, "the operation is null (OP_NULL or freed)")
        found = self._buffer_ops.get(datatype)
        if found is None:
            found = ops.Op.create(_BufferFunction(self._function, datatype), self._commute,
                                  self._name)
            self._buffer_ops[datatype] = found
        return found

    def _for_objects(self) -> ops.Op:
        """The native operation that reduces Python values with ``self(x, y)``."""
        if not self:
            raise Exception(ERR_OP, "the operation is null (OP_NULL or freed)")
        return ops.Op.create(self.__call__, self._commute, self._name)


def object_op(op: Any) -> ops.Op:
    """The native operation for a lowercase reduction: an ``MPI.Op`` or any ``f(x, y)``."""
    if isinstance(op, Op):
        return op._for_objects()
    if callable(op):
        return ops.Op.create(op, False, getattr(op, "__name__", "user_op"))
    raise TypeError(f"op must be an MPI.Op or a callable f(x, y), got {type(op).__name__}")


def predefined_native(op: Any) -> ops.Op | None:
    """The native operation of a predefined ``MPI.Op`` (whatever the datatype), else None."""
    if type(op) is Op and op._predefined:
        return _NATIVE[op._name]
    return None


def buffer_op(op: Any, datatype: Datatype) -> ops.Op:
    """The native operation for a buffer reduction over ``datatype``."""
    if not isinstance(op, Op):
        raise TypeError(f"op must be an MPI.Op (e.g. MPI.SUM), got {type(op).__name__}")
    return op._for_buffers(datatype)


OP_NULL: Final = Op()
SUM: Final = Op._named("MPI_SUM")
PROD: Final = Op._named("MPI_PROD")
MAX: Final = Op._named("MPI_MAX")
MIN: Final = Op._named("MPI_MIN")
LAND: Final = Op._named("MPI_LAND")
LOR: Final = Op._named("MPI_LOR")
LXOR: Final = Op._named("MPI_LXOR")
BAND: Final = Op._named("MPI_BAND")
BOR: Final = Op._named("MPI_BOR")
BXOR: Final = Op._named("MPI_BXOR")
MAXLOC: Final = Op._named("MPI_MAXLOC")
MINLOC: Final = Op._named("MPI_MINLOC")
