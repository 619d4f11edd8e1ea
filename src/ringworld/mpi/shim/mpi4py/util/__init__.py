"""``mpi4py.util`` stand-in: only :mod:`mpi4py.util.dtlib` is provided."""
