"""Which path a shared-memory collective takes inside its windows, as one value (no numpy).

The shared-memory collectives (:mod:`ringworld.algorithms.shm_collectives`) copy through
their windows or, from some size on, read and write their peers' buffers directly (one kernel
copy instead of two); between two sizes they race the two paths and keep the faster. Where
those sizes lie is a tuning decision: the values, with the measurements behind them, are
:data:`ringworld.tuning.shm_paths.DEFAULT`, and the arena is handed a :class:`Policy` (tests
hand it their own). ``SLOT``, ``EAGER_MAX`` and ``CHUNK`` are the windows' layout, which the
cost model shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the arena's predicates below read its state; it imports this module)
    from ringworld.algorithms.shm_arena import Arena

#: bytes of each of a rank's two small slots: a call whose data fit takes one sync through them
#: (allgather: its block; alltoall and reduce_scatter_block: the send buffer; allreduce and
#: reduce: see :meth:`Policy.small`). Two syncs through the windows cost more than the copies
#: up to here: np=2, same runs, allgather 64 KiB blocks 7.6-9.2 us against 13.8-16.1, 256 KiB
#: 20-22 against 31-34 (raced), alltoall 256 KiB (128 KiB blocks) 14-17 against 21-22; np=4 on
#: 2 cores, allgather 32 KiB blocks 38-40 us against 70, alltoall 128 KiB 45-52 against 81-96
SLOT = 256 << 10
#: an allreduce or reduce takes the slots while p times its vector is at most this, and up to
#: SMALL whatever p: every rank (the root) then combines all p inputs itself, where the windows
#: share that out at the price of a second sync. np=2, same runs: 32 KiB 6-7 us against 15-16,
#: 128 KiB 13 against 18-28, 256 KiB 19-21 against 26-41; np=4 on 2 cores, 128 KiB 59-81
#: against 112-133; np=8 on 2 cores, 32 KiB 142 against 513 (64 KiB is the rule's limit there)
COMBINE_ALL = 512 << 10
#: an allreduce or reduce of up to this many bytes takes the slots at any number of ranks
SMALL = 16384
#: bytes a broadcast may take through the root's eager ring (each of its large entries holds
#: this much: EAGER_BIG of them, see ``Arena.eager_bcast``): larger ones are streamed, and this
#: is one piece of that stream, so beyond it the stream's copies overlap
EAGER_MAX = 256 << 10
# broadcasts of up to EAGER_MAX bytes go through a ring in the root's window, without a sync:
# the root returns once its data is there (Arena.eager_bcast). Call s takes stamp s % EAGER_RING
# and, up to EAGER_SMALL bytes, entry s % EAGER_RING of the small entries, else entry s %
# EAGER_BIG of the large ones (EAGER_MAX each): a root runs up to EAGER_RING small calls ahead
# (np=4 on 2 cores, 4-byte blocks, jobs alternating with 8 entries of EAGER_MAX: scatter 9.0 ->
# 7.0 us, gather 13.5 -> 10.6, bcast 8.5 -> 6.4, gatherv 23.5 -> 17.7; 16 KiB calls parity)
EAGER_RING, EAGER_BIG, EAGER_SMALL = 32, 8, 16 << 10
def gather_eager(nbytes: int, p: int, crowded: bool, direct_from: float = math.inf) -> bool:
    """Whether a gather of ``nbytes``-byte blocks on ``p`` ranks takes the eager rings (each
    sender puts its block in its own ring and returns, no sync) rather than the slots or the
    windows: where ranks share cores, and on two ranks with cores of their own, up to
    EAGER_MAX, where a sender running ahead overlaps its copy in with the root's copy out
    (np=2, the bench's gather alternating in two jobs each: 64 KiB 7.0 and 6.7 us through the
    slots against 5.5 and 5.3 in the rings, 256 KiB 16.5 and 16.1 against 13.3 and 12.8; once
    the rings' runners wrote out their begin and end steps, small blocks too: same job, three
    jobs each, 8 B 2.52-2.68 us against 2.25-2.32, 1 KiB 2.56-2.61 against 2.24-2.33, 16 KiB
    3.54-3.67 against 2.97-3.01; beside one busy process 8 B 6.35-6.70 against 4.97-6.40, 16 KiB
    8.39-9.38 against 6.57-7.34; new arrays each call, 8 B 4.45-4.49 against 4.24-4.33, 16 KiB
    6.84-6.86 against 5.94-5.96), but below ``direct_from``, where the direct path takes over
    (see ``tuning.shm_paths``). More ranks with cores of their own take the slots."""
    if crowded or p == 2:
        return nbytes <= EAGER_MAX and nbytes < direct_from
    return False


def gathers_eager(a: Arena, nbytes: int) -> bool:
    """:func:`gather_eager` for a gather of ``nbytes``-byte
    blocks on ``a``: below the size of its direct path, where ranks may take that."""
    return gather_eager(nbytes, a.chan.size, a.crowded,
                        a.direct_min["gather"] if a.direct else math.inf)


def gathers_direct(a: Arena, nbytes: int) -> bool:
    """Whether a gather of ``nbytes``-byte blocks past its eager rings takes the direct path,
    before the slots (the runner's choice too)."""
    return a.direct and nbytes >= a.direct_min["gather"]


def bcast_eager(a: Arena, nbytes: int) -> bool:
    """Whether a broadcast of ``nbytes`` takes the root's eager ring: up to EAGER_MAX, unless
    the direct path starts below that (ranks with cores of their own: see
    ``tuning.shm_paths``), which then takes it first."""
    return nbytes <= EAGER_MAX and not (a.direct and nbytes >= a.direct_min["bcast"])


#: bytes of the other rank's block of a scatterv or gatherv on two ranks with cores of their
#: own over which, and up to which, it goes through the eager rings (see :func:`vector_eager`)
VECTOR_EAGER_FROM, VECTOR_EAGER_TO = EAGER_SMALL, 88 << 10


def vector_eager(nbytes: int, p: int, room: int) -> bool:
    """Whether a scatterv or gatherv on ``p`` ranks with cores of their own takes the eager
    rings (the root's for a scatterv, the senders' for a gatherv; no sync: the root of a
    scatterv and the sender of a gatherv return once their part is in the entry) rather than
    the slots: on two ranks, where the other rank's block (``nbytes``: by a root's counts, or
    the other rank's own) is over VECTOR_EAGER_FROM, up to VECTOR_EAGER_TO and ``room`` (an
    entry's, past its header). Same job, slots against rings, medians of 9: scatterv 8-byte
    blocks 0.88x, 4 KiB 0.92x, 16 KiB 1.00x, 32 KiB 1.10x, 64 KiB 1.23-1.32x, 80 KiB 1.28x,
    88 KiB 1.21x, 92 KiB 0.94x, 96-128 KiB 0.92-0.97x; gatherv 8 B 0.95x, 16 KiB 1.00x,
    24 KiB 1.08x, 32 KiB 1.11x, 64 KiB 1.08-1.15x, 84 KiB 1.11x, 88 KiB 1.00x, 96-192 KiB
    0.96-1.03x (the slots' copies of 92 KiB and more ran faster than of 64-88 KiB, at every
    page offset of the user's buffers tried)."""
    return p == 2 and VECTOR_EAGER_FROM < nbytes <= min(VECTOR_EAGER_TO, room)


#: block bytes from which an alltoall through the slots copies only the others' blocks into its
#: slot and its own block straight across, while the others copy theirs in (a rank reads only
#: its block of every slot; its own went in and out of its slot). Same job, old runner against
#: new, medians of 9: np=2 64 KiB blocks 1.06x, 128 KiB 1.12x; np=3 64 KiB 1.06x, 85 KiB 1.15x;
#: np=4 on 2 cores 64 KiB 1.10x; below, the extra steps cost more (np=2 32 KiB 0.96x, 8 B 0.83x)
OWN_APART = 64 << 10
#: block bytes from which a scatter's root leaves its own block out of its eager entry (the
#: others' blocks, in rank order, are all the receivers read: see :func:`scatter_apart`). Same
#: job, the whole send against the others' blocks, medians of 9: np=2 8 B 0.95x, 4 KiB 0.97x,
#: 8 KiB 1.02x, 12 KiB 1.17x, 16 KiB 1.25x, 32 KiB 1.11x, 64 KiB 1.17x, 96 KiB 1.21x; np=4 on 2
#: cores 8 B 0.94x, 8 KiB 1.00x, 16 KiB 1.03x, 32 KiB 1.09x; np=3, root 1 (two copies) 8 B 0.92x,
#: 16 KiB 1.09x, 32 KiB 1.05x
SCATTER_APART = 12 << 10


def scatter_apart(nbytes: int) -> bool:
    """Whether a scatter of ``nbytes``-byte blocks through the root's eager ring puts only
    the other ranks' blocks in the entry (block i at i, or at i - 1 past the root), not its
    own as well."""
    return nbytes >= SCATTER_APART


def scatter_skip(r: int, root: int, n: int, nbytes: int) -> int:
    """Where rank ``r``'s block of ``n`` elements (``nbytes`` bytes) lies in a scatter root's
    eager entry, in elements: block r, or one block earlier past the root where the entry
    leaves the root's own out (:func:`scatter_apart`). The root's copy in and every reader
    go by this one layout."""
    return (r - (r > root and scatter_apart(nbytes))) * n


#: bytes of a window area: larger transfers go through the windows a chunk at a time
CHUNK = 2 << 20
#: the collectives that have a direct path, and the ones among them whose paths may race
DIRECT = ("allreduce", "bcast", "allgather", "alltoall", "reduce_scatter_block", "gather",
          "scatter")
RACED = ("alltoall", "allgather", "reduce_scatter_block")


@dataclass(frozen=True)
class Policy:
    """Sizes (bytes per transfer: of the vector for allreduce and bcast, of one block for
    allgather, reduce_scatter_block, gather and scatter, of the send buffer for alltoall) from
    which each
    collective of :data:`DIRECT` takes the direct path, where ranks have cores of their own
    (``direct``) and where they share them (``direct_crowded``; a collective missing there
    uses ``direct``; ``math.inf``: never); the sizes between which the two paths race
    (``race_min`` up to ``race_max``, exclusive; never where ranks share cores, nor with
    ``race`` off); and ``slot_max``, the bytes up to which calls take the one-sync slots
    before any of that (at most SLOT, their size; see :meth:`small`)."""

    direct: Mapping[str, float]
    direct_crowded: Mapping[str, float] = field(default_factory=dict)
    race_min: Mapping[str, float] = field(default_factory=dict)
    race_max: float = 0.0
    race: bool = True
    slot_max: float = SLOT

    def __post_init__(self) -> None:
        for name, table in (("direct", self.direct), ("direct_crowded", self.direct_crowded),
                            ("race_min", self.race_min)):
            extra = set(table) - set(DIRECT if name != "race_min" else RACED)
            if extra:
                raise ValueError(f"Policy.{name}: no direct path to choose for {sorted(extra)}")
        missing = set(DIRECT) - set(self.direct)
        if missing:
            raise ValueError(f"Policy.direct: no size given for {sorted(missing)}")

    def direct_from(self, collective: str, crowded: bool) -> float:
        """The size from which ``collective`` takes the direct path (``math.inf``: never)."""
        if crowded:
            return self.direct_crowded.get(collective, self.direct[collective])
        return self.direct[collective]

    def small(self, collective: str, p: int) -> float:
        """Bytes up to which a call of ``collective`` on ``p`` ranks takes the one-sync slots:
        of the vector for allreduce, reduce, scan and exscan (while p of them are at most
        COMBINE_ALL, and up to SMALL whatever p), of one block for allgather and gather (or
        the eager rings: see :func:`gather_eager`), of the send buffer for alltoall and
        reduce_scatter_block; a bcast takes the eager rings, no sync, up to EAGER_MAX, and so
        does a scatter whose root's send buffer (p blocks) fits that."""
        if collective in ("bcast", "scatter"):
            return EAGER_MAX
        cap = min(self.slot_max, SLOT)
        if collective in ("allreduce", "reduce", "scan", "exscan"):
            return min(cap, max(SMALL, COMBINE_ALL // max(1, p)))
        return cap

    def races(self, collective: str, nbytes: int, crowded: bool) -> bool:
        """Whether a call of ``nbytes`` races the two paths rather than take the threshold's."""
        return (self.race and not crowded
                and self.race_min.get(collective, math.inf) <= nbytes < self.race_max)
