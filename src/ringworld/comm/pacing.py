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
  (TCP's): if work other than the job's ranks competes for the host's CPUs (another task
  runs, and with all of the job's ranks here running there would be more runnable tasks than
  CPUs: :class:`Outside`, :meth:`Placement.contended_at`), skip the first spin and sleep at
  once, as a blocking socket does. Spinning there kept the CPU from the peer and from the
  kernel's copies: a 16 MiB stream between two ranks beside one busy process (2 cores) ran
  at 0.46x a plain socket's speed, 1.35x quiet. A blocking receive of a small message then
  sleeps in the socket's read itself (the engine's ``sleepy``, see
  ``TcpTransport.take_eager``): no Python runs between the data's arrival and its wake-up.
  The finding does not depend on how the ranks wait, so every rank of a pair finds the same
  (one that judged by its own run-queue wait found the load in 20 ms, its peer, which then
  had a core to itself, up to 545 ms later; a wake-up on an idle CPU counts as a run-queue
  wait too, so that such a test, once its waits slept, found load on a quiet host).
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
from ringworld.transport.cpus import Runnable, move_off, this_cpu

CPU_EVERY = 0.0001   # seconds between checks of where the awaited peers run, while sharing
# ... and while apart: a 64 KiB allreduce (quiet, np=2) lost 2-5 % to a check every 100 us
CPU_EVERY_APART = 0.001
#: the check's share of a spinning wait stays below this: with many peers it runs less often
CHECK_SHARE = 0.05
#: seconds between looks at whether other work competes for the CPUs (see Outside)
LOOK_EVERY = 0.02
#: looks in a row that must agree before the finding changes (a task that runs for an instant,
#: one of the job's monitor threads say, is seen by one look now and then)
LOOKS_AGREE = 2

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
    ``contended`` (:meth:`contended_at`, from ``outside()``: whether work other than the
    job's ranks competes for the CPUs, None where unknown, see :class:`Outside`); such waits
    then skip their first spin and sleep at once.
    """

    __slots__ = ("_streak", "changed", "contended", "move", "next_check", "next_look",
                 "outside", "shared")

    def __init__(self, changed: Callable[[bool], None] | None = None,
                 move: Callable[[], bool] = lambda: move_off(this_cpu()),
                 outside: Callable[[], bool | None] = lambda: None) -> None:
        self.shared = False
        self.next_check = 0.0
        self.changed = changed
        self.move = move  # moves this thread off its CPU; False if it cannot
        # whether work other than the job's competes for this host's CPUs (see Outside)
        self.outside = outside
        self.contended = False
        self.next_look = 0.0
        self._streak = 0  # looks in a row that disagreed with ``contended``

    def contended_at(self, now: float) -> bool:
        """Whether work other than the job's ranks competes for this host's CPUs, as
        ``outside()`` found at ``LOOKS_AGREE`` looks in a row (one every ``LOOK_EVERY`` s at
        most); False where it cannot tell. Cost: a comparison; ``outside()`` per look."""
        if now < self.next_look:
            return self.contended
        self.next_look = now + LOOK_EVERY
        found = self.outside() is True
        if found == self.contended:
            self._streak = 0
        else:
            self._streak += 1
            if self._streak >= LOOKS_AGREE:
                self.contended = found
                self._streak = 0
        return self.contended

    def close(self) -> None:
        """Let go of what the looks keep open (they reopen it if asked again)."""
        close = getattr(self.outside, "close", None)
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
    """Whether work other than the job's ranks competes for this host's CPUs now: some task
    other than this rank and its ``here - 1`` peers on this host runs or waits to run, and
    with every one of the job's ranks here running there would be more runnable tasks than
    this process has CPUs. From Linux's count of runnable tasks (``/proc/loadavg``; in a
    container it may count the host's) less this rank and its runnable peers here
    (``transport.runnable_peers()``). None where that cannot be told (no count; peers here
    the transport cannot see). The finding does not depend on how the job's ranks wait
    (asleep or spinning), so every rank finds the same. Cost: a ``pread`` (0.5 us) and one per
    peer on this host (5 us each) where the count is above one."""

    __slots__ = ("_cpus", "_here", "_runnable", "_transport")

    def __init__(self, transport: Transport | None, cpus: int, here: int) -> None:
        self._transport = transport
        self._cpus = cpus
        self._here = here
        self._runnable = Runnable()

    def __call__(self) -> bool | None:
        running = self._runnable()
        if running is None:
            return None
        if running <= 1:
            return False
        peers = None if self._transport is None else self._transport.runnable_peers()
        if peers is None:
            if self._here > 1:
                return None
            peers = 0
        others = running - 1 - peers
        return others > 0 and others + self._here > self._cpus

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
