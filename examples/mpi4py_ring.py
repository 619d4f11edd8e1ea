"""Pass a token around a ring of processes: a classic mpi4py program.

Only the import differs from mpi4py (``from mpi4py import MPI``). Run it with::

    ringworld run -n 4 python examples/mpi4py_ring.py

Rank 0 starts the token at 0; every rank adds its rank and passes it on, so after one lap
rank 0 holds 0 + 1 + ... + (size - 1).
"""

import numpy as np

from ringworld import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
right = (rank + 1) % size
left = (rank - 1) % size

token = np.zeros(1, dtype="i")
status = MPI.Status()
if rank == 0:
    comm.Send([token, MPI.INT], dest=right, tag=11)
    comm.Recv([token, MPI.INT], source=left, tag=11, status=status)
    expected = size * (size - 1) // 2
    print(f"token went round {size} processes: {token[0]} (expected {expected}), "
          f"last hop from rank {status.Get_source()}")
else:
    comm.Recv([token, MPI.INT], source=left, tag=11, status=status)
    token += rank
    comm.Send([token, MPI.INT], dest=right, tag=11)
