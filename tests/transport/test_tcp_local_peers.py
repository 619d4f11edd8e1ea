"""A TCP transport knows which of its peers run on this host (their pids, from the job's
start-up) and tells its waits when one of them runs, or waits to run, on this rank's CPU; one
asleep, one on another host, and one whose process cannot be seen never count (nor do they
among the peers it counts as runnable, for the waits' test of other work). Two ranks
that talk over TCP on one host and share a CPU otherwise spun out a whole receive spin (4 ms)
per message."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ringworld.testing import run_processes
from ringworld.transport.cpus import this_cpu
from ringworld.transport.tcp import TcpTransport

linux_only = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/stat"),
    reason="needs Linux /proc and sched_setaffinity")


@pytest.fixture
def transport() -> Iterator[TcpTransport]:
    a, b = socket.socketpair()
    t = TcpTransport(0, {1: a, 2: b})
    try:
        yield t
    finally:
        t.close()


def _child(code: str, cpu: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", code])
    os.sched_setaffinity(p.pid, {cpu})
    return p


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    return text[text.rindex(b")") + 2 :].split()[0]


def _until_asleep(p: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30  # (its interpreter starts first, on this busy CPU)
    while _state(p.pid) != b"S":
        assert time.monotonic() < deadline, "the sleeping child never went to sleep"
        time.sleep(0.01)


@linux_only
def test_a_local_peer_counts_only_while_it_runs_on_this_cpu(transport: TcpTransport) -> None:
    assert not transport.knows_cpus  # no peer named local yet: the waits cannot tell
    mask = os.sched_getaffinity(0)
    cpu = min(mask)
    os.sched_setaffinity(0, {cpu})
    busy = _child("while True: pass", cpu)  # runnable on this CPU whenever asked
    asleep = _child("import time; time.sleep(60)", cpu)
    try:
        _until_asleep(asleep)
        if this_cpu() < 0:
            pytest.skip("sched_getcpu is not available here")
        transport.watch_local({1: busy.pid, 2: asleep.pid, 7: os.getpid()})  # (7: no peer)
        assert transport.knows_cpus
        assert transport.shares_cpu([1])
        assert transport.shares_cpu(range(8))
        assert not transport.shares_cpu([2])  # asleep: it needs no CPU
        assert not transport.shares_cpu([7])  # not a peer of this transport: ignored
        assert transport.runnable_peers() == 1  # the busy one, not the sleeper (nor 7)
        transport.watch_local({2: asleep.pid})  # 1 on another host now
        assert not transport.shares_cpu([1, 2])
        busy.kill()
        busy.wait()
        transport.watch_local({1: busy.pid})  # a process gone: cannot tell, not shared
        assert transport.knows_cpus and not transport.shares_cpu([1])
        assert transport.runnable_peers() == 0
        transport.watch_local({})
        assert not transport.knows_cpus
        assert transport.runnable_peers() is None  # none known here: cannot tell
    finally:
        for p in (busy, asleep):
            p.kill()
            p.wait()
        os.sched_setaffinity(0, mask)


def _watched(comm: object) -> tuple[int, bool, dict[int, int]]:
    import ringworld

    t = ringworld.runtime._engine.transports[0]
    assert isinstance(t, TcpTransport)
    return os.getpid(), t.knows_cpus, dict(t._local)


def test_a_job_over_tcp_on_one_host_names_each_rank_its_local_peers() -> None:
    out = run_processes(3, _watched, transport="tcp", timeout=60)
    pids = [pid for pid, _, _ in out]
    for rank, (_, knows, local) in enumerate(out):
        assert knows
        assert local == {r: pids[r] for r in range(3) if r != rank}
