"""Predefined MPI datatypes and their mapping to numpy dtypes and buffer formats.

Besides the predefined (named) datatypes, only contiguous derived ones exist
(``Create_contiguous``, ``Dup``): a run of ``count`` elements of another datatype, whose
``dtype`` is that of its elements. Strided and struct types (``Create_vector`` and friends) are
not supported. The (value, index) pair types for ``MAXLOC``/``MINLOC`` (``DOUBLE_INT``,
``TWOINT``, ...) are numpy structured dtypes with C struct layout: fields ``v`` and ``i``
(``int32``), padded as a C compiler pads them, so ``size`` < ``extent`` for some of them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from ringworld.mpi import _exception


class Datatype:
    """A predefined MPI datatype: a name, a size in bytes and a numpy dtype."""

    __slots__ = ("_code", "_derived", "_dtype", "_extent", "_name", "_size")

    def __init__(self, name: str, code: str, dtype: str | np.dtype[np.generic]) -> None:
        self._name = name
        self._code = code
        self._dtype: np.dtype[np.generic] = np.dtype(dtype)
        self._extent = self._dtype.itemsize
        fields = self._dtype.fields
        # a pair type's size counts its members, not the padding that its extent includes
        self._size = (sum(f[0].itemsize for f in fields.values()) if fields is not None
                      else self._extent)
        self._derived = False

    # -- contiguous derived datatypes --------------------------------------------------------

    def Create_contiguous(self, count: int) -> Datatype:
        """A datatype of ``count`` consecutive elements of this one (its dtype is theirs).

        Raises:
            ValueError: ``count`` is negative.
        """
        if isinstance(count, bool) or count < 0:
            raise ValueError(f"Create_contiguous: count must be an int >= 0, got {count!r}")
        new = Datatype("", self._code, self._dtype)
        new._extent = self._extent * count
        new._size = self._size * count
        new._derived = True
        return new

    def Dup(self) -> Datatype:
        """A derived datatype equal to this one (``Create_contiguous(1)``)."""
        return self.Create_contiguous(1)

    Create_dup = Dup

    def Commit(self) -> Datatype:
        """Make the datatype usable in communication (nothing to do here); return it."""
        return self

    def Free(self) -> None:
        """Free a derived datatype (the garbage collector does the work).

        Raises:
            MPI.Exception: the datatype is predefined.
        """
        if not self._derived:
            raise _exception.Exception(
                _exception.ERR_TYPE, f"cannot free the predefined datatype {self._name}"
            )

    def Set_name(self, name: str) -> None:
        """Name a derived datatype."""
        self._name = str(name)

    def __repr__(self) -> str:
        if self._derived:
            n = self._extent // max(self._dtype.itemsize, 1)
            return f"<MPI.Datatype contiguous {n} x {self._dtype}>"
        return f"<MPI.Datatype {self._name}>"

    def Get_size(self) -> int:
        """Return the size of one element in bytes."""
        return self._size

    def Get_name(self) -> str:
        """Return the MPI name, e.g. ``"MPI_DOUBLE"``."""
        return self._name

    def Get_extent(self) -> tuple[int, int]:
        """Return ``(lb, extent)``; the extent includes a pair type's padding."""
        return 0, self._extent

    @property
    def size(self) -> int:
        """Size of one element in bytes."""
        return self._size

    @property
    def name(self) -> str:
        """The MPI name, e.g. ``"MPI_DOUBLE"``."""
        return self._name

    @property
    def extent(self) -> int:
        """Extent in bytes: the stride of consecutive elements in a buffer."""
        return self._extent

    @property
    def lb(self) -> int:
        """Lower bound (always 0)."""
        return 0

    @property
    def ub(self) -> int:
        """Upper bound (equal to the extent)."""
        return self._extent

    @property
    def is_predefined(self) -> bool:
        """Whether this is a predefined datatype (not made by ``Create_contiguous``)."""
        return not self._derived

    @property
    def is_named(self) -> bool:
        """Whether this is a named (predefined) datatype."""
        return not self._derived

    @property
    def typechar(self) -> str:
        """The single-character numpy type code, e.g. ``"d"``."""
        return self._dtype.char

    @property
    def typestr(self) -> str:
        """The numpy array-interface type string, e.g. ``"<f8"``."""
        return self._dtype.str

    @property
    def dtype(self) -> np.dtype[np.generic]:
        """The numpy dtype of one element (a Ringworld extension)."""
        return self._dtype

    def tocode(self) -> str:
        """Return the type code mpi4py uses for this datatype, e.g. ``"d"`` or ``"i4"``."""
        return self._code

    @classmethod
    def fromcode(cls, code: str) -> Datatype:
        """Return the predefined datatype for a type code (``"d"``, ``"i4"``, ``"float64"``)."""
        return from_code(code)


