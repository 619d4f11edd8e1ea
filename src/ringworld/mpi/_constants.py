"""Constants of the mpi4py-compatible layer.

``ANY_SOURCE``, ``ANY_TAG`` and the tag upper bound are the native values. ``PROC_NULL`` is
handled entirely by this layer: operations on it complete at once without communication.
"""

from __future__ import annotations

from typing import Final

import ringworld

ANY_SOURCE: Final[int] = ringworld.ANY_SOURCE
ANY_TAG: Final[int] = ringworld.ANY_TAG
PROC_NULL: Final = -2
UNDEFINED: Final = -32766

#: The largest valid tag. It doubles as the attribute key: ``comm.Get_attr(TAG_UB)`` returns
#: the same number, so code written either way (``MPI.TAG_UB`` as a key, as in mpi4py, or as
#: the bound itself) behaves correctly.
TAG_UB: Final[int] = ringworld.TAG_UB


class _InPlaceType:
    """The type of :data:`IN_PLACE`, the in-place marker for collectives."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_PLACE"

    def __reduce__(self) -> str:
        return "IN_PLACE"


IN_PLACE: Final = _InPlaceType()
