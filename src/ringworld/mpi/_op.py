"""``MPI.Op``: reduction operations. Named placeholders until collectives use them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ringworld.mpi._exception import ERR_OP, Exception


class Op:
    """A reduction operation: a predefined one (``MPI.SUM``) or a user function."""

    __slots__ = ("_commute", "_function", "_name", "_predefined")

    def __init__(self) -> None:
        self._name = "MPI_OP_NULL"
        self._function: Callable[..., Any] | None = None
        self._commute = False
        self._predefined = False

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
        if self._predefined:
            raise Exception(ERR_OP, f"cannot free the predefined operation {self._name}")
        self._function = None
        self._name = "MPI_OP_NULL"


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
