"""The progress engine: MPI matching over the transports of one rank, and waiting.

Matching follows MPI. Arriving messages are offered to the posted receives of their context in
posting order; the first whose (source, tag) accepts them wins. Unmatched messages wait in the
context's unexpected queue in arrival order, and a newly posted receive takes the first one it
accepts. Transports are FIFO per sender, so two messages from one sender on one context and tag
are received in the order sent (the non-overtaking rule).

Waiting spins on the transports briefly (lowest latency), then yields the CPU, then sleeps in the
transport's ``wait_event`` (doorbell / select), so jobs with more ranks than cores keep working.
Peers are checked for liveness while waiting; a failure breaks the engine and is raised on every
later call.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ringworld.comm.calls import CallChecks, _nothing
from ringworld.comm.hooks import observable, observed
from ringworld.comm.pacing import SLEEP, SPIN, YIELD, Outside, Pacer, Placement
from ringworld.comm.requests import (
    ACK_CONTEXT,
    ANY_SOURCE,
    ANY_TAG,
    FLAG_SYNC,
    SEQ_MASK,
    RecvRequest,
    SyncSendRequest,
    check_timeout,
)
from ringworld.errors import (
    CommBroken,
    CommRevoked,
    MismatchError,
    PeerFailure,
    RingworldError,
    Timeout,
    TransportError,
)
from ringworld.transport.base import BufferedIncoming, Incoming, SendHandle, Transport

#: how a collective's wait says what it waits for: ``awaits(world_ranks)`` gives one of them
#: that the wait still needs a message from, or None
Awaits = Callable[[Collection[int]], int | None]
#: a collective call's wait (blocking, or a nonblocking one's), for the monitor: (context,
#: call number, when it began, awaits, the communicator's world ranks, the call's signature
#: text or None where the call in progress says it)
WaitingCall = tuple[int, int, float, Awaits, Sequence[int], str | None]
#: what a collective's wait tells :meth:`Engine.wait_for`: a WaitingCall less when it began
CallWait = tuple[int, int, Awaits, Sequence[int], str | None]

FAST_POLLS = 32          # polls before the first clock read
RECV_SPIN = 4000         # polls of a blocking receive before the general wait loop
RECV_SPIN_CROWDED = 4    # ... when ranks outnumber cores: the sender may need this core
# polls before the pacer decides (ringworld.comm.pacing: spin while the peers run elsewhere,
# yield to one queued on this CPU)
SPIN_POLLS = 256
# ... then spin up to this long, as MPI libraries busy-poll, before sleeping: a sleeper's wake-up
# cost 0.1-0.3 ms per message in a 16 MiB ping-pong after 1 ms (the sender sleeps through the read)
SPIN_TIME = 0.01
# ... when the job's ranks outnumber this host's CPUs: each poll polls the transports, and the
# awaited rank may need this core (same job, both at 64 then at 4, alternating rounds, np=4 on
# 2 cores: recursive-doubling allreduce 16 B 233 -> 162 us, 1.47x; np=3 1.80x; over TCP 1.64x;
# 8-byte ping-pong pairs 1.78x; dissemination barrier 1.31x; a binomial bcast at parity)
SPIN_POLLS_CROWDED = 4
# ... and while a peer shares this rank's CPU (ringworld.comm.pacing.Placement): it runs only
# once this rank yields (np=2 pinned to one CPU beside a busy process, 8-byte ping-pong round
# trip: 185 us with 64 polls, 85 us with 4)
SHARED_POLLS = 4
YIELD_POLLS = 200        # ... and then polls with sched_yield before sleeping
SLEEP_SLICE = 0.005      # longest single sleep: bounds a lost doorbell wake-up
CHECK_PEERS_EVERY = 0.05  # seconds between liveness checks while spinning
# an unmatched rendezvous announcement waits this long for its receive before the payload is
# pulled into an owned buffer (an extra allocation and copy: 16 blocking 1 MiB receives of a
# sender running just ahead took 6.3 ms that way, 2.6 ms taken straight into their buffers)
DEFER_DETACH = 0.001
WORLD_CONTEXT = 0        # contexts 0/1: the world communicator (point-to-point, collective)
SELF_CONTEXT = 2         # contexts 2/3: the self communicator
FIRST_FREE_CONTEXT = 4


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@observed
class Engine(CallChecks):
    """Matching and progress for one rank over its transports."""

    def __init__(self, rank: int, size: int, route: Sequence[Transport | None],
                 timeout: float | None = None, *, hosts: Sequence[str] | None = None,
                 cpus: Sequence[int] | None = None) -> None:
        """``route``: world rank -> the transport reaching it (None for this rank);
        ``hosts``: each world rank's host label (default: all on one host); ``cpus``: each
        rank's usable CPUs as exchanged at start-up (default: this rank's alone), which set
        whether the job is crowded (see :meth:`agree_crowded`)."""
        self.rank = rank
        self.size = size
        self.route = list(route)  # world rank -> transport (None for this rank itself)
        uniq: list[Transport] = []
        for t in self.route:
            if t is not None and t not in uniq:
                uniq.append(t)
        self.transports = uniq
        self.timeout = timeout
        self.posted: defaultdict[int, list[RecvRequest[Any]]] = defaultdict(list)
        self.unexpected: defaultdict[int, list[Incoming]] = defaultdict(list)
        # signed collective messages among them: context -> sequence -> {tag: how many}, so
        # that checking a call's signature costs a lookup, not a scan of a queue that a root
        # running ahead (a bcast loop's) fills with thousands of later calls' messages
        self._signed: defaultdict[int, dict[int, dict[int, int]]] = defaultdict(dict)
        self.broken: BaseException | None = None
        self.closed = False  # close() ran (ringworld.finalize): every later operation raises
        self.dead: dict[int, PeerFailure] = {}  # world rank -> how it failed
        self._deliver = self.deliver
        self._next_context = FIRST_FREE_CONTEXT
        # nonblocking collectives in flight: advanced on every progress() call, so a rank
        # blocked in any wait still forwards the data its peers need (MPI's progress rule)
        self.background: list[Callable[[], object]] = []
        self._init_calls()  # the bookkeeping of collective calls (see CallChecks)
        self.hosts: list[str] = list(hosts) if hosts is not None else ["local"] * size
        # crowded, spin_polls, recv_spin: agreed by every rank when cpus are the exchanged ones
        self.agree_crowded(list(cpus) if cpus is not None else [usable_cpus()])
        if len(uniq) == 1:  # (with several, a sleep in one would hold the others up)
            uniq[0].sleepy = self._sleepy
        # for the monitor (heartbeats) and timeout diagnosis: set cheaply on the hot path,
        # read from the monitor thread
        self.entered: dict[int, int] = {}  # collective context -> last sequence entered
        self.comm_names: dict[int, str] = {}  # collective context -> communicator name
        self.current: tuple[int, int, str, tuple[int, ...]] | None = None  # that collective
        self.waiting: Callable[[], str] | None = None  # what a blocking wait waits for
        # ... and, a blocking collective call's wait: (context, call number, when it began,
        # which of some world ranks it still waits for a message from): see Monitor
        self.waiting_call: WaitingCall | None = None
        self.waiting_since = 0.0  # when it started (wall clock)
        self.remote_failures: list[PeerFailure] = []  # found by the monitor (another thread)
        self.reported: set[int] = set()  # world ranks reported failed (hung, or by the launcher)
        self.revoked: dict[int, CommRevoked] = {}  # context -> why (read by requests' done)
        # nothing broken, revoked or dead: the fast paths may skip those checks (cleared once,
        # for good, by whichever of the three happens first)
        self.calm = True
        # revocations the monitor found: (contexts, member world ranks, error)
        self.remote_revocations: list[tuple[tuple[int, ...], frozenset[int], CommRevoked]] = []
        self._explained: set[int] = set()  # exited ranks whose reasons were looked up
        self.failure_order: list[int] = []  # reported failed ranks, first published first
        self.lost: str | None = None  # why this rank is cut off from the job (see lose)
        self.crashed: str | None = None  # the exception that ended this program (see runtime)
        self.crashed_peer: int | None = None  # ... a PeerFailure naming that world rank
        # synchronous sends waiting for their match, by (dest, context, tag), in send order
        self.sync_waiting: dict[tuple[int, int, int], deque[SyncSendRequest]] = {}
        self.ft: Any = None  # the job's fault-tolerance service (see serve_with)
        # collective context -> how to describe its call in progress on a path that sends no
        # messages (the shared-memory windows; see PointToPoint.describe_calls)
        self.call_describers: dict[
            int, Callable[[], Callable[[], tuple[int, str] | None] | None]] = {}
        self.deferred = 0  # lazy messages queued undetached (an upper bound), since when:
        self.deferred_since = 0.0
        self.explain: Callable[[str], str] | None = None  # the monitor's job-wide diagnosis

    def serve_with(self, service: Any, explain: Callable[[str], str]) -> None:
        """Make ``service`` (the job's monitor) this engine's fault-tolerance service and
        ``explain`` its job-wide diagnosis of timeouts (set once, before any call)."""
        self.ft = service
        self.explain = explain

    def agree_crowded(self, cpus: Sequence[int]) -> None:
        """Set whether the job's ranks outnumber the cores: true if they outnumber any of
        ``cpus`` (each rank's :func:`usable_cpus`, exchanged at start-up, so that every rank
        agrees: the choice of algorithms and shared-memory paths depends on it)."""
        # ranks outnumbering cores: a long spin keeps the awaited rank off the CPU
        self.crowded = any(self.size > c for c in cpus)
        self.spin_polls = SPIN_POLLS_CROWDED if self.crowded else SPIN_POLLS
        # a blocking receive's first spin: spinning thousands of polls while the sender waits
        # for this core cost 1-2 ms per step (a 1 KiB Bruck alltoall on 4 ranks, 2 cores: 3 ms)
        self.recv_spin = RECV_SPIN_CROWDED if self.crowded else RECV_SPIN
        # where this rank runs beside its peers, as its waits last found (ringworld.comm.pacing)
        last: Placement | None = getattr(self, "placement", None)
        if last is not None:  # (agreed again: let go of the last one's descriptors)
            last.close()
        self.placement = Placement(self._placed, outside=Outside(
            self.transports[0] if len(self.transports) == 1 else None, usable_cpus(),
            self.hosts.count(self.hosts[self.rank])))

    def _sleepy(self) -> bool:
        """Whether a blocking receive may sleep in the transport at once, as a blocking
        socket does: other work competes for the CPUs (:meth:`Placement.contended_at`) and no
        nonblocking collective needs this rank's progress meanwhile."""
        return not self.background and self.placement.contended_at(time.monotonic())

    def _placed(self, shared: bool) -> None:
        """The waits found this rank sharing its CPU with a peer (or no longer): a blocking
        receive's inline spin then keeps the CPU from it as a crowded job's would."""
        self.recv_spin = (SHARED_POLLS if shared else RECV_SPIN_CROWDED if self.crowded
                          else RECV_SPIN)

    # ------------------------------------------------------------------ contexts
    @property
    def next_context(self) -> int:
        """The lowest context id this rank has not used yet."""
        return self._next_context

    def reserve_contexts(self, first: int, pairs: int = 1) -> None:
        """Mark ``pairs`` context pairs from ``first`` as used (ids agreed with other ranks)."""
        self._next_context = max(self._next_context, first + 2 * pairs)

    def kind_for(self, ranks: Sequence[int]) -> str:
        """How ``ranks`` (world ranks, this one included) are reached: "self" alone, "shm" when
        one transport that maps shared windows (shared memory, or the in-process one) reaches
        all the others, else "tcp"."""
        others = {self.route[w] for w in ranks if w != self.rank}
        if not others:
            return "self"
        if len(others) == 1:
            t = next(iter(others))
            return "shm" if t is not None and t.supports_shared_windows else "tcp"
        return "tcp"

    def forget_contexts(self, contexts: Sequence[int]) -> None:
        """Drop the bookkeeping of a freed communicator's contexts (queues left empty, names,
        sequence marks), so creating and freeing communicators leaks nothing."""
        for c in contexts:
            for table in (self.posted, self.unexpected):
                if not table.get(c, True):
                    del table[c]
            if not self._signed.get(c, True):
                del self._signed[c]
            self.entered.pop(c, None)
            self.entered_tag.pop(c, None)
            self.previous_tag.pop(c, None)
            self.open_calls.pop(c, None)
            self._left_seen.pop(c, None)
            self._closes.pop(c, None)
            self.comm_names.pop(c, None)
            self.mismatched.pop(c, None)

    # ------------------------------------------------------------------ matching
    def deliver(self, inc: Incoming) -> None:
        """Called by transports for each arriving message: match it or queue it."""
        posted = self.posted.get(inc.context)
        if posted:
            src = inc.source
            tag = inc.tag
            for i, r in enumerate(posted):
                if ((r.source == src or r.source == ANY_SOURCE)
                        and (r.tag == tag or r.tag == ANY_TAG)):
                    del posted[i]
                    r.bind(inc)
                    return
            if inc.tag > SEQ_MASK:  # a signed collective message nobody takes: a mismatch?
                self._check_signatures(inc.context, inc.source, inc.tag, posted)
        if inc.context == ACK_CONTEXT:
            self._take_ack(inc)
            return
        if inc.tag > SEQ_MASK:
            if self.dropping and inc.tag & SEQ_MASK in self.dropping.get(inc.context, ()):
                self._drop(inc)  # of a call this rank refused as its root, or gave up
                return
            if self.entered_tag:
                self._check_unexpected(inc.context, inc.tag, inc.source, inc.nbytes)
            tags = self._signed[inc.context].setdefault(inc.tag & SEQ_MASK, {})
            tags[inc.tag] = tags.get(inc.tag, 0) + 1
        if inc.lazy:
            if not self.deferred:
                self.deferred_since = time.monotonic()
            self.deferred += 1
            self.unexpected[inc.context].append(inc)
        else:
            self.unexpected[inc.context].append(inc.detach())

    def detach_deferred(self) -> None:
        """Pull the payloads of the lazy messages still unmatched into owned buffers, so their
        senders finish (see :attr:`Incoming.lazy`)."""
        self.deferred = 0
        for queue in self.unexpected.values():
            for i, m in enumerate(queue):
                if m.lazy:
                    queue[i] = m.detach()

    def post(self, req: RecvRequest[Any]) -> None:
        """Post a receive: take the first matching unexpected message, or queue the receive."""
        if self.broken is not None:
            self._check_broken()
        if self.revoked and req.context in self.revoked:
            req._error = self.revoked[req.context]
            req._done = True
            return
        if self.mismatched and req.tag > SEQ_MASK and req.context in self.mismatched:
            seq, text = self.mismatched[req.context]
            if req.tag & SEQ_MASK >= seq:  # the sequence broke there: this call cannot match
                self.unsurfaced.pop(req.context, None)  # it raises here
                req._error = MismatchError(f"{text} (this rank now in call "
                                           f"#{req.tag & SEQ_MASK})")
                req._done = True
                return
        unexpected = self.unexpected.get(req.context)
        if unexpected:
            i = _find(unexpected, req.source, req.tag)
            if i >= 0:
                m = unexpected.pop(i)
                if m.tag > SEQ_MASK:
                    self._unindex(m.context, m.tag)
                req.bind(m)
                return
            if req.tag > SEQ_MASK:  # another signature for the same call, from anyone
                other = self._other_signature(req.context, req.tag)
                if other is not None:
                    self._mismatch(req, other.tag, other.source)
                    return
        self.posted[req.context].append(req)

    # ------------------------------------------------------------------ stray messages
    def unpost(self, req: RecvRequest[Any]) -> bool:
        """Remove a not-yet-matched receive; return whether it was still posted."""
        posted = self.posted.get(req.context)
        if posted and req in posted:
            posted.remove(req)
            if req.tag > SEQ_MASK:  # a collective given up here: its late messages are no strays
                self.open_calls[req.context].add(req.tag & SEQ_MASK)
            return True
        return False

    def find_unexpected(self, context: int, source: int, tag: int) -> Incoming | None:
        """The first queued message matching (source, tag) on ``context``, without taking it."""
        unexpected = self.unexpected.get(context)
        if unexpected:
            i = _find(unexpected, source, tag)
            if i >= 0:
                return unexpected[i]
        return None

    # ------------------------------------------------------------------ sending
    def isend(self, dest: int, context: int, tag: int, flags: int,
              segments: Sequence[memoryview], nbytes: int) -> SendHandle:
        """Hand a message to the transport reaching world rank ``dest``.

        Raises:
            CommBroken: the engine failed earlier.
            PeerFailure: ``dest`` is known to have failed.
        """
        if self.broken is not None:
            self._check_broken()
        if self.revoked and context in self.revoked:
            raise self.revoked[context]
        t = self.route[dest]
        if t is None:  # a message to ourselves: copy now, so the send completes at once
            inc = BufferedIncoming(dest, context, tag, flags, nbytes)
            at = 0
            for seg in segments:
                inc.data[at : at + len(seg)] = seg
                at += len(seg)
            inc.mark_complete()
            self.deliver(inc)
            return SendHandle(True)
        if dest in self.dead:
            raise self.peer_failure(dest, "", "cannot send to it")
        try:
            return t.isend(dest, context, tag, flags, segments, nbytes)
        except PeerFailure as exc:
            self._peer_failed(exc)
            raise
        except TransportError as exc:
            self._break(exc)
            raise

    # ------------------------------------------------------------------ progress
    def progress(self) -> bool:
        """Poll every transport once; return whether anything moved.

        A peer found dead is recorded in :attr:`dead` (waits that depend on it then fail).

        Raises:
            CommBroken: a transport failed beyond a single peer (now or earlier).
        """
        if self.broken is not None:
            self._check_broken()
        did = False
        for t in self.transports:
            try:
                if t.poll(self._deliver):
                    did = True
            except PeerFailure as exc:
                self._peer_failed(exc)
                did = True
            except TransportError as exc:
                self._break(exc)
                raise
        if self._mismatched:
            self._fail_mismatched()
            did = True
        if self.deferred and time.monotonic() - self.deferred_since >= DEFER_DETACH:
            self.detach_deferred()
            did = True
        if self.strays:
            self._fail_strays()
            did = True
        if self.background:
            for advance in tuple(self.background):
                advance()
        return did

    def spin(self, req: RecvRequest[Any], polls: int) -> None:
        """Poll the only transport up to ``polls`` times until ``req`` completes.

        The latency-critical start of a blocking receive: no liveness checks (``wait_for``
        does those if this returns with ``req`` still pending), a clock read every 64 polls
        only where the transport can tell where its peers run: a peer found on this CPU ends
        the spin (``wait_for`` then gives the CPU up). Polls of a socket cost a system call
        each: two TCP ranks on one CPU spun out 4000 of them, 4 ms, per message.
        """
        if len(self.transports) != 1 or self.broken is not None:
            return
        t = self.transports[0]
        poll = t.poll
        deliver = self._deliver
        look = t.knows_cpus
        pl = self.placement
        try:
            for i in range(polls):
                poll(deliver)
                if req._done:
                    return
                if look and i & 63 == 63 and pl.check(t, self._all_peers(), time.monotonic()):
                    return  # (check looks again only when due, else says what it last found)
        except PeerFailure as exc:
            self._peer_failed(exc)
        except TransportError as exc:
            self._break(exc)
            raise

    def take_direct(self, context: int, source: int, tag: int, dest: memoryview | None,
                    polls: int, exact: bool = False) -> tuple[int, int, int, bytes | None] | None:
        """Receive the next message from ``source`` without posting, if the transport can.

        Only when no posted or queued receive could claim it first (so MPI matching order
        holds) and the transport offers :meth:`Transport.take_eager`. Returns what
        ``take_eager`` took, or None to use the general path. Cost: at most ``polls`` peeks.
        """
        t = self.route[source]
        if (not self.calm or t is None or not t.supports_take_eager or self.posted.get(context)
                or self.unexpected.get(context)):
            return None
        got = t.take_eager(source, context, tag, dest, polls, exact)
        if not isinstance(got, tuple):
            return None
        if got[1] & FLAG_SYNC:  # matched here: the sender waits for this
            self.acknowledge(source, context, got[0])
            return got[0], got[1] ^ FLAG_SYNC, got[2], got[3]
        return got

    # ------------------------------------------------------------------ synchronous sends
    def isend_sync(self, dest: int, context: int, tag: int, flags: int,
                   segments: Sequence[memoryview], nbytes: int,
                   keep: object) -> SyncSendRequest:
        """Send a message that completes only once a receive on ``dest`` matches it (MPI's
        synchronous mode): the receiver acknowledges the match with an empty message on
        ACK_CONTEXT. Sends of one (dest, context, tag) are matched in order (MPI's
        non-overtaking rule), so the acknowledgements need no ids.

        Raises:
            as :meth:`isend`.
        """
        req = SyncSendRequest(self, dest, keep, context)
        key = (dest, context, tag)
        waiting = self.sync_waiting.setdefault(key, deque())
        waiting.append(req)  # before sending: a send to this rank is matched at once
        try:
            req._handle = self.isend(dest, context, tag, flags | FLAG_SYNC, segments, nbytes)
        except BaseException:
            waiting.remove(req)
            raise
        return req

    def acknowledge(self, source: int, context: int, tag: int) -> None:
        """Tell world rank ``source`` that its synchronous send (context, tag) was matched.
        Best effort: a sender that is gone waits for nothing."""
        with contextlib.suppress(RingworldError):
            self.isend(source, ACK_CONTEXT, context << 32 | tag, 0, (), 0)

    def _take_ack(self, inc: Incoming) -> None:
        inc.read_into(memoryview(bytearray(0)), _nothing)
        key = (inc.source, inc.tag >> 32, inc.tag & SEQ_MASK)
        waiting = self.sync_waiting.get(key)
        if waiting:
            waiting.popleft().acked = True
            if not waiting:
                del self.sync_waiting[key]

    def lose(self, why: BaseException) -> None:
        """The job's store stopped answering this rank's monitor (``why``): this rank is cut
        off from the others, or the launcher is gone. Its waits raise CommBroken from now on
        (:meth:`check_peers`): it can no longer learn of failures or take part in recovery,
        and the others have declared it failed or will."""
        self.lost = (f"world rank {self.rank} lost contact with the job: {why} (cut off from "
                     f"the other ranks, or the launcher is gone)")
        self.calm = False

    def check_peers(self) -> None:
        """Record peers that have exited (after draining what they sent before they died), and
        those the monitor found not responding.

        Raises:
            CommBroken: this rank lost contact with the job (see :meth:`lose`).
        """
        if self.lost is not None:
            raise CommBroken(self.lost)
        while self.remote_failures:
            exc = self.remote_failures.pop(0)
            if exc.rank not in self.reported:
                self.failure_order.append(exc.rank)
            self.reported.add(exc.rank)
            self._peer_failed(exc)
        while self.remote_mismatches:
            self.fail_call(*self.remote_mismatches.pop())
        while self.remote_left:
            self.fail_left(*self.remote_left.pop())
        while self.remote_revocations:
            contexts, members, why = self.remote_revocations.pop()
            if self.rank in members:
                self.revoke(contexts, why)
        for t in self.transports:
            while True:
                try:
                    t.check_peers()
                    break
                except PeerFailure as exc:
                    if exc.rank in self.dead:
                        break
                    self._peer_failed(exc)
        if self.dead:
            self.progress()

    def report_failure(self, exc: PeerFailure) -> None:
        """Tell every rank (through the job store) that ``exc.rank`` failed a collective: it
        left without doing its part. Once per rank; best effort (the monitor may be off)."""
        if exc.rank in self.reported or exc.rank == self.rank:
            return
        self.reported.add(exc.rank)
        if self.ft is not None:
            with contextlib.suppress(RingworldError):
                self.ft.publish_failure(exc.rank, f"{exc.detail.split(';')[0]}, during a "
                                                  "collective")

    def _peer_failed(self, exc: PeerFailure) -> None:
        if exc.rank not in self.dead:
            self.dead[exc.rank] = exc
            self.calm = False

    @observable("wait")
    def wait_for(self, cond: Callable[[], bool], timeout: float | None,
                 describe: Callable[[], str],
                 depends: Callable[[Collection[int]], int | None] | None = None, *,
                 call: CallWait | None = None) -> None:
        """Make progress until ``cond()`` holds.

        ``timeout`` None means the engine's default (itself possibly None: no limit).
        ``depends(dead_world_ranks)`` names a dead peer the wait needs (then it fails), or None;
        without it, any dead peer fails the wait. ``call``: the wait is that of a collective
        call (see ``CallWait``), for the monitor (see ``Monitor._left_behind``).

        Raises:
            Timeout: ``cond`` did not hold within the timeout; names the operation.
            PeerFailure: a peer the operation needs has exited.
            CommBroken: the engine failed.
        """
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        progress = self.progress
        # the common case: done within a few polls, no clock reads (fewer beside a peer on this
        # CPU, or where ranks outnumber cores: the peer runs only once this rank yields; np=4
        # on 2 cores over TCP, 32 polls of 4 us each made an 8-byte allreduce 231-306 us, 4
        # made it 170)
        pl = self.placement  # (contended: only a socket's waits look; see comm.pacing)
        for _ in range(SHARED_POLLS if pl.shared or pl.contended or self.crowded else FAST_POLLS):
            if progress() and self.dead and not cond():
                self._raise_if_needed(depends, describe)
            if cond():
                return
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        next_check = now + CHECK_PEERS_EVERY
        self.waiting = describe
        self.waiting_since = since = time.time()
        self.waiting_call = (None if call is None
                             else (call[0], call[1], since, call[2], call[3], call[4]))
        try:
            self._wait_loop(cond, timeout, deadline, next_check, describe, depends)
        finally:
            self.waiting = self.waiting_call = None

    def timeout_error(self, what: str, timeout: float, where: str) -> Timeout:
        """The Timeout for ``what`` after ``timeout`` s, with the monitor's job-wide diagnosis."""
        text = f"{what}: not complete after {timeout:g} s ({where})"
        if self.explain is not None:
            try:
                extra = self.explain(what)
            except Exception as exc:  # diagnosis must never hide the timeout itself
                extra = f"(no job state: {type(exc).__name__}: {exc})"
            if extra:
                text += "\n" + extra
        return Timeout(text)

    def _wait_loop(self, cond: Callable[[], bool], timeout: float | None,
                   deadline: float | None, next_check: float, describe: Callable[[], str],
                   depends: Callable[[Collection[int]], int | None] | None) -> None:
        progress = self.progress
        placement = self.placement
        spin = (SHARED_POLLS if placement.shared or placement.contended
                else self.spin_polls)
        polls = 0
        transports = self.transports
        pacer: Pacer | None = None
        slept = False  # once this wait sleeps, peers are checked after every sleep
        while True:
            if progress():
                polls = 0
                if self.dead and not cond():
                    self._raise_if_needed(depends, describe)
            if cond():
                return
            polls += 1
            if polls < spin and polls & 63:
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.progress()
                if cond():
                    return
                assert timeout is not None
                raise self.timeout_error(describe(), timeout,
                                         f"rank {self.rank} of {self.size}")
            if now >= next_check or slept:
                self.check_peers()
                if cond():
                    return
                if self.dead:
                    self._raise_if_needed(depends, describe)
                next_check = now + CHECK_PEERS_EVERY
            if polls < spin:
                continue
            if self.crowded:
                step = YIELD if polls < spin + YIELD_POLLS else SLEEP
            else:
                if pacer is None:
                    pacer = Pacer(transports[0] if len(transports) == 1 else None,
                                  self._all_peers, SPIN_TIME, now, placement)
                step = pacer.step(now)
            if step == SPIN:
                continue
            if step == YIELD:
                os.sched_yield()
                continue
            slept = True
            slice_ = SLEEP_SLICE if deadline is None else max(0.0, min(SLEEP_SLICE,
                                                                       deadline - now))
            if len(transports) == 1:
                transports[0].wait_event(slice_)
            elif transports:
                time.sleep(min(slice_, 0.0005))
            else:  # only ourselves: nothing can arrive that isn't here already
                time.sleep(slice_)

    def _all_peers(self) -> range:
        """Every world rank (a wait of the engine may be for any of them)."""
        return range(self.size)

    def _raise_if_needed(self, depends: Callable[[Collection[int]], int | None] | None,
                         describe: Callable[[], str]) -> None:
        if depends is None:
            rank: int | None = min(self.dead)
        else:
            rank = depends(self.dead.keys())
        if rank is not None:
            if self.explained(rank):
                return  # the wait's requests failed with the reason: the caller raises it
            raise self.peer_failure(rank, describe())

    def peer_failure(self, rank: int, waiting: str, doing: str = "") -> PeerFailure:
        """The error of a wait (``waiting``: what for) that cannot end as world rank ``rank``
        has failed (``doing``: what this rank did instead of a wait, such as "cannot send to
        it"). Where ``rank`` left the job after another rank failed, that first failure is
        named instead (the job's root cause); where it left on its own, whether it crashed (an
        exception ended its program: shown) or finalized. Cost: a store round trip."""
        cause = self.dead[rank]
        where = doing or f"while waiting for {waiting}"
        info = None if self.ft is None else self.ft.exit_info(rank)
        if info is None:  # (not chained to the transport's error: its text is all in here)
            return PeerFailure(rank, f"{cause.detail}; {where}")
        first = next((r for r in self.failure_order if r != rank and r in self.reported), None)
        crashed = info.get("crashed")
        peer = info.get("failed_peer")
        if first is None and isinstance(peer, int) and peer != rank:
            first = peer  # it crashed of that rank's failure
        if first is not None and first != self.rank:
            root = self.dead.get(first)
            why = root.detail if root is not None else str(crashed or "failed")
            return PeerFailure(first, f"{why}; rank {rank}, which this rank needed for "
                                      f"{waiting or 'a send'}, left the job after that")
        if crashed:
            return PeerFailure(rank, f"{cause.detail}; {where} (rank {rank} crashed: {crashed})")
        return PeerFailure(rank, f"{cause.detail}; {where} (rank {rank} had already left the "
                                 "job: it finalized or its program ended, so it will send nothing "
                                 "more; this rank waits for a message or call it never made)")

    def explained(self, rank: int) -> bool:
        """Whether a record another rank published explains why this rank's wait on ``rank``,
        which has exited, cannot end: a mismatch it found or a call it left with an error
        (taken in now, not at the monitor's next tick, so that the error this rank raises names
        the first failure rather than blaming the exit). Once per exited rank."""
        if self.ft is None or rank in self._explained:
            return False
        self._explained.add(rank)
        with contextlib.suppress(RingworldError):
            self.ft.collect_now()
        if not (self.remote_mismatches or self.remote_left):
            return False
        self.check_peers()
        return True

    def raise_published(self, context: int, seq: int) -> None:
        """Raise what other ranks published that breaks call ``seq`` on ``context`` (a
        mismatch at it or before, a member that left it with an error), taken in now: a rank
        about to blame a peer for something missing (its shared window) looks first for the
        reason the peer gave up. Failed peers published meanwhile are recorded (the next wait
        on one fails naming it). Returns if nothing is published (or there is no monitor).
        Cost: a few store round trips.

        Raises:
            MismatchError, CommBroken: as published (CommBroken also: this rank lost the job).
        """
        if self.ft is not None:
            with contextlib.suppress(RingworldError):
                self.ft.collect_now()
        self.check_peers()
        self.check_mismatched(context, seq)
        self.check_left(context, seq)

    # ------------------------------------------------------------------ failure
    def revoke(self, contexts: Sequence[int], why: CommRevoked) -> None:
        """Fail every posted receive on ``contexts`` and every later operation on them.

        Sends in flight on them complete with the error (see ``SendRequest.done``). Local; the
        monitor tells the other members.
        """
        self.calm = False
        for c in contexts:
            self.revoked.setdefault(c, why)
            for r in self.posted.pop(c, []):
                r._error = self.revoked[c]
                r._done = True
            self.unexpected.pop(c, None)
            self._signed.pop(c, None)

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            self.calm = False

    def _check_broken(self) -> None:
        if self.broken is not None:
            b = self.broken
            if self.closed:
                raise CommBroken(str(b))
            raise CommBroken(f"the communicator failed earlier: {b}") from b

    def close(self) -> None:
        """Close every transport; idempotent. Every later operation of this rank raises
        CommBroken (a send would otherwise find no route and land in this rank's own queue)."""
        self.placement.close()
        for t in self.transports:
            t.close()
        self.transports = []
        self.route = [None] * self.size
        self._break(CommBroken(f"rank {self.rank}: ringworld.finalize() has run here; no "
                               "communicator of this job can be used any more"))
        self.closed = True


def _find(queue: list[Incoming], source: int, tag: int) -> int:
    for i, m in enumerate(queue):
        if (source == ANY_SOURCE or m.source == source) and (tag == ANY_TAG or m.tag == tag):
            return i
    return -1
