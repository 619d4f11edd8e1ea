"""Runners of repeated eager collectives (:class:`EagerRunners`, a part of
:class:`ringworld.algorithms.shm_arena.Arena`): a broadcast, a scatter (one entry of the
root's eager ring holds every block) and a gather (each sender's block in its own ring) as
the arena's eager calls run them, with their entries' views made once for a call shape (see
:mod:`ringworld.algorithms.shm_repeat`). They take exactly the eager calls' steps: the same
numbering, stamps, ring space and errors, in small entries and large (up to EAGER_MAX bytes).
Same job, old and new code swapped each round, medians of 9, large entries (over EAGER_SMALL)
with a runner against without: np=2 bcast 64 KiB 6.53 -> 5.95 us (1.10x), scatter 64 KiB
6.16 -> 5.85 (1.07x); np=4 on 2 cores, gather 32 KiB blocks 25.6 -> 21.9 (1.17x), 64 KiB
38.8 -> 34.1 (1.16x), bcast 32 KiB 13.6 -> 12.6 (1.08x).

The broadcast's and the gather's runners write out the arena's ``_eager_begin`` and
``_eager_end`` (the call's number, stamp and hash): two calls fewer a call, where a small
call's cost is its Python steps. Same job, old and new code alternating, two to six jobs
each: np=2 bcast 8 B 1.88-2.10 -> 1.74-1.84 us, 64 KiB 5.33-5.68 -> 5.08-5.39; scatter 8 B
2.20-2.29 -> 2.06-2.13; gather 64 KiB 4.84-4.95 -> 4.64-4.79; np=4 on 2 cores gather 64 KiB
13.3-13.6 -> 12.6-12.7 (bcast there: no change). A change to those two must change these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ringworld.algorithms.shm_policy import EAGER_BIG, EAGER_RING, EAGER_SMALL

if TYPE_CHECKING:
    from ringworld.algorithms.shm_arena import Arena
    from ringworld.comm.channel import Channel

Array = np.ndarray[Any, Any]

_BCAST = ("its root", "broadcast", "broadcast")  # (_eager_take's words for a broadcast)
_GATHER = ("a sender", "gather block", "sent")


class EagerRunners:
    """:class:`~ringworld.algorithms.shm_arena.Arena`'s runners (its state: the arena's)."""

    if not TYPE_CHECKING:  # (no state of its own; the checker sees the arena's, written here)
        __slots__ = ()
    chan: Channel
    _ctr: list[memoryview]
    _mine: memoryview
    _others: list[memoryview]
    _ring_done: int
    _bseq: int  # (the eager calls' number, stamp and hash: see _eager_begin, _eager_end)
    _bhash: int
    _seq: int
    _sig: tuple[int, int, str] | None
    _wake: Callable[[], None]

    if TYPE_CHECKING:  # the arena's
        def _eager_begin(self) -> tuple[int, int, int]: ...

        def _eager_end(self, s: int, root: int, stamp: int) -> None: ...

        def _ring_space(self, need: int) -> None: ...

        def _two_roots(self, word: int, want: int) -> NoReturn: ...

        def _eager_take(self, rank: int, s: int, word: int, stamp: int,
                        who: tuple[str, str, str]) -> int: ...

        def _entry(self, rank: int, e: int, like: Array, skip: int = 0) -> Array: ...

    def bcast_runner(self, root: int, like: Array, skip: int = 0, own: slice | None = None,
                     whole: int = -1, apart: bool = False) -> Callable[..., None]:
        """:meth:`eager_bcast` from ``root``, with ``shm_collectives.RUN``'s arguments (its
        arena, op and root are this one's), for flat arrays of ``like``'s dtype and size (at
        most EAGER_MAX bytes): the entries' views made once, for a repeated broadcast (see
        shm_repeat). A small scatter is such a broadcast of the root's ``send``, ``like``
        (``own``: its own block, copied into its ``recv``), of which every other rank takes
        the ``like``-sized block from element ``skip`` on; ``whole``: the bytes the root puts
        in the entry, where not ``like``'s (a scatter's other ranks). ``apart``: the root's
        entry (``like``) holds the others' blocks only, in rank order (see
        ``shm_policy.scatter_apart``). Raises: as eager_bcast."""
        from ringworld.algorithms.shm_arena import EAGER_DONE, EAGER_STAMP, SEQ_MASK  # (cycle)

        # a small or a large entry by the root's bytes (bit 0 of the stamp: as _eager_put)
        large = int((like.nbytes if whole < 0 else whole) > EAGER_SMALL)
        ring, first = (EAGER_BIG, EAGER_RING) if large else (EAGER_RING, 0)
        entries = [self._entry(root, first + e, like, skip) for e in range(ring)]
        mine, src, others = self._mine, self._ctr[root], self._others
        rootmix = (root + 1) * 0x9E3779B1  # (_eager_end's hash of the root)
        # a scatter's root whose entry leaves its own block out: (part of entry, of send)
        pieces = None if own is None or not apart else [
            [(x[: own.start], slice(0, own.start))] * (own.start > 0)
            + [(x[own.start :], slice(own.stop, None))] * (x.size > own.start)
            for x in entries]

        def put(_: Arena, send: Array, buf: Array, _op: Any, _root: int) -> None:
            s = self._bseq + 1  # (_eager_begin inline)
            sig = self._sig
            self._sig = None
            assert sig is not None, "begin() names the call first"
            mark = (sig[1] ^ (sig[0] * 0x9E3779B1) ^ (self._seq * 0x85EBCA77)) & 0xFFFFFFFE
            word = EAGER_STAMP + s % EAGER_RING
            stamp = (s & SEQ_MASK) << 32 | mark
            if s - ring > self._ring_done:  # (as _eager_put)
                self._ring_space(s - ring)
            if pieces is None:
                entries[s % ring][...] = buf if own is None else send
            else:
                for part, at in pieces[s % ring]:
                    part[...] = send[at]
            mine[word] = stamp | large
            want = stamp >> 32
            for c in others:
                if c[word] >> 32 == want:
                    self._two_roots(word, want)
            mine[EAGER_DONE] = s  # (_eager_end inline)
            self._bseq = s
            self._bhash = (self._bhash * 1000003 + rootmix + mark) & SEQ_MASK
            self._wake()
            if own is not None:
                buf[...] = send[own]  # (its own place when in place: harmless)

        def take(_: Arena, send: Array, buf: Array, _op: Any, _root: int) -> None:
            s = self._bseq + 1  # (_eager_begin inline)
            sig = self._sig
            self._sig = None
            assert sig is not None, "begin() names the call first"
            mark = (sig[1] ^ (sig[0] * 0x9E3779B1) ^ (self._seq * 0x85EBCA77)) & 0xFFFFFFFE
            word = EAGER_STAMP + s % EAGER_RING
            stamp = (s & SEQ_MASK) << 32 | mark
            if src[word] | 1 != stamp | 1:
                self._eager_take(root, s, word, stamp, _BCAST)
            # (the entry's size is the root's, which the signature makes this one's)
            buf[...] = entries[s % ring]
            mine[EAGER_DONE] = s  # (_eager_end inline)
            self._bseq = s
            self._bhash = (self._bhash * 1000003 + rootmix + mark) & SEQ_MASK
            self._wake()

        return put if self.chan.rank == root else take

    def gather_runner(self, root: int, like: Array) -> Callable[..., None]:
        """:meth:`eager_gather` to ``root`` of blocks of ``like``'s dtype and size (at most
        EAGER_MAX bytes), with ``shm_collectives.RUN``'s arguments (its arena, op and root are
        this one's): the entries' views made once, for a repeated gather (see shm_repeat); the
        root's own block copied first, as gather does. Raises: as eager_gather."""
        from ringworld.algorithms.shm_arena import EAGER_DONE, EAGER_STAMP, SEQ_MASK  # (cycle)

        me, mine, n = self.chan.rank, self._mine, like.size
        rootmix = (root + 1) * 0x9E3779B1  # (_eager_end's hash of the root)
        large = int(like.nbytes > EAGER_SMALL)  # (bit 0 of the stamp: as _eager_put)
        ring, first = (EAGER_BIG, EAGER_RING) if large else (EAGER_RING, 0)
        if me != root:
            own = [self._entry(me, first + e, like) for e in range(ring)]

            def put(_: Arena, send: Array, _recv: Array, _op: Any, _root: int) -> None:
                s = self._bseq + 1  # (_eager_begin inline, as the broadcast's)
                sig = self._sig
                self._sig = None
                assert sig is not None, "begin() names the call first"
                mark = (sig[1] ^ (sig[0] * 0x9E3779B1) ^ (self._seq * 0x85EBCA77)) & 0xFFFFFFFE
                word = EAGER_STAMP + s % EAGER_RING
                if s - ring > self._ring_done:  # (as _eager_put)
                    self._ring_space(s - ring)
                own[s % ring][...] = send
                mine[word] = (s & SEQ_MASK) << 32 | mark | large
                mine[EAGER_DONE] = s  # (_eager_end inline)
                self._bseq = s
                self._bhash = (self._bhash * 1000003 + rootmix + mark) & SEQ_MASK
                self._wake()

            return put
        senders = [(i, i * n, (i + 1) * n, self._ctr[i],
                    [self._entry(i, first + e, like) for e in range(ring)])
                   for i in range(self.chan.size) if i != me]

        def take(_: Arena, send: Array, recv: Array, _op: Any, _root: int) -> None:
            recv[me * n : (me + 1) * n] = send  # (its own place when in place: harmless)
            s = self._bseq + 1  # (_eager_begin inline, as the broadcast's)
            sig = self._sig
            self._sig = None
            assert sig is not None, "begin() names the call first"
            mark = (sig[1] ^ (sig[0] * 0x9E3779B1) ^ (self._seq * 0x85EBCA77)) & 0xFFFFFFFE
            word = EAGER_STAMP + s % EAGER_RING
            stamp = (s & SEQ_MASK) << 32 | mark
            if s - EAGER_RING > self._ring_done:  # (as eager_gather's root: a small entry)
                self._ring_space(s - EAGER_RING)
            mine[word] = stamp ^ 0xFFFFFFFE  # (as eager_gather's root: no sender stamps so)
            k = s % ring
            for i, lo, hi, src, entries in senders:
                if src[word] | 1 != stamp | 1:
                    self._eager_take(i, s, word, stamp, _GATHER)
                # (the entry's size is the root's block size, which the signature makes theirs)
                recv[lo:hi] = entries[k]
            mine[EAGER_DONE] = s  # (_eager_end inline)
            self._bseq = s
            self._bhash = (self._bhash * 1000003 + rootmix + mark) & SEQ_MASK
            self._wake()

        return take

    def ring_entries(self, rank: int, like: Array) -> list[Array]:
        """Every entry of ``rank``'s eager ring as ``like``'s dtype, at most its size: the
        EAGER_RING small ones, then the EAGER_BIG large ones (an entry's index here is the
        ``e`` of the filled runners' ``fill``)."""
        return [self._entry(rank, e, like) for e in range(EAGER_RING + EAGER_BIG)]

    def filled_bcast_runner(self, root: int, large: bool, fill: Callable[[int, Array], Any]
                            ) -> Callable[[Array], Any]:
        """:meth:`eager_bcast` from ``root`` with a ``fill``, for a repeated call whose root
        puts a (``large``) entry of a size known in advance: ``run(buf)`` on the root calls
        ``fill(e, buf)`` to fill its entry ``e`` (see :meth:`ring_entries`), on the others
        ``fill(e, buf)`` to read the root's (small or large, as the root's stamp says), and
        returns what that returns. There ``fill`` must raise nothing (the call must end: see
        eager_bcast). Raises: as eager_bcast."""
        mine, src, others = self._mine, self._ctr[root], self._others
        ring, first = (EAGER_BIG, EAGER_RING) if large else (EAGER_RING, 0)
        bit = int(large)

        def root_run(buf: Array) -> None:
            s, word, stamp = self._eager_begin()
            if s - ring > self._ring_done:  # (as _eager_put)
                self._ring_space(s - ring)
            fill(first + s % ring, buf)
            mine[word] = stamp | bit
            want = stamp >> 32
            for c in others:
                if c[word] >> 32 == want:
                    self._two_roots(word, want)
            self._eager_end(s, root, stamp)

        def other_run(buf: Array) -> Any:
            s, word, stamp = self._eager_begin()
            got = src[word]
            if got | 1 != stamp | 1:
                got = self._eager_take(root, s, word, stamp, _BCAST)
            got = fill(EAGER_RING + s % EAGER_BIG if got & 1 else s % EAGER_RING, buf)
            self._eager_end(s, root, stamp)
            return got

        return root_run if self.chan.rank == root else other_run

    def filled_gather_runner(self, root: int, large: bool, fill: Callable[..., None],
                             who: tuple[str, str, str] = _GATHER) -> Callable[[Array], None]:
        """:meth:`eager_gather` to ``root`` with a ``fill`` (no lead, no follow), for a repeated
        call whose senders put a (``large``) entry of a size known in advance: ``run(buf)`` on
        a sender calls ``fill(e, buf)`` to fill its entry ``e`` (see :meth:`ring_entries`), on
        the root ``fill(i, e, buf)`` for each other rank i in turn, ``e`` its entry (small or
        large, as its stamp says). There ``fill`` raises only where the call cannot end.
        ``who``: as eager_gather's. Raises: as eager_gather."""
        me, mine = self.chan.rank, self._mine
        if me != root:
            ring, first = (EAGER_BIG, EAGER_RING) if large else (EAGER_RING, 0)
            bit = int(large)

            def put_run(buf: Array) -> None:
                s, word, stamp = self._eager_begin()
                if s - ring > self._ring_done:  # (as _eager_put)
                    self._ring_space(s - ring)
                fill(first + s % ring, buf)
                mine[word] = stamp | bit
                self._eager_end(s, root, stamp)

            return put_run
        senders = [(i, self._ctr[i]) for i in range(self.chan.size) if i != me]

        def take_run(buf: Array) -> None:
            s, word, stamp = self._eager_begin()
            if s - EAGER_RING > self._ring_done:  # (as eager_gather's root: no lead)
                self._ring_space(s - EAGER_RING)
            mine[word] = stamp ^ 0xFFFFFFFE  # (as eager_gather's root: no sender stamps so)
            small, big = s % EAGER_RING, EAGER_RING + s % EAGER_BIG
            for i, src in senders:
                got = src[word]
                if got | 1 != stamp | 1:
                    got = self._eager_take(i, s, word, stamp, who)
                fill(i, big if got & 1 else small, buf)
            self._eager_end(s, root, stamp)

        return take_run
