"""Marker values of the collective API (no numpy needed to import them)."""

from __future__ import annotations

from typing import Final


class _InPlace:
    """The ``IN_PLACE`` marker: take the input from the output buffer (MPI_IN_PLACE)."""

    _instance: _InPlace | None = None

    def __new__(cls) -> _InPlace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "IN_PLACE"

    def __reduce__(self) -> str:
        return "IN_PLACE"


IN_PLACE: Final = _InPlace()
UNDEFINED: Final = -32766  # split color of ranks that want no new communicator (MPI_UNDEFINED)
