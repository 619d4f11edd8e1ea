"""The shared windows of one communicator and the flag barrier over them (see
:mod:`ringworld.algorithms.shm_collectives` for the collectives that use them, and the
windows' layout).

An :class:`Arena` maps every rank's window, syncs the ranks (a flag barrier that also checks
every rank's call number and signature), keeps the record a rank leaves in its header when it
leaves a call with an error, stamps the eager broadcast ring, and races the direct and window
paths where its :class:`~ringworld.algorithms.shm_policy.Policy` says so.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Callable, Collection
from functools import partial
from os import sched_yield as _sched_yield
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ringworld.algorithms.shm_direct import address as _addr
from ringworld.algorithms.shm_direct import probe_direct
from ringworld.algorithms.shm_eager_runners import _BCAST, _GATHER, EagerRunners
from ringworld.algorithms.shm_failure import (
    call_texts,
    peer_left,
    read_text,
    write_text,
)
from ringworld.algorithms.shm_policy import (
    CHUNK,
    DIRECT,
    EAGER_BIG,
    EAGER_MAX,
    EAGER_RING,
    EAGER_SMALL,
    SLOT,
    Policy,
)
from ringworld.algorithms.shm_race import RaceCalls, _Race
from ringworld.errors import CommBroken, CommError, MismatchError, PeerFailure

if TYPE_CHECKING:
    from ringworld.comm.channel import Channel

Array = np.ndarray[Any, Any]
Fill = Callable[[int, Array], None]  # moves an eager call's data itself (see eager_bcast)
Follow = Callable[[int, Array | None], None]  # a gather's sender after its root began it

HEADER = 4096
PAGE = 4096
CONSUMED = 88  # header words CONSUMED + j: pieces taken from rank j's stream (one per peer)
MAX_RANKS = HEADER // 8 - CONSUMED
# Which path a call takes (windows or direct copies, raced or not) is the Policy the arena
# is handed (ringworld.tuning.shm_paths.DEFAULT: the measured sizes, and why)
RACE_ALLTOALL, RACE_ALLGATHER, RACE_REDUCE_SCATTER = 0, 1, 2  # indices: RACED order
EAGER_DONE = 23  # header word: the eager broadcasts this rank has finished
REFUSING = 22  # header word: (sync count << 32) | the eager gather this rank refuses as root
PROGRESS = 14  # header words 14, 15: a call's progress between two syncs (see Arena.tell)
EAGER_STAMP = 32  # header words 32 ..: per ring stamp, (call number << 32) | signature | large
SEQ_WORD = 2  # header words 2, 3: by sync parity, the number of the call that made the sync
# A rank that leaves a call with an error says so in its header, for good (see Arena.abandon):
FAILED = 4  # header word: 1 + the number of the call it left (0: none)
# header word: how (1: a mismatch, 2: another error, 3: a peer failed) | (1 + first rank) << 8
FAILED_FROM = 5
REFUSED = 1 << 62  # in a sync's call-number word: this rank, the root, refuses the call
REFUSED_KIND = 7  # header word: 1 ValueError, 2 TypeError (the refusal's text at FAILED_TEXT)
SEQ_MASK = 0x7FFFFFFF
INLINE_SPIN = 256  # a few microseconds of counter checks (see Arena.sync)
INLINE_YIELDS = 8  # where ranks share cores: yields of the core to them (see Arena.sync)


class Arena(RaceCalls, EagerRunners):
    """The shared windows of one communicator and the flag barrier over them."""

    # slots: over 30 attributes would take an instance dict out of CPython's shared-key form,
    # and every attribute read of the sync path slower with it (an 8 B allreduce ~0.2 us)
    __slots__ = (
        "__weakref__", "_areas", "_bhash", "_bseq", "_call", "_copiers", "_crc", "_ctr",
        "_inline_spin", "_inline_yields", "_mine", "_others", "_ring", "_ring_cache",
        "_ring_done", "_seq", "_sig",
        "_slot_cache", "_slots", "_wake",
        "_what", "broken", "chan", "chunk", "crowded", "direct", "direct_min", "epoch", "pieces",
        "policy", "small", "small_reduce", "timeout", "vector_views",
    )

    def __init__(self, comm: Channel, barrier: Callable[[], None], policy: Policy,
                 chunk: int = CHUNK) -> None:
        self.chan = comm
        self.chunk = chunk
        self._copiers: list[Callable[[int, int, int], None] | None] = [None] * (2 * comm.size)
        self.policy = policy
        # bytes up to which calls take the slots: copies (allgather's block, alltoall's and
        # reduce_scatter_block's send buffer), and an allreduce or reduce (each rank combines
        # all p inputs)
        self.small = policy.small("allgather", comm.size)
        self.small_reduce = policy.small("allreduce", comm.size)
        base = HEADER + 2 * SLOT
        span = chunk + PAGE  # an area: a chunk, placed at any offset within a page
        ring = EAGER_RING * EAGER_SMALL + EAGER_BIG * EAGER_MAX
        views = comm.map_shared(base + 2 * span + ring, "arena", barrier)
        # word 0: the sync counter; words 8..11: two call signatures (bytes, kind) by parity;
        # words 12, 13: where in area 0 / 1 the data starts (see place()); words 24, 25: the
        # buffers peers may read directly (see publish()); word 26: the direct-read verdict;
        # words 16..21: the race's picks (shm_race.RACE_WORD); word 23 and words 32..63: the eager
        # broadcasts done and the ring's stamps (EAGER_DONE, EAGER_STAMP ..).
        # memoryviews: indexing one gives a plain int, the cheapest read in a spin loop
        self._ctr = [v[:HEADER].cast("q") for v in views]
        self._mine = self._ctr[comm.rank]
        self._slots = [(np.frombuffer(v, dtype=np.uint8, count=SLOT, offset=HEADER),
                        np.frombuffer(v, dtype=np.uint8, count=SLOT, offset=HEADER + SLOT))
                       for v in views]
        self._slot_cache: dict[tuple[int, np.dtype[Any], int], list[Array]] = {}
        # shm_vector's views of these windows (its own keys): they go when the arena does
        self.vector_views: dict[Any, Any] = {}
        self._areas = [(np.frombuffer(v, dtype=np.uint8, count=span, offset=base),
                        np.frombuffer(v, dtype=np.uint8, count=span, offset=base + span))
                       for v in views]
        self._ring = [np.frombuffer(v, dtype=np.uint8, count=ring, offset=base + 2 * span)
                      for v in views]
        self._ring_cache: dict[tuple[int, int, np.dtype[Any], int, int], Array] = {}
        self._others = [v for i, v in enumerate(self._ctr) if i != comm.rank]
        self._wake = comm.waker()  # wakes peers asleep on their counters (see arrive)
        self._ring_done = 0  # every rank has finished the eager broadcasts up to this one
        self._bseq = 0  # eager broadcasts so far (the same on every rank)
        self._bhash = 0  # a hash of their roots and signatures, checked at every sync
        self.epoch = 0  # syncs so far (the same on every rank between two syncs); read-only
        self._seq = -1  # the number of the call in progress (as the communicator counts
        # calls); -1 while the windows are set up
        # why this rank's windows cannot be used any more (see abandon): (how, first rank, text)
        self.broken: tuple[int, int, str] | None = None
        self._what = ("", "", 0)
        self.timeout: float | None = None
        self._sig: tuple[int, int, str] | None = None  # checked at the call's syncs
        self._call: tuple[int, int, str] | None = None  # the call's, for the monitor
        self._crc: dict[tuple[Any, ...], tuple[int, str]] = {}
        self.pieces = 0  # pieces streamed so far (the same count on every rank)
        # counter checks in sync() before the general wait; none when ranks outnumber cores
        # (the awaited rank may need this one's core)
        self._inline_spin = 0 if comm.oversubscribed else INLINE_SPIN
        self._inline_yields = INLINE_YIELDS if comm.oversubscribed else 0
        # ranks share cores (direct copies start later): every rank has the same answer (the
        # ranks' core counts are exchanged at start-up), as it picks between paths that every
        # rank must take alike
        self.crowded = comm.oversubscribed
        # per collective, the size from which it takes the direct path (tuning's policy)
        self.direct_min = {c: policy.direct_from(c, self.crowded) for c in DIRECT}
        self.direct = probe_direct(comm, self._ctr, self.sync)
        comm.describe_calls(weakref.WeakMethod(self._describe))
        self._races = [0, 0, 0]  # raced calls so far, by collective (the same on every rank)
        self._race_log: dict[int, _Race] = {}  # rank 0's times, by kind << 8 | size class
        self._race_mask = [0, 0, 0]  # rank 0: the size classes whose next call leaves the default
        self._racing: tuple[_Race, bool, float] | None = None  # rank 0: the call being timed

    def publish(self, which: int, arr: Array) -> None:
        """Announce the address of this rank's buffer ``which`` (0, 1) for peers to read."""
        self._mine[24 + which] = _addr(arr)

    def read(self, rank: int, which: int, offset: int, into: Array) -> None:
        """Copy ``into.nbytes`` from ``offset`` bytes into ``rank``'s published buffer."""
        n = into.nbytes
        if n:
            copy = self._copiers[rank] or self._copier(rank)
            copy(self._ctr[rank][24 + which] + offset, _addr(into), n)

    def write(self, rank: int, which: int, offset: int, data: Array) -> None:
        """Copy ``data`` to ``offset`` bytes into ``rank``'s published buffer."""
        n = data.nbytes
        if n:
            copy = self._copiers[rank + self.chan.size] or self._copier(rank, True)
            copy(self._ctr[rank][24 + which] + offset, _addr(data), n)

    def _copier(self, rank: int, write: bool = False) -> Callable[[int, int, int], None]:
        """The channel's copier from (``write``: to) ``rank``, made on first use and kept
        (the lookups behind ``Channel.read_peer`` cost 2.6 us a copy)."""
        copy = self._copiers[rank + self.chan.size * write] = self.chan.peer_copier(rank, write)
        return copy

    @property
    def what(self) -> str:
        """The collective in progress, for messages."""
        return f"{self._what[0]} (shm) #{self._what[2]} on {self._what[1]}"

    def begin(self, what: str, timeout: float | None, nbytes: int,
              kind: tuple[Any, ...], seq: int = 0) -> None:
        """Start collective number ``seq``: name it for errors and check at the next sync that
        every rank called it with the same size and ``kind`` (dtype, op, root: what must
        agree)."""
        self.begin_signed(what, timeout, self.signature(what, nbytes, kind), seq)

    def signature(self, what: str, nbytes: int, kind: tuple[Any, ...]) -> tuple[int, int, str]:
        """What :meth:`begin` checks across ranks: (bytes, checksum of the call, its text)."""
        key = (what, *kind)
        found = self._crc.get(key)
        if found is None:
            if len(self._crc) > 4096:  # (a program of endlessly new allgatherv counts)
                self._crc.clear()
            text = " ".join(str(k) for k in key)
            found = self._crc[key] = (zlib.crc32(text.encode()), text)
        return (nbytes, *found)

    def begin_signed(self, what: str, timeout: float | None, sig: tuple[int, int, str],
                     seq: int) -> None:
        """:meth:`begin` with the call's :meth:`signature` computed earlier (kept by callers
        that repeat one call)."""
        if self.broken is not None:
            self._what = (what, self.chan.name, seq)
            raise self._broken_error()
        self._what = (what, self.chan.name, seq)
        self._seq = seq
        self.timeout = timeout
        self._sig = self._call = sig

    def place(self, which: int, like: Array) -> None:
        """Start this rank's data in area ``which`` at ``like``'s address modulo a page.

        Copies between addresses a few bytes apart modulo 4 KiB (a page-aligned area and a
        numpy buffer 16 bytes past a page) run up to 10x slower: loads falsely wait on recent
        stores to the same low address bits. Matching the user buffer's page offset makes the
        copy in, and the copies out into similarly placed buffers of other ranks, run at full
        speed. Readers find the offset in this rank's header.
        """
        off = _addr(like) % PAGE if like.size else 0
        self._mine[12 + which] = off - off % like.itemsize

    def area(self, rank: int, which: int, dtype: np.dtype[Any], count: int) -> Array:
        """``count`` elements of ``dtype`` where ``rank``'s data in area ``which`` starts."""
        off = self._ctr[rank][12 + which]
        return self._areas[rank][which][off : off + count * dtype.itemsize].view(dtype)

    def slots(self, parity: int, dtype: np.dtype[Any], count: int) -> list[Array]:
        """Every rank's small slot ``parity`` as ``count`` elements of ``dtype`` (cached)."""
        key = (parity, dtype, count)
        views = self._slot_cache.get(key)
        if views is None:
            if len(self._slot_cache) > 256:
                self._slot_cache.clear()
            nb = count * dtype.itemsize
            views = self._slot_cache[key] = [s[parity][:nb].view(dtype) for s in self._slots]
        return views

    def next_parity(self) -> int:
        """The slot parity of the next sync."""
        return (self.epoch + 1) & 1

    def tell(self, value: int, word: int = 0) -> None:
        """Publish ``value`` in this rank's progress word ``word`` (0, 1), for peers to read with
        :meth:`told` between two syncs (header words hold nothing a user's data can put there: a
        value is this call's or an earlier call's, so tag it with :attr:`epoch`)."""
        self._mine[PROGRESS + word] = value

    def told(self, rank: int, word: int = 0) -> int:
        """``rank``'s progress word ``word`` (see :meth:`tell`)."""
        return self._ctr[rank][PROGRESS + word]

    def sync(self, arrive: bool = True, wait: bool = True) -> None:
        """Wait until every rank has reached this point (a barrier over shared counters).

        ``arrive=False`` is :meth:`await_all`, ``wait=False`` :meth:`arrive` (one function:
        a sync is most of a small call's cost, and each call of a method adds to it; ``wait``
        is read only where this rank arrives).

        Raises:
            Timeout, PeerFailure: as :meth:`Channel.spin_until`.
            MismatchError: ranks started different calls (see :meth:`begin`).
        """
        sig = self._sig
        if arrive:
            e = self.epoch = self.epoch + 1
            mine = self._mine
            if sig is not None:
                at = 8 + 2 * (e & 1)  # by parity: a rank may announce its next call meanwhile
                # written only when they change (a repeated call's do not): a word the peers
                # have read sits in their caches, and a write takes its line back from them
                if mine[at] != sig[0]:
                    mine[at] = sig[0]
                word = sig[1] | self._bhash << 32  # and the eager broadcasts before it
                if mine[at + 1] != word:
                    mine[at + 1] = word
            mine[SEQ_WORD + (e & 1)] = self._seq
            mine[0] = e
            self._wake()
            if not wait:
                return
        else:
            e = self.epoch
        others = self._others
        for c in others:
            if c[0] < e and self._inline_yields:
                # ranks that share cores: the peer runs once this rank gives up its core,
                # usually within a yield or two; the general wait (its closures, its clock
                # reads) costs more than the sync itself there
                for _ in range(self._inline_yields):
                    _sched_yield()
                    if c[0] >= e:
                        break
                else:
                    self._wait(e)
                    break
            if c[0] < e:
                # (none while a peer shares this CPU: it runs only once this rank yields)
                spin = 0 if self.chan.sharing_cpu else self._inline_spin
                # the peer is usually a few microseconds behind: spin on its counter here
                # before the general wait (which builds its closures and polls the transports)
                for _ in range(spin):
                    if c[0] >= e:
                        break
                else:
                    self._wait(e)
                    break
        # every sync checks that every rank reached it in this same call, made alike: a rank
        # that left an earlier call with an error reaches the same sync count in a later one
        # (one pass of word reads here; the analysis only where one differs)
        seq = self._seq
        sq = SEQ_WORD + (e & 1)
        # (a rank that left a call with an error arrives at no sync after it: see begin)
        # (this rank's own words are the ones it compares with: the peers' are read)
        if sig is None:
            for c in others:
                if c[sq] != seq:
                    self._out_of_step(e, sig)
            return
        at = 8 + 2 * (e & 1)
        size = sig[0]
        word = sig[1] | self._bhash << 32
        for c in others:
            if c[at] != size or c[at + 1] != word or c[sq] != seq:
                self._out_of_step(e, sig)

    def arrive(self) -> None:
        """The first half of :meth:`sync`: tell the others this rank has reached it. Work done
        before :meth:`await_all` overlaps the wait for slower ranks; it may touch only this
        rank's own buffers (peers may already be past the sync)."""
        self.sync(wait=False)

    def await_all(self) -> None:
        """The second half of :meth:`sync`: wait until every rank has arrived.

        Raises:
            as :meth:`sync`.
        """
        self.sync(arrive=False)

    def _out_of_step(self, e: int, sig: tuple[int, int, str] | None) -> None:
        """Why the ranks' words at sync ``e`` differ from this rank's (see :meth:`await_all`):
        raise the error, or return if nothing is wrong after all (this rank's own refusal)."""
        seq = self._seq & ~REFUSED  # (set while this rank refuses the call)
        sq = SEQ_WORD + (e & 1)
        for i, c in enumerate(self._ctr):
            if c[FAILED] and c[sq] & ~REFUSED != seq:  # then name the first failure
                self._check_failed()
            if c[sq] == seq | REFUSED and i != self.chan.rank:
                refused = TypeError if c[REFUSED_KIND] == 2 else ValueError
                bad = refused(read_text(self._ctr[i]))
                setattr(bad, "in_step", True)  # noqa: B010 (see abandon)
                raise bad
        if sig is not None:
            at = 8 + 2 * (e & 1)
            word = sig[1] | self._bhash << 32
            for c in self._ctr:
                if c[at] != sig[0] or c[at + 1] != word:
                    # every rank raises here; the calls may have counted raced calls apart
                    # (sizes on either side of the policy's race_min): count afresh, all
                    # reading the same pick words (rank 0's last writes, before this sync)
                    self._races = [0, 0, 0]
                    seen = [(c[at], c[at + 1]) for c in self._ctr]
                    if all(b == sig[0] and k & 0xFFFFFFFF == sig[1] for b, k in seen):
                        raise MismatchError(
                            f"{self.what}: the ranks made different small broadcasts before "
                            f"it (roots, sizes or types differ; this rank made "
                            f"{self._bseq}); per rank, a hash of them: "
                            + ", ".join(f"rank {i}: {k >> 32:08x}"
                                        for i, (_, k) in enumerate(seen)))
                    in_step = all(c[sq] & ~REFUSED == seq for c in self._ctr)
                    texts = (call_texts(self._ctr, self.chan.rank, e, sig[2], self._wake)
                             if in_step else {})
                    if len(texts) == len(seen):
                        per = "per rank: " + "; ".join(
                            f"rank {i}: {texts[i]}, {b} bytes" for i, (b, _) in enumerate(seen))
                    else:  # (a rank not in step here: its call's checksum, not its text)
                        per = "per rank (bytes, call signature): " + ", ".join(
                            f"rank {i}: ({b}, {k & 0xFFFFFFFF:08x})"
                            for i, (b, k) in enumerate(seen))
                    this = f"this rank: {sig[2]}, {sig[0]} bytes"
                    if in_step:
                        exc = MismatchError(
                            f"{self.what}: ranks called it differently ({this}); {per}")
                    else:  # (what it is first: a peer reading it gets its first 192 bytes)
                        calls = ", ".join(f"rank {i}: #{c[sq] & ~REFUSED}"
                                          for i, c in enumerate(self._ctr))
                        exc = MismatchError(
                            f"{self.what}: the ranks are at different calls ({calls}; {this}): "
                            f"a rank leaves a call without a sync where the eager rings let it "
                            f"(a gather's sender, a scatter's root), so some rank made a call "
                            f"with other sizes, or one the others did not make; {per}")
                    if in_step:
                        # every rank reads the same words here, so every rank raises at this
                        # same sync, in the same call: the windows stay in step and usable
                        setattr(exc, "in_step", True)  # noqa: B010 (no such field in the class)
                    raise exc
        for c in self._ctr:
            if c[sq] & ~REFUSED != seq:
                raise MismatchError(
                    f"{self.what}: ranks reached this sync in different calls (one left a "
                    f"call or made one more); per rank, its call number: "
                    + ", ".join(f"rank {i}: #{c[sq]}" for i, c in enumerate(self._ctr)))

    def eager_bcast(self, buf: Array, root: int, skip: int = 0, fill: Fill | None = None,
                    need: int = -1) -> None:
        """Broadcast ``buf`` (at most EAGER_MAX bytes) through ``root``'s ring, without a sync;
        with ``skip``, a rank other than the root takes the ``buf.size`` elements that follow
        the first ``skip`` of the root's data (a scatter: the root's ``buf`` holds them all).
        With ``fill``, ``buf`` only shapes the entry (at most its size), ``fill(root, entry)``
        moves the data in place of the copy (the root's writes the entry, the others' read
        it), and the root's ``need`` says how many bytes it writes there.

        Broadcast number s (counted alike on every rank) takes stamp s % EAGER_RING of the
        root's ring and an entry: small or large by the bytes the root puts there (see
        EAGER_SMALL). The root waits until every rank has finished the call that last used
        that entry (header word EAGER_DONE), copies ``buf`` into the entry and stamps it
        (header word EAGER_STAMP + s % EAGER_RING: s, the call's signature and whether the
        entry is large), and returns; the others wait for the stamp, check that the
        signature is theirs, copy the entry out and count the broadcast done. x86 stores
        become visible in program order, so a stamp seen means its data is there, and a count
        seen means the entry has been read. A root thus runs up to EAGER_RING small
        broadcasts ahead of the slowest rank instead of waiting for all of them every call,
        as MPI allows.

        Disagreements fail as MismatchError: a rank whose root has reached a sync without
        stamping the entry (it called something else), a stamp with another signature (other
        size, type or root), two ranks stamping one broadcast (both think they are its root:
        seen by the second at once, or at the next sync, whose signatures carry a hash of every
        rank's broadcasts so far).

        Raises:
            Timeout, PeerFailure: as :meth:`sync` (a rank stopped taking broadcasts, or the
            root stopped sending them).
            MismatchError: as above.
        Cost: one copy in (root) or out (others) and a few shared-memory reads.
        """
        s, word, stamp = self._eager_begin()
        me = self.chan.rank
        if me == root:
            self._eager_put(buf, s, word, stamp, True, fill, need)
        else:
            got = self._ctr[root][word]
            if got | 1 != stamp | 1:  # (usually there: no call to look)
                got = self._eager_take(root, s, word, stamp, _BCAST)
            e = EAGER_RING + s % EAGER_BIG if got & 1 else s % EAGER_RING
            if fill is None:
                buf[...] = self._entry(root, e, buf, skip)
            else:
                fill(root, self._entry(root, e, buf))
        self._eager_end(s, root, stamp)

    def eager_gather(self, buf: Array, root: int, out: Array, fill: Fill | None = None,
                     lead: Fill | None = None, follow: Follow | None = None,
                     need: int = -1, who: tuple[str, str, str] = _GATHER) -> None:
        """Gather every rank's ``buf`` (at most EAGER_MAX bytes) into ``out`` of ``root``,
        block i from rank i, without a sync: each other rank puts its ``buf`` into its own
        ring as a broadcast's root does (same numbering, rules and errors as
        :meth:`eager_bcast`) and returns; the root copies the blocks out as they are stamped
        (a root refusing the call: :meth:`refuse_gather`). With ``fill``: as eager_bcast's,
        ``fill(i, entry)`` for rank i's entry, ``need`` a sender's bytes there. With ``lead``,
        the root first fills its own (large) entry of the call (``lead(root, entry)``); with
        ``follow``, a sender then waits for the root to begin the call and calls
        ``follow(root, that entry)``, or ``follow(root, None)`` if the root had no ``lead``
        (not at all if the root ended the call refusing it). ``who``: what a sender is, what
        it makes, how (for messages). Raises: as :meth:`eager_bcast`."""
        s, word, stamp = self._eager_begin()
        me = self.chan.rank
        big = EAGER_RING + s % EAGER_BIG
        led, plain = stamp ^ 0xFFFFFFFF, stamp ^ 0xFFFFFFFE  # (the root's marks: below)
        if me != root:
            self._eager_put(buf, s, word, stamp, False, fill, need)
            if follow is not None:
                src = self._ctr[root]
                self.await_peer(root, lambda: src[word] in (led, plain) or src[EAGER_DONE] >= s,
                                f"the root (rank {root}) to begin gather {s}")
                mark = src[word]  # (stays until this rank's call is done)
                if mark in (led, plain):
                    follow(root, self._entry(root, big, buf) if mark == led else None)
        else:
            # marked as no sender can stamp (a second root fails at once, not waiting), once
            # no reader can still look for an earlier call's stamp or lead there
            lag = EAGER_RING if lead is None else EAGER_BIG
            if s - lag > self._ring_done:
                self._ring_space(s - lag)
            if lead is not None:
                lead(me, self._entry(me, big, buf))
            self._mine[word] = plain if lead is None else led
            n = buf.size
            for i in range(self.chan.size):
                if i != me:
                    got = self._ctr[i][word]
                    if got | 1 != stamp | 1:
                        got = self._eager_take(i, s, word, stamp, who)
                    e = EAGER_RING + s % EAGER_BIG if got & 1 else s % EAGER_RING
                    if fill is None:
                        out[i * n : (i + 1) * n] = self._entry(i, e, buf)
                    else:
                        fill(i, self._entry(i, e, buf))
        self._eager_end(s, root, stamp)

    def refuse_gather(self, text: str, kind: type[Exception] = ValueError) -> None:
        """:meth:`refuse` for a gather, whose others have stamped their blocks (its eager path:
        their part is done, as a send's; the stamps are taken, unused) or wait at a sync, or
        refuse it too, each as its root (refused, at a sync). Raises: as :meth:`sync`."""
        s = self._bseq + 1
        word, want, epoch = EAGER_STAMP + s % EAGER_RING, s & SEQ_MASK, self.epoch
        me = self.chan.rank
        others = [i for i in range(self.chan.size) if i != me]
        refusing = self._mine[REFUSING] = epoch << 32 | want  # (stale after a sync or call)

        def unsettled() -> list[int]:
            return [i for i in others if self._ctr[i][word] >> 32 != want
                    and self._ctr[i][0] <= epoch and self._ctr[i][REFUSING] != refusing]

        if unsettled():
            self._eager_wait(lambda: not unsettled(), unsettled, "their part of the call")
        if others and all(self._ctr[i][word] >> 32 == want for i in others):
            self._sig = None
            self._eager_end(s, me, self._ctr[others[0]][word])
        else:
            self.refuse(text, kind)

    def _eager_begin(self) -> tuple[int, int, int]:
        """The next eager call's number, its ring entry's header word and its stamp (written
        out in the broadcast's and the gather's runners too: see shm_eager_runners)."""
        s = self._bseq + 1
        sig = self._sig
        self._sig = None  # no sync checks this call
        assert sig is not None, "begin() names the call first"
        # the call number too: a rank that left an earlier call before stamping it stamps its
        # next call into the same entry, and that must not pass for this one
        mark = (sig[1] ^ (sig[0] * 0x9E3779B1) ^ (self._seq * 0x85EBCA77)) & 0xFFFFFFFE
        return s, EAGER_STAMP + s % EAGER_RING, (s & SEQ_MASK) << 32 | mark  # (bit 0: large)

    def _eager_put(self, buf: Array, s: int, word: int, stamp: int, alone: bool,
                   fill: Fill | None = None, need: int = -1) -> None:
        """Put ``buf`` (``need`` bytes of it, if given) in this rank's entry of eager call
        ``s`` (or ``fill`` it: see :meth:`eager_bcast`); ``alone``: a broadcast's root."""
        me = self.chan.rank
        large = (buf.nbytes if need < 0 else need) > EAGER_SMALL
        lag = EAGER_BIG if large else EAGER_RING
        if s - lag > self._ring_done:  # the entry may not have been read yet
            self._ring_space(s - lag)
        e = EAGER_RING + s % EAGER_BIG if large else s % EAGER_RING
        if fill is None:
            self._entry(me, e, buf)[...] = buf
        else:
            fill(me, self._entry(me, e, buf))
        self._mine[word] = stamp | large
        want = stamp >> 32
        for c in self._others if alone else ():
            if c[word] >> 32 == want:  # (of two such roots, the later one sees it)
                self._two_roots(word, want)

    def _two_roots(self, word: int, want: int) -> NoReturn:
        """Raise MismatchError: a peer stamped eager call ``want`` in its ring's ``word`` too
        (it and this rank both called the broadcast as its root)."""
        me = self.chan.rank
        them = [i for i, d in enumerate(self._ctr) if i != me and d[word] >> 32 == want]
        raise MismatchError(f"{self.what}: ranks {me} and {them[0]} both called it as the root")

    def _eager_take(self, rank: int, s: int, word: int, stamp: int,
                    who: tuple[str, str, str]) -> int:
        """Wait until ``rank`` has stamped its entry of eager call ``s`` with ``stamp``
        (``who``: what it is, what it makes, how, for messages); the stamp (bit 0: the entry
        is large). Raises: MismatchError (it went on to another call, or stamped another
        signature); the root's refusal of the call, if it made one (see :meth:`refuse`)."""
        src = self._ctr[rank]
        want = s & SEQ_MASK
        if src[word] >> 32 != want:
            epoch = self.epoch

            def stamped() -> bool:
                # the rank's sync counter first: once it is past this rank's, the stamp
                # (stored before it) is visible if it made this call at all
                return src[word] >> 32 == want or src[0] > epoch

            self._eager_wait(stamped, lambda: [rank], f"rank {rank}'s {who[1]} {s}")
        got: int = src[word]
        if got | 1 == stamp | 1:
            return got
        self._check_failed()
        if src[SEQ_WORD + ((self.epoch + 1) & 1)] == self._seq | REFUSED:
            self.sync()  # the root refused the call at a sync (see refuse): join it, which
            # raises the refusal and keeps the syncs in step
        call, there = self._call, 8 + 2 * (src[0] & 1)  # (its sync's signature words)
        if (got >> 32 != want and src[0] > self.epoch and call is not None
                and src[SEQ_WORD + (src[0] & 1)] == self._seq
                and src[there + 1] & 0xFFFFFFFF == call[1]):
            # at a sync of this same call, made alike: its sizes sent it through the slots
            raise MismatchError(
                f"{self.what}: rank {rank}, {who[0]}, waits at this call's sync instead of "
                f"making this {who[1]}: it was given other sizes than this rank (this rank: "
                f"{call[2]})")
        if got >> 32 != want:
            raise MismatchError(
                f"{self.what}: rank {rank}, {who[0]}, went on to another collective without "
                f"making this {who[1]} (ranks called different collectives)")
        raise MismatchError(
            f"{self.what}: rank {rank}, {who[0]}, {who[2]} something else (size, type or root "
            f"differ: signature {got & 0xFFFFFFFE:08x} against this rank's "
            f"{stamp & 0xFFFFFFFE:08x})")

    def _eager_end(self, s: int, root: int, stamp: int) -> None:
        """Count eager call ``s`` done, hashed into what the next sync compares (root, sig);
        written out in the broadcast's and the gather's runners too (see shm_eager_runners)."""
        self._mine[EAGER_DONE] = s
        self._bseq = s
        mark = stamp & 0xFFFFFFFE  # (a sender's, in refuse_gather: not whether it was large)
        self._bhash = (self._bhash * 1000003 + (root + 1) * 0x9E3779B1 + mark) & SEQ_MASK
        self._wake()  # (the channel's wake_peers, made once: two calls fewer)

    def _ring_space(self, need: int) -> None:
        """Wait until every rank has finished broadcast ``need``; note how far all have got
        (so that the next calls need not look)."""
        ctr = self._ctr
        if any(c[EAGER_DONE] < need for c in ctr):
            self._eager_wait(lambda: all(c[EAGER_DONE] >= need for c in ctr),
                             lambda: [i for i, c in enumerate(ctr) if c[EAGER_DONE] < need],
                             f"rank(s) to take broadcast {need} out of the ring")
        self._ring_done = min(c[EAGER_DONE] for c in ctr)

    def _entry(self, rank: int, e: int, like: Array, skip: int = 0) -> Array:
        """Entry ``e`` of ``rank``'s eager ring (small below EAGER_RING, large from there), as
        ``like``'s dtype and size (at most the entry's), from element ``skip`` on (cached)."""
        key = (rank, e, like.dtype, like.size, skip)
        view = self._ring_cache.get(key)
        if view is None:
            if len(self._ring_cache) > 4096:  # (a gather root reads up to 40 entries a rank)
                self._ring_cache.clear()
            at, room = ((e * EAGER_SMALL, EAGER_SMALL) if e < EAGER_RING else
                        (EAGER_RING * EAGER_SMALL + (e - EAGER_RING) * EAGER_MAX, EAGER_MAX))
            lo = at + skip * like.itemsize
            view = self._ring_cache[key] = self._ring[rank][
                lo : lo + min(like.nbytes, at + room - lo)].view(like.dtype)
        return view

    def await_peer(self, rank: int, cond: Callable[[], bool], what: str) -> None:
        """Wait until ``cond()``, a flag ``rank`` sets in shared memory (``what``: for
        messages). Raises: as :meth:`sync` (the rank failed, left the call, or is late)."""
        if not cond():
            self._eager_wait(cond, lambda: [rank], what)

    def _eager_wait(self, cond: Callable[[], bool], missing: Callable[[], list[int]],
                    what: str) -> None:
        ranks = self.chan.world_ranks
        self.chan.spin_until(cond, self.timeout, lambda: f"{self.what}, waiting for {what}",
                             lambda: [ranks[i] for i in missing()],
                             partial(self._check_failed, cond))

    # ------------------------------------------------------------ calls left with an error
    def abandon(self, exc: BaseException) -> None:
        """Record that this rank leaves the call in progress with ``exc``; the windows are
        unusable from now on (the ranks' sync counts and streams no longer line up).

        Peers find it in this rank's header: those waiting in the call (or any later one) raise
        at once, naming the first rank that failed and why, instead of waiting for a count this
        rank may reach in its next call, with other data. This rank's later shared-memory calls
        on the communicator raise too; a mismatch also breaks its collective sequence, as on
        the message path. Idempotent. Cost: a few header writes.
        """
        if self.broken is not None or getattr(exc, "in_step", False):
            return
        me = self.chan.world_ranks[self.chan.rank]
        found: tuple[int, int, str] | None = getattr(exc, "first_failure", None)
        if found is not None:
            how, first, text = found
        elif isinstance(exc, PeerFailure):  # the failed rank is the first failure
            how, first, text = 3, exc.rank, exc.detail.split("; while waiting")[0]
        else:
            how = 1 if isinstance(exc, MismatchError) else 2
            first, text = me, f"{type(exc).__name__}: {exc}"
        self.broken = (how, first, text)
        write_text(self._mine, text)
        mine = self._mine
        mine[FAILED_FROM] = how | (first + 1) << 8
        mine[FAILED] = self._seq + 1  # last: a peer that sees it sees the rest
        if how == 1:
            self.chan.note_broken_sequence(self._seq, text.removeprefix("MismatchError: "))
        self.chan.wake_peers()

    def _check_failed(self, cond: Callable[[], bool] | None = None) -> None:
        """Raise if a rank has left a call (see :meth:`abandon`), or the communicator's
        collective sequence broke elsewhere (a rank on the message path found a mismatch).
        ``cond``: what a wait waits for; if it holds after all (the rank did its part here,
        then left), nothing is wrong here. A rank that left makes no later call on these
        windows, so nothing it does after can make ``cond`` hold."""
        failed = [i for i, c in enumerate(self._ctr) if c[FAILED] and i != self.chan.rank]
        seq = self._seq & ~REFUSED  # (set while this rank refuses the call)
        if not failed:
            if seq >= 0:
                self.chan.check_sequence(seq, self._sig)
            return
        if cond is not None and cond():
            return
        # the rank whose own failure it was, if one says so; else the first to tell
        ranks = self.chan.world_ranks
        pick = failed[0]
        for i in failed:
            if self._ctr[i][FAILED_FROM] >> 8 == ranks[i] + 1:
                pick = i
                break
            if self._ctr[i][FAILED_FROM] & 0xFF == 3:  # a failed peer: name it
                pick = i
        c = self._ctr[pick]
        how, first = c[FAILED_FROM] & 0xFF, (c[FAILED_FROM] >> 8) - 1
        text = read_text(self._ctr[pick])
        if how == 1 and seq >= 0:  # a mismatch: its whole text where it was published (the
            try:  # header holds FAILED_TEXT_BYTES of it)
                self.chan.raise_published(seq)
            except MismatchError as exc:  # (first found by that rank: see abandon)
                setattr(exc, "first_failure", (how, first, text))  # noqa: B010
                raise
        raise peer_left(how, first, text, self.what, c[FAILED] - 1)

    def unsign(self) -> None:
        """The call begun checks call numbers only at its syncs: a root that refuses a call it
        cannot size (see :meth:`refuse`) has no signature to compare."""
        self._sig = None

    def refuse(self, text: str, kind: type[Exception] = ValueError) -> None:
        """This rank, the root of the call begun, refuses it: its arguments are wrong in a way
        only it can see (``text`` says how). It takes part in the call's first sync, where
        every other rank raises ``kind`` with ``text`` (all at the same sync, so the windows
        stay in step and usable); the caller then raises its own error.

        Raises:
            Timeout, PeerFailure: as :meth:`sync`.
        """
        write_text(self._mine, text)
        self._mine[REFUSED_KIND] = 2 if kind is TypeError else 1
        seq = self._seq
        self._seq = seq | REFUSED  # what this sync's call-number word says
        try:
            self.sync()
        except BaseException as exc:
            self._seq = seq
            self.abandon(exc)
            raise
        self._seq = seq

    def _describe(self) -> tuple[int, str] | None:
        """The call in progress, for the monitor: (its number, its signature text)."""
        sig = self._call
        return None if sig is None else (self._seq, f"{sig[2]} (shm, {sig[0]} bytes)")

    def _broken_error(self) -> CommError:
        """The error of a call on windows that a failure made unusable (see :meth:`abandon`)."""
        assert self.broken is not None
        how, first, text = self.broken
        kind = MismatchError if how == 1 else CommBroken
        return kind(f"{self.what}: the shared-memory collectives on {self.chan.name} stopped "
                    f"when world rank {first} left a call with {text}")

    @property
    def counters(self) -> list[memoryview]:
        """Every rank's header words (28: pieces produced, 30, 31: the stream's size and
        pieces; CONSUMED + j: pieces taken from rank j's stream)."""
        return self._ctr

    def wait_for(self, cond: Callable[[], bool], missing: Callable[[], Collection[int]],
                 what: str) -> None:
        """Wait for a condition on the counters (see :meth:`Channel.spin_until`).

        Raises:
            as :meth:`Channel.spin_until`; CommBroken or MismatchError when a rank left
            the call (see :meth:`abandon`).
        """
        self.chan.spin_until(cond, self.timeout, lambda: f"{self.what}, waiting for {what}",
                             missing, partial(self._check_failed, cond))

    def _wait(self, e: int) -> None:
        ctr = self._ctr

        def arrived() -> bool:
            return all(c[0] >= e for c in ctr)

        ranks = self.chan.world_ranks

        def missing() -> Collection[int]:
            return [ranks[i] for i, c in enumerate(ctr) if c[0] < e]

        def describe() -> str:
            who = [i for i, c in enumerate(ctr) if c[0] < e]
            return f"{self.what}, shared-memory sync {e}, waiting for rank(s) {who}"

        self.chan.spin_until(arrived, self.timeout, describe, missing,
                             partial(self._check_failed, arrived))

