"""OSU-style bandwidth: rank 0 streams a window of Isends to rank 1, which acknowledges.

Every message is checked; bandwidth prints only with --timings.
"""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
timings = "--timings" in sys.argv
WINDOW, ITERS = 8, 4
SIZES = [1, 64, 1024, 16384, 131072, 1048576]

if rank == 0:
    print(f"# OSU-style bandwidth test, window {WINDOW}, {ITERS} iterations per size")
    print("# size  verified  acks" + ("  MB/s" if timings else ""))
for nbytes in SIZES:
    acks = 0
    ok = True
    elapsed = 1.0
    if rank in (0, 1):
        start = MPI.Wtime()
        for it in range(ITERS):
            if rank == 0:
                bufs = [(np.arange(nbytes) * 7 + w + it).astype("u1") for w in range(WINDOW)]
                reqs = [comm.Isend([b, MPI.BYTE], dest=1, tag=100 + w) for w, b in enumerate(bufs)]
                MPI.Request.Waitall(reqs)
                ack = np.empty(1, dtype="i")
                comm.Recv([ack, MPI.INT], source=1, tag=99)
                acks += int(ack[0])
            else:
                bufs = [np.empty(nbytes, dtype="u1") for _ in range(WINDOW)]
                reqs = [comm.Irecv([b, MPI.BYTE], source=0, tag=100 + w)
                        for w, b in enumerate(bufs)]
                statuses = [MPI.Status() for _ in reqs]
                MPI.Request.Waitall(reqs, statuses)
                for w, (b, st) in enumerate(zip(bufs, statuses, strict=True)):
                    want = (np.arange(nbytes) * 7 + w + it).astype("u1")
                    ok = ok and bool((b == want).all()) and st.Get_count(MPI.BYTE) == nbytes
                comm.Send([np.array([1 if ok else 0], dtype="i"), MPI.INT], dest=0, tag=99)
        elapsed = MPI.Wtime() - start
    verdict = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        line = f"{nbytes:8d}  {verdict}  {acks}"
        if timings:
            line += f"  {nbytes * WINDOW * ITERS / elapsed / 1e6:10.1f}"
        print(line)
