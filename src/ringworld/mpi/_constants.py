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
#: The root argument of intercommunicator collectives (none exist here; the name is provided).
ROOT: Final = -3
UNDEFINED: Final = -32766

#: The largest valid tag. It doubles as the attribute key: ``comm.Get_attr(TAG_UB)`` returns
#: the same number, so code written either way (``MPI.TAG_UB`` as a key, as in mpi4py, or as
#: the bound itself) behaves correctly.
TAG_UB: Final[int] = ringworld.TAG_UB

#: Attribute keys of ``Comm.Get_attr`` besides ``TAG_UB`` (distinct from it and each other).
HOST: Final = 0x64400003
IO: Final = 0x64400005
WTIME_IS_GLOBAL: Final = 0x64400007
UNIVERSE_SIZE: Final = 0x64400009
LASTUSEDCODE: Final = 0x6440000B
APPNUM: Final = 0x6440000D
KEYVAL_INVALID: Final = 0x24000000

__all__ = ["ANY_SOURCE", "ANY_TAG", "APPNUM", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED",
           "COMM_TYPE_RESOURCE_GUIDED", "COMM_TYPE_SHARED", "HOST", "IN_PLACE", "IO",
           "KEYVAL_INVALID", "LASTUSEDCODE", "PROC_NULL", "ROOT", "TAG_UB", "UNDEFINED",
           "UNIVERSE_SIZE", "WTIME_IS_GLOBAL"]


#: Split types of ``Comm.Split_type`` (only ``COMM_TYPE_SHARED`` is implemented).
COMM_TYPE_SHARED: Final = 1
COMM_TYPE_HW_GUIDED: Final = 2
COMM_TYPE_HW_UNGUIDED: Final = 3
COMM_TYPE_RESOURCE_GUIDED: Final = 4
