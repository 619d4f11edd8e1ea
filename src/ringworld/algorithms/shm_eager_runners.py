"""Runners of repeated small eager collectives (:class:`EagerRunners`, a part of
:class:`ringworld.algorithms.shm_arena.Arena`): a broadcast, a scatter (one entry of the
root's eager ring holds every block) and a gather (each sender's block in its own ring) as
the arena's eager calls run them, with their entries' views made once for a call shape (see
:mod:`ringworld.algorithms.shm_repeat`). They take exactly the eager calls' steps: the same
numbering, stamps, ring space and errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ringworld.algorithms.shm_policy import EAGER_BIG, EAGER_RING

if TYPE_CHECKING:
    from ringworld.algorithms.shm_arena import Arena
    from ringworld.comm.channel import Channel

Array = np.ndarray[Any, Any]

_BCAST = ("its root", "broadcast", "broadcast")  # (_eager_take's words for a broadcast)
_GATHER = ("a sender", "gather block", "sent")


class EagerRunners:
    """:class:`~ringworld.algorithms.shm_arena.Arena`'s runners (its state: the arena's)."""

    __slots__ = ()
    chan: Channel
    _ctr: list[memoryview]
    _mine: memoryview
    _others: list[memoryview]
    _ring_done: int

    if TYPE_CHECKING:  # the arena's
        def _eager_begin(self) -> tuple[int, int, int]: ...

        def _eager_end(self, s: int, root: int, stamp: int) -> None: ...

        def _ring_space(self, need: int) -> None: ...

        def _two_roots(self, word: int, want: int) -> NoReturn: ...

        def _eager_take(self, rank: int, s: int, word: int, stamp: int,
                        who: tuple[str, str, str]) -> int: ...

        def _entry(self, rank: int, e: int, like: Array, skip: int = 0) -> Array: ...

    def bcast_runner(self, root: int, like: Array, skip: int = 0,
                     own: slice | None = None) -> Callable[..., None]:
        """:meth:`eager_bcast` from ``root``, with ``shm_collectives.RUN``'s arguments (its
        arena, op and root are this one's), for flat arrays of ``like``'s dtype and size, at
        most EAGER_SMALL bytes (small entries): the entries' views made once, for a repeated
        broadcast (see shm_repeat). A small scatter is such a broadcast of the root's
        ``send``, ``like`` (``own``: its own block, copied into its ``recv``), of which every
        other rank takes the ``like``-sized block from element ``skip`` on. Raises: as
        eager_bcast."""
        entries = [self._entry(root, e, like, skip) for e in range(EAGER_RING)]
        mine, src, others = self._mine, self._ctr[root], self._others

        def put(_: Arena, send: Array, buf: Array, _op: Any, _root: int) -> None:
            s, word, stamp = self._eager_begin()
            if s - EAGER_RING > self._ring_done:  # (as _eager_put, for a small entry)
                self._ring_space(s - EAGER_RING)
            entries[s % EAGER_RING][...] = buf if own is None else send
            mine[word] = stamp
            want = stamp >> 32
            for c in others:
                if c[word] >> 32 == want:
                    self._two_roots(word, want)
            self._eager_end(s, root, stamp)
            if own is not None:
                buf[...] = send[own]  # (its own place when in place: harmless)

        def take(_: Arena, send: Array, buf: Array, _op: Any, _root: int) -> None:
            s, word, stamp = self._eager_begin()
            got = src[word]
            if got | 1 != stamp | 1:
                got = self._eager_take(root, s, word, stamp, _BCAST)
            # (a large entry only if the root's size differs, which the signature excludes)
            buf[...] = (self._entry(root, EAGER_RING + s % EAGER_BIG, buf, skip) if got & 1
                        else entries[s % EAGER_RING])
            self._eager_end(s, root, stamp)

        return put if self.chan.rank == root else take

    def gather_runner(self, root: int, like: Array) -> Callable[..., None]:
        """:meth:`eager_gather` to ``root`` of blocks of ``like``'s dtype and size (at most
        EAGER_SMALL bytes: small entries), with ``shm_collectives.RUN``'s arguments (its
        arena, op and root are this one's): the entries' views made once, for a repeated
        gather (see shm_repeat); the root's own block copied first, as gather does. Raises:
        as eager_gather."""
        me, mine, n = self.chan.rank, self._mine, like.size
        if me != root:
            own = [self._entry(me, e, like) for e in range(EAGER_RING)]

            def put(_: Arena, send: Array, _recv: Array, _op: Any, _root: int) -> None:
                s, word, stamp = self._eager_begin()
                if s - EAGER_RING > self._ring_done:  # (as _eager_put, for a small entry)
                    self._ring_space(s - EAGER_RING)
                own[s % EAGER_RING][...] = send
                mine[word] = stamp
                self._eager_end(s, root, stamp)

            return put
        senders = [(i, i * n, (i + 1) * n, self._ctr[i],
                    [self._entry(i, e, like) for e in range(EAGER_RING)])
                   for i in range(self.chan.size) if i != me]

        def take(_: Arena, send: Array, recv: Array, _op: Any, _root: int) -> None:
            recv[me * n : (me + 1) * n] = send  # (its own place when in place: harmless)
            s, word, stamp = self._eager_begin()
            if s - EAGER_RING > self._ring_done:
                self._ring_space(s - EAGER_RING)
            mine[word] = stamp ^ 0xFFFFFFFE  # (as eager_gather's root: no sender stamps so)
            k = s % EAGER_RING
            for i, lo, hi, src, entries in senders:
                got = src[word]
                if got | 1 != stamp | 1:
                    got = self._eager_take(i, s, word, stamp, _GATHER)
                recv[lo:hi] = (self._entry(i, EAGER_RING + s % EAGER_BIG, like) if got & 1
                               else entries[k])
            self._eager_end(s, root, stamp)

        return take
