"""Compute pi by the midpoint rule on 4 / (1 + x^2), the intervals dealt round-robin."""

import math

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

for intervals in (10, 1000, 100_000):
    n = np.array(intervals if rank == 0 else 0, dtype="i")
    comm.Bcast([n, MPI.INT], root=0)
    h = 1.0 / int(n)
    x = h * (np.arange(rank, int(n), size, dtype="d") + 0.5)
    mine = np.array(h * np.sum(4.0 / (1.0 + x * x)), dtype="d")
    pi = np.array(0.0, dtype="d")
    comm.Reduce([mine, MPI.DOUBLE], [pi, MPI.DOUBLE], op=MPI.SUM, root=0)
    pi_obj = comm.reduce(float(mine), op=MPI.SUM, root=0)
    pi_all = comm.allreduce(float(mine))
    if rank == 0:
        error = abs(float(pi) - math.pi)
        print(f"n={intervals:7d} pi~{float(pi):.9f} error<{10 ** math.ceil(math.log10(error))}"
              f" object-form-agrees={abs(pi_obj - float(pi)) < 1e-12}"
              f" allreduce-agrees={abs(pi_all - float(pi)) < 1e-12}")
