"""Ringworld's stand-in for the ``mpi4py`` package, on the path under ``ringworld run --mpi4py``.

``from mpi4py import MPI``, ``import mpi4py.MPI`` and ``mpi4py.MPI`` after ``import mpi4py``
all give :mod:`ringworld.MPI`. ``mpi4py.rc`` holds mpi4py's run-time options: ``initialize``
(default True: importing ``MPI`` starts the runtime, as mpi4py's import initialises MPI) is
honoured; the others are accepted and recorded. ``python -m mpi4py prog.py`` runs a program as
mpi4py's runner does. Importing this package is cheap: nothing starts until ``MPI`` is imported.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

#: The mpi4py API version this layer follows (programs sometimes compare it).
__version__ = "4.0.0"
#: Marks the stand-in (real mpi4py has no such attribute).
__ringworld__ = True
__all__ = ["MPI"]


class Rc:
    """mpi4py's run-time options; set them as attributes or with ``rc(name=value, ...)``.

    Raises:
        TypeError: an unknown option name.
    """

    initialize: Any = True
    threads: Any = True
    thread_level: Any = "multiple"
    finalize: Any = None
    fast_reduce: Any = True
    recv_mprobe: Any = True
    irecv_bufsz: Any = 32768
    errors: Any = "exception"

    def __init__(self, **kwargs: Any) -> None:
        self(**kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if not hasattr(type(self), name) or name.startswith("_"):
            raise TypeError(f"unexpected argument {name!r}")
        super().__setattr__(name, value)

    def __call__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        return f"<{__name__}.rc>"


rc = Rc()
sys.modules[__name__ + ".rc"] = rc  # type: ignore[assignment]  # as mpi4py does


def __getattr__(name: str) -> ModuleType:
    """``mpi4py.MPI`` without importing it first (mpi4py itself needs the import)."""
    if name == "MPI":
        return importlib.import_module(__name__ + ".MPI")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