def _dt(name: str, code: str, dtype: str | None = None) -> Datatype:
    return Datatype(name, code, dtype if dtype is not None else code)


BYTE: Final = _dt("MPI_BYTE", "B")
CHAR: Final = _dt("MPI_CHAR", "c", "S1")
WCHAR: Final = _dt("MPI_WCHAR", "U", "U1")
SIGNED_CHAR: Final = _dt("MPI_SIGNED_CHAR", "b")
UNSIGNED_CHAR: Final = _dt("MPI_UNSIGNED_CHAR", "B")
SHORT: Final = _dt("MPI_SHORT", "h")
UNSIGNED_SHORT: Final = _dt("MPI_UNSIGNED_SHORT", "H")
INT: Final = _dt("MPI_INT", "i")
UNSIGNED: Final = _dt("MPI_UNSIGNED", "I")
LONG: Final = _dt("MPI_LONG", "l")
UNSIGNED_LONG: Final = _dt("MPI_UNSIGNED_LONG", "L")
LONG_LONG: Final = _dt("MPI_LONG_LONG", "q")
UNSIGNED_LONG_LONG: Final = _dt("MPI_UNSIGNED_LONG_LONG", "Q")
FLOAT: Final = _dt("MPI_FLOAT", "f")
DOUBLE: Final = _dt("MPI_DOUBLE", "d")
LONG_DOUBLE: Final = _dt("MPI_LONG_DOUBLE", "g")
C_BOOL: Final = _dt("MPI_C_BOOL", "b1", "?")
INT8_T: Final = _dt("MPI_INT8_T", "i1")
INT16_T: Final = _dt("MPI_INT16_T", "i2")
INT32_T: Final = _dt("MPI_INT32_T", "i4")
INT64_T: Final = _dt("MPI_INT64_T", "i8")
UINT8_T: Final = _dt("MPI_UINT8_T", "u1")
UINT16_T: Final = _dt("MPI_UINT16_T", "u2")
UINT32_T: Final = _dt("MPI_UINT32_T", "u4")
UINT64_T: Final = _dt("MPI_UINT64_T", "u8")
C_FLOAT_COMPLEX: Final = _dt("MPI_C_FLOAT_COMPLEX", "F")
C_DOUBLE_COMPLEX: Final = _dt("MPI_C_DOUBLE_COMPLEX", "D")
C_LONG_DOUBLE_COMPLEX: Final = _dt("MPI_C_LONG_DOUBLE_COMPLEX", "G")
COMPLEX: Final = _dt("MPI_COMPLEX", "F")
DOUBLE_COMPLEX: Final = _dt("MPI_DOUBLE_COMPLEX", "D")
AINT: Final = _dt("MPI_AINT", "i8")
OFFSET: Final = _dt("MPI_OFFSET", "i8")
COUNT: Final = _dt("MPI_COUNT", "i8")



def _pair(name: str, value: str) -> Datatype:
    dtype = np.dtype([("v", value), ("i", "i4")], align=True)
    return Datatype(name, dtype.str, dtype)


# (value, index) pairs for MAXLOC / MINLOC, with C struct layout.
SHORT_INT: Final = _pair("MPI_SHORT_INT", "h")
TWOINT: Final = _pair("MPI_2INT", "i")
LONG_INT: Final = _pair("MPI_LONG_INT", "l")
FLOAT_INT: Final = _pair("MPI_FLOAT_INT", "f")
DOUBLE_INT: Final = _pair("MPI_DOUBLE_INT", "d")
LONG_DOUBLE_INT: Final = _pair("MPI_LONG_DOUBLE_INT", "g")

