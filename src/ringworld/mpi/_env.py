"""Environment functions: initialization, timers, version and processor name."""

from __future__ import annotations

import socket
import time

import ringworld


def Init() -> None:
    """Start the runtime now (otherwise the first use of ``COMM_WORLD`` does); idempotent."""
    ringworld.init()


def Finalize() -> None:
    """Shut the runtime down (also done at exit); idempotent."""
    ringworld.finalize()


def Is_initialized() -> bool:
    """Return whether the runtime has been started."""
    return ringworld.initialized()


def Is_finalized() -> bool:
    """Return whether the runtime has been shut down."""
    return ringworld.finalized()


def Wtime() -> float:
    """Return elapsed wall-clock seconds since an arbitrary point (per process)."""
    return time.perf_counter()


def Wtick() -> float:
    """Return the resolution of ``Wtime`` in seconds."""
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    """Return the host name of this process."""
    return socket.gethostname()


def Get_version() -> tuple[int, int]:
    """Return the MPI standard version this layer follows: ``(3, 1)``."""
    return 3, 1


def Get_library_version() -> str:
    """Return a line naming the library and its version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("ringworld")
    except PackageNotFoundError:
        number = "unknown"
    return f"Ringworld {number} (mpi4py-compatible layer)"
