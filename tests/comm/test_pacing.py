"""The waiting policy (ringworld.comm.pacing) and where processes run (ringworld.transport.cpus).

The policy is tested against a transport whose answer the test sets, so that the tests depend
on neither the machine's CPUs nor its load; the /proc reader is tested on this process, pinned
to one CPU for the check.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest

from ringworld.comm import engine as engine_module
from ringworld.comm import pacing
from ringworld.comm.engine import RECV_SPIN, SHARED_POLLS, Engine
from ringworld.comm.pacing import SLEEP, SPIN, YIELD, Outside, Pacer, Placement
from ringworld.transport.base import Transport
from ringworld.transport.cpus import CpuWatch, Runnable, move_off, this_cpu


class Where:
    """Stands for a transport: says whether the asked ranks share this CPU, and records it."""

    knows_cpus = True
    wakes_on_arrival = False

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.asked: list[list[int]] = []

    def shares_cpu(self, ranks: Iterable[int]) -> bool:
        self.asked.append(list(ranks))
        return self.shared


def _pacer(where: Where | None, placement: Placement, now: float = 0.0,
           spin_time: float = 0.01) -> Pacer:
    t: Transport | None = where  # type: ignore[assignment]  # duck-typed stand-in
    return Pacer(t, lambda: [1, 2], spin_time, now, placement)


def test_peer_on_another_cpu_spins_then_sleeps() -> None:
    where, placement = Where(False), Placement()
    p = _pacer(where, placement)
    assert p.step(0.0) == SPIN
    assert where.asked == [[1, 2]]  # asked about the awaited ranks
    assert p.step(0.005) == SPIN
    assert p.step(0.0101) == SLEEP  # past the spin time: stop burning the core


def test_peer_on_this_cpu_yields_and_the_engine_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    # a check that took long looks again later (see the slow-check test): here every check
    # takes no time, whatever the machine's load (CI failed once on a check delayed 8 us)
    monkeypatch.setattr(pacing, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    told: list[bool] = []
    where, placement = Where(True), Placement(told.append, move=lambda: False)
    p = _pacer(where, placement)
    assert p.step(0.0) == YIELD
    assert placement.shared and told == [True]
    where.shared = False  # the scheduler moved the peer away
    assert p.step(pacing.CPU_EVERY / 2) == YIELD  # not looked at again yet
    assert len(where.asked) == 1
    assert p.step(pacing.CPU_EVERY * 1.5) == SPIN
    assert told == [True, False] and not placement.shared


def test_the_placement_is_shared_by_later_waits() -> None:
    where, placement = Where(True), Placement(move=lambda: False)
    _pacer(where, placement).step(0.0)
    later = _pacer(where, placement, now=pacing.CPU_EVERY / 4)
    assert later.step(pacing.CPU_EVERY / 4) == YIELD
    assert len(where.asked) == 1  # the first wait's finding, reused


def test_a_rank_sharing_its_cpu_moves_off_it_and_then_spins() -> None:
    moves: list[int] = []

    class Moved(Where):
        def shares_cpu(self, ranks: Iterable[int]) -> bool:
            shared = super().shares_cpu(ranks)
            self.shared = False  # once asked, this rank "moved" (see move below)
            return shared

    def move() -> bool:
        moves.append(1)
        return True

    where, placement = Moved(True), Placement(move=move)
    assert _pacer(where, placement).step(0.0) == SPIN  # moved off, then found apart
    assert moves == [1] and len(where.asked) == 2 and not placement.shared


def test_unknown_placement_spins_and_leaves_the_placement_alone() -> None:
    placement = Placement(move=lambda: False)
    assert _pacer(None, placement, spin_time=0.01).step(0.0) == SPIN
    assert not placement.shared and placement.next_check == 0.0
    assert _pacer(None, placement, spin_time=0.01).step(0.0101) == SLEEP


def test_a_slow_check_runs_less_often() -> None:
    class Slow(Where):
        def shares_cpu(self, ranks: Iterable[int]) -> bool:
            import time

            t = time.perf_counter()
            while time.perf_counter() - t < 0.001:
                pass
            return super().shares_cpu(ranks)

    placement = Placement()
    placement.check(Slow(False), [1], now=0.0)  # type: ignore[arg-type]
    # 1 ms a check: the next one only after 1 ms / CHECK_SHARE
    assert placement.next_check >= 0.001 / pacing.CHECK_SHARE * 0.99


def test_engine_shortens_its_receive_spin_while_sharing() -> None:
    e = Engine(0, 2, [None, None], cpus=[64, 64])
    e.placement.move = lambda: False
    try:
        assert not e.crowded and e.recv_spin == RECV_SPIN
        e.placement.check(Where(True), [1], now=0.0)  # type: ignore[arg-type]
        assert e.recv_spin == SHARED_POLLS
        e.placement.check(Where(False), [1], now=1.0)  # type: ignore[arg-type]
        assert e.recv_spin == RECV_SPIN
    finally:
        e.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/stat"),
                    reason="needs Linux /proc and sched_setaffinity")
def test_cpu_watch_reads_where_a_process_runs() -> None:
    mask = os.sched_getaffinity(0)
    cpu = min(mask)
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_yield()  # (the move takes effect at once; this settles it)
        if this_cpu() < 0:
            pytest.skip("sched_getcpu is not available here")
        assert this_cpu() == cpu
        w = CpuWatch()
        try:
            assert w.cpu_of(os.getpid()) == cpu
            assert w.shares_cpu([os.getpid()])
            assert not w.shares_cpu([])
            assert w.cpu_of(2**22 + 12345) == -1  # no such process: unknown
            assert w.shares_cpu([2**22 + 12345])  # unknown counts as shared (yield: safe)
        finally:
            w.close()
        assert w.cpu_of(os.getpid()) == cpu  # reopens after close
        w.close()
    finally:
        os.sched_setaffinity(0, mask)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_move_off_restores_the_affinity_exactly() -> None:
    mask = os.sched_getaffinity(0)
    try:
        outside = max(mask) + 1
        assert not move_off(outside)  # not one of this thread's CPUs: nothing done
        assert os.sched_getaffinity(0) == mask
        if len(mask) >= 2:
            assert move_off(min(mask))
            assert os.sched_getaffinity(0) == mask  # the user's affinity, as it was
        one = {min(mask)}
        os.sched_setaffinity(0, one)
        assert not move_off(min(mask))  # nowhere else to run
        assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, mask)


def test_a_transport_that_cannot_tell_never_moves_the_rank() -> None:
    class Blind(Where):
        knows_cpus = False

    moves: list[int] = []
    blind = Blind(True)
    placement = Placement(move=lambda: bool(moves.append(1)) or True)
    assert _pacer(blind, placement).step(0.0) == SPIN  # its "True" means only "cannot tell"
    assert moves == [] and blind.asked == [] and not placement.shared


class Socket(Where):
    """Stands for a socket transport: cannot see its peers' CPUs, sleeps until data arrives."""

    knows_cpus = False
    wakes_on_arrival = True