# Aliases, as in MPI and mpi4py.
INT_INT: Final = TWOINT
BOOL: Final = C_BOOL
C_COMPLEX: Final = C_FLOAT_COMPLEX
SIGNED_SHORT: Final = SHORT
SIGNED_INT: Final = INT
SIGNED_LONG: Final = LONG
SIGNED_LONG_LONG: Final = LONG_LONG
UNSIGNED_INT: Final = UNSIGNED
LONG_LONG_INT: Final = LONG_LONG

# Fortran datatypes (default kinds: INTEGER and REAL 4 bytes, LOGICAL a 4-byte integer).
CHARACTER: Final = _dt("MPI_CHARACTER", "c", "S1")
LOGICAL: Final = _dt("MPI_LOGICAL", "i4")
INTEGER: Final = _dt("MPI_INTEGER", "i4")
REAL: Final = _dt("MPI_REAL", "f4")
DOUBLE_PRECISION: Final = _dt("MPI_DOUBLE_PRECISION", "f8")
INTEGER1: Final = _dt("MPI_INTEGER1", "i1")
INTEGER2: Final = _dt("MPI_INTEGER2", "i2")
INTEGER4: Final = _dt("MPI_INTEGER4", "i4")
INTEGER8: Final = _dt("MPI_INTEGER8", "i8")
REAL4: Final = _dt("MPI_REAL4", "f4")
REAL8: Final = _dt("MPI_REAL8", "f8")
COMPLEX8: Final = _dt("MPI_COMPLEX8", "F")
COMPLEX16: Final = _dt("MPI_COMPLEX16", "D")

# Type codes (buffer-protocol format characters, numpy characters, mpi4py codes).
_BY_CODE: Final[dict[str, Datatype]] = {
    "c": CHAR, "S": CHAR, "s": CHAR, "S1": CHAR,
    "U": WCHAR, "w": WCHAR, "U1": WCHAR,
    "b": SIGNED_CHAR, "B": UNSIGNED_CHAR,
    "h": SHORT, "H": UNSIGNED_SHORT,
    "i": INT, "I": UNSIGNED,
    "l": LONG, "L": UNSIGNED_LONG,
    "q": LONG_LONG, "Q": UNSIGNED_LONG_LONG,
    "f": FLOAT, "d": DOUBLE, "g": LONG_DOUBLE,
    "?": C_BOOL, "b1": C_BOOL,
    "i1": INT8_T, "i2": INT16_T, "i4": INT32_T, "i8": INT64_T,
    "u1": UINT8_T, "u2": UINT16_T, "u4": UINT32_T, "u8": UINT64_T,
    "F": C_FLOAT_COMPLEX, "Zf": C_FLOAT_COMPLEX,
    "D": C_DOUBLE_COMPLEX, "Zd": C_DOUBLE_COMPLEX,
    "G": C_LONG_DOUBLE_COMPLEX, "Zg": C_LONG_DOUBLE_COMPLEX,
}  # fmt: skip

_FIXED: Final[dict[tuple[str, int], Datatype]] = {
    ("i", 1): INT8_T, ("i", 2): INT16_T, ("i", 4): INT32_T, ("i", 8): INT64_T,
    ("u", 1): UINT8_T, ("u", 2): UINT16_T, ("u", 4): UINT32_T, ("u", 8): UINT64_T,
    ("f", 4): FLOAT, ("f", 8): DOUBLE, ("f", LONG_DOUBLE.size): LONG_DOUBLE,
    ("c", 8): C_FLOAT_COMPLEX, ("c", 16): C_DOUBLE_COMPLEX,
    ("c", C_LONG_DOUBLE_COMPLEX.size): C_LONG_DOUBLE_COMPLEX,
    ("b", 1): C_BOOL, ("S", 1): CHAR, ("U", 4): WCHAR,
}  # fmt: skip

_PAIRS: Final = (SHORT_INT, TWOINT, LONG_INT, FLOAT_INT, DOUBLE_INT, LONG_DOUBLE_INT)

_NATIVE_ORDER: Final = "<" if sys.byteorder == "little" else ">"


