"""``MPI.Info`` (string key/value hints) and ``MPI.Errhandler`` (error handler handles).

Ringworld takes no hints, so an ``Info`` is only a small string dictionary that calls accept
and ignore. Errors always surface as Python exceptions (mpi4py's default, ``ERRORS_RETURN`` with
``rc.errors = "exception"``); an error handler set on a communicator is recorded and handed back
by ``Get_errhandler``, and an uncaught exception ends the rank, which makes the launcher stop the
job as ``ERRORS_ARE_FATAL`` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Self

from ringworld.mpi._exception import ERR_ARG, ERR_INFO, Exception


class Info:
    """String hints; ``Info()`` is null like ``INFO_NULL``, ``Info.Create()`` an empty one."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[str, str] | None = None

    @classmethod
    def Create(cls, items: dict[str, str] | None = None) -> Self:
        """A new info object holding ``items``."""
        info = cls()
        info._items = {}
        for key, value in (items or {}).items():
            info.Set(key, value)
        return info

    def _dict(self) -> dict[str, str]:
        if self._items is None:
            raise Exception(ERR_INFO, "the info object is null (INFO_NULL or freed)")
        return self._items

    def __bool__(self) -> bool:
        return self._items is not None

    def __repr__(self) -> str:
        return "<MPI.Info null>" if self._items is None else f"<MPI.Info {self._items!r}>"

    def Set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value`` (both strings).

        Raises:
            MPI.Exception: ``key`` or ``value`` is not a string.
        """
        if not isinstance(key, str) or not isinstance(value, str):
            raise Exception(ERR_ARG, f"Info keys and values must be str, got {key!r}: {value!r}")
        self._dict()[key] = value

    def Get(self, key: str) -> str | None:
        """Return the value of ``key``, or None."""
        return self._dict().get(key)

    def Delete(self, key: str) -> None:
        """Remove ``key``.

        Raises:
            MPI.Exception: ``key`` is not set.
        """
        if self._dict().pop(key, None) is None:
            raise Exception(ERR_INFO, f"Info has no key {key!r}")

    def Get_nkeys(self) -> int:
        """Return the number of keys."""
        return len(self._dict())

    def Get_nthkey(self, n: int) -> str:
        """Return the ``n``-th key, in insertion order."""
        return list(self._dict())[n]

    def Dup(self) -> Self:
        """A copy of this info object."""
        return type(self).Create(dict(self._dict()))

    def Free(self) -> None:
        """Make this info object null."""
        self._dict()
        self._items = None

    def __len__(self) -> int:
        return len(self._items or {})

    def __contains__(self, key: object) -> bool:
        return key in (self._items or {})

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._items or {}))

    def __getitem__(self, key: str) -> str:
        return self._dict()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.Set(key, value)

    def __delitem__(self, key: str) -> None:
        self.Delete(key)

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of ``key`` or ``default``."""
        return (self._items or {}).get(key, default)

    def items(self) -> list[tuple[str, str]]:
        """The (key, value) pairs."""
        return list((self._items or {}).items())

    def keys(self) -> list[str]:
        """The keys."""
        return list(self._items or {})

    def values(self) -> list[str]:
        """The values."""
        return list((self._items or {}).values())


INFO_NULL: Final = Info()
#: The environment's hints: always empty here.
INFO_ENV: Final = Info.Create()


class Errhandler:
    """An error handler handle; ``Errhandler()`` is null like ``ERRHANDLER_NULL``."""

    __slots__ = ("_name",)

    def __init__(self, name: str = "") -> None:
        self._name = name

    def __bool__(self) -> bool:
        return bool(self._name)

    def __repr__(self) -> str:
        return f"<MPI.Errhandler {self._name or 'MPI_ERRHANDLER_NULL'}>"

    def Free(self) -> None:
        """Release the handle (predefined handlers stay valid, as in MPI)."""


ERRHANDLER_NULL: Final = Errhandler()
ERRORS_RETURN: Final = Errhandler("MPI_ERRORS_RETURN")
ERRORS_ARE_FATAL: Final = Errhandler("MPI_ERRORS_ARE_FATAL")
ERRORS_ABORT: Final = Errhandler("MPI_ERRORS_ABORT")