class Other:
    """Stands for pacing.Outside: answers ``found`` (other work competes for the CPUs, or
    None: cannot tell); counts the looks."""

    def __init__(self, found: bool | None = False) -> None:
        self.found = found
        self.looks = 0

    def __call__(self) -> bool | None:
        self.looks += 1
        return self.found


def test_a_socket_wait_spins_on_a_quiet_host_and_sleeps_at_once_on_a_busy_one() -> None:
    def at(k: float) -> float:  # the time of the k-th look (a little past it: float sums)
        return k * pacing.LOOK_EVERY * 1.001

    other = Other()
    placement = Placement(move=lambda: False, outside=other)
    p = _pacer(Socket(False), placement, spin_time=100.0)
    assert p.step(0.0) == SPIN and other.looks == 1  # quiet
    other.found = True  # other work now competes for the CPUs
    assert p.step(at(0.5)) == SPIN and other.looks == 1  # not looked at again yet
    assert p.step(at(1)) == SPIN and not placement.contended  # one look: maybe a passing task
    assert p.step(at(2)) == SLEEP and placement.contended and other.looks == 3  # two in a row
    # the finding holds for later waits, and across a look that disagrees once
    later = _pacer(Socket(False), placement, now=at(2.5), spin_time=100.0)
    assert later.step(at(2.5)) == SLEEP
    other.found = False
    assert later.step(at(3)) == SLEEP and placement.contended
    other.found = True
    assert later.step(at(4)) == SLEEP and later.step(at(5)) == SLEEP
    other.found = False  # gone for good: two looks in a row, and the waits spin again
    assert later.step(at(6)) == SLEEP and later.step(at(7)) == SPIN
    assert not placement.contended and not placement.shared  # (the shared-CPU finding: apart)
    unknown = Placement(move=lambda: False, outside=Other(None))  # cannot tell: spin
    p = _pacer(Socket(False), unknown, spin_time=100.0)
    assert all(p.step(at(k)) == SPIN for k in range(5)) and not unknown.contended


def test_outside_work_is_another_task_that_would_make_the_job_wait_for_a_cpu() -> None:
    class Peers:
        def __init__(self, n: int | None) -> None:
            self.n = n

        def runnable_peers(self) -> int | None:
            return self.n

    def outside(running: int | None, peers: int | None, cpus: int = 2,
                here: int = 2) -> bool | None:
        o = Outside(Peers(peers), cpus, here)  # type: ignore[arg-type]  # duck-typed stand-in
        o._runnable = lambda: running  # type: ignore[assignment, method-assign]
        return o()

    assert outside(None, 1) is None  # no /proc/loadavg: unknown
    assert outside(2, 1) is False  # this rank and its peer: the job alone
    assert outside(2, 0) is True  # this rank and one other task, the peer asleep: the peer
    assert outside(3, 1) is True  # ... would find both CPUs taken, as it does here
    assert outside(3, 1, cpus=4) is False  # room for the job beside the other task
    assert outside(3, 1, cpus=4, here=4) is True  # ... but not for four ranks
    assert outside(4, 3, here=4) is False  # a job with more ranks than cores, alone
    assert outside(5, 3, here=4) is True  # ... and beside another task
    assert outside(1, None) is False  # this rank alone runs: nothing to ask the peers
    assert outside(3, None) is None  # peers here that cannot be seen: cannot tell
    assert outside(3, None, here=1) is True  # no peer here: the others are not the job's
    assert outside(2, None, cpus=2, here=1) is False
    assert Outside(None, 1, 1)() in (True, False, None)  # (reads this host: any answer)


