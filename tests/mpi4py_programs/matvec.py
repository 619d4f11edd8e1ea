"""Matrix-vector products y = A x with A distributed by rows and by columns."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N = 11  # not a multiple of the world size: uneven blocks

A = (np.arange(N * N, dtype="d").reshape(N, N) % 7) - 3 if rank == 0 else None
x = np.arange(1, N + 1, dtype="d") if rank == 0 else np.empty(N, dtype="d")
comm.Bcast([x, MPI.DOUBLE], root=0)

# rows: Scatterv of row blocks, local product, Allgatherv of the pieces of y
rows = [N // size + (r < N % size) for r in range(size)]
starts = [sum(rows[:r]) for r in range(size)]
local = np.empty((rows[rank], N), dtype="d")
counts = [r * N for r in rows]
displs = [s * N for s in starts]
comm.Scatterv([A, (counts, displs), MPI.DOUBLE], [local, MPI.DOUBLE], root=0)
y_part = local @ x
y = np.empty(N, dtype="d")
comm.Allgatherv([y_part, MPI.DOUBLE], [y, (rows, starts), MPI.DOUBLE])

# columns: each rank gets a column block (sent row by row), partial sums reduced and scattered
cols = comm.bcast(rows, root=0)
mine = np.empty((N, cols[rank]), dtype="d")
if rank == 0:
    assert A is not None
    for r in range(size):
        block = np.ascontiguousarray(A[:, starts[r]:starts[r] + cols[r]])
        if r == 0:
            mine[...] = block
        else:
            comm.Send([block, MPI.DOUBLE], dest=r, tag=3)
else:
    comm.Recv([mine, MPI.DOUBLE], source=0, tag=3)
partial = mine @ x[starts[rank]:starts[rank] + cols[rank]]
y_cols = np.empty(rows[rank], dtype="d")
comm.Reduce_scatter([partial, MPI.DOUBLE], [y_cols, MPI.DOUBLE], recvcounts=rows, op=MPI.SUM)
pieces = comm.gather(y_cols.tolist(), root=0)

# y^T y with Allreduce over the row pieces
dot = np.array(0.0)
comm.Allreduce([np.array(y_part @ y_part), MPI.DOUBLE], [dot, MPI.DOUBLE], op=MPI.SUM)

if rank == 0:
    assert A is not None and pieces is not None
    print("y (rows)   =", y.astype(int).tolist())
    print("y (columns)=", [int(v) for p in pieces for v in p])
    print("serial     =", (A @ x).astype(int).tolist())
    print("y.y        =", int(dot))
