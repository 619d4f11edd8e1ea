"""Constants of the mpi4py-compatible layer.

``ANY_SOURCE``, ``ANY_TAG``, ``UNDEFINED``, ``IN_PLACE`` and the tag upper bound are the native
values. ``PROC_NULL`` is handled entirely by this layer: operations on it complete at once
without communication.
"""

from __future__ import annotations

from typing import Final

import ringworld
from ringworld.collective.markers import IN_PLACE

ANY_SOURCE: Final[int] = ringworld.ANY_SOURCE
ANY_TAG: Final[int] = ringworld.ANY_TAG
PROC_NULL: Final = -2
UNDEFINED: Final = -32766

#: The largest valid tag. It doubles as the attribute key: ``comm.Get_attr(TAG_UB)`` returns
#: the same number, so code written either way (``MPI.TAG_UB`` as a key, as in mpi4py, or as
#: the bound itself) behaves correctly.
TAG_UB: Final[int] = ringworld.TAG_UB

__all__ = ["ANY_SOURCE", "ANY_TAG", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED",
           "COMM_TYPE_RESOURCE_GUIDED", "COMM_TYPE_SHARED", "IN_PLACE", "PROC_NULL", "TAG_UB",
           "UNDEFINED"]


#: Split types of ``Comm.Split_type`` (only ``COMM_TYPE_SHARED`` is implemented).
COMM_TYPE_SHARED: Final = 1
COMM_TYPE_HW_GUIDED: Final = 2
COMM_TYPE_HW_UNGUIDED: Final = 3
COMM_TYPE_RESOURCE_GUIDED: Final = 4
