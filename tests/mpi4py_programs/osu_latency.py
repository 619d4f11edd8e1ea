"""OSU-style latency: ping-pong between ranks 0 and 1 over message sizes (others idle).

Every message is checked; the half round-trip times print only with --timings, so the default
output is deterministic.
"""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
timings = "--timings" in sys.argv
WARMUP, ITERS = 2, 10
SIZES = [0, 1, 8, 64, 512, 4096, 32768, 262144]

if rank == 0:
    print(f"# OSU-style latency test, {ITERS} iterations per size")
    print("# size  verified" + ("  latency(us)" if timings else ""))
comm.Barrier()
for nbytes in SIZES:
    send = (np.arange(nbytes, dtype="i8") * 31 + nbytes).astype("u1")
    recv = np.empty(nbytes, dtype="u1")
    ok = True
    if rank in (0, 1):
        peer = 1 - rank
        start = MPI.Wtime()
        for i in range(WARMUP + ITERS):
            if i == WARMUP:
                start = MPI.Wtime()
            if rank == 0:
                comm.Send([send, MPI.BYTE], dest=peer, tag=1)
                comm.Recv([recv, MPI.BYTE], source=peer, tag=1)
            else:
                comm.Recv([recv, MPI.BYTE], source=peer, tag=1)
                comm.Send([recv, MPI.BYTE], dest=peer, tag=1)
            ok = ok and bool((recv == send).all())
        elapsed = MPI.Wtime() - start
        if rank == 0:
            line = f"{nbytes:8d}  {ok}"
            if timings:
                line += f"  {elapsed / ITERS / 2 * 1e6:12.2f}"
            print(line)
    comm.Barrier()
