"""Ringworld: MPI-style communication for Python over shared memory and TCP.

Start a job with ``ringworld run -n 4 python script.py``; in the script::

    import ringworld
    comm = ringworld.init()
    if comm.rank == 0:
        comm.send_obj("hello", dest=1)
    total = np.empty(3); comm.allreduce(np.arange(3.0), total, ringworld.SUM)

``from ringworld import MPI`` gives an mpi4py-compatible layer over the same communicators.

Names are loaded on first use (PEP 562), so the launcher and ``import ringworld`` stay cheap:
numpy and the transports are imported only when communication starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ANY_SOURCE": "ringworld.comm.requests",
    "ANY_TAG": "ringworld.comm.requests",
    "TAG_UB": "ringworld.comm.requests",
    "Request": "ringworld.comm.requests",
    "Status": "ringworld.comm.requests",
    "test_all": "ringworld.comm.requests",
    "test_any": "ringworld.comm.requests",
    "wait_all": "ringworld.comm.requests",
    "wait_any": "ringworld.comm.requests",
    "Communicator": "ringworld.collective.communicator",
    "IN_PLACE": "ringworld.collective.markers",
    "UNDEFINED": "ringworld.collective.markers",
    "Op": "ringworld.comm.ops",
    "SUM": "ringworld.comm.ops",
    "PROD": "ringworld.comm.ops",
    "MAX": "ringworld.comm.ops",
    "MIN": "ringworld.comm.ops",
    "LAND": "ringworld.comm.ops",
    "LOR": "ringworld.comm.ops",
    "LXOR": "ringworld.comm.ops",
    "BAND": "ringworld.comm.ops",
    "BOR": "ringworld.comm.ops",
    "BXOR": "ringworld.comm.ops",
    "MAXLOC": "ringworld.comm.ops",
    "MINLOC": "ringworld.comm.ops",
    "BootstrapError": "ringworld.errors",
    "CommBroken": "ringworld.errors",
    "CommRevoked": "ringworld.errors",
    "CommError": "ringworld.errors",
    "ConfigError": "ringworld.errors",
    "DeviceError": "ringworld.errors",
    "DeviceUnavailable": "ringworld.errors",
    "MismatchError": "ringworld.errors",
    "PeerFailure": "ringworld.errors",
    "RingworldError": "ringworld.errors",
    "ShortMessageError": "ringworld.errors",
    "Timeout": "ringworld.errors",
    "TransportError": "ringworld.errors",
    "TruncationError": "ringworld.errors",
    "device_group": "ringworld.collective.devices",
    "device_stream": "ringworld.device.plane",
    "init_all": "ringworld.collective.devices",
    "local_device": "ringworld.device.cuda",
    "finalize": "ringworld.runtime",
    "finalized": "ringworld.runtime",
    "init": "ringworld.runtime",
    "initialized": "ringworld.runtime",
    "world": "ringworld.runtime",
}

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "BAND",
    "BOR",
    "BXOR",
    "IN_PLACE",
    "LAND",
    "LOR",
    "LXOR",
    "MAX",
    "MAXLOC",
    "MIN",
    "MINLOC",
    "PROD",
    "SUM",
    "TAG_UB",
    "UNDEFINED",
    "BootstrapError",
    "CommBroken",
    "CommError",
    "CommRevoked",
    "Communicator",
    "ConfigError",
    "DeviceError",
    "DeviceUnavailable",
    "MismatchError",
    "Op",
    "PeerFailure",
    "Request",
    "RingworldError",
    "ShortMessageError",
    "Status",
    "Timeout",
    "TransportError",
    "TruncationError",
    "__version__",
    "device_group",
    "device_stream",
    "finalize",
    "finalized",
    "init",
    "init_all",
    "initialized",
    "local_device",
    "test_all",
    "test_any",
    "wait_all",
    "wait_any",
    "world",
]

if TYPE_CHECKING:
    from ringworld.collective.communicator import Communicator
    from ringworld.collective.devices import device_group, init_all
    from ringworld.collective.markers import IN_PLACE, UNDEFINED
    from ringworld.comm.ops import (
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
        PROD,
        SUM,
        Op,
    )
    from ringworld.comm.requests import (
        ANY_SOURCE,
        ANY_TAG,
        TAG_UB,
        Request,
        Status,
        test_all,
        test_any,
        wait_all,
        wait_any,
    )
    from ringworld.device.cuda import local_device
    from ringworld.device.plane import device_stream
    from ringworld.errors import (
        BootstrapError,
        CommBroken,
        CommError,
        CommRevoked,
        ConfigError,
        DeviceError,
        DeviceUnavailable,
        MismatchError,
        PeerFailure,
        RingworldError,
        ShortMessageError,
        Timeout,
        TransportError,
        TruncationError,
    )
    from ringworld.runtime import finalize, finalized, init, initialized, world


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name == "MPI":
            return importlib.import_module("ringworld.MPI")
        raise AttributeError(f"module 'ringworld' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
