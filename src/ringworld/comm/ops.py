"""Reduction operations: the built-in set as numpy ufuncs, and user operations from callables.

An :class:`Op` combines two equally shaped arrays elementwise, ``left op right``, where ``left``
holds the contributions of lower ranks. Built-in ops are commutative and run as numpy ufuncs
writing into the destination (``out=``), so a reduction step allocates nothing. ``MAXLOC`` and
``MINLOC`` work on structured arrays of (value, index) pairs: the extreme value wins, ties go to
the smaller index, as in MPI. User operations wrap a callable ``fn(left, right) -> array``; a
non-commutative one is applied in rank order by every algorithm allowed to run it.

Object reductions (``allreduce_obj`` and friends) use :meth:`Op.combine_obj`: Python operators
for the built-ins (``+``, ``*``, ``max``, ...), so they work on any values that support them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


class Op:
    """A reduction operation; use the module constants (``SUM``, ...) or :meth:`create`."""

    __slots__ = ("_fn", "_obj", "_ufunc", "_ufunc_name", "commutative", "name")

    def __init__(self, name: str, *, ufunc: str | None = None,
                 fn: Callable[[Any, Any], Any] | None = None,
                 obj: Callable[[Any, Any], Any] | None = None, commutative: bool = True) -> None:
        self.name = name
        self._ufunc_name = ufunc  # numpy's ufunc, looked up on first use (numpy loads lazily)
        self._ufunc: np.ufunc | None = None
        self._fn = fn
        self._obj = obj
        self.commutative = commutative

    def __repr__(self) -> str:
        return f"<Op {self.name}>"

    @classmethod
    def create(cls, fn: Callable[[Any, Any], Any], commutative: bool = False,
               name: str | None = None) -> Op:
        """A user operation: ``fn(left, right)`` returns the combined value or array.

        For buffers ``fn`` receives two numpy arrays (lower ranks' data on the left) and returns
        an array of the same shape; for objects it receives the two values.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"op function must be callable, got {type(fn).__name__}")
        return cls(name or str(getattr(fn, "__name__", "user_op")), fn=fn, obj=fn,
                   commutative=bool(commutative))

    @property
    def is_builtin(self) -> bool:
        """Whether this is one of the predefined operations."""
        return self._fn is None

    @property
    def ufunc(self) -> np.ufunc | None:
        """numpy's ufunc for a built-in elementwise op (None for user ops, maxloc, minloc)."""
        return self._ufunc or self._uf()

    def _uf(self) -> np.ufunc | None:
        uf = self._ufunc
        if uf is None and self._ufunc_name is not None:
            import numpy

            uf = self._ufunc = getattr(numpy, self._ufunc_name)
        return uf

    def check_dtype(self, dtype: np.dtype[Any], name: str = "buffer") -> None:
        """Raise TypeError if this op cannot reduce arrays of ``dtype``."""
        if self._ufunc_name is None and self.name not in ("maxloc", "minloc"):
            return
        if self.name in ("maxloc", "minloc"):
            if dtype.names is None or len(dtype.names) != 2:
                raise TypeError(f"{self.name} needs a structured dtype of (value, index) "
                                f"pairs; {name} has dtype {dtype}")
            return
        if dtype.names is not None or dtype.kind in "OSUVMm":
            raise TypeError(f"op {self.name} cannot reduce {name} of dtype {dtype}")
        if self.name.startswith("b") and dtype.kind not in "iub":
            raise TypeError(f"bitwise op {self.name} needs an integer or bool dtype, not "
                            f"{dtype} ({name})")
        if self.name in ("max", "min") and dtype.kind == "c":
            raise TypeError(f"op {self.name} is not defined for complex numbers, as {dtype} "
                            f"({name})")

    def reduce_into(self, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any],
                    src_left: bool) -> None:
        """``dst = src op dst`` if ``src_left`` else ``dst op src``, in place.

        Cost: one pass over both arrays for built-ins; user ops may allocate.
        """
        uf = self._ufunc or self._uf()
        if uf is not None:
            if src_left:
                uf(src, dst, out=dst)
            else:
                uf(dst, src, out=dst)
            return
        if self._fn is None:  # maxloc / minloc
            _loc_into(dst, src, src_left, self.name == "maxloc")
            return
        res = self._fn(src, dst) if src_left else self._fn(dst, src)
        if res is not dst:
            import numpy

            numpy.copyto(dst, numpy.asarray(res, dtype=dst.dtype).reshape(dst.shape))

    def combine_into(self, out: np.ndarray[Any, Any], left: np.ndarray[Any, Any],
                     right: np.ndarray[Any, Any]) -> None:
        """``out = left op right`` (``out`` may be either operand).

        Cost: one pass for built-ins, no temporaries.
        """
        uf = self._ufunc or self._uf()
        if uf is not None:
            uf(left, right, out=out)
            return
        import numpy

        if out is not right:
            if out is not left and not numpy.shares_memory(out, left):
                numpy.copyto(out, right)
                self.reduce_into(out, left, src_left=True)
                return
            tmp = left.copy()
            numpy.copyto(out, right)
            self.reduce_into(out, tmp, src_left=True)
            return
        self.reduce_into(out, left, src_left=True)

    def combine_obj(self, left: Any, right: Any) -> Any:
        """``left op right`` for Python values (object collectives)."""
        assert self._obj is not None
        return self._obj(left, right)


