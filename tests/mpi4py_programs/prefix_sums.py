"""Parallel prefix sums: Scan, Exscan, their object forms and a hand-written recursive doubling."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

data = np.arange(5, dtype="i8") * (rank + 1) + rank
inclusive = np.empty_like(data)
comm.Scan([data, MPI.INT64_T], [inclusive, MPI.INT64_T], op=MPI.SUM)
exclusive = np.zeros_like(data)
comm.Exscan([data, MPI.INT64_T], [exclusive, MPI.INT64_T], op=MPI.SUM)
running_max = np.empty_like(data)
comm.Scan([data[::-1].copy(), MPI.INT64_T], [running_max, MPI.INT64_T], op=MPI.MAX)
in_place = data.astype("d")
comm.Scan(MPI.IN_PLACE, [in_place, MPI.DOUBLE], op=MPI.PROD)

obj_scan = comm.scan(rank + 1)
obj_exscan = comm.exscan(rank + 1)
list_scan = comm.scan([rank])  # list concatenation: order matters

# recursive doubling (Hillis-Steele): after log2(size) rounds every rank holds its prefix
mine = data.copy()
acc = data.copy()
step = 1
while step < size:
    dest = rank + step if rank + step < size else MPI.PROC_NULL
    source = rank - step if rank - step >= 0 else MPI.PROC_NULL
    incoming = np.zeros_like(acc)
    comm.Sendrecv([acc, MPI.INT64_T], dest, 9, [incoming, MPI.INT64_T], source, 9)
    acc = acc + incoming
    step *= 2

rows = comm.gather({"scan": inclusive.tolist(), "exscan": exclusive.tolist() if rank else None,
                    "max": running_max.tolist(), "prod": in_place.tolist(),
                    "obj": (obj_scan, obj_exscan), "list": list_scan,
                    "doubling_matches": bool((acc == inclusive).all())}, root=0)
if rank == 0:
    assert rows is not None
    for r, row in enumerate(rows):
        print(r, row)
