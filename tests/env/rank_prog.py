"""A rank started by a foreign launcher (or by the tests with its variables); prints one line:

``RANKLINE <rank> <size> <allgather ok> <bcast value> <sum of ranks+1 through ringworld.MPI>``
"""

from __future__ import annotations

import sys

import numpy as np

import ringworld
from ringworld import MPI

comm = ringworld.init()
x = np.arange(4, dtype=np.float64) + 10 * comm.rank
out = np.empty(4)
comm.allreduce(x, out)
want = np.arange(4) * comm.size + 10 * sum(range(comm.size))
assert np.array_equal(out, want), (out, want)
b = np.full(2, comm.rank, dtype=np.int64)
comm.bcast(b, root=comm.size - 1)
mpi_sum = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank() + 1)
ok = comm.allgather_obj(comm.rank) == list(range(comm.size))
# one write per record, so a launcher merging the ranks' output cannot split it
sys.stdout.write(f"RANKLINE {comm.rank} {comm.size} {ok} {int(b[0])} {mpi_sum}\n")
sys.stdout.flush()
