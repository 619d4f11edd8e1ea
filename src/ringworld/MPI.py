"""mpi4py-compatible module: ``from ringworld import MPI`` (see :mod:`ringworld.mpi`)."""

from ringworld import mpi as _mpi
from ringworld.mpi import *  # noqa: F403

__all__ = list(_mpi.__all__)
