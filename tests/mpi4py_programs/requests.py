"""Nonblocking point-to-point: Waitany, Waitsome, Testall, Test, Probe, statuses, persistent."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
row = {}

# every rank sends one message to every other rank, tag = sender; receive with ANY_SOURCE
sends = [comm.Isend([np.full(rank + 1, rank, dtype="i"), MPI.INT], dest=d, tag=rank)
         for d in range(size) if d != rank]
bufs = [np.full(size, -1, dtype="i") for _ in range(size - 1)]
recvs = [comm.Irecv([b, MPI.INT], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) for b in bufs]
seen = []
status = MPI.Status()
while True:
    index = MPI.Request.Waitany(recvs, status)
    if index == MPI.UNDEFINED:
        break
    seen.append((status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT),
                 bufs[index][: status.Get_count(MPI.INT)].tolist()))
MPI.Request.Waitall(sends)
row["waitany"] = sorted(seen)
row["all_null"] = all(r == MPI.REQUEST_NULL for r in recvs)

# Testall spins until done; Waitsome hands out completions in batches
comm.Barrier()
right, left = (rank + 1) % size, (rank - 1) % size
ins = [np.zeros(2, dtype="d") for _ in range(3)]
reqs = [comm.Irecv([b, MPI.DOUBLE], source=left, tag=20 + i) for i, b in enumerate(ins)]
outs = [comm.Isend([np.array([rank, i], dtype="d"), MPI.DOUBLE], dest=right, tag=20 + i)
        for i in range(3)]
done = []
while len(done) < 3:
    indices = MPI.Request.Waitsome(reqs)
    done.extend(indices or [])
while not MPI.Request.Testall(outs):
    pass
row["waitsome"] = (sorted(done), [b.tolist() for b in ins])

# Probe: learn the size first, then receive exactly that much
if rank == 0:
    for d in range(1, size):
        comm.Send([np.arange(d * 3, dtype="f"), MPI.FLOAT], dest=d, tag=33)
else:
    st = MPI.Status()
    comm.Probe(source=0, tag=MPI.ANY_TAG, status=st)
    n = st.Get_count(MPI.FLOAT)
    got = np.empty(n, dtype="f")
    comm.Recv([got, MPI.FLOAT], source=st.Get_source(), tag=st.Get_tag())
    row["probe"] = (n, st.Get_tag(), got.sum().item())

# object requests: isend / irecv, test until done
req = comm.irecv(source=left, tag=40)
comm.isend({"rank": rank, "payload": list(range(rank))}, dest=right, tag=40).wait()
flag, obj = req.test()
while not flag:
    flag, obj = req.test()
row["object"] = obj

# persistent requests: set up once, start three times
out = np.zeros(1, dtype="i")
inbox = np.zeros(1, dtype="i")
send_p = comm.Send_init([out, MPI.INT], dest=right, tag=50)
recv_p = comm.Recv_init([inbox, MPI.INT], source=left, tag=50)
history = []
for step in range(3):
    out[0] = 100 * step + rank
    MPI.Prequest.Startall([recv_p, send_p])
    MPI.Request.Waitall([send_p, recv_p])
    history.append(int(inbox[0]))
send_p.Free()
recv_p.Free()
row["persistent"] = history

# a null request completes at once with an empty status
st = MPI.Status()
row["null"] = (MPI.REQUEST_NULL.Test(st), st.Get_source() == MPI.ANY_SOURCE,
               st.Get_tag() == MPI.ANY_TAG)

rows = comm.gather(row, root=0)
if rank == 0:
    assert rows is not None
    for r, entry in enumerate(rows):
        print(r, entry)
