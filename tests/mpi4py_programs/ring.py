"""Pass tokens around a ring: buffers, objects, Sendrecv, Sendrecv_replace and Isendrecv."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
lines = []

# the classic: rank 0 starts a token; everybody adds its rank and passes it on
token = np.zeros(1, dtype="i")
status = MPI.Status()
if rank == 0:
    comm.Send([token, MPI.INT], dest=right, tag=11)
    comm.Recv([token, MPI.INT], source=left, tag=11, status=status)
    lines.append(f"token after one lap: {token[0]} (last hop from {status.Get_source()}, "
                 f"tag {status.Get_tag()}, {status.Get_count(MPI.INT)} int)")
else:
    comm.Recv([token, MPI.INT], source=left, tag=11)
    token += rank
    comm.Send([token, MPI.INT], dest=right, tag=11)

# a Python object carried all the way round, collecting the ranks it visits
if rank == 0:
    comm.send(["start"], dest=right, tag=1)
    visited = comm.recv(source=left, tag=1)
    lines.append(f"object visited: {visited}")
else:
    visited = comm.recv(source=left, tag=1)
    comm.send([*visited, rank], dest=right, tag=1)

# everybody shifts at once, size times: each value comes home
value = np.array([rank * 10, rank * 10 + 1], dtype="l")
incoming = np.empty_like(value)
for _ in range(size):
    comm.Sendrecv([value, MPI.LONG], right, 2, [incoming, MPI.LONG], left, 2)
    value, incoming = incoming, value
home = comm.gather(value.tolist(), root=0)

# the same with Sendrecv_replace and the object sendrecv
block = np.full(3, rank, dtype="d")
comm.Sendrecv_replace([block, MPI.DOUBLE], dest=right, sendtag=4, source=left, recvtag=4)
got = comm.sendrecv({"from": rank}, dest=right, sendtag=5, source=left, recvtag=5)
shifted = comm.gather((block.tolist(), got["from"]), root=0)

# nonblocking ring: Irecv first, then Isend, then Waitall
recv = np.empty(4, dtype="f")
reqs = [comm.Irecv([recv, MPI.FLOAT], source=left, tag=6),
        comm.Isend([np.arange(4, dtype="f") + rank, MPI.FLOAT], dest=right, tag=6)]
statuses = [MPI.Status(), MPI.Status()]
MPI.Request.Waitall(reqs, statuses)
nonblocking = comm.gather((recv.tolist(), statuses[0].Get_source(),
                           statuses[0].Get_count(MPI.FLOAT)), root=0)

if rank == 0:
    lines.append(f"values home after {size} shifts: {home}")
    lines.append(f"Sendrecv_replace and sendrecv: {shifted}")
    lines.append(f"Irecv/Isend ring: {nonblocking}")
    print("\n".join(lines))
