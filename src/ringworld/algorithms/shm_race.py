"""The race between the two paths of a shared-memory collective (:meth:`RaceCalls.race`, a
part of :class:`ringworld.algorithms.shm_arena.Arena`), and rank 0's record of them: which is
faster, and when to try the other.
"""

from __future__ import annotations

import math
from time import perf_counter as _clock
from typing import TYPE_CHECKING

from ringworld.algorithms.shm_policy import RACED

if TYPE_CHECKING:
    from ringworld.algorithms.shm_policy import Policy
    from ringworld.comm.channel import Channel

__all__ = ["RACE_COST", "RACE_FIRST", "RACE_KEEP", "RACE_LAST", "RACE_TRY", "RACE_WORD",
           "RaceCalls", "_Race"]

RACE_WORD = 16  # header words 16..21: rank 0's picks, by collective and call parity

RACE_KEEP = 3  # times kept per path: the estimate is their median
RACE_TRY = 2  # calls of a try of the slower path
RACE_FIRST, RACE_LAST = 4, 256  # calls between tries (growing while the tried path loses)
# a lost try sets the gap to at least what keeps the tries' expected cost under this fraction
# of the time (np=2 alltoall at 16-64 MiB, where the windows took 2x the direct path's time:
# 10 of 165 calls on the windows with plain doubling up to 64, a 6% loss; now 4)
RACE_COST = 0.02


class _Race:
    """Rank 0's times of the two paths of one collective at one size class (see Arena.race).

    Calls take the best path; every ``gap`` calls (RACE_FIRST, at least doubling while the other
    keeps losing, and long enough that tries cost at most RACE_COST of the time, up to
    RACE_LAST) a *try* runs RACE_TRY calls of the other, which takes over if their mean beats
    the median of the best's last RACE_KEEP times by 10%. A try also starts at
    once when the best's median grows past the other's last known median (the machine slowed
    the best down).
    """

    __slots__ = ("best", "default", "fresh", "gap", "times", "trying", "wait")

    def __init__(self, default: bool) -> None:
        self.default = default
        self.best = default
        self.times: tuple[list[float], list[float]] = ([], [])  # window path, direct path
        self.wait = RACE_TRY  # calls of the best path before the next try
        self.gap = RACE_FIRST
        self.trying = 0  # calls of the running try planned so far (0: none running)
        self.fresh: list[float] = []  # the running try's times

    def plan(self) -> bool:
        """The path of the next call (True: direct); call once per call, in order."""
        if 0 < self.trying < RACE_TRY:
            self.trying += 1
            return not self.best
        if self.trying:  # the try is planned in full: back to the best (add() may change it)
            self.trying = 0
            self.wait = self.gap
        if self.wait <= 0:
            self.trying = 1
            self.fresh = []
            return not self.best
        self.wait -= 1
        return self.best

    def add(self, direct: bool, seconds: float) -> None:
        """Record the time of a call that took path ``direct`` (calls in the order planned)."""
        t = self.times[direct]
        t.append(seconds)
        if len(t) > RACE_KEEP:
            del t[0]
        if direct != self.best:
            self.fresh.append(seconds)
            if len(self.fresh) < RACE_TRY:
                return
            ratio = sum(self.fresh) / len(self.fresh) / _median(self.times[self.best])
            self.fresh = []
            if ratio < 0.9:
                self.best = direct
                self.gap = RACE_FIRST
            else:  # a try costs RACE_TRY * (ratio - 1) calls' time: spread it over the gap
                self.gap = min(max(2 * self.gap, math.ceil(RACE_TRY * (ratio - 1) / RACE_COST)),
                               RACE_LAST)
            self.wait = self.gap
        elif self.times[not direct] and not self.trying and (
                0.9 * _median(t) > _median(self.times[not direct])):
            self.wait = 0


def _median(t: list[float]) -> float:
    return sorted(t)[len(t) // 2]


class RaceCalls:
    """:class:`~ringworld.algorithms.shm_arena.Arena`'s raced calls (its state: the arena's)."""

    __slots__ = ("_race_log", "_race_mask", "_races", "_racing")
    chan: Channel
    policy: Policy
    crowded: bool
    _ctr: list[memoryview]
    _mine: memoryview
    _races: list[int]
    _race_log: dict[int, _Race]
    _race_mask: list[int]
    _racing: tuple[_Race, bool, float] | None

    def race(self, kind: int, nbytes: int, default: bool) -> bool:
        """Whether this call of collective ``kind`` (RACE_*) takes the direct path.

        ``default`` is what the thresholds say, and the path of a size class's first calls
        (and of every call the policy does not race: a crowded job's, or one too small or too
        large).
        Rank 0 times every call (see :meth:`raced`) and keeps, per collective and power-of-two
        size class, the last times of each path; the faster path is taken, the other tried
        again now and then, as the machine may change speed (see :class:`_Race`).

        Rank 0 publishes the paths of call c + 1 (a bitmask over the size classes that leave
        the default) in header word ``RACE_WORD + 2 * kind + (c + 1) % 2`` at the start of call
        c; every rank reads word ``... + c % 2`` at the start of call c. Every raced path syncs
        at least once, so call c's readers have all read that word before rank 0 writes it
        again (at the start of call c + 1, past call c's syncs) and have all seen the write
        before call c + 1. Collective: every rank must call it for the same calls. Cost: a few
        microseconds on rank 0.
        """
        if not self.policy.races(RACED[kind], nbytes, self.crowded):
            self._racing = None
            return default
        c = self._races[kind]
        self._races[kind] = c + 1
        cls = nbytes.bit_length()
        direct = default != bool(self._ctr[0][RACE_WORD + 2 * kind + (c & 1)] >> cls & 1)
        if self.chan.rank == 0:
            rec = self._race_log.get(kind << 8 | cls)
            if rec is None:
                rec = self._race_log[kind << 8 | cls] = _Race(default)
                rec.plan()  # this call's (the default)
            mask = self._race_mask[kind]
            mask = mask | 1 << cls if rec.plan() != default else mask & ~(1 << cls)
            self._race_mask[kind] = mask
            self._mine[RACE_WORD + 2 * kind + ((c + 1) & 1)] = mask
            self._racing = (rec, direct, _clock())
        return direct

    def raced(self) -> None:
        """End a call that :meth:`race` started: rank 0 records its time."""
        racing = self._racing
        if racing is not None:
            self._racing = None
            racing[0].add(racing[1], _clock() - racing[2])
