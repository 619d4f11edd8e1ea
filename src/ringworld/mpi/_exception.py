"""``MPI.Exception`` and the MPI error classes.

Errors raised by the native layer (``ringworld.errors`` types, ``ValueError``, ``TypeError``)
pass through the compatibility layer unchanged. ``MPI.Exception`` is raised only for errors that
exist at the MPI level alone, such as using a freed communicator.
"""

from __future__ import annotations

SUCCESS = 0
ERR_BUFFER = 1
ERR_COUNT = 2
ERR_TYPE = 3
ERR_TAG = 4
ERR_COMM = 5
ERR_RANK = 6
ERR_ROOT = 7
ERR_GROUP = 8
ERR_OP = 9
ERR_ARG = 12
ERR_UNKNOWN = 13
ERR_TRUNCATE = 14
ERR_OTHER = 15
ERR_INTERN = 16
ERR_IN_STATUS = 17
ERR_PENDING = 18
ERR_REQUEST = 19
ERR_TOPOLOGY = 10
ERR_DIMS = 11
ERR_INFO = 28
ERR_INFO_KEY = 29
ERR_INFO_VALUE = 30
ERR_INFO_NOKEY = 31
ERR_NO_MEM = 34
ERR_NOT_SAME = 35
ERR_UNSUPPORTED_OPERATION = 44
ERR_KEYVAL = 48
ERR_SIZE = 51
ERR_PROC_ABORTED = 76
ERR_VALUE_TOO_LARGE = 77
ERR_ERRHANDLER = 80
ERR_LASTCODE = 1073741823

_ERROR_STRINGS: dict[int, str] = {
    SUCCESS: "No MPI error",
    ERR_BUFFER: "Invalid buffer pointer",
    ERR_COUNT: "Invalid count",
    ERR_TYPE: "Invalid datatype",
    ERR_TAG: "Invalid tag",
    ERR_COMM: "Invalid communicator",
    ERR_RANK: "Invalid rank",
    ERR_ROOT: "Invalid root",
    ERR_GROUP: "Invalid group",
    ERR_OP: "Invalid MPI_Op",
    ERR_ARG: "Invalid argument",
    ERR_UNKNOWN: "Unknown error",
    ERR_TRUNCATE: "Message truncated",
    ERR_OTHER: "Other MPI error",
    ERR_INTERN: "Internal MPI error",
    ERR_IN_STATUS: "See the MPI_ERROR field in MPI_Status for the error code",
    ERR_PENDING: "Pending request (no error)",
    ERR_REQUEST: "Invalid MPI_Request",
    ERR_TOPOLOGY: "Invalid topology",
    ERR_DIMS: "Invalid dimension argument",
    ERR_INFO: "Invalid MPI_Info",
    ERR_INFO_KEY: "Invalid key for MPI_Info",
    ERR_INFO_VALUE: "Invalid MPI_Info value",
    ERR_INFO_NOKEY: "MPI_Info key is not defined",
    ERR_NO_MEM: "Out of memory",
    ERR_NOT_SAME: "Collective argument not identical on all processes",
    ERR_UNSUPPORTED_OPERATION: "Unsupported operation",
    ERR_KEYVAL: "Invalid keyval",
    ERR_SIZE: "Invalid size argument",
    ERR_PROC_ABORTED: "Process aborted",
    ERR_VALUE_TOO_LARGE: "Value is too large to store",
    ERR_ERRHANDLER: "Invalid errhandler",
}


def Get_error_class(errorcode: int) -> int:
    """Return the error class of an error code (codes are their own classes here)."""
    return errorcode


def Get_error_string(errorcode: int) -> str:
    """Return the text describing an error code."""
    return _ERROR_STRINGS.get(errorcode, f"Unknown error code {errorcode}")


class Exception(RuntimeError):
    """An MPI-level error carrying an MPI error code, like mpi4py's ``MPI.Exception``."""

    def __init__(self, ierr: int = SUCCESS, detail: str = "") -> None:
        self.ierr = int(ierr)
        self.detail = detail
        text = Get_error_string(self.ierr)
        super().__init__(f"{text}: {detail}" if detail else text)

    def __repr__(self) -> str:
        return f"MPI.Exception({self.ierr})"

    def __int__(self) -> int:
        return self.ierr

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Exception):
            return self.ierr == other.ierr
        if isinstance(other, int):
            return self.ierr == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ierr)

    def Get_error_code(self) -> int:
        """Return the error code."""
        return self.ierr

    def Get_error_class(self) -> int:
        """Return the error class."""
        return Get_error_class(self.ierr)

    def Get_error_string(self) -> str:
        """Return the text of the error class."""
        return Get_error_string(self.ierr)

    @property
    def error_code(self) -> int:
        """The error code."""
        return self.ierr

    @property
    def error_class(self) -> int:
        """The error class."""
        return Get_error_class(self.ierr)

    @property
    def error_string(self) -> str:
        """The text of the error class."""
        return Get_error_string(self.ierr)
