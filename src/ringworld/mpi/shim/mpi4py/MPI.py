# ruff: noqa: N999  (mpi4py's module name)
"""``mpi4py.MPI`` under ``ringworld run --mpi4py``: replaced by :mod:`ringworld.MPI` on import.

With ``mpi4py.rc.initialize`` true (the default) the runtime starts here, as importing mpi4py's
``MPI`` initialises MPI; set it false before the import to start later with ``MPI.Init()``.
"""

from __future__ import annotations

import importlib
import sys

from . import rc

_impl = importlib.import_module("ringworld.MPI")

if rc.initialize:
    if rc.threads:
        _impl.Init_thread()
    else:
        _impl.Init()
sys.modules[__name__] = _impl  # the import statement hands out ringworld.MPI itself
