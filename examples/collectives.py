"""A tour of the collectives: run with ``ringworld run -n 4 python examples/collectives.py``.

Every rank contributes data derived from its rank; each result is checked against numpy, and
rank 0 prints which algorithm the cost model chose for each call.
"""

from __future__ import annotations

import numpy as np

import ringworld


def main() -> None:
    comm = ringworld.init()
    p, r = comm.size, comm.rank
    chosen: list[tuple[str, str]] = []

    vec = np.arange(1_000_000, dtype=np.float64) + r
    total = np.empty_like(vec)
    comm.allreduce(vec, total, ringworld.SUM)
    assert np.array_equal(total, p * np.arange(1_000_000, dtype=np.float64) + p * (p - 1) // 2)
    chosen.append(("allreduce 8 MB", comm.last_algorithm))

    params = np.arange(16, dtype=np.float32) if r == 0 else np.zeros(16, dtype=np.float32)
    comm.bcast(params, root=0)
    assert np.array_equal(params, np.arange(16, dtype=np.float32))
    chosen.append(("bcast 64 B", comm.last_algorithm))

    everyone = np.empty(p * 3, dtype=np.int64)
    comm.allgather(np.full(3, r, dtype=np.int64), everyone)
    assert np.array_equal(everyone, np.repeat(np.arange(p), 3))
    chosen.append(("allgather", comm.last_algorithm))

    prefix = np.empty(1, dtype=np.int64)
    comm.scan(np.array([r + 1]), prefix)
    assert prefix[0] == (r + 1) * (r + 2) // 2
    chosen.append(("scan", comm.last_algorithm))

    req = comm.iallreduce(ringworld.IN_PLACE, total, ringworld.MAX)  # overlaps with the next
    best = comm.allreduce_obj((float(vec[0]), r), ringworld.MAXLOC)
    req.wait()
    assert best == (float(p - 1), p - 1)

    pairs = comm.split(color=r // 2)  # ranks {0,1}, {2,3}, ...
    assert pairs is not None
    pair_sum = pairs.allreduce_obj(r)
    assert pair_sum == sum(range(2 * (r // 2), min(p, 2 * (r // 2) + 2)))

    if r == 0:
        print(f"{p} ranks: all collectives agree with numpy")
        for what, algo in chosen:
            print(f"  {what:<16} {algo}")


if __name__ == "__main__":
    main()
