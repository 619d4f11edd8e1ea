"""Buffer specifications with datatypes, counts and displacements; IN_PLACE; MAXLOC; Op.Create."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
row = {}

# [buf, count, type] and [buf, (count, displ), type]: send part of an array into part of another
src = np.arange(10, dtype="d") + 100 * rank
dst = np.full(10, -1.0)
comm.Sendrecv([src, 4, MPI.DOUBLE], right, 1, [dst, (4, 3), MPI.DOUBLE], left, 1)
row["count_displ"] = dst.tolist()
raw = np.zeros(16, dtype="u1")
comm.Sendrecv([np.array([rank, -rank], dtype="i"), MPI.INT], right, 2, [raw, MPI.BYTE], left, 2)
row["as_bytes"] = raw[:8].view("i").tolist()

# contiguous derived datatype: a row of 3 doubles
triple = MPI.DOUBLE.Create_contiguous(3).Commit()
rows3 = np.zeros((2, 3))
comm.Sendrecv([np.arange(6.0) + rank, 2, triple], right, 3, [rows3, 2, triple], left, 3)
row["contiguous"] = (triple.Get_size(), triple.Get_extent(), rows3.tolist())
triple.Free()

# Gatherv / Scatterv / Allgatherv / Alltoallv with explicit counts and displacements
counts = [r + 1 for r in range(size)]
displs = [sum(counts[:r]) + r for r in range(size)]  # a gap of one element between blocks
gathered = np.full(sum(counts) + size, -1, dtype="i") if rank == 0 else None
comm.Gatherv([np.full(rank + 1, rank, dtype="i"), MPI.INT],
             [gathered, (counts, displs), MPI.INT], root=0)
if rank == 0:
    assert gathered is not None
    row["gatherv"] = gathered.tolist()
piece = np.zeros(rank + 1, dtype="i")
comm.Scatterv([gathered, counts, displs, MPI.INT], [piece, MPI.INT], root=0)
row["scatterv"] = piece.tolist()
everything = np.full(sum(counts), -1, dtype="l")
comm.Allgatherv([np.full(rank + 1, rank * 2, dtype="l"), MPI.LONG], [everything, counts])
row["allgatherv"] = everything.tolist()
scounts = [(rank + d) % 3 + 1 for d in range(size)]
sdispls = [sum(scounts[:d]) for d in range(size)]
rcounts = comm.alltoall(scounts)
rdispls = [sum(rcounts[:d]) for d in range(size)]
sendbuf = np.arange(sum(scounts), dtype="f") + 10 * rank
recvbuf = np.zeros(sum(rcounts), dtype="f")
comm.Alltoallv([sendbuf, (scounts, sdispls), MPI.FLOAT], [recvbuf, (rcounts, rdispls), MPI.FLOAT])
row["alltoallv"] = recvbuf.tolist()

# IN_PLACE reductions and gathers
vec = np.arange(4, dtype="i") * (rank + 1)
comm.Allreduce(MPI.IN_PLACE, [vec, MPI.INT], op=MPI.SUM)
row["allreduce_in_place"] = vec.tolist()
table = np.zeros(size * 2, dtype="i")
table[2 * rank: 2 * rank + 2] = [rank, rank * rank]
comm.Allgather(MPI.IN_PLACE, [table, MPI.INT])
row["allgather_in_place"] = table.tolist()
root_buf = np.array([rank + 1.0, -rank])
if rank == 0:
    comm.Reduce(MPI.IN_PLACE, [root_buf, MPI.DOUBLE], op=MPI.MAX, root=0)
    row["reduce_in_place"] = root_buf.tolist()
else:
    comm.Reduce([root_buf, MPI.DOUBLE], None, op=MPI.MAX, root=0)

# MAXLOC / MINLOC with DOUBLE_INT pairs
pair_t = np.dtype([("v", "d"), ("i", "i4")], align=True)
pairs = np.array([((rank * 3) % 5, rank), (-(rank % 2), rank)], dtype=pair_t)
best = np.zeros(2, dtype=pair_t)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MAXLOC)
least = np.zeros(2, dtype=pair_t)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [least, MPI.DOUBLE_INT], op=MPI.MINLOC)
row["maxloc"] = [(float(v), int(i)) for v, i in best.tolist()]
row["minloc"] = [(float(v), int(i)) for v, i in least.tolist()]
row["objects_maxloc"] = comm.allreduce((rank % 3, rank), op=MPI.MAXLOC)


# a user-defined, non-commutative op: 2x2 matrix product, applied in rank order
def matmul(invec, inoutvec, datatype):
    a = np.frombuffer(invec, dtype="d").reshape(-1, 2, 2)
    b = np.frombuffer(inoutvec, dtype="d").reshape(-1, 2, 2)
    np.frombuffer(inoutvec, dtype="d")[:] = (a @ b).ravel()


op = MPI.Op.Create(matmul, commute=False)
mat = np.array([[1.0, rank], [0.0, 1.0]]) if rank % 2 else np.array([[1.0, 0.0], [rank, 1.0]])
prod = np.zeros((2, 2))
comm.Allreduce([mat, MPI.DOUBLE], [prod, MPI.DOUBLE], op=op)
op.Free()
row["op_create"] = prod.tolist()

rows = comm.gather(row, root=0)
if rank == 0:
    assert rows is not None
    for r, entry in enumerate(rows):
        print(r, entry)
