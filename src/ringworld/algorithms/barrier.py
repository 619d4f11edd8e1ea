"""Barrier: dissemination (Hensgen, Finkel and Manber).

In round k every rank signals the rank 2^k ahead and waits for the one 2^k behind; after
ceil(log2 p) rounds every rank has heard, directly or through others, from every rank::

    round 0:  0 -> 1 -> 2 -> 3 -> 4 -> 0        (distance 1)
    round 1:  0 -> 2, 1 -> 3, 2 -> 4, 3 -> 0 ...  (distance 2)
    round 2:  0 -> 4, 1 -> 0, ...                 (distance 4)

Works for any p; messages carry no data.
"""

from __future__ import annotations

from ringworld.algorithms.schedule import SEND, Schedule, Spec, Xfer, schedule, step


def dissemination(s: Spec) -> Schedule:
    """ceil(log2 p) rounds of one empty message each way."""
    p, r = s.size, s.rank
    steps = []
    dist = 1
    while dist < p:
        steps.append(step([Xfer((r - dist) % p, SEND, 0, 0)], [Xfer((r + dist) % p, SEND, 0, 0)],
                          keep_empty=True))
        dist *= 2
    return schedule(steps)
