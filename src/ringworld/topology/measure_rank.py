"""Rank side of ``ringworld calibrate --compare``: time collectives with a forced algorithm.

Run under ``ringworld run -n N python -m ringworld.topology.measure_rank --sizes 1048576,...
--collectives allreduce,bcast``; rank 0 prints one line ``RINGWORLD_MEASURE <json>``: a list
of {collective, algorithm, bytes, seconds}, seconds being the max over ranks of the median
over interleaved passes of the mean time per call (each timing after a barrier). Sizes are bytes of
float32 data; for allgather the size is the whole gathered buffer, for reduce_scatter_block and
alltoall the whole send buffer (as in nccl-tests and ``ringworld bench``). Over shared memory the
shared-memory algorithm (``shm``) is timed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "rabenseifner", "recursive_doubling"),
    "bcast": ("binomial", "ring", "scatter_allgather"),
    "allgather": ("ring", "recursive_doubling", "bruck"),
    "reduce": ("binomial", "ring"),
    "reduce_scatter_block": ("ring", "pairwise"),
    "alltoall": ("pairwise", "bruck"),
}
REPEATS = 5
TARGET_S = 0.05  # seconds per repeat


def _op(comm: Any, collective: str, algorithm: str, nbytes: int,
        cache: dict[tuple[str, int], tuple[Any, Any]]) -> Callable[[], object]:
    """The call to time; its buffers are shared by every cell of one shape and size."""
    p = comm.size
    if collective == "allgather":
        blk = max(1, nbytes // (4 * p))
        if ("gather", nbytes) not in cache:
            cache["gather", nbytes] = (np.arange(blk, dtype=np.float32) + comm.rank,
                                       np.empty(blk * p, dtype=np.float32))
        send, out = cache["gather", nbytes]
        return lambda: comm.allgather(send, out, algorithm=algorithm)
    if collective in ("reduce_scatter_block", "alltoall"):
        blk = max(1, nbytes // (4 * p))
        if ("blocks", nbytes) not in cache:
            cache["blocks", nbytes] = (np.arange(blk * p, dtype=np.float32) % 1021 + comm.rank,
                                       np.empty(blk * p, dtype=np.float32))
        send, out = cache["blocks", nbytes]
        if collective == "alltoall":
            return lambda: comm.alltoall(send, out, algorithm=algorithm)
        return lambda: comm.reduce_scatter_block(send, out[:blk], algorithm=algorithm)
    if ("vector", nbytes) not in cache:
        n = max(1, nbytes // 4)
        cache["vector", nbytes] = (np.arange(n, dtype=np.float32) % 1021,
                                   np.empty(n, dtype=np.float32))
    a, b = cache["vector", nbytes]
    if collective == "allreduce":
        return lambda: comm.allreduce(a, b, algorithm=algorithm)
    if collective == "reduce":
        return lambda: comm.reduce(a, b, root=0, algorithm=algorithm)
    return lambda: comm.bcast(a, root=0, algorithm=algorithm)


def _time(comm: Any, op: Callable[[], object], iters: int) -> float:
    """Mean seconds per call over ``iters`` calls started together (after a barrier)."""
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    return (time.perf_counter() - t0) / iters


def main(argv: list[str] | None = None) -> None:
    """Time every (collective, algorithm, size); rank 0 prints the results as JSON.

    The cells are timed in ``REPEATS`` interleaved passes (every cell once per pass, the order
    reversed on odd passes), so that a change in the machine's load during the run spreads over
    every cell instead of landing on a few.
    """
    import ringworld

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--collectives", required=True)
    args = ap.parse_args(argv)
    comm = ringworld.init()
    cache: dict[tuple[str, int], tuple[Any, Any]] = {}
    cells = []
    # the shared-memory algorithm too where it runs (what a blocking call on one host picks)
    shm = ("shm",) if comm.transport == "shm" and comm.supports_shared_memory else ()
    for coll in args.collectives.split(","):
        for algo in ALGORITHMS[coll] + shm:
            for nbytes in (int(s) for s in args.sizes.split(",")):
                op = _op(comm, coll, algo, nbytes, cache)
                op()  # warm: windows mapped, schedules built, pages touched
                first = max(comm.allgather_obj(_time(comm, op, 1)))
                cells.append((coll, algo, nbytes, op, max(1, min(50, int(TARGET_S / max(
                    first, 1e-6))))))
    samples: list[list[float]] = [[] for _ in cells]
    for k in range(REPEATS):
        order = range(len(cells)) if k % 2 == 0 else range(len(cells) - 1, -1, -1)
        for i in order:
            samples[i].append(_time(comm, cells[i][3], cells[i][4]))
    rows = []
    for (coll, algo, nbytes, _, _), mine in zip(cells, samples, strict=True):
        worst = max(comm.allgather_obj(statistics.median(mine)))
        rows.append({"collective": coll, "algorithm": algo, "bytes": nbytes,
                     "seconds": worst, "ranks": comm.size})
    if comm.rank == 0:
        print("RINGWORLD_MEASURE " + json.dumps(rows), flush=True)
    ringworld.finalize()


if __name__ == "__main__":
    main()
