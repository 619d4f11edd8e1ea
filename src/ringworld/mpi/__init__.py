"""An mpi4py-compatible layer over Ringworld's native API.

Use it as ``from ringworld import MPI``; a program written for mpi4py then runs unchanged as long
as it keeps to what is here: point-to-point communication (object and buffer forms, blocking and
nonblocking), probing, every collective (object forms, buffer forms with mpi4py's buffer specs,
nonblocking forms), reduction operations (predefined and ``Op.Create``), communicator management
(``Dup``, ``Split``, ``Split_type``, ``Create``, ``Create_group``, ``Free``), groups, statuses,
requests and the predefined datatypes (with the ``MAXLOC``/``MINLOC`` pair types).

* Importing does not start communication; ``COMM_WORLD`` starts the runtime on first use (or call
  ``Init()``). Outside a launched job the world is a singleton of size 1, like MPI's.
* ``PROC_NULL`` is handled here: sends to it and receives from it complete at once; a receive
  reports source ``PROC_NULL``, tag ``ANY_TAG`` and count 0.
* Errors of the native layer propagate as themselves (``ringworld.errors.TruncationError``,
  ``Timeout``, ``PeerFailure``, ``ValueError`` for a bad rank or tag, ...); ``MPI.Exception`` is
  raised only for MPI-level misuse such as using a freed communicator.
* Synchronous sends (``Ssend``, ``ssend``, ...) are standard-mode sends.
"""

from __future__ import annotations

from ringworld.mpi._comm import COMM_NULL, COMM_SELF, COMM_WORLD, Comm, Intracomm
from ringworld.mpi._constants import (
    ANY_SOURCE,
    ANY_TAG,
    COMM_TYPE_HW_GUIDED,
    COMM_TYPE_HW_UNGUIDED,
    COMM_TYPE_RESOURCE_GUIDED,
    COMM_TYPE_SHARED,
    IN_PLACE,
    PROC_NULL,
    TAG_UB,
    UNDEFINED,
)
from ringworld.mpi._datatype import (
    AINT,
    BOOL,
    BYTE,
    C_BOOL,
    C_COMPLEX,
    C_DOUBLE_COMPLEX,
    C_FLOAT_COMPLEX,
    C_LONG_DOUBLE_COMPLEX,
    CHAR,
    COMPLEX,
    COUNT,
    DOUBLE,
    DOUBLE_COMPLEX,
    DOUBLE_INT,
    FLOAT,
    FLOAT_INT,
    INT,
    INT8_T,
    INT16_T,
    INT32_T,
    INT64_T,
    INT_INT,
    LONG,
    LONG_DOUBLE,
    LONG_DOUBLE_INT,
    LONG_INT,
    LONG_LONG,
    LONG_LONG_INT,
    OFFSET,
    SHORT,
    SHORT_INT,
    SIGNED_CHAR,
    SIGNED_INT,
    SIGNED_LONG,
    SIGNED_LONG_LONG,
    SIGNED_SHORT,
    TWOINT,
    UINT8_T,
    UINT16_T,
    UINT32_T,
    UINT64_T,
    UNSIGNED,
    UNSIGNED_CHAR,
    UNSIGNED_INT,
    UNSIGNED_LONG,
    UNSIGNED_LONG_LONG,
    UNSIGNED_SHORT,
    WCHAR,
    Datatype,
    from_numpy_dtype,
    to_numpy_dtype,
)
from ringworld.mpi._env import (
    Finalize,
    Get_library_version,
    Get_processor_name,
    Get_version,
    Init,
    Is_finalized,
    Is_initialized,
    Wtick,
    Wtime,
)
from ringworld.mpi._exception import (
    ERR_ARG,
    ERR_BUFFER,
    ERR_COMM,
    ERR_COUNT,
    ERR_GROUP,
    ERR_IN_STATUS,
    ERR_INTERN,
    ERR_LASTCODE,
    ERR_OP,
    ERR_OTHER,
    ERR_PENDING,
    ERR_RANK,
    ERR_REQUEST,
    ERR_ROOT,
    ERR_TAG,
    ERR_TRUNCATE,
    ERR_TYPE,
    ERR_UNKNOWN,
    SUCCESS,
    Exception,
    Get_error_class,
    Get_error_string,
)
from ringworld.mpi._group import (
    CONGRUENT,
    GROUP_EMPTY,
    GROUP_NULL,
    IDENT,
    SIMILAR,
    UNEQUAL,
    Group,
)
from ringworld.mpi._op import (
    BAND,
    BOR,
    BXOR,
    LAND,
    LOR,
    LXOR,
    MAX,
    MAXLOC,
    MIN,
    MINLOC,
    OP_NULL,
    PROD,
    SUM,
    Op,
)
from ringworld.mpi._request import REQUEST_NULL, Request
from ringworld.mpi._status import Status

__all__ = [
    "AINT", "ANY_SOURCE", "ANY_TAG", "BAND", "BOOL", "BOR", "BXOR", "BYTE", "CHAR",
    "COMM_NULL", "COMM_SELF", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED",
    "COMM_TYPE_RESOURCE_GUIDED", "COMM_TYPE_SHARED", "COMM_WORLD", "COMPLEX", "CONGRUENT",
    "COUNT", "C_BOOL", "C_COMPLEX", "C_DOUBLE_COMPLEX", "C_FLOAT_COMPLEX",
    "C_LONG_DOUBLE_COMPLEX", "DOUBLE", "DOUBLE_COMPLEX", "DOUBLE_INT", "ERR_ARG", "ERR_BUFFER",
    "ERR_COMM", "ERR_COUNT", "ERR_GROUP", "ERR_INTERN", "ERR_IN_STATUS", "ERR_LASTCODE", "ERR_OP",
    "ERR_OTHER", "ERR_PENDING", "ERR_RANK", "ERR_REQUEST", "ERR_ROOT", "ERR_TAG", "ERR_TRUNCATE",
    "ERR_TYPE", "ERR_UNKNOWN", "FLOAT", "FLOAT_INT", "GROUP_EMPTY", "GROUP_NULL", "IDENT", "INT",
    "INT8_T", "INT16_T", "INT32_T", "INT64_T", "INT_INT", "IN_PLACE", "LAND", "LONG",
    "LONG_DOUBLE", "LONG_DOUBLE_INT", "LONG_INT", "LONG_LONG", "LONG_LONG_INT", "LOR", "LXOR",
    "MAX", "MAXLOC", "MIN", "MINLOC", "OFFSET", "OP_NULL", "PROC_NULL", "PROD", "REQUEST_NULL",
    "SHORT", "SHORT_INT", "SIGNED_CHAR", "SIGNED_INT", "SIGNED_LONG", "SIGNED_LONG_LONG",
    "SIGNED_SHORT", "SIMILAR", "SUCCESS", "SUM", "TAG_UB", "TWOINT", "UINT8_T", "UINT16_T",
    "UINT32_T", "UINT64_T", "UNDEFINED", "UNEQUAL", "UNSIGNED", "UNSIGNED_CHAR", "UNSIGNED_INT",
    "UNSIGNED_LONG", "UNSIGNED_LONG_LONG", "UNSIGNED_SHORT", "WCHAR", "Comm", "Datatype",
    "Exception", "Finalize", "Get_error_class", "Get_error_string", "Get_library_version",
    "Get_processor_name", "Get_version", "Group", "Init", "Intracomm", "Is_finalized",
    "Is_initialized", "Op", "Request", "Status", "Wtick", "Wtime", "from_numpy_dtype",
    "to_numpy_dtype",
]  # fmt: skip