def from_code(code: str) -> Datatype:
    """Return the predefined datatype for a type code or numpy dtype name.

    Raises:
        TypeError: no predefined datatype matches ``code``.
    """
    found = _BY_CODE.get(code)
    if found is not None:
        return found
    try:
        dtype = np.dtype(code)
    except TypeError:
        raise TypeError(f"no MPI datatype for type code {code!r}") from None
    return from_numpy_dtype(dtype)


def from_numpy_dtype(dtype: np.dtype[np.generic] | str | type) -> Datatype:
    """Return the predefined datatype for a numpy dtype (native byte order, scalar kinds).

    Raises:
        TypeError: the dtype has no predefined MPI datatype (float16, structured, object, ...).
    """
    dt = np.dtype(dtype)
    if dt.byteorder not in ("=", "|", _NATIVE_ORDER):
        raise TypeError(f"no MPI datatype for non-native byte order dtype {dt.str!r}")
    if dt.fields is not None:
        for pair in _PAIRS:
            if _layout(pair.dtype) == _layout(dt):
                return pair
        raise TypeError(f"no MPI datatype for structured numpy dtype {dt}")
    found = _BY_CODE.get(dt.char) if dt.char not in ("S", "U") else None
    if found is None:
        found = _FIXED.get((dt.kind, dt.itemsize))
    if found is None:
        raise TypeError(f"no MPI datatype for numpy dtype {dt.name} ({dt.str!r})")
    return found


def _layout(dt: np.dtype[np.generic]) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Item size and (field dtype, offset) of each field, whatever the field names."""
    fields: Mapping[str, tuple[Any, ...]] = dt.fields or {}
    return dt.itemsize, tuple((f[0].str, f[1]) for f in fields.values())


def to_numpy_dtype(datatype: Datatype) -> np.dtype[np.generic]:
    """Return the numpy dtype of one element of ``datatype``."""
    return datatype.dtype


def from_buffer_format(fmt: str, itemsize: int) -> Datatype | None:
    """Return the datatype of a buffer-protocol format string, or None if there is none.

    A repeat count (``"2w"`` from a numpy ``U2`` array) is allowed; the datatype is then the
    element type and the buffer holds ``itemsize // size`` of them per item.
    """
    order = ""
    if fmt[:1] in ("@", "=", "<", ">", "!"):
        order, fmt = fmt[0], fmt[1:]
    body = fmt.lstrip("0123456789")
    if order in ("", "@"):
        found = _BY_CODE.get(body)
        if found is not None and itemsize % found.size == 0:
            return found
        return None
    if order == "!" or (order in ("<", ">") and order != _NATIVE_ORDER):
        return None
    # "=" or the native explicit order: standard sizes, so match on kind and item size.
    kind = {"b": "i", "h": "i", "i": "i", "l": "i", "q": "i", "B": "u", "H": "u", "I": "u",
            "L": "u", "Q": "u", "e": "f", "f": "f", "d": "f", "?": "b"}.get(body)  # fmt: skip
    if kind is None:
        return None
    return _FIXED.get((kind, itemsize))


DATATYPES: Final[tuple[Datatype, ...]] = (
    BYTE, CHAR, WCHAR, SIGNED_CHAR, UNSIGNED_CHAR, SHORT, UNSIGNED_SHORT, INT, UNSIGNED,
    LONG, UNSIGNED_LONG, LONG_LONG, UNSIGNED_LONG_LONG, FLOAT, DOUBLE, LONG_DOUBLE, C_BOOL,
    INT8_T, INT16_T, INT32_T, INT64_T, UINT8_T, UINT16_T, UINT32_T, UINT64_T,
    C_FLOAT_COMPLEX, C_DOUBLE_COMPLEX, C_LONG_DOUBLE_COMPLEX, COMPLEX, DOUBLE_COMPLEX,
    AINT, OFFSET, COUNT, SHORT_INT, TWOINT, LONG_INT, FLOAT_INT, DOUBLE_INT, LONG_DOUBLE_INT,
    CHARACTER, LOGICAL, INTEGER, REAL, DOUBLE_PRECISION, INTEGER1, INTEGER2, INTEGER4, INTEGER8,
    REAL4, REAL8, COMPLEX8, COMPLEX16,
)  # fmt: skip
