"""Measure the cost model's constants on this machine (``ringworld tune``).

Run as a job of two ranks (``ringworld run -n 2 python -m ringworld.tuning.measure``); rank 0
prints one JSON line with the constants of :class:`ringworld.tuning.cost.Constants`:

* ``step``: one dependent collective step, the time of an 8-byte recursive-doubling allreduce
  on two ranks (one exchange plus the executor's Python overhead);
* ``message``: each extra message in a step, from a step of 8 small messages each way;
* ``bandwidth``: bytes a rank sends plus receives per second, from a 16 MiB exchange in both
  directions at once (how ring steps move data);
* ``reduce_rate`` / ``copy_rate``: numpy ``add(out=)`` and ``copyto`` on 32 MiB of float32;
* ``sync``: one flag barrier over shared memory (shm only), from ``barrier(algorithm="shm")``.

Each figure is the median of several timed repetitions, so one preemption does not skew it.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

REPEATS = 7


def link_bandwidth(comm: Any, nbytes: int = 256 << 10, repeats: int = 3) -> float:
    """Bytes/s between ranks 0 and 1 of ``comm`` from the best of ``repeats`` ping-pongs of
    ``nbytes`` (both directions counted); ``math.inf`` on other ranks and where ``comm`` has
    one rank. Collective on ranks 0 and 1. Cost: a few ms on a fast link."""
    if comm.rank >= 2 or comm.size < 2:
        return math.inf
    probe = np.zeros(nbytes // 8)
    peer = 1 - comm.rank
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        if comm.rank == 0:
            comm.send(probe, peer, tag=7)
            comm.recv(probe, peer, tag=7)
        else:
            comm.recv(probe, peer, tag=7)
            comm.send(probe, peer, tag=7)
        best = min(best, time.perf_counter() - start)
    return 2 * probe.nbytes / best


def _median_time(fn: Callable[[], object], inner: int, sync: Callable[[], object]) -> float:
    fn()
    samples = []
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def main() -> None:
    """Measure on a two-rank job; rank 0 prints the constants as JSON."""
    import ringworld

    comm = ringworld.init()
    if comm.size != 2:
        raise SystemExit("ringworld.tuning.measure needs exactly 2 ranks")
    peer = 1 - comm.rank
    sync = comm.barrier
    small = np.arange(2, dtype=np.float32)
    out = np.empty_like(small)
    step = _median_time(lambda: comm.allreduce(small, out, algorithm="recursive_doubling"),
                        400, sync)
    bufs = [np.empty(2, dtype=np.float32) for _ in range(8)]

    def exchange(k: int) -> None:
        reqs: list[ringworld.Request[Any]] = [comm.irecv(bufs[i], peer, i) for i in range(k)]
        reqs += [comm.isend(small, peer, i) for i in range(k)]
        ringworld.wait_all(reqs)

    one = _median_time(lambda: exchange(1), 300, sync)
    eight = _median_time(lambda: exchange(8), 100, sync)
    message = max(0.0, (eight - one) / 7)
    big = np.arange(4 << 20, dtype=np.float32)
    land = np.empty_like(big)
    bw_t = _median_time(lambda: comm.sendrecv(big, peer, land, peer), 3, sync)
    bandwidth = 2 * big.nbytes / bw_t
    a = np.ones(8 << 20, dtype=np.float32)
    b = np.ones_like(a)
    red_t = _median_time(lambda: np.add(a, b, out=a), 3, lambda: None)
    copy_t = _median_time(lambda: np.copyto(a, b), 3, lambda: None)
    result = {"step": step, "message": message, "bandwidth": bandwidth,
              "reduce_rate": a.nbytes / red_t, "copy_rate": a.nbytes / copy_t}
    if comm.supports_shared_memory:
        result["sync"] = _median_time(lambda: comm.barrier(algorithm="shm"), 1000, sync)
    gathered = comm.gather_obj(result, 0)
    if comm.rank == 0:
        assert gathered is not None
        merged = {k: (max if k in ("step", "message") else min)(g[k] for g in gathered)
                  for k in result}
        print("RINGWORLD_TUNE " + json.dumps(merged), flush=True)


if __name__ == "__main__":
    main()
