"""The narrow surface collective algorithms run on: a communicator's channel.

A :class:`Channel` is what the executor (schedules over messages) and the shared-memory arena
(windows) use of a communicator, and all they use: sends and receives on the collective
context (buffers, values, encoded values), the call numbers (``next_seq``, ``begin_call``) and
the checks of a broken sequence, the bookkeeping of a call in progress (registered to advance
from every progress call, reported when left with an error), waiting on a step's messages or
on a flag in shared memory while messages keep moving, shared windows and single-copy peer
reads and writes, and the description of a call in progress for the monitor. The algorithms
never hold the engine, nor touch a private attribute of these objects
(``tests/architecture/test_algorithms_surface.py`` checks it). The user's
:class:`~ringworld.comm.point_to_point.PointToPoint` (and the full Communicator on it) owns one
as ``_chan``; none of this is on the user's communicator.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ringworld.comm import serialize as objects
from ringworld.comm.engine import CHECK_PEERS_EVERY, Awaits, Engine
from ringworld.comm.pacing import SLEEP, SPIN, YIELD, Pacer
from ringworld.comm.requests import (
    SEQ_MASK,
    SIG_SHIFT,
    TAG_UB,
    BlockRecvRequest,
    RecvRequest,
    Request,
    SendRequest,
    check_timeout,
)
from ringworld.errors import PeerFailure, TransportError
from ringworld.transport.base import Transport

SHM_SPIN_POLLS = 200       # flag checks before the pacer decides (see ringworld.comm.pacing)
SHM_SPIN_TIME = 0.005      # then spin this long while the awaited ranks run on other CPUs
# ... when ranks outnumber cores: none, the awaited rank needs this core at once (np=4 on 2
# cores, a shared-memory barrier: 43-52 us yielding at once, 103-119 us after 32 checks)
SHM_SPIN_POLLS_CROWDED = 0
SHM_SLEEP_SLICE = 0.0005   # longest sleep: bounds a wake-up lost between flag and sleep
SHM_YIELDS = 1000         # crowded ranks: sched_yield calls between spinning and sleeping


def _no_wake() -> None:
    """The waker of a communicator without shared windows: nobody sleeps on a flag."""


class Channel:
    """A communicator's collective context, call numbers and shared memory, for algorithms.

    ``ranks`` maps the communicator's ranks to world ranks; ``coll_context`` is its
    collective context id. Cost: none until used.
    """

    def __init__(self, engine: Engine, ranks: Sequence[int], coll_context: int,
                 name: str) -> None:
        self._engine = engine
        self._ranks = tuple(ranks)
        self._identity = self._ranks == tuple(range(engine.size))
        self._to_comm_map = {w: i for i, w in enumerate(self._ranks)}
        self.rank = self._to_comm_map.get(engine.rank, -1)  # -1: this rank is no member
        self.size = len(self._ranks)
        self.coll_context = coll_context
        self.name = name
        self._coll_seq = 0
        self._wake: Callable[[], None] | None = None
        self._wt: Transport | None = None
        self._wt_known = False
        self._closers: dict[str, weakref.finalize[Any, Any]] = {}  # window key -> its closer

    def to_comm(self, world_rank: int) -> int:
        """The communicator rank of ``world_rank`` (-1 if it is no member)."""
        return world_rank if self._identity else self._to_comm_map.get(world_rank, -1)

    @property
    def world_ranks(self) -> tuple[int, ...]:
        """The world rank of each rank of the communicator, in rank order."""
        return self._ranks

    @property
    def seq(self) -> int:
        """The number the next collective call on the communicator will take."""
        return self._coll_seq

    # ------------------------------------------------- the surface collectives are built on
    def coll_isend(self, view: memoryview, dest: int, tag: int) -> SendRequest | None:
        """Start sending ``view`` to rank ``dest`` on the collective context; None if done.

        For collective algorithms: ``dest`` is trusted (a schedule's peer), ``tag`` is the
        collective's sequence number, so concurrent collectives never match each other.
        """
        w = self._ranks[dest]
        h = self._engine.isend(w, self.coll_context, tag, 0, (view,), len(view))
        return None if h.done else SendRequest(self._engine, h, w, view, self.coll_context)

    def coll_irecv(self, view: memoryview, source: int, tag: int) -> BlockRecvRequest:
        """Post a receive of exactly ``len(view)`` bytes from rank ``source`` on the collective
        context (a shorter message fails it with ShortMessageError)."""
        req = BlockRecvRequest(self._engine, self.coll_context, self._ranks[source], tag, view,
                                self.to_comm)
        self._engine.post(req)
        return req

    def coll_take(self, view: memoryview, source: int, tag: int) -> bool:
        """Receive exactly ``len(view)`` bytes from rank ``source`` on the collective context
        straight from the transport, as a blocking receive takes a small message (see
        :meth:`Engine.take_direct`); False, having taken nothing, where :meth:`coll_irecv`
        must: nothing came within the receive spin, another message is next, or one of another
        length (that path reports it). Cost: at most the engine's receive spin of peeks."""
        e = self._engine
        return e.take_direct(self.coll_context, self._ranks[source], tag, view, e.recv_spin,
                             True) is not None

    def coll_isend_raw(self, segments: Sequence[memoryview], nbytes: int, flags: int,
                       dest: int, tag: int, keep: object = None) -> SendRequest | None:
        """Start sending an encoded value (see :mod:`ringworld.comm.serialize`) as is."""
        w = self._ranks[dest]
        h = self._engine.isend(w, self.coll_context, tag, flags, segments, nbytes)
        return None if h.done else SendRequest(self._engine, h, w, (segments, keep),
                                               self.coll_context)

    def coll_irecv_raw(self, source: int, tag: int) -> RawRecvRequest:
        """Post a receive of an encoded value; ``wait()`` returns (flags, payload)."""
        req = RawRecvRequest(self._engine, self.coll_context, self._ranks[source], tag, None,
                             self.to_comm)
        self._engine.post(req)
        return req

    # ------------------------------------------------- shared memory between the ranks
    def _window_transport(self) -> Transport | None:
        """The one transport reaching every other rank, if it maps shared windows (cached:
        the routes are fixed from init to close, and callers include per-call paths)."""
        if not self._wt_known:
            route = self._engine.route
            ts = {route[w] for w in self._ranks if w != self._engine.rank}
            t = next(iter(ts)) if len(ts) == 1 else None
            self._wt = t if t is not None and t.supports_shared_windows else None
            self._wt_known = True
        return self._wt

    @property
    def supports_shared_memory(self) -> bool:
        """Whether every rank of this communicator can map memory of every other."""
        return self.size > 1 and self._window_transport() is not None

    def map_shared(self, nbytes: int, key: str, sync: Callable[[], None]) -> list[memoryview]:
        """Collectively give each rank a shared segment of ``nbytes``; return all, rank order.

        Like MPI_Win_allocate_shared: each rank creates its own segment; ``sync`` (a barrier
        of this communicator) separates creating, attaching and unlinking, so the names are
        gone once this returns (nothing left behind if the job is killed later). ``key`` must be
        unique for this communicator and identical on every rank. Cost: one mapping per rank.

        Raises:
            TransportError: the ranks cannot share memory, or it is exhausted.
            MismatchError / CommBroken: a rank gave up the call (``sync``) after the first
                sync, for this reason (another call's message, an error), and took its
                segment away.
        """
        t = self._window_transport()
        if t is None:
            raise TransportError(f"the ranks of {self.name} cannot share memory")
        full = f"{self.coll_context - 1}x{key}"  # the point-to-point context: as before
        views: list[memoryview] = []
        try:
            mine = t.window_create(full, nbytes)
            sync()
            for i, w in enumerate(self._ranks):
                try:
                    views.append(mine if i == self.rank else t.window_attach(w, full, nbytes))
                except TransportError:
                    # its owner passed the first sync, then gave up the call: its reason
                    self.raise_published(self._coll_seq - 1)
                    raise
            sync()
        finally:
            t.window_unlink(full)
        # a communicator dropped without free() still releases its windows when collected
        self._closers[key] = weakref.finalize(self, t.window_close, full)
        return views

    @property
    def supports_peer_reads(self) -> bool:
        """Whether :meth:`read_peer` may work (one host, a transport that can do it)."""
        t = self._window_transport()
        return t is not None and t.supports_peer_reads

    def read_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        """Copy ``nbytes`` from address ``remote_addr`` of rank ``rank`` to ``local_addr``.

        A single copy between the ranks' own buffers (the caller learned ``remote_addr``
        through shared memory and keeps the peer from touching it meanwhile).

        Raises:
            TransportError: not possible between these ranks, or the read failed.
        """
        self._peer_transport("read").read_peer(self._ranks[rank], remote_addr, local_addr,
                                                nbytes)

    def write_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``local_addr`` here to address ``remote_addr`` of rank ``rank``
        (the mirror of :meth:`read_peer`; the peer keeps that memory untouched meanwhile).

        Raises:
            TransportError: not possible between these ranks, or the write failed.
        """
        self._peer_transport("write").write_peer(self._ranks[rank], remote_addr, local_addr,
                                                  nbytes)

    def peer_copier(self, rank: int, write: bool) -> Callable[[int, int, int], None]:
        """:meth:`write_peer` (``write``) or :meth:`read_peer` with ``rank``, as a function of
        (remote_addr, local_addr, nbytes) made once: a caller that copies often keeps it.

        Raises:
            TransportError: not possible between these ranks (the copies raise it too).
        """
        return self._peer_transport("write" if write else "read").peer_copier(
            self._ranks[rank], write)

    def _peer_transport(self, verb: str) -> Transport:
        """The transport that maps this communicator's windows; TransportError if none."""
        t = self._window_transport()
        if t is None:
            raise TransportError(f"the ranks of {self.name} cannot {verb} each other's memory")
        return t

    def unmap_shared(self, key: str) -> None:
        """Release the segments :meth:`map_shared` mapped under ``key`` (drop views first)."""
        closer = self._closers.pop(key, None)
        if closer is not None:
            closer()  # closes the window (once), and forgets the finalizer

    def spin_until(self, cond: Callable[[], bool], timeout: float | None,
                   describe: Callable[[], str], waiting_for: Callable[[], Collection[int]],
                   abort: Callable[[], None] | None = None) -> None:
        """Wait for ``cond()`` (a flag in shared memory), keeping messages moving.

        Spins first (the flag usually flips within microseconds), polling the transports every
        few checks so nonblocking operations progress; then sleeps in the transport's
        ``wait_event`` in short slices (peers that flip a flag call :meth:`wake_peers`), so
        ranks that outnumber the cores hand theirs to the rank being waited for. Checks peers'
        liveness every 50 ms; ``waiting_for()`` names the world ranks still awaited. ``abort()``,
        if given, is called now and then once the first spin is over: it raises to end the wait
        (a peer that left the call, say).

        Raises:
            Timeout: not true within ``timeout`` (default: the job's); names what was awaited.
            PeerFailure: an awaited rank has exited.
        """
        if cond():
            return
        engine = self._engine
        try:
            self._spin_loop(cond, engine.timeout if timeout is None else check_timeout(timeout),
                            describe, waiting_for, abort)
        finally:
            engine.waiting = engine.waiting_call = None  # set once the wait got long

    def _spin_loop(self, cond: Callable[[], bool], timeout: float | None,
                   describe: Callable[[], str], waiting_for: Callable[[], Collection[int]],
                   abort: Callable[[], None] | None) -> None:
        engine = self._engine

        def waiting() -> bool:
            return not cond()

        polls = 0
        deadline = None
        next_check = 0.0
        transports = engine.transports
        sleeper = transports[0] if len(transports) == 1 else None
        placement = engine.placement
        spin = (SHM_SPIN_POLLS_CROWDED if engine.crowded or placement.shared
                else SHM_SPIN_POLLS)
        pacer: Pacer | None = None
        while not cond():
            polls += 1
            if polls & 15 == 0:
                engine.progress()
            if polls < spin:
                continue
            if abort is not None and polls & 15 == 0:
                abort()
            now = time.monotonic()
            if deadline is None:
                deadline = math.inf if timeout is None else now + timeout
                next_check = now + CHECK_PEERS_EVERY
                engine.waiting = describe
                engine.waiting_since = since = time.time()
                ctx = self.coll_context
                engine.waiting_call = (ctx, engine.entered.get(ctx, -1), since, lambda ranks: next(
                    (w for w in waiting_for() if w in ranks), None), self._ranks, None)
            if now >= next_check:
                next_check = now + CHECK_PEERS_EVERY
                engine.check_peers()
                if engine.revoked and self.coll_context in engine.revoked:
                    raise engine.revoked[self.coll_context]
                dead = [w for w in waiting_for() if w in engine.dead]
                if engine.reported and not dead:  # a member hangs: the sync never ends
                    dead = [w for w in self._ranks if w in engine.reported]
                if dead and engine.explained(dead[0]) and abort is not None:
                    abort()  # raises the published reason, if it is this call's
                if dead:
                    raise engine.peer_failure(dead[0], describe())
            if now >= deadline:
                if cond():
                    return
                assert timeout is not None
                raise engine.timeout_error(describe(), timeout,
                                           f"rank {self.rank} of {self.size} on {self.name}")
            if engine.crowded:  # a rank queued on this core (maybe the awaited one) goes first
                step = SLEEP if sleeper is not None and polls >= spin + SHM_YIELDS else YIELD
            else:
                if pacer is None:
                    pacer = Pacer(self._window_transport(), waiting_for, SHM_SPIN_TIME, now,
                                  placement)
                step = pacer.step(now)
            if step == SLEEP and sleeper is not None:
                sleeper.wait_event(SHM_SLEEP_SLICE, waiting)
                engine.progress()
            elif step != SPIN:
                os.sched_yield()

    @property
    def oversubscribed(self) -> bool:
        """Whether this job has more ranks than this host has cores (then waits spin little)."""
        return self._engine.crowded

    @property
    def sharing_cpu(self) -> bool:
        """Whether this rank's waits last found a peer queued on its CPU (then a wait should
        give the CPU up at once; see :mod:`ringworld.comm.pacing`)."""
        return self._engine.placement.shared

    def wake_peers(self) -> None:
        """Wake the ranks of this communicator that sleep in :meth:`spin_until`."""
        self.waker()()

    def waker(self) -> Callable[[], None]:
        """:meth:`wake_peers` as a function of no arguments (made once: a sync's caller keeps
        it, and saves the method calls on its per-call path)."""
        found = self._wake
        if found is None:
            t = self._window_transport()
            me = self._engine.rank
            others = tuple(w for w in self._ranks if w != me)
            found = self._wake = _no_wake if t is None else t.waker(others)
        return found

    def next_seq(self) -> int:
        """The sequence number (tag) of this rank's next collective on this communicator."""
        seq = self._coll_seq
        self._coll_seq = (seq + 1) & TAG_UB
        e = self._engine
        e.entered[self.coll_context] = seq  # for the monitor: who entered which collective
        e.current = (self.coll_context, seq, self.name, self._ranks)
        return seq

    # ------------------------------------------------- a collective call's bookkeeping
    def init_request(self, req: Request[Any]) -> None:
        """Set up the :class:`Request` part of ``req``, a request an algorithm defines (the
        executor's), in place of ``super().__init__``: its ``wait`` and ``test`` then make
        progress on this rank. (The algorithms never hold the engine.)"""
        Request.__init__(req, self._engine)

    def begin_call(self, sig: int = 0) -> int:
        """Take this rank's next collective call number on this communicator (as
        :meth:`next_seq`); return the call's tag, ``number | sig << SIG_SHIFT``.

        ``sig`` is the call's 16-bit signature (0: unsigned). It rides in the tag's high bits:
        the engine fails a receive whose peer sent the same number with another signature, and
        a signed call is noted as this rank's current one, so that a message of it queued with
        another signature is found too (a root that only sends). Cost: as :meth:`next_seq`,
        plus two dict lookups when signed.

        Raises:
            MismatchError: the sequence broke at an earlier call (raised before anything of
                this call is sent).
        """
        seq = self._coll_seq  # next_seq, inlined: once per collective call
        self._coll_seq = (seq + 1) & TAG_UB
        e = self._engine
        ctx = self.coll_context
        e.entered[ctx] = seq
        e.current = (ctx, seq, self.name, self._ranks)
        tag = seq | (sig << SIG_SHIFT)
        if sig:
            e.note_call(ctx, tag)
        if e.mismatched or e.remote_mismatches:  # broke earlier: fail before sending
            e.check_mismatched(ctx, seq)
        return tag

    def check_call(self, tag: int) -> None:
        """Raise if call ``tag`` (from :meth:`begin_call`) cannot complete: the sequence broke
        at it or before, or a member left it with an error. For a call waiting on its messages
        (its sends may wait for receivers that never come). Cost: four attribute tests.

        Raises:
            MismatchError: the sequence broke at this call or before.
            CommBroken: a member left this call with an error (ValueError / TypeError: a root
                refused the call's arguments).
        """
        e = self._engine
        if e.mismatched or e.remote_mismatches:
            e.check_mismatched(self.coll_context, tag & SEQ_MASK)
        if e.left_calls or e.remote_left:
            e.check_left(self.coll_context, tag & SEQ_MASK)

    def check_completed(self, tag: int) -> None:
        """Raise if call ``tag``, whose messages have all arrived, was found broken meanwhile
        (a stray message noted while it ran, or a mismatch on this rank).

        Raises:
            MismatchError: as above.
        """
        e = self._engine
        if e.strays or e.mismatched:
            e.check_mismatched(self.coll_context, tag & SEQ_MASK)

    def register_call(self, tag: int, poll: Callable[[], object]) -> None:
        """Run ``poll`` from every progress call on this rank (any wait, any test) until
        :meth:`unregister_call`: it advances call ``tag``, a nonblocking collective in progress,
        whose messages are expected meanwhile (they are no strays)."""
        e = self._engine
        e.background.append(poll)
        e.open_calls[self.coll_context].add(tag & SEQ_MASK)

    def unregister_call(self, tag: int, poll: Callable[[], object], completed: bool) -> None:
        """Undo :meth:`register_call`. ``completed`` false: the call failed here, and its
        messages that may still come stay expected (see :meth:`abandon_call`)."""
        e = self._engine
        with contextlib.suppress(ValueError):
            e.background.remove(poll)
        if completed:
            e.close_call(self.coll_context, tag & SEQ_MASK)

    def abandon_call(self, tag: int) -> None:
        """Note that this rank gave up call ``tag``: its messages may still come, and are
        taken and dropped as expected, not found as strays (a mismatch) nor kept."""
        self._engine.give_up_call(self.coll_context, tag & SEQ_MASK)

    def report_left(self, tag: int, text: str) -> None:
        """Tell every rank that this rank left call ``tag`` with an error (``text``: "the
        call with the error"): members waiting in it for this rank's part fail instead of
        waiting. Best effort (without a monitor they wait for their timeout)."""
        self._engine.report_left(self.coll_context, tag & SEQ_MASK, text)

    def report_failure(self, exc: PeerFailure) -> None:
        """Tell every rank that world rank ``exc.rank`` failed a collective: it left without
        doing its part. Once per rank; best effort."""
        self._engine.report_failure(exc)

    def first_reported(self) -> int | None:
        """The lowest world rank of this communicator reported failed (hung, or by the
        launcher), or None: a collective never ends without it."""
        failed = self._engine.reported
        if failed:
            hit = [w for w in self._ranks if w in failed]
            if hit:
                return min(hit)
        return None

    def progress_until(self, cond: Callable[[], bool], timeout: float | None,
                       describe: Callable[[], str],
                       depends: Callable[[Collection[int]], int | None],
                       call: tuple[int, Awaits] | None = None) -> None:
        """Make progress until ``cond()`` holds (which may raise to end the wait).

        ``timeout`` None: the job's. ``depends(dead_world_ranks)`` names a dead rank the wait
        needs (then it fails), or None. ``call``: a collective call's (tag, awaits), for the
        monitor (see ``Engine.wait_for``).

        Raises:
            Timeout: ``cond`` did not hold in time; the text is ``describe()``.
            PeerFailure: a rank the wait depends on has exited.
            CommBroken: the engine failed.
        """
        e = self._engine
        e.wait_for(cond, timeout, describe, depends, call=None if call is None else (
            self.coll_context, call[0] & SEQ_MASK, call[1], self._ranks,
            e.signatures.get(call[0] >> SIG_SHIFT)))

    def wait_recv(self, req: RecvRequest[Any], cond: Callable[[], bool], timeout: float | None,
                  describe: Callable[[], str],
                  depends: Callable[[Collection[int]], int | None],
                  call: tuple[int, Awaits] | None = None) -> None:
        """Wait for ``req``, the only transfer of a schedule's step, as a blocking receive
        waits: spin on the transport first (no clock reads: the latency-critical case), then
        :meth:`progress_until` ``cond()`` (the step is done; it may raise: the call broke).

        Raises:
            As :meth:`progress_until`, and the receive's own error (a TruncationError, a
            MismatchError...).
        """
        if not req._done:
            e = self._engine
            e.spin(req, e.recv_spin)
            if not req._done:
                self.progress_until(cond, timeout, describe, depends, call)
        if req._error is not None:
            raise req._error

    def describe_calls(self, describe: Callable[[], Callable[[], tuple[int, str] | None] | None]
                       ) -> None:
        """Register how to describe this communicator's collective in progress on a path that
        sends no messages (the shared-memory windows): ``describe()()`` gives (call number, the
        call's signature text), or None (``describe`` is a weak reference to the method, so
        the registration keeps nothing alive). The monitor compares it with the members'."""
        self._engine.call_describers[self.coll_context] = describe

    def note_broken_sequence(self, seq: int, text: str) -> None:
        """Break this communicator's collective sequence at call ``seq`` on this rank: ranks
        disagreed there (``text`` says how); this and every later collective call raises
        MismatchError showing it, on every path."""
        self._engine.mismatched.setdefault(self.coll_context, (seq, text))
        self._engine.unsurfaced.pop(self.coll_context, None)  # the caller raises it

    def raise_published(self, seq: int) -> None:
        """Raise what other ranks published that breaks this communicator's call ``seq`` (a
        mismatch, a member that left it), taken in now; return if nothing is. Cost: a few
        store round trips (see ``Engine.raise_published``)."""
        self._engine.raise_published(self.coll_context, seq)

    def check_sequence(self, seq: int, sig: Any = None) -> None:
        """Raise if this communicator's collective sequence broke at call ``seq`` or before
        (found by this rank or published by another). The first check in a call notes it as
        the call in progress (``sig``: its shared-memory signature), so that messages another
        rank sends in the same call, on another path, are found as a mismatch.

        Raises:
            MismatchError: as above.
        """
        e = self._engine
        ctx = self.coll_context
        if sig is not None and e.entered_tag.get(ctx, -1) & SEQ_MASK != seq:
            e.note_call(ctx, seq | e.sign(f"{sig[2]} (shm, {sig[0]} bytes)") << SIG_SHIFT)
        if e.mismatched or e.remote_mismatches or e.strays:
            e.check_mismatched(ctx, seq)
        if e.left_calls or e.remote_left:  # a rank (a root refusing its arguments) left it
            e.check_left(ctx, seq)


class ObjectRecvRequest(RecvRequest[Any]):
    """A receive of a pickled value; ``wait()`` returns the value."""

    __slots__ = ()

    def _value(self) -> Any:
        if self._error is not None:
            raise self._error
        if self.dest is not None:
            if self.incoming_flags == objects.FLAG_OBJ:  # the common case, inlined
                self._result = pickle.loads(self.dest)
            else:
                self._result = objects.decode(self.dest, self.incoming_flags)
            self.dest = None  # the value owns the buffers it needs
        return self._result


class RawRecvRequest(RecvRequest[tuple[int, memoryview]]):
    """A receive of an encoded value kept encoded; ``wait()`` returns (flags, payload)."""

    __slots__ = ()

    def _value(self) -> tuple[int, memoryview]:
        if self._error is not None:
            raise self._error
        assert self.dest is not None
        return self.incoming_flags, self.dest
