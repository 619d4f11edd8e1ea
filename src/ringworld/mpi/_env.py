"""Environment functions: initialization, threads, timers, versions, memory, processor name."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

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


# -- threads -----------------------------------------------------------------------------------

THREAD_SINGLE: Final = 0
THREAD_FUNNELED: Final = 1
THREAD_SERIALIZED: Final = 2
THREAD_MULTIPLE: Final = 3

_main_thread = threading.main_thread()


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Start the runtime (as ``Init``) and return the thread level provided.

    Every level up to ``THREAD_MULTIPLE`` is provided: calls may come from any thread.
    """
    del required
    ringworld.init()
    return THREAD_MULTIPLE


def Query_thread() -> int:
    """Return the thread level provided (``THREAD_MULTIPLE``)."""
    return THREAD_MULTIPLE


def Is_thread_main() -> bool:
    """Return whether the calling thread is the main thread."""
    return threading.current_thread() is _main_thread


# -- versions, vendor, limits ------------------------------------------------------------------

VERSION: Final = 3
SUBVERSION: Final = 1
MAX_PROCESSOR_NAME: Final = 256
MAX_ERROR_STRING: Final = 512
MAX_OBJECT_NAME: Final = 128
MAX_LIBRARY_VERSION_STRING: Final = 8192
MAX_INFO_KEY: Final = 255
MAX_INFO_VAL: Final = 1024


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """Return ``("Ringworld", (major, minor, micro))``, like mpi4py's ``MPI.get_vendor``."""
    parts = [int(p) for p in ringworld.__version__.split(".")[:3] if p.isdigit()]
    parts += [0] * (3 - len(parts))
    return "Ringworld", (parts[0], parts[1], parts[2])


def Pcontrol(level: int) -> None:
    """Profiling control: accepted and ignored (no profiling layer)."""
    del level


# -- memory and buffered-send buffers ------------------------------------------------------------

_attached: list[Any] = []


def Alloc_mem(size: int, info: Any = None) -> memoryview:
    """Return ``size`` bytes of zeroed, writable memory (a memoryview of a bytearray).

    Raises:
        ValueError: ``size`` is negative.
    """
    del info
    if size < 0:
        raise ValueError(f"Alloc_mem: size must be >= 0, got {size}")
    return memoryview(bytearray(size))


def Free_mem(mem: Any) -> None:
    """Release memory from ``Alloc_mem`` (the garbage collector does the work)."""
    del mem


def Attach_buffer(buf: Any) -> None:
    """Attach a buffer for buffered sends; kept only to hand back from ``Detach_buffer``.

    Buffered sends need no user buffer here: every send is buffered at the receiver.
    """
    _attached.append(buf)


def Detach_buffer() -> Any:
    """Return the buffer last attached with ``Attach_buffer`` (None if there is none)."""
    return _attached.pop() if _attached else None


def Flush_buffer() -> None:
    """Nothing to flush: buffered sends are standard sends."""


def Compute_dims(nnodes: int, dims: int | Sequence[int]) -> list[int]:
    """Return a balanced grid of ``nnodes`` processes, as ``MPI_Dims_create`` does.

    ``dims`` is the number of dimensions or a list whose nonzero entries are kept; the free
    entries get the prime factors of what remains, each to the currently smallest entry, and are
    sorted in non-increasing order.

    Raises:
        ValueError: negative arguments, or fixed entries that do not divide ``nnodes``.
    Cost: trial division up to the square root of ``nnodes``.
    """
    grid = [0] * dims if isinstance(dims, int) else [int(d) for d in dims]
    if nnodes < 0 or any(d < 0 for d in grid):
        raise ValueError(f"Compute_dims: nnodes={nnodes} and dims={grid} must be >= 0")
    fixed = math.prod(d for d in grid if d)
    free = [i for i, d in enumerate(grid) if d == 0]
    if fixed == 0 or nnodes % fixed or (not free and fixed != nnodes):
        raise ValueError(f"Compute_dims: the fixed entries of dims={grid} do not divide "
                         f"nnodes={nnodes}")
    rest, factors, p = nnodes // fixed, [], 2
    while p * p <= rest:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    if rest > 1:
        factors.append(rest)
    sizes = [1] * len(free)
    for factor in sorted(factors, reverse=True):
        if sizes:
            sizes[sizes.index(min(sizes))] *= factor
    for i, size in zip(free, sorted(sizes, reverse=True), strict=True):
        grid[i] = size
    return grid
