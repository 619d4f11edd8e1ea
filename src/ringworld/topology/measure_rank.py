"""Rank side of ``ringworld calibrate --compare``: time collectives with a forced algorithm.

Run under ``ringworld run -n N python -m ringworld.topology.measure_rank --sizes 1048576,...
--collectives allreduce,bcast``; rank 0 prints one line ``RINGWORLD_MEASURE <json>``: a list
of {collective, algorithm, bytes, seconds}, seconds being the max over ranks of the median
over repeats of the mean time per call (each repeat after a barrier). Sizes are bytes of
float32 data; for allgather the size is the whole gathered buffer (as in nccl-tests).
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
}
REPEATS = 5
TARGET_S = 0.05  # seconds per repeat


def _op(comm: Any, collective: str, algorithm: str, nbytes: int) -> Callable[[], object]:
    p = comm.size
    if collective == "allgather":
        blk = max(1, nbytes // (4 * p))
        send = np.arange(blk, dtype=np.float32) + comm.rank
        out = np.empty(blk * p, dtype=np.float32)
        return lambda: comm.allgather(send, out, algorithm=algorithm)
    n = max(1, nbytes // 4)
    a = np.arange(n, dtype=np.float32) % 1021
    b = np.empty_like(a)
    if collective == "allreduce":
        return lambda: comm.allreduce(a, b, algorithm=algorithm)
    if collective == "reduce":
        return lambda: comm.reduce(a, b, root=0, algorithm=algorithm)
    return lambda: comm.bcast(a, root=0, algorithm=algorithm)


def main(argv: list[str] | None = None) -> None:
    """Time every (collective, algorithm, size); rank 0 prints the results as JSON."""
    import ringworld

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--collectives", required=True)
    args = ap.parse_args(argv)
    comm = ringworld.init()
    rows = []
    for coll in args.collectives.split(","):
        for algo in ALGORITHMS[coll]:
            for nbytes in (int(s) for s in args.sizes.split(",")):
                op = _op(comm, coll, algo, nbytes)
                op()
                comm.barrier()
                t0 = time.perf_counter()
                op()
                first = max(comm.allgather_obj(time.perf_counter() - t0))
                iters = max(1, min(50, int(TARGET_S / max(first, 1e-6))))
                samples = []
                for _ in range(REPEATS):
                    comm.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        op()
                    samples.append((time.perf_counter() - t0) / iters)
                worst = max(comm.allgather_obj(statistics.median(samples)))
                rows.append({"collective": coll, "algorithm": algo, "bytes": nbytes,
                             "seconds": worst, "ranks": comm.size})
    if comm.rank == 0:
        print("RINGWORLD_MEASURE " + json.dumps(rows), flush=True)
    ringworld.finalize()


if __name__ == "__main__":
    main()
