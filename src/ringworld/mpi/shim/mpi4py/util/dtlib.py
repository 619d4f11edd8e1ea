"""``mpi4py.util.dtlib``: conversion between numpy dtypes and predefined MPI datatypes."""

from __future__ import annotations

from ringworld.mpi import from_numpy_dtype, to_numpy_dtype

__all__ = ["from_numpy_dtype", "to_numpy_dtype"]
