"""Test harnesses: run a function on every rank of a world.

:func:`run_threads` runs each rank as a thread of this process over the in-process transport:
the fast tier for matching and collective semantics. :func:`run_processes` forks one process per
rank (cheap, no interpreter start-up) and gives each the job environment the launcher would; use
it for failure semantics and the real transports. :func:`run_ranks` picks one by name.
"""

from collections.abc import Callable
from typing import Any, TypeVar

from ringworld.testing.processes import RankFailed, run_processes
from ringworld.testing.threads import run_threads

T = TypeVar("T")

#: What :func:`run_ranks` accepts: ranks as threads, or processes over a real transport.
WORLDS = ("threads", "shm", "tcp", "auto")


def run_ranks(size: int, fn: Callable[..., T], *args: Any, transport: str = "threads",
              timeout: float = 60.0) -> list[T]:
    """``fn(comm, *args)`` on ``size`` ranks: threads (``transport="threads"``) or forked
    processes over ``transport``; results in rank order. Raises as the harness it picks."""
    if transport not in WORLDS:
        raise ValueError(f"transport={transport!r} must be one of {WORLDS}")
    if transport == "threads":
        return run_threads(size, fn, *args, timeout=timeout)
    return run_processes(size, fn, *args, transport=transport, timeout=timeout)


__all__ = ["WORLDS", "RankFailed", "run_processes", "run_ranks", "run_threads"]