def test_only_a_wait_that_sleeps_until_arrival_looks_for_other_work() -> None:
    other = Other(True)
    placement = Placement(move=lambda: False, outside=other)

    class Blind(Where):
        knows_cpus = False

    for t in (None, Blind(False)):
        p = _pacer(t, placement, spin_time=1.0)
        assert p.step(0.0) == SPIN and p.step(2 * pacing.LOOK_EVERY) == SPIN
    assert other.looks == 0


class Wire(Transport):
    """A socket-like transport that never delivers: counts polls and records each sleep."""

    knows_cpus = False
    wakes_on_arrival = True

    def __init__(self) -> None:
        super().__init__(0, [1])
        self.polls = 0
        self.sleeps: list[int] = []  # the poll count at each sleep

    def isend(self, *args: Any) -> Any:
        raise NotImplementedError

    def poll(self, deliver: Any) -> bool:
        self.polls += 1
        return False

    def wait_event(self, timeout: float, waiting: Any = None) -> None:
        self.sleeps.append(self.polls)

    def check_peers(self) -> None:
        return

    def close(self) -> None:
        return


def test_an_engine_on_a_contended_host_sleeps_after_a_short_first_spin() -> None:
    wire = Wire()
    busy = Other(False)
    e = Engine(0, 2, [None, wire], cpus=[64, 64])
    e.placement.outside = busy
    e.placement.move = lambda: False
    try:
        e.wait_for(lambda: len(wire.sleeps) > 0, 5.0, lambda: "test")
        quiet = wire.sleeps[0]  # a quiet host: the whole spin (SPIN_TIME) before sleeping
        assert quiet > engine_module.FAST_POLLS + engine_module.SPIN_POLLS
        wire.polls, wire.sleeps = 0, []
        busy.found = True  # other work competes for the CPUs: two looks find it
        for _ in range(pacing.LOOKS_AGREE):
            e.placement.next_look = 0.0
            e.placement.contended_at(1.0)
        assert e.placement.contended
        wire.polls, wire.sleeps = 0, []
        e.wait_for(lambda: len(wire.sleeps) > 0, 5.0, lambda: "test")
        # (a poll per check of the condition, a few more around the pacer's first step)
        assert wire.sleeps[0] <= 2 * engine_module.SHARED_POLLS + 2, wire.sleeps
    finally:
        e.close()


def test_runnable_reads_the_hosts_runnable_tasks() -> None:
    r = Runnable()
    try:
        got = r()
        if got is None:
            pytest.skip("no /proc/loadavg here")
        assert got >= 1  # (this thread runs while it reads)
        r.close()
        assert r() is not None  # reopens after close
    finally:
        r.close()


class LocalSocket(Where):
    """Stands for a TCP transport that sees its peers on this host."""

    wakes_on_arrival = True


def test_a_socket_wait_sleeps_when_a_peer_runs_on_this_cpu() -> None:
    shared = Placement(move=lambda: False, outside=Other())
    assert _pacer(LocalSocket(True), shared).step(0.0) == SLEEP  # not a yield: data wakes it
    assert shared.shared
    other = Other()
    apart = Placement(move=lambda: False, outside=other)
    p = _pacer(LocalSocket(False), apart, spin_time=1.0)
    assert p.step(0.0) == SPIN  # a quiet host, the peer elsewhere: spin as before
    other.found = True  # other work competes: sleep at once, as where it cannot tell
    w = pacing.LOOK_EVERY * 1.001
    assert p.step(w) == SPIN and p.step(2 * w) == SLEEP
    assert apart.contended and not apart.shared


class Polled(Wire):
    """A transport that sees its peers' CPUs; the test says whether one shares this one."""

    knows_cpus = True

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.shared = shared

    def shares_cpu(self, ranks: Iterable[int]) -> bool:
        return self.shared


def test_a_receive_spin_ends_once_a_peer_is_found_on_this_cpu() -> None:
    for shared in (False, True):
        wire = Polled(shared)
        e = Engine(0, 2, [None, wire], cpus=[64, 64])
        e.placement.move = lambda: False
        try:
            e.spin(SimpleNamespace(_done=False), RECV_SPIN)  # type: ignore[arg-type]
            # apart: the whole spin; sharing: over at the first look (a socket's poll is a
            # system call: 4000 of them kept the peer off this CPU for 4 ms)
            assert wire.polls == (64 if shared else RECV_SPIN), wire.polls
            assert e.placement.shared == shared
        finally:
            e.close()
