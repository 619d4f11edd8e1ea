"""What the timing simulator needs of a schedule: per step, messages (peer, bytes) and local work.

:func:`shape` reads a real :class:`~ringworld.algorithms.schedule.Schedule` (the one the
communicator runs) and keeps, per step, the receives and sends as (peer, bytes) and the bytes
reduced and copied locally: the data slices are dropped, nothing else is.

:class:`Programs` holds every rank's program of one collective. For large worlds building p
schedules is itself the bottleneck (a 4,096-rank ring allreduce has 8,190 steps per rank, about
0.1 s each to build), so :meth:`Programs.rotational` builds rank 0's schedule, expresses its
peers as offsets (peer - rank) mod p, and checks that the real schedules of sample ranks (every
rank up to :data:`CHECK_ALL_BELOW`, else a fixed spread of eight) are exactly that program
rotated; ring and pairwise algorithms are, trees and recursive doubling are not (then every rank
is built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ringworld.algorithms.schedule import COPY, Schedule

CHECK_ALL_BELOW = 64


class PStep(NamedTuple):
    """One step of one rank: receives and sends as (peer, bytes), local bytes reduced/copied."""

    recvs: tuple[tuple[int, int], ...]
    sends: tuple[tuple[int, int], ...]
    reduced: int
    copied: int


Program = tuple[PStep, ...]
Builder = Callable[[int], Schedule]  # rank -> that rank's real schedule


def shape(sched: Schedule, itemsize: int) -> Program:
    """The timing shape of a schedule whose elements are ``itemsize`` bytes. Cost: O(steps)."""
    out = []
    for s in sched.steps:
        red = cop = 0
        for loc in s.locals:
            if loc.kind == COPY:
                cop += loc.length
            else:
                red += loc.length
        out.append(PStep(tuple((x.peer, x.length * itemsize) for x in s.recvs),
                         tuple((x.peer, x.length * itemsize) for x in s.sends),
                         red * itemsize, cop * itemsize))
    return tuple(out)


def _relative(prog: Program, r: int, p: int) -> Program:
    return tuple(PStep(tuple(((q - r) % p, b) for q, b in s.recvs),
                       tuple(((q - r) % p, b) for q, b in s.sends), s.reduced, s.copied)
                 for s in prog)


def _absolute(rel: Program, r: int, p: int) -> Program:
    return tuple(PStep(tuple(((r + d) % p, b) for d, b in s.recvs),
                       tuple(((r + d) % p, b) for d, b in s.sends), s.reduced, s.copied)
                 for s in rel)


def _aligned(rel: Program, p: int) -> bool:
    """Every message is received in the same step index it is sent in (rotated programs)."""
    for s in rel:
        sends = sorted(((-d) % p, b) for d, b in s.sends)
        if sends != sorted(s.recvs) or len({d for d, _ in s.sends}) != len(s.sends):
            return False
    return True


class Programs:
    """Every rank's program: explicit per rank, or one relative program for all ranks."""

    def __init__(self, p: int, per_rank: list[Program] | None = None,
                 relative: Program | None = None, label: str = "") -> None:
        if (per_rank is None) == (relative is None):
            raise ValueError("give exactly one of per_rank and relative")
        if per_rank is not None and len(per_rank) != p:
            raise ValueError(f"{len(per_rank)} programs for {p} ranks")
        self.p = p
        self.per_rank = per_rank
        self.relative = relative
        self.label = label
        self.aligned = relative is not None and _aligned(relative, p)

    def rank(self, r: int) -> Program:
        """Rank ``r``'s program with absolute peers."""
        if self.per_rank is not None:
            return self.per_rank[r]
        assert self.relative is not None
        return _absolute(self.relative, r, self.p)

    @property
    def steps(self) -> int:
        """The most steps any rank runs."""
        if self.relative is not None:
            return len(self.relative)
        return max((len(x) for x in self.per_rank or ()), default=0)

    @classmethod
    def explicit(cls, builder: Builder, p: int, itemsize: int, label: str = "") -> Programs:
        """Build every rank's real schedule. Cost: p schedule builds."""
        return cls(p, [shape(builder(r), itemsize) for r in range(p)], label=label)

    @classmethod
    def rotational(cls, builder: Builder, p: int, itemsize: int,
                   label: str = "") -> Programs | None:
        """One relative program if the sample ranks' real schedules are rank 0's rotated,
        else None. Cost: up to 9 schedule builds (p of them below CHECK_ALL_BELOW)."""
        rel = _relative(shape(builder(0), itemsize), 0, p)
        if p < CHECK_ALL_BELOW:
            sample = list(range(1, p))
        else:
            sample = sorted({1, 2, p // 3, p // 2, (2 * p) // 3, p - 2, p - 1, p // 2 + 1})
        for r in sample:
            if _relative(shape(builder(r), itemsize), r, p) != rel:
                return None
        return cls(p, relative=rel, label=label)

    @classmethod
    def of(cls, builder: Builder, p: int, itemsize: int, label: str = "",
           try_rotation: bool = True) -> Programs:
        """Rotational when the check passes (and p is large enough to matter), else explicit."""
        if try_rotation and p >= CHECK_ALL_BELOW:
            rot = cls.rotational(builder, p, itemsize, label)
            if rot is not None:
                return rot
        return cls.explicit(builder, p, itemsize, label)
