"""How a blocking wait spends the CPU once its first spin is over: spin, yield or sleep.

One policy for both places a rank waits on its peers (the engine's message waits and the
shared-memory flag waits of the collectives), chosen by where the awaited peers run:

* a peer on **another CPU** (running, or queued there behind other work) cannot be helped by
  giving this CPU up; a yield would only hand it to an unrelated process. Under Linux's EEVDF
  scheduler a yield also moves the yielder's deadline a slice back, so beside a busy process
  every yield could cost milliseconds. Spin, as MPI libraries do, for up to ``spin_time``.
* a peer **queued on this CPU** runs only when this rank gives the CPU up. If this rank may run
  on another CPU it moves there at once (its affinity narrowed for an instant, then restored
  exactly: :func:`~ringworld.transport.cpus.move_off`); the scheduler, which cannot know that
  the two wait for each other, otherwise keeps them on one CPU beside an idle-looking busy one.
  Else: yield at once.
  TCP's peers on this host are watched so too (those running or waiting to run: one asleep
  in its socket's wait needs no CPU), and a socket's wait that cannot move sleeps until the
  data arrives rather than yield: two ranks on one CPU beside a busy process on the other
  took 4 ms a ping-pong message spinning (a socket's poll is a system call, and the receive's
  first spin 4000 of them), 50 us now; unpinned, the mean half round trip went from 26-42 to
  19-20 us (median 8.7 either way).
* where the peers' CPUs cannot be told (no transport, or one that cannot see its peers: TCP's
  to other hosts): spin, as MPI libraries do, and leave the engine's placement as it was.
* wherever no peer is found on this CPU and the transport's wait sleeps until data arrives
  (TCP's): if this thread has lately waited for a CPU (its run-queue wait grew: other work
  competes for the cores), skip the first spin and sleep at once, as a blocking socket does
  (:meth:`Placement.contended_at`). Spinning there kept the CPU from the peer and from the
  kernel's copies: a 16 MiB stream between two ranks beside one busy process (2 cores) ran
  at 0.46x a plain socket's speed, 1.35x quiet. A blocking receive of a small message then
  sleeps in the socket's read itself (the engine's ``sleepy``, see
  ``TcpTransport.take_eager``): no Python runs between the data's arrival and its wake-up.
* a wait longer than ``spin_time`` sleeps (the transport's ``wait_event``, woken by peers that
  flip what it waits on), so an idle rank stops burning a core.

Measured on 2 cores beside one busy process (np=2, each state taken on purpose by pinning):
with both ranks on one CPU the former spin-then-yield waits took 1.5 ms per 8-byte allreduce
and 7.9 ms per ping-pong round trip (each rank spun out its slice); these take 43 us and 84 us.
With the ranks on different CPUs, and on a quiet machine, both take the same (10.5 us, 5.1 us).
Unpinned (five fresh runs each, alternating): moving off the shared CPU took the allreduce from
16.5-20.5 to 11.7-12.2 us, the round trip from 24-28 to 18 us, a 64 KiB allreduce from 116-129
to 83-97 us.
Ranks that outnumber the cores (``crowded``) keep yielding at once: there a peer nearly always
waits for this CPU.

Cost: nothing during the first spin; then a clock read per poll and, every ``CPU_EVERY``
seconds (``CPU_EVERY_APART`` while no peer shares the CPU), one ``/proc`` read per awaited peer
(about 5 us each).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from ringworld.transport.base import Transport
from ringworld.transport.cpus import QueueWait, Runnable, move_off, this_cpu

CPU_EVERY = 0.0001   # seconds between checks of where the awaited peers run, while sharing
# ... and while apart: a 64 KiB allreduce (quiet, np=2) lost 2-5 % to a check every 100 us
CPU_EVERY_APART = 0.001
#: the check's share of a spinning wait stays below this: with many peers it runs less often
CHECK_SHARE = 0.05
#: seconds between looks at this thread's run-queue wait (1.5 us each), the window each judges
QUEUE_EVERY = 0.02
#: a run-queue wait that grew by this share of the window: contended. np=2 ping-pong over TCP
#: (2 cores), 20 ms windows of spinning waits: quiet, every share under 15 % (the job's own
#: threads); beside one busy process, most 20-50 %, a third under 1 % (the scheduler lets the
#: ranks run for long spells)
QUEUE_SHARE = 0.2
#: a finding of contention lasts this long (s); then, while other work than the job's still
#: runs or waits to run, it is held again, for up to CONTENDED_RECHECK s in all, after which a
#: new window looks again. No window judges meanwhile: waits that sleep lengthen the run-queue
#: wait themselves (each wake-up on an idle CPU counts as waiting), so a look over them would
#: find contention on a quiet host; and a window of spinning waits costs (a 16 MiB ping-pong
#: beside one busy process, np=2: 10.1-10.6 ms a half round trip with a new window every 0.5
#: s, contended 71-91 % of the time; 9.0-9.8 ms found contended throughout)
CONTENDED_HOLD = 0.5
CONTENDED_RECHECK = 5.0

SPIN = 0
YIELD = 1
SLEEP = 2


class Placement:
    """Whether this rank shares its CPU with a peer, as last found (one per engine, shared by
    all its waits; re-checked at most every ``CPU_EVERY`` s while sharing, ``CPU_EVERY_APART``
    s while not, less often with many peers).

    While it does, waits skip their first spin and yield at once: under EEVDF a rank that spins
    while its peer waits for the CPU runs ahead in virtual time, and the peer then yields in
    vain until it has burnt as much (np=2 pinned to one CPU beside one busy process, 8-byte
    allreduce: 222 us per call after a 200-poll spin). ``changed(shared)`` is told each change
    (the engine shortens its receives' inline spin); ``move()`` moves this thread to another
    CPU, False where it cannot (see the module's docstring).

    For waits that cannot see their peers (a socket's) it also keeps whether the host is
    ``contended`` (:meth:`contended_at`, from ``queue()``: this thread's run-queue wait in ns,
    None where unknown; and ``outside()``: whether work other than the job's ranks wants more
    CPUs than there are, None where unknown, see :class:`Outside`); such waits then skip their
    first spin and sleep at once.
    """

    __slots__ = ("_held_since", "_hold_until", "_queued", "changed", "contended", "move",
                 "next_check", "next_queue_check", "outside", "queue", "shared")

    def __init__(self, changed: Callable[[bool], None] | None = None,
                 move: Callable[[], bool] = lambda: move_off(this_cpu()),
                 queue: Callable[[], int | None] | None = None,
                 outside: Callable[[bool], bool | None] = lambda anywhere: None) -> None:
        self.shared = False
        self.next_check = 0.0
        self.changed = changed
        self.move = move  # moves this thread off its CPU; False if it cannot
        # this thread's run-queue wait in ns (None: unknown), for contended_at
        self.queue: Callable[[], int | None] = QueueWait() if queue is None else queue
        # ... and whether other work than the job's wants more CPUs than there are (see Outside)
        self.outside = outside
        self.contended = False
        self.next_queue_check = 0.0
        self._queued: tuple[int, float] | None = None  # the last look: (wait, when)
        self._hold_until = -1.0
        self._held_since = -1.0  # when the finding held now was made

    def contended_at(self, now: float) -> bool:
        """Whether other work lately competed with this thread for the CPUs: its run-queue
        wait grew by more than ``QUEUE_SHARE`` of a window of at least ``QUEUE_EVERY`` s
        between two looks, and ``outside(False)`` does not deny that other work than the job's
        ranks wants more CPUs than there are at the window's end (the ranks of a job that
        outnumbers the cores lengthen each other's run-queue waits too); a finding holds
        ``CONTENDED_HOLD`` s, again while ``outside(True)`` finds other work running (up to
        ``CONTENDED_RECHECK`` s), and the next window starts when it ends (see there). False where
        the wait cannot be read. Cost: a comparison; a ``pread`` (1.5 us) per window, and
        ``outside()`` where the queue wait grew."""
        if now < self.next_queue_check:
            return self.contended
        if self.contended:
            if now < self._hold_until:
                return True
            if now < self._held_since + CONTENDED_RECHECK and self.outside(True):
                self._hold_until = self.next_queue_check = now + CONTENDED_HOLD
                return True
            self.contended = False
            self._queued = None  # (the window so far held sleeping waits: start afresh)
        self.next_queue_check = now + QUEUE_EVERY
        queued = self.queue()
        if queued is None:
            return False
        last, self._queued = self._queued, (queued, now)
        if last is None or queued - last[0] <= QUEUE_SHARE * (now - last[1]) * 1e9:
            return False
        if self.outside(False) is not False:
            self._hold_until = self.next_queue_check = now + CONTENDED_HOLD
            self._held_since = now
            self.contended = True
        return self.contended

    def close(self) -> None:
        """Let go of what the looks keep open (they reopen it if asked again)."""
        for look in (self.queue, self.outside):
            close = getattr(look, "close", None)
            if close is not None:
                close()

    def check(self, transport: Transport, peers: Collection[int], now: float) -> bool:
        """Look again (if due) where ``peers`` run, through ``transport`` (one that
        ``knows_cpus``); return whether one shares this CPU."""
        if now < self.next_check:
            return self.shared
        t0 = time.perf_counter()
        shared = transport.shares_cpu(peers)
        if shared and self.move():  # leave the peer this CPU, if this thread may run on another
            shared = transport.shares_cpu(peers)
        every = max(CPU_EVERY if shared else CPU_EVERY_APART,
                    (time.perf_counter() - t0) / CHECK_SHARE)
        self.next_check = now + every
        if shared != self.shared:
            self.shared = shared
            if self.changed is not None:
                self.changed(shared)
        return shared


class Outside:
    """``outside(False)``: whether work other than the job's ranks wants more of this host's
    CPUs than there are, now: more tasks run or wait to run than this process may use CPUs,
    and not all of them are this rank and its peers here (``transport.runnable_peers()``;
    where that is unknown, the count alone decides). ``outside(True)``: whether any task but
    this rank and its peers here runs or waits to run at all (None where the peers are
    unknown). None where the count cannot be read. A job with more ranks than cores keeps its
    own ranks runnable (they yield); a quiet host's other tasks sleep. Cost: a ``pread`` (0.5
    us) and one per peer on this host (5 us each)."""

    __slots__ = ("_cpus", "_runnable", "_transport")

    def __init__(self, transport: Transport | None, cpus: int) -> None:
        self._transport = transport
        self._cpus = cpus
        self._runnable = Runnable()

    def __call__(self, anywhere: bool) -> bool | None:
        running = self._runnable()
        if running is None:
            return None
        if not anywhere and running <= self._cpus:
            return False
        peers = None if self._transport is None else self._transport.runnable_peers()
        if peers is None:
            return None if anywhere else True
        return running - 1 - peers > 0

    def close(self) -> None:
        """Close the kept descriptor (it reopens on the next call)."""
        self._runnable.close()


class Pacer:
    """The policy for one wait (see the module's docstring); ``step(now)`` says what to do.

    ``transport`` reaches the awaited peers (None, or one that cannot see where they run:
    the wait spins and the placement is left alone);
    ``peers()`` names them (world ranks); ``spin_time`` bounds the spinning, from ``now``;
    ``placement`` is the engine's (see :class:`Placement`). A caller that cannot sleep yields
    instead.
    """

    __slots__ = ("_arrival", "_peers", "_placement", "_spin_end", "_transport")

    def __init__(self, transport: Transport | None, peers: Callable[[], Collection[int]],
                 spin_time: float, now: float, placement: Placement) -> None:
        self._transport = transport if transport is not None and transport.knows_cpus else None
        # a wait that sleeps until the data arrives: it sleeps at once on a contended host
        self._arrival = transport is not None and transport.wakes_on_arrival
        self._peers = peers
        self._spin_end = now + spin_time
        self._placement = placement

    def step(self, now: float) -> int:
        """SPIN, YIELD or SLEEP, for a wait still unmet at ``now`` (``time.monotonic()``)."""
        if now >= self._spin_end:
            return SLEEP
        t = self._transport
        if t is None:
            return SLEEP if self._arrival and self._placement.contended_at(now) else SPIN
        pl = self._placement
        if now >= pl.next_check:
            pl.check(t, self._peers(), now)
        if pl.shared:  # (a socket's wait sleeps until the peer's data is there)
            return SLEEP if self._arrival else YIELD
        return SLEEP if self._arrival and pl.contended_at(now) else SPIN
