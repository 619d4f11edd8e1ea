"""``MPI.Status``: the mutable envelope of a received message, as in mpi4py."""

from __future__ import annotations

from ringworld.mpi._constants import ANY_SOURCE, ANY_TAG, UNDEFINED
from ringworld.mpi._datatype import BYTE, Datatype
from ringworld.mpi._exception import SUCCESS


class Status:
    """Source, tag, error, byte count and cancelled flag of a completed operation.

    ``count`` is in bytes; ``Get_count(datatype)`` converts it to elements.
    A new status is empty: source ``ANY_SOURCE``, tag ``ANY_TAG``, count 0.
    """

    __slots__ = ("cancelled", "count", "error", "source", "tag")

    def __init__(self, status: Status | None = None) -> None:
        self.source: int = ANY_SOURCE
        self.tag: int = ANY_TAG
        self.error: int = SUCCESS
        self.count: int = 0
        self.cancelled: bool = False
        if status is not None:
            self.source = status.source
            self.tag = status.tag
            self.error = status.error
            self.count = status.count
            self.cancelled = status.cancelled

    def __repr__(self) -> str:
        return (
            f"Status(source={self.source}, tag={self.tag}, count={self.count}, "
            f"error={self.error}, cancelled={self.cancelled})"
        )

    def _set(self, source: int, tag: int, count: int, cancelled: bool = False) -> None:
        self.source = source
        self.tag = tag
        self.count = count
        self.error = SUCCESS
        self.cancelled = cancelled

    def Get_source(self) -> int:
        """Return the source rank of the message."""
        return self.source

    def Set_source(self, source: int) -> None:
        """Set the source rank."""
        self.source = source

    def Get_tag(self) -> int:
        """Return the tag of the message."""
        return self.tag

    def Set_tag(self, tag: int) -> None:
        """Set the tag."""
        self.tag = tag

    def Get_error(self) -> int:
        """Return the error code (``SUCCESS`` unless set)."""
        return self.error

    def Set_error(self, error: int) -> None:
        """Set the error code."""
        self.error = error

    def Get_count(self, datatype: Datatype = BYTE) -> int:
        """Return the number of ``datatype`` elements received, or ``UNDEFINED``.

        ``UNDEFINED`` is returned when the byte count is not a multiple of the datatype extent.
        """
        size = datatype.extent
        if size == 0:
            return 0 if self.count == 0 else UNDEFINED
        whole, rest = divmod(self.count, size)
        return UNDEFINED if rest else whole

    def Get_elements(self, datatype: Datatype) -> int:
        """Return the number of basic elements received (``Get_count`` for predefined types)."""
        return self.Get_count(datatype)

    def Set_elements(self, datatype: Datatype, count: int) -> None:
        """Set the count to ``count`` elements of ``datatype``."""
        self.count = count * datatype.extent

    def Is_cancelled(self) -> bool:
        """Return whether the operation was cancelled."""
        return self.cancelled

    def Set_cancelled(self, flag: bool) -> None:
        """Set the cancelled flag."""
        self.cancelled = bool(flag)
