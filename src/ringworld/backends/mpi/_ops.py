"""Ringworld reduction ops as MPI ops, chosen per (op, dtype).

Built-in ops on the numeric types MPI defines them for run as MPI's own (``MPI.SUM`` on
``MPI.DOUBLE``, ...), so the library's tuned reductions apply. Everything else -- user ops,
MAXLOC/MINLOC on (value, index) structured arrays, dtypes MPI has no predefined type for
(float16, structured, bool arithmetic) -- runs as an ``MPI.Op.Create`` function over a
contiguous byte datatype of the element size, calling the ringworld op's numpy code
(``invec`` holds lower ranks' data, so non-commutative ops keep rank order). Datatypes and ops
are created once per process and reused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ringworld.comm import ops

_MPI_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN", "land": "LAND",
            "lor": "LOR", "lxor": "LXOR", "band": "BAND", "bor": "BOR", "bxor": "BXOR"}
# dtype kinds MPI defines each predefined op on (C integer, floating, complex, logical)
_KINDS = {"sum": "iufc", "prod": "iufc", "max": "iuf", "min": "iuf", "land": "iub",
          "lor": "iub", "lxor": "iub", "band": "iu", "bor": "iu", "bxor": "iu"}
_CHARS = frozenset("bBhHiIlLqQfdFD?")  # C integers, float, double, their complex, bool
_bytes_types: dict[int, Any] = {}
_user_ops: dict[tuple[ops.Op, str], Any] = {}


def _predefined_type(dtype: np.dtype[Any]) -> Any:
    if dtype.names is not None or not dtype.isnative or dtype.char not in _CHARS:
        return None
    return MPI._typedict.get(dtype.char)


def _bytes_type(itemsize: int) -> Any:
    t = _bytes_types.get(itemsize)
    if t is None:
        t = _bytes_types[itemsize] = MPI.BYTE.Create_contiguous(itemsize).Commit()
    return t


def _user_op(op: ops.Op, dtype: np.dtype[Any]) -> Any:
    key = (op, dtype.str if dtype.names is None else str(dtype.descr))
    found = _user_ops.get(key)
    if found is None:
        def apply(invec: Any, inoutvec: Any, datatype: Any) -> None:
            src = np.frombuffer(invec, dtype=dtype)
            dst = np.frombuffer(inoutvec, dtype=dtype)
            op.reduce_into(dst, src, src_left=True)

        found = _user_ops[key] = MPI.Op.Create(apply, commute=op.commutative)
    return found


def reduction(op: ops.Op, dtype: np.dtype[Any]) -> tuple[Any, Any]:
    """``(datatype, mpi_op)`` to reduce arrays of ``dtype`` with ``op``.

    Raises:
        TypeError: ``op`` cannot reduce ``dtype`` (as the native backend says).
    Cost: a dict lookup; the first use of a (user op, dtype) pair creates an MPI op.
    """
    op.check_dtype(dtype)
    name = _MPI_OPS.get(op.name) if op.is_builtin else None
    mpi_type = _predefined_type(dtype)
    if name is not None and mpi_type is not None and dtype.kind in _KINDS[op.name]:
        return mpi_type, getattr(MPI, name)
    return _bytes_type(dtype.itemsize), _user_op(op, dtype)
