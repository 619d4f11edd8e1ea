"""The cost model: predicted time of each algorithm of each collective, from its structure.

Each algorithm is described by what its slowest rank does (:class:`Work`): dependent steps,
messages, bytes sent or received, bytes reduced and bytes copied locally. A time follows from
the machine's constants (:class:`Constants`), NCCL-style::

    t = steps * step + messages * message + bytes / bandwidth + reduced / reduce_rate
        + copied / copy_rate

The constants live in :mod:`ringworld.tuning.constants` with their provenance, and ``ringworld
tune`` re-measures them on the machine at hand. ``n`` below is the vector length in bytes for
bcast/reduce/allreduce/scan and one rank's block for the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from ringworld.algorithms.shm_policy import CHUNK, SLOT
from ringworld.tuning import shm_paths


class Constants(NamedTuple):
    """Measured machine constants for one transport."""

    step: float         # s: latency of one dependent step (message + software overhead)
    message: float      # s: extra cost per additional message in a step
    bandwidth: float    # bytes/s a rank moves through the transport (send + receive side)
    reduce_rate: float  # bytes/s of an in-place numpy reduction (out=) from main memory
    copy_rate: float    # bytes/s of a local numpy copy
    sync: float = math.inf  # s: one flag barrier over shared memory (inf: no shared memory)
    # the simulator's cache model (fitted by `ringworld calibrate --fit`; the tuner ignores it):
    # collectives whose buffers, over all ranks, span at most cache_bytes move and combine
    # bytes cache_speedup times faster than the rates above; twice that size or more, at them
    cache_bytes: float = 0.0
    cache_speedup: float = 1.0
    # bytes/s of a direct read from a peer's memory (process_vm_readv), counted once, at the
    # reader (fitted by `ringworld calibrate --fit`); 0: half the bandwidth, which counts a
    # message's bytes at both ends
    read_rate: float = 0.0
    # s: what a message above the eager limit costs on top of its bytes (the receiver learns of
    # it, reads it from the sender, and tells the sender it is done: a round trip the eager
    # protocol does not make); the simulator's (fitted by `ringworld calibrate --fit`)
    rendezvous: float = 0.0
    # s: the fixed part of any collective call (argument checks, algorithm choice, the call's
    # bookkeeping, the ranks' arrival skew) on top of its steps, syncs and bytes; added to
    # every algorithm's time, formulas and simulated schedules alike (fitted by
    # `ringworld calibrate --fit`)
    call: float = 0.0
    # bytes/s of memory traffic all ranks of a host sustain together from main memory (each
    # byte copied counts twice, read and written; each byte reduced three times): ranks that
    # stream at once share it, so their bytes take at least their traffic over this rate
    # (fitted by `ringworld calibrate --fit`, the simulator's; 0: no such limit)
    bus_rate: float = 0.0

    @property
    def reads(self) -> float:
        """The direct-read rate in effect: ``read_rate``, or half the bandwidth if unfitted."""
        return self.read_rate or self.bandwidth / 2


class Work(NamedTuple):
    """What the busiest rank does in one algorithm."""

    steps: float
    messages: float
    moved: float       # bytes the rank sends plus receives on its critical path
    reduced: float = 0.0
    copied: float = 0.0
    syncs: float = 0.0  # flag barriers over shared memory
    read: float = 0.0  # bytes the rank reads straight from peers' memory
    # another way the same call may run, the faster of the two taken (the shared-memory
    # collectives that race their direct and window paths)
    alt: Work | None = None
    # bytes of the memory traffic below that stay in the cache (a read into a cached scratch
    # area is written there, and combined from there)
    cached: float = 0.0

    @property
    def traffic(self) -> float:
        """Bytes of main-memory traffic: 2 per byte copied, read from a peer or received (a
        receive is one copy, and ``moved`` counts it at both ends), 3 per byte reduced, less
        what stays in the cache (``cached``)."""
        return self.moved + 2 * (self.copied + self.read) + 3 * self.reduced - self.cached

    def time(self, c: Constants, streams: int = 0) -> float:
        """Predicted seconds under ``c`` (of the faster way, with ``alt``). With ``streams``
        ranks on one host doing the same at once and ``c.bus_rate`` set, the bytes take at
        least their traffic over the bus (:attr:`traffic`)."""
        t = self.moved / c.bandwidth + self.reduced / c.reduce_rate + self.copied / c.copy_rate
        if self.read:
            t += self.read / c.reads
        if streams and c.bus_rate > 0:
            t = max(t, streams * self.traffic / c.bus_rate)
        t += c.call + self.steps * c.step + self.messages * c.message
        if self.syncs:
            t += self.syncs * c.sync
        return t if self.alt is None else min(t, self.alt.time(c, streams))


def _log2(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def _fold(p: int) -> int:
    return 0 if p & (p - 1) == 0 else 1


Model = Callable[[int, float, int], Work]  # (p, n bytes, segment bytes) -> Work


def _bcast_ring(p: int, n: float, seg: int) -> Work:
    k = max(1, math.ceil(n / seg)) if seg else 1
    return Work(p - 2 + k, 0, 2 * n * (p - 2 + k) / k)


MODELS: dict[str, dict[str, Model]] = {
    "barrier": {"dissemination": lambda p, n, s: Work(_log2(p), 0, 0)},
    "bcast": {
        "linear": lambda p, n, s: Work(1, p - 2, (p - 1) * n),
        "binomial": lambda p, n, s: Work(_log2(p), 0, 2 * _log2(p) * n),
        "ring": _bcast_ring,
        # busiest rank: a middle one (on two ranks, each moves n: the root never receives)
        "scatter_allgather": lambda p, n, s: Work(_log2(p) + p - 1, 0,
                                                  3 * n * (p - 1) / p if p > 2 else n),
    },
    "reduce": {
        "linear": lambda p, n, s: Work(1, p - 2, (p - 1) * n, (p - 1) * n, 2 * n),
        "binomial": lambda p, n, s: Work(_log2(p) + 1, 0, 2 * _log2(p) * n,
                                         _log2(p) * n, n),
        "ring": lambda p, n, s: Work(p, p - 2, 3 * n * (p - 1) / p, n * (p - 1) / p, n / p),
    },
    "allreduce": {
        "linear": lambda p, n, s: Work(1, p - 2, 2 * (p - 1) * n, (p - 1) * n, 3 * n),
        "recursive_doubling": lambda p, n, s: Work(
            _log2(p) + 2 * _fold(p), 0, 2 * (_log2(p) + 2 * _fold(p)) * n,
            (_log2(p) + _fold(p)) * n, n),
        "ring": lambda p, n, s: Work(2 * (p - 1), 0, 4 * n * (p - 1) / p,
                                     n * (p - 1) / p, n),
        "rabenseifner": lambda p, n, s: Work(
            2 * _log2(p) + 2 * _fold(p), 0, 4 * n * (p - 1) / p + 4 * _fold(p) * n,
            n * (p - 1) / p + _fold(p) * n, n),
        "reduce_bcast": lambda p, n, s: Work(2 * _log2(p) + 1, 0, 4 * _log2(p) * n,
                                             _log2(p) * n, n),
    },
    "gather": {
        "linear": lambda p, n, s: Work(1, p - 2, (p - 1) * n, 0, n),
        "binomial": lambda p, n, s: Work(_log2(p) + 1, 0, (p - 1) * n, 0, 2 * p * n),
    },
    "scatter": {
        "linear": lambda p, n, s: Work(1, p - 2, (p - 1) * n, 0, n),
        "binomial": lambda p, n, s: Work(_log2(p) + 1, 0, (p - 1) * n, 0, 2 * p * n),
    },
    "allgather": {
        "linear": lambda p, n, s: Work(1, 2 * (p - 2), 2 * (p - 1) * n, 0, n),
        "ring": lambda p, n, s: Work(p - 1, 0, 2 * (p - 1) * n, 0, n),
        "recursive_doubling": lambda p, n, s: Work(
            _log2(p) + 2 * _fold(p), 0, 2 * (p - 1) * n + 2 * _fold(p) * p * n, 0, n),
        "bruck": lambda p, n, s: Work(_log2(p) + 1, 0, 2 * (p - 1) * n, 0, 3 * p * n),
    },
    "alltoall": {
        "linear": lambda p, n, s: Work(1, 2 * (p - 2), 2 * (p - 1) * n, 0, n),
        "pairwise": lambda p, n, s: Work(p - 1, 0, 2 * (p - 1) * n, 0, n),
        "bruck": lambda p, n, s: Work(2 * _log2(p) + 1, 0, _log2(p) * p * n, 0,
                                      (2 + 2 * _log2(p)) * p * n),
    },
    "reduce_scatter_block": {
        # the last (ring) or first (pairwise) reduction writes the output: no copy
        "ring": lambda p, n, s: Work(p - 1, 0, 2 * (p - 1) * n, (p - 1) * n),
        "pairwise": lambda p, n, s: Work(p - 1, 0, 2 * (p - 1) * n, (p - 1) * n),
    },
    "scan": {
        "linear": lambda p, n, s: Work(p - 1, 0, 2 * n, n, n),
        "recursive_doubling": lambda p, n, s: Work(_log2(p), 0, 2 * _log2(p) * n,
                                                   _log2(p) * n, n),
    },
}
SHM_CHUNK = CHUNK  # the shared-memory windows' layout (algorithms.shm_policy)
SHM_SLOT = SLOT


def _shm(sync_per_chunk: int, copied: float, reduced: float, per_rank: bool = False,
         small: Callable[[int], float] | None = None, all_blocks: bool = False, own: float = 0.0,
         per_p: float = 0.0) -> Model:
    """A shared-memory algorithm: syncs per chunk, bytes copied and reduced per byte of n.

    ``small``: on p ranks, messages of at most ``small(p)`` bytes (the slots' limit,
    ``Policy.small``; a bcast's: its eager ring's) take one sync (and every
    rank reduces all p inputs itself); ``all_blocks``: the send buffer holds p blocks of n
    (alltoall, reduce_scatter), so that is what must fit; ``own``: further copies per byte
    of n whatever p (allgather copies its block in and to its own place, then the p-1 others
    out);
    ``per_p``: further copies per byte of n / p (allreduce copies (p-1)/p of its input in, its
    1/p result out and the (p-1)/p of the others' results back: 2 - 1/p, not 2).
    """
    def m(p: int, n: float, seg: int) -> Work:
        if small is not None and (n * p if all_blocks else n) <= small(p):
            return Work(0, 0, 0, reduced * n * (p - 1), copied * n * (p if per_rank else 1),
                        syncs=1)
        total = n * p if per_rank else n
        chunks = max(1, math.ceil(total / SHM_CHUNK))
        return Work(0, 0, 0, reduced * n * (p - 1) / p,
                    (copied * (p - 1 if per_rank else 1) + own + per_p / p) * n,
                    syncs=sync_per_chunk * chunks + (0 if reduced else 1))
    return m


# From the sizes of the shared-memory policy (tuning.shm_paths: bytes of the vector; of one block
# for allgather; of the send buffer for alltoall) a shared-memory collective reads its peers'
# buffers with one kernel copy (process_vm_readv; allgather writes them instead,
# process_vm_writev, at the same rate) instead of going through the windows. Such a copy costs
# 1 / ``read_rate`` per byte; without a fitted rate, what receiving through the transport does
# (``bandwidth`` counts bytes sent plus received: 2 / bandwidth). Between the policy's race
# sizes the two paths race, and calls take whichever rank 0 measured faster: the model predicts
# the faster of the two. Ranks that share cores start later and never race (direct_crowded).
SHM_DIRECT = dict(shm_paths.DEFAULT.direct)
SHM_RACE = dict(shm_paths.DEFAULT.race_min)
SHM_RACE_MAX = shm_paths.DEFAULT.race_max
SHM_DIRECT_CROWDED = {c: shm_paths.DEFAULT.direct_from(c, True) for c in SHM_DIRECT}
# The direct reduce_scatter_block and allreduce combine each peer's chunk right after reading it
# into a cached scratch area (algorithms.shm._combine_slice): two of a combining pass's three
# streams come from main memory, where ``reduce_rate`` (numpy add(out=) on large arrays) has
# all three. Their combining passes cost this fraction of ``reduced / reduce_rate``.
SHM_COMBINE_CACHED = 2 / 3


def _direct(collective: str, windows: Model, crowded: bool = False) -> Model:
    """``windows`` below the direct-read size of ``collective`` or where the call fits the slots
    (``Policy.small``); above it, the direct reads:
    allreduce reads (p-1)/p of the others' inputs and then of their results (3 syncs); bcast
    moves (p-1)/p of the vector (root writing, others reading at once); allgather writes its
    block into p-1 peers and alltoall reads p-1 blocks, and both copy their own;
    reduce_scatter_block reads its block of p-1 inputs and combines them. Where the two paths
    race (SHM_RACE up to SHM_RACE_MAX), the direct one with the windows as its ``alt``;
    ``crowded`` (ranks share cores): from SHM_DIRECT_CROWDED, never raced."""
    limit: float = SHM_DIRECT[collective]
    race = SHM_RACE.get(collective, math.inf)
    if crowded:
        limit, race = SHM_DIRECT_CROWDED.get(collective, limit), math.inf

    blocks = collective in ("alltoall", "reduce_scatter_block", "scatter")  # slots: p blocks
    slots = _slots(collective)
    # direct before the eager rings and slots (a crowded gather: its rings first, to EAGER_MAX)
    first = collective == "bcast" or (collective == "gather" and not crowded)

    def m(p: int, n: float, seg: int) -> Work:
        size = n * p if collective == "alltoall" else n
        if size < min(limit, race) or (not first and (n * p if blocks else n) <= slots(p)):
            return windows(p, n, seg)  # (which knows the slots)
        f = (p - 1) / p
        # the inputs read for combining are written to a cached scratch area (and combined
        # from there, as SHM_COMBINE_CACHED counts): that write stays in the cache
        if collective == "allreduce":
            direct = Work(0, 0, 0, SHM_COMBINE_CACHED * f * n, 0, syncs=3, read=2 * f * n,
                          cached=f * n)
        elif collective == "bcast":
            direct = Work(0, 0, 0, syncs=2, read=f * n)
        elif collective == "reduce_scatter_block":  # its block of every other rank's input
            direct = Work(0, 0, 0, SHM_COMBINE_CACHED * (p - 1) * n, 0, syncs=2,
                          read=(p - 1) * n, cached=(p - 1) * n)
        elif collective in ("gather", "scatter"):
            # the p-1 others each write (read) their block at once, where the linear schedule's
            # root takes the messages one after another; the root copies its own block
            # meanwhile (np=2, same job, 4 MiB blocks: 155-258 us against linear's 337-512;
            # 16 and 64 MiB blocks a tie, 1.7-2.3 and 7.2-9.9 ms both)
            direct = Work(0, 0, 0, 0, 0, syncs=2, read=n)
        else:
            direct = Work(0, 0, 0, 0, n, syncs=2, read=(p - 1) * n)
        if not race <= size < SHM_RACE_MAX:
            return direct
        return direct._replace(alt=windows(p, n, seg))
    return m


def _slots(collective: str) -> Callable[[int], float]:
    """On p ranks, the bytes up to which ``collective`` takes the one-sync slots."""
    return lambda p: shm_paths.DEFAULT.small(collective, p)


def _shm_scan(collective: str) -> Model:
    """The shared-memory scan: every rank publishes its input (in its slot, one sync, while
    it fits ``Policy.small``; else a chunk at a time through its area, two syncs a chunk) and
    the last rank combines all p of them: p-1 combining passes."""
    slots = _slots(collective)

    def m(p: int, n: float, seg: int) -> Work:
        if n <= slots(p):
            return Work(0, 0, 0, (p - 1) * n, n, syncs=1)
        return Work(0, 0, 0, (p - 1) * n, n, syncs=2 * max(1, math.ceil(n / SHM_CHUNK)))
    return m


def _shm_models(crowded: bool) -> dict[str, Model]:
    return {
        "barrier": lambda p, n, s: Work(0, 0, 0, syncs=1),
        "allreduce": _direct("allreduce", _shm(2, 2.0, 1.0, small=_slots("allreduce"),
                                               per_p=-1.0), crowded),
        "reduce": _shm(2, 1.5, 1.0, small=_slots("reduce")),
        "bcast": _direct("bcast", _shm(1, 1.0, 0.0, small=_slots("bcast")), crowded),
        "allgather": _direct("allgather", _shm(1, 1.0, 0.0, per_rank=True,
                                               small=_slots("allgather"), own=2.0), crowded),
        "reduce_scatter_block": _direct("reduce_scatter_block", _shm(
            2, 1.0, 1.0, per_rank=True, small=_slots("reduce_scatter_block"), all_blocks=True),
            crowded),
        "alltoall": _direct("alltoall", _shm(2, 2.0, 0.0, per_rank=True, small=_slots("alltoall"),
                                             all_blocks=True, own=1.0), crowded),
        # the root copies its own block and the p-1 others' (out of or into the windows)
        "gather": _direct("gather", _shm(1, 1.0, 0.0, per_rank=True, small=_slots("gather"),
                                         own=1.0), crowded),
        "scatter": _direct("scatter", _shm(1, 1.0, 0.0, per_rank=True, small=_slots("scatter"),
                                           all_blocks=True, own=1.0), crowded),
        "scan": _shm_scan("scan"),
        "exscan": _shm_scan("exscan"),
    }


SHM_MODELS: dict[str, Model] = _shm_models(False)
SHM_MODELS_CROWDED: dict[str, Model] = _shm_models(True)  # ranks sharing cores

# collectives whose algorithms share a model with another's
ALIASES = {"gatherv": "gather", "scatterv": "scatter", "allgatherv": "allgather",
           "alltoallv": "alltoall", "alltoallw": "alltoall",
           "reduce_scatter": "reduce_scatter_block", "exscan": "scan"}


def model(collective: str, algorithm: str, crowded: bool = False) -> Model | None:
    """The cost model of an algorithm, or None if it has none (then it is never auto-chosen);
    ``crowded``: of the shared-memory one where ranks outnumber the host's cores."""
    if algorithm == "shm":
        return (SHM_MODELS_CROWDED if crowded else SHM_MODELS).get(collective)
    return MODELS.get(ALIASES.get(collective, collective), {}).get(algorithm)


def predict(collective: str, algorithm: str, p: int, nbytes: float, c: Constants,
            segment: int = 0) -> float:
    """Predicted seconds of ``algorithm`` for ``nbytes`` on ``p`` ranks (inf if unmodelled)."""
    m = model(collective, algorithm)
    if m is None:
        return math.inf
    return m(p, nbytes, segment).time(c)
