"""Ringworld: MPI-style communication for Python over shared memory and TCP.

Start a job with ``ringworld run -n 4 python script.py``; in the script::

    import ringworld
    comm = ringworld.init()
    if comm.rank == 0:
        comm.send_obj("hello", dest=1)

``from ringworld import MPI`` gives an mpi4py-compatible layer over the same communicators.
"""

from ringworld.comm import (
    ANY_SOURCE,
    ANY_TAG,
    TAG_UB,
    Communicator,
    Request,
    Status,
    test_all,
    test_any,
    wait_all,
    wait_any,
)
from ringworld.errors import (
    BootstrapError,
    CommBroken,
    CommError,
    ConfigError,
    PeerFailure,
    RingworldError,
    Timeout,
    TransportError,
    TruncationError,
)
from ringworld.runtime import finalize, finalized, init, initialized, world

__version__ = "0.1.0"

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "TAG_UB",
    "BootstrapError",
    "CommBroken",
    "CommError",
    "Communicator",
    "ConfigError",
    "PeerFailure",
    "Request",
    "RingworldError",
    "Status",
    "Timeout",
    "TransportError",
    "TruncationError",
    "__version__",
    "finalize",
    "finalized",
    "init",
    "initialized",
    "test_all",
    "test_any",
    "wait_all",
    "wait_any",
    "world",
]
