"""Communicator management: dup, split, create, self; revoke, agree, shrink; free.

New communicators agree on their context ids through an allgather of every rank's next free
one; agreement and shrink go through the job's monitor (store based), so they work while ranks
are failing.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

from ringworld._lazy import LazyModule
from ringworld.collective.core import CollectiveCore
from ringworld.collective.markers import UNDEFINED
from ringworld.comm.hooks import observable, observed
from ringworld.comm.point_to_point import FreedRanks, _as_int
from ringworld.errors import CommError, CommRevoked

if TYPE_CHECKING:
    import numpy as np

    from ringworld.collective.buffers import Array
    from ringworld.comm.monitor import Monitor
else:  # imported on first use: init() and point-to-point never load numpy
    np = LazyModule("numpy", globals(), "np")


@observed
class CommManagement(CollectiveCore):
    """Making communicators from this one, and living with failed members."""

    if TYPE_CHECKING:  # the collective it uses (see Communicator)
        def allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                      timeout: float | None = None) -> None: ...

    # ------------------------------------------------------------------ management
    def _agree_context(self, extra: Sequence[int] = ()) -> tuple[int, Array]:
        """Allgather (next free context, *extra) and reserve the agreed context id."""
        mine = np.array([self._engine.next_context, *extra], dtype=np.int64)
        table = np.empty(self.size * mine.size, dtype=np.int64)
        self.allgather(mine, table, algorithm=None)
        rows = table.reshape(self.size, mine.size)
        ctx = int(rows[:, 0].max())
        self._engine.reserve_contexts(ctx)
        return ctx, rows

    def _derive(self, ranks: Sequence[int], context: int, name: str) -> Self:
        return type(self)(self._engine, ranks, context, name, self.selector,
                          self._engine.kind_for(ranks))

    def self_comm(self) -> Self:
        """A communicator holding only this rank (MPI's COMM_SELF); no traffic to create."""
        base = super().self_comm()
        base.selector = self.selector
        return base

    @observable("management")
    def dup(self, name: str | None = None) -> Self:
        """A new communicator with the same ranks and its own message contexts.

        Collective over this communicator. Cost: one allgather of 8 bytes.

        Raises:
            Timeout, PeerFailure.
        """
        ctx, _ = self._agree_context()
        return self._derive(self._ranks, ctx, name or f"{self.name}.dup")

    @observable("management")
    def split(self, color: int | None, key: int = 0, name: str | None = None) -> Self | None:
        """Partition into one communicator per ``color``, ranked by (``key``, old rank).

        ``color`` None or :data:`UNDEFINED` returns None on this rank. Collective over this
        communicator. Cost: one allgather of 24 bytes per rank.

        Raises:
            TypeError / ValueError: color or key not an int, or a negative color.
            Timeout, PeerFailure.
        """
        col = UNDEFINED if color is None else int(_as_int(color, "color"))
        if col < 0 and col != UNDEFINED:
            raise ValueError(f"color={color} must be >= 0, None or UNDEFINED")
        k = int(_as_int(key, "key"))
        ctx, rows = self._agree_context((col, k))
        if col == UNDEFINED:
            return None
        members = sorted((int(rows[i, 2]), i) for i in range(self.size) if rows[i, 1] == col)
        return self._derive([self._ranks[i] for _, i in members], ctx,
                            name or f"{self.name}.split{col}")

    @observable("management")
    def create(self, ranks: Sequence[int], name: str | None = None) -> Self | None:
        """A communicator of ``ranks`` (ranks of this one, in new-rank order); None elsewhere.

        Collective over this communicator: every rank passes the same ``ranks``.

        Raises:
            ValueError: duplicates or out-of-range ranks.  Timeout, PeerFailure.
        """
        group = [int(_as_int(x, "ranks")) for x in ranks]
        if len(set(group)) != len(group) or any(not 0 <= x < self.size for x in group):
            raise ValueError(f"ranks={group} must be distinct ranks in 0..{self.size - 1}")
        pos = {x: i for i, x in enumerate(group)}
        color = 0 if self.rank in pos else None
        return self.split(color, pos.get(self.rank, 0), name or f"{self.name}.create")

    # ------------------------------------------------------------------ fault tolerance
    def failed_ranks(self) -> list[int]:
        """Ranks of this communicator known to have failed (exited or stopped responding).

        Local: what this rank has learned so far (from its transports, its heartbeat monitor
        and the launcher).
        """
        self._engine.check_peers()
        gone = set(self._engine.dead) | self._engine.reported
        return [i for i, w in enumerate(self._ranks) if w in gone]

    def revoke(self) -> None:
        """Make every member's pending and later operations on this communicator fail with
        :class:`~ringworld.CommRevoked` (ULFM's revoke); other communicators keep working.

        This rank's fail at once; the other members' within about 0.3 s (their monitors poll
        the job store). Use it after a failure so that ranks blocked on other members learn of
        it, then :meth:`shrink`. Cost: two store round trips.

        Raises:
            CommError: no job monitor (a job not started by ``ringworld run``, or
                ``RINGWORLD_LIVENESS_TIMEOUT=0``) and more than one rank.
        """
        why = CommRevoked(f"{self.name} was revoked by rank {self.rank}")
        self._engine.revoke((self.context, self.coll_context), why)
        if self.size > 1:
            self._fault_tolerance("revoke").publish_revocation(
                (self.context, self.coll_context), self._ranks, self.name)

    def agree(self, flag: int = 1, *, timeout: float | None = None) -> int:
        """The bitwise AND of ``flag`` over the live members (ULFM's agree), same on all.

        Works on a failed or revoked communicator: members that failed are left out instead of
        blocking it. Collective over the live members. Cost: a few store round trips each.

        Raises:
            Timeout: no agreement within ``timeout`` (default: the job's).
            CommError: no job monitor, or the coordinating rank failed while agreeing.
        """
        result, _, _ = self._agreement("agree", flag, timeout)
        return result

    def shrink(self, name: str | None = None, *, timeout: float | None = None) -> Self:
        """A new communicator of the live members, in rank order (ULFM's shrink).

        Call it on every surviving member after a failure (usually after :meth:`revoke`); the
        result works normally, failed ranks excluded. Collective over the live members. Cost:
        an agreement (a few store round trips each).

        Raises:
            Timeout: no agreement within ``timeout``.
            CommError: no job monitor, or the coordinating rank failed while agreeing.
        """
        _, alive, ctx = self._agreement("shrink", 1, timeout)
        self._engine.reserve_contexts(ctx)
        members = [w for w in self._ranks if w in set(alive)]
        return self._derive(members, ctx, name or f"{self.name}.shrunk")

    def _agreement(self, what: str, flag: int, timeout: float | None
                   ) -> tuple[int, list[int], int]:
        self._agree_round += 1
        if self.size == 1:
            ctx = self._engine.next_context
            return int(flag), [self._ranks[0]], ctx
        members = ",".join(map(str, self._ranks))
        key = f"{self.coll_context}.{zlib.crc32(members.encode()):08x}.{self._agree_round}"
        return self._fault_tolerance(what).agree(
            key, self._ranks, flag, self._engine.next_context,
            self._engine.timeout if timeout is None else timeout)

    def _fault_tolerance(self, what: str) -> Monitor:
        ft: Monitor | None = self._engine.ft
        if ft is None:
            raise CommError(f"{what} on {self.name} needs the job's monitor: run the job with "
                            "`ringworld run` and RINGWORLD_LIVENESS_TIMEOUT > 0")
        return ft

    def free(self) -> None:
        """Release this communicator (scratch, shared windows); every later call on it (a
        collective, a send, a receive, a probe) raises CommError.

        Local: call it on every rank once no operation on the communicator is pending.
        """
        self._freed = True
        if self._plane is not None:
            self._plane.close()
            self._plane = None
        self._scratch = None
        self._cache.clear()  # the repeated calls would reach the windows directly
        if self._arena is not None:
            self._arena = None
            self._chan.unmap_shared("arena")
        if self._hier is not None:
            for sub in self._hier:
                if sub is not None and sub is not self:
                    sub.free()
            self._hier = None
        self._engine.forget_contexts((self.context, self.coll_context))
        self._ranks = FreedRanks(self.name)  # point-to-point calls map a rank: now they raise
