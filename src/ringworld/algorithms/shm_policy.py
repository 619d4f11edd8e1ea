"""Which path a shared-memory collective takes inside its windows, as one value (no numpy).

The shared-memory collectives (:mod:`ringworld.algorithms.shm_collectives`) copy through
their windows or, from some size on, read and write their peers' buffers directly (one kernel
copy instead of two); between two sizes they race the two paths and keep the faster. Where
those sizes lie is a tuning decision: the values, with the measurements behind them, are
:data:`ringworld.tuning.shm_paths.DEFAULT`, and the arena is handed a :class:`Policy` (tests
hand it their own). ``SMALL``, ``EAGER_MAX`` and ``CHUNK`` are the windows' layout, which the
cost model shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: bytes per rank that take the one-sync small path (each rank's slot holds this much)
SMALL = 16384
#: bytes a broadcast may take through the root's eager ring (each of its entries holds this
#: much: EAGER_RING of them, see ``Arena.eager_bcast``): larger ones are streamed, and this is
#: one piece of that stream, so beyond it the stream's copies overlap
EAGER_MAX = 256 << 10
#: bytes of a window area: larger transfers go through the windows a chunk at a time
CHUNK = 2 << 20
#: the collectives that have a direct path, and the ones among them whose paths may race
DIRECT = ("allreduce", "bcast", "allgather", "alltoall", "reduce_scatter_block")
RACED = ("alltoall", "allgather", "reduce_scatter_block")


@dataclass(frozen=True)
class Policy:
    """Sizes (bytes per transfer: of the vector for allreduce and bcast, of one block for
    allgather and reduce_scatter_block, of the send buffer for alltoall) from which each
    collective of :data:`DIRECT` takes the direct path, where ranks have cores of their own
    (``direct``) and where they share them (``direct_crowded``; a collective missing there
    uses ``direct``; ``math.inf``: never); and the sizes between which the two paths race
    (``race_min`` up to ``race_max``, exclusive; never where ranks share cores, nor with
    ``race`` off)."""

    direct: Mapping[str, float]
    direct_crowded: Mapping[str, float] = field(default_factory=dict)
    race_min: Mapping[str, float] = field(default_factory=dict)
    race_max: float = 0.0
    race: bool = True

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

    def races(self, collective: str, nbytes: int, crowded: bool) -> bool:
        """Whether a call of ``nbytes`` races the two paths rather than take the threshold's."""
        return (self.race and not crowded
                and self.race_min.get(collective, math.inf) <= nbytes < self.race_max)