def _loc_into(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], src_left: bool,
              is_max: bool) -> None:
    names = dst.dtype.names
    assert names is not None
    val, idx = names
    dv, sv = dst[val], src[val]
    better = (sv > dv) if is_max else (sv < dv)
    tie = (sv == dv) & (src[idx] < dst[idx])
    take = better | tie
    dst[take] = src[take]


def _obj_loc(is_max: bool) -> Callable[[Any, Any], Any]:
    def combine(a: Any, b: Any) -> Any:
        (va, ia), (vb, ib) = a, b
        if va == vb:
            return a if ia <= ib else b
        return a if (va > vb) == is_max else b
    return combine


SUM = Op("sum", ufunc="add", obj=operator.add)
PROD = Op("prod", ufunc="multiply", obj=operator.mul)
MAX = Op("max", ufunc="maximum", obj=lambda a, b: b if b > a else a)
MIN = Op("min", ufunc="minimum", obj=lambda a, b: b if b < a else a)
LAND = Op("land", ufunc="logical_and", obj=lambda a, b: bool(a) and bool(b))
LOR = Op("lor", ufunc="logical_or", obj=lambda a, b: bool(a) or bool(b))
LXOR = Op("lxor", ufunc="logical_xor", obj=lambda a, b: bool(a) != bool(b))
BAND = Op("band", ufunc="bitwise_and", obj=operator.and_)
BOR = Op("bor", ufunc="bitwise_or", obj=operator.or_)
BXOR = Op("bxor", ufunc="bitwise_xor", obj=operator.xor)
MAXLOC = Op("maxloc", obj=_obj_loc(True))
MINLOC = Op("minloc", obj=_obj_loc(False))

BUILTIN: dict[str, Op] = {o.name: o for o in (SUM, PROD, MAX, MIN, LAND, LOR, LXOR, BAND, BOR,
                                               BXOR, MAXLOC, MINLOC)}


def resolve(op: Op | str) -> Op:
    """``op`` as an :class:`Op`; strings name built-ins (``"sum"``, ``"max"``, ...).

    Raises:
        ValueError: an unknown name.  TypeError: neither an Op nor a str.
    """
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        found = BUILTIN.get(op.lower())
        if found is None:
            raise ValueError(f"op={op!r} is not a built-in op; use one of {sorted(BUILTIN)} "
                             "or Op.create(fn)")
        return found
    raise TypeError(f"op must be a ringworld Op or a name such as 'sum', got "
                    f"{type(op).__name__}")
