"""Planes that carry a job's calls outside Ringworld's own transports, chosen at start-up.

:mod:`ringworld.backends.mpi` runs the native API over mpi4py (``RINGWORLD_BACKEND=mpi``). The
device planes (NCCL for GPU memory, UCX for RDMA fabrics) will live here beside it, chosen by
the same tuning as the host transports.

:data:`BACKENDS` is the table of them by name: the module each lives in and the function that
starts its world. :func:`start_world` imports that module only when a job asks for the backend,
so ``import ringworld`` (and this package) imports no backend and nothing optional (mpi4py, ...).
``"native"`` is not in the table: the runtime builds that world itself.

The contract, stated here once: a backend's start function is called as
``start(timeout, expect_size=n)`` and returns its world communicator, which provides the native
:class:`~ringworld.Communicator`'s interface (the same methods, arguments, results and errors;
each backend's tests check it, ``tests/backends_mpi`` for MPI). It is not a subclass, and the
interface is too wide (some 70 methods) for a Protocol beside it, so :func:`start_world`'s return
type is where that claim is made: the module is loaded by name, so mypy cannot check it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ringworld.collective.communicator import Communicator

__all__ = ["BACKENDS", "Backend", "StartWorld", "start_world"]


@dataclass(frozen=True, slots=True)
class Backend:
    """Where a backend lives: ``module`` (imported on first use) and the name of its
    start function there (see :class:`StartWorld`)."""

    module: str
    start: str


class StartWorld(Protocol):
    """A backend's start function: its world communicator, rank and size from the backend."""

    def __call__(self, timeout: float | None, *, expect_size: int) -> Communicator: ...


#: every backend besides the native one, by the name ``init(backend=...)`` and
#: ``RINGWORLD_BACKEND`` use (:data:`ringworld.config.BACKENDS` lists the same names)
BACKENDS: Mapping[str, Backend] = MappingProxyType({
    "mpi": Backend("ringworld.backends.mpi", "init_world"),
})


def start_world(name: str, timeout: float | None, *, expect_size: int) -> Communicator:
    """Import backend ``name`` and start its world: the communicator of every rank of the job.

    ``timeout`` is the default timeout of blocking calls; ``expect_size`` > 1 (the job size the
    launcher announced) must equal the backend's world size. Collective: every rank calls it.

    Raises:
        ValueError: ``name`` is not in :data:`BACKENDS`.
        ConfigError: the backend cannot start (its library is missing, sizes disagree, ...).
    """
    try:
        entry = BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend={name!r} must be one of {tuple(BACKENDS)}") from None
    start: StartWorld = getattr(importlib.import_module(entry.module), entry.start)
    return start(timeout, expect_size=expect_size)
