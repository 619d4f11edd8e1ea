"""Run a function on every rank of a world whose ranks are threads of this process.

The fast test tier: matching, mismatch detection and every collective, without forking or a
store. Each rank gets its own matching engine and world communicator over an
:class:`~ringworld.transport.inproc.InprocTransport`, so the code under test is the code users
run; only the bytes move through process memory. Failure semantics that need a process to die
belong to :func:`~ringworld.testing.run_processes`.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ringworld.collective.communicator import Communicator
from ringworld.comm.engine import WORLD_CONTEXT, Engine
from ringworld.comm.monitor import Monitor
from ringworld.errors import CommBroken, MismatchError, PeerFailure
from ringworld.store.memory import MemoryStore
from ringworld.store.prefix import PrefixStore
from ringworld.testing.processes import RankFailed
from ringworld.transport.inproc import Hub
from ringworld.tuning import constants
from ringworld.tuning.select import Selector

T = TypeVar("T")

#: The GIL hand-over interval while ranks run: a rank that spins hands the interpreter to the
#: rank it waits for within this, not within the default 5 ms.
SWITCH_INTERVAL = 1e-4
#: The ranks' monitors declare a rank failed after this many seconds without a heartbeat.
LIVENESS_TIMEOUT = 10.0
_switch_lock = threading.Lock()
_running = 0  # run_threads calls in progress (they may nest in threads of their own)
_saved_interval = 0.0


def world_of(engine: Engine, selector: Selector | None = None,
             transport: str = "shm") -> Communicator:
    """The world communicator over ``engine`` (every world rank, the world's context)."""
    return Communicator(engine, range(engine.size), WORLD_CONTEXT, "world",
                        selector or Selector(constants.DEFAULTS), transport)


def run_threads(size: int, fn: Callable[..., T], *args: Any, timeout: float = 60.0,
                call_timeout: float | None = 30.0, algorithms: Sequence[tuple[str, str]] = (),
                crowded: bool = True, liveness_timeout: float = LIVENESS_TIMEOUT) -> list[T]:
    """Run ``fn(comm, *args)`` on ``size`` ranks, each a thread; return results in rank order.

    ``call_timeout`` is every blocking call's default timeout; ``algorithms`` forces choices as
    ``RINGWORLD_ALGORITHMS`` does (``("allreduce", "ring")``...); ``crowded`` (default) runs
    the ranks as if they outnumbered the cores, as threads under one interpreter lock do.
    Each rank has its monitor, as launched ranks do (over one in-memory store), so failures,
    mismatches and calls left are published job-wide; ``liveness_timeout`` 0 runs without.
    A rank that raises leaves the world at once, so its peers get a PeerFailure naming it
    instead of waiting out their timeouts. After every rank returns, each rank's engine runs
    the exit check ``finalize()`` runs (a collective message no call took is a mismatch).

    Raises:
        ValueError: ``size`` < 1 or ``timeout`` <= 0.
        RankFailed: a rank raised; the first that did not fail only because of another
            (PeerFailure, CommBroken) is reported, with its traceback.
        TimeoutError: ranks were still running after ``timeout`` s (they are then failed, so
            their threads end).
        MismatchError: every rank returned, but the exit check found a collective message
            that no call took (ranks disagreed on a call that left none of them waiting).
    Cost: one thread per rank; the ranks take turns on the interpreter lock.
    """
    if size < 1:
        raise ValueError(f"size={size} must be at least 1")
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be positive")
    hub = Hub(size)
    ends = hub.endpoints()
    engines = [Engine(r, size, [None if w == r else ends[r] for w in range(size)],
                      call_timeout, cpus=[1 if crowded else size]) for r in range(size)]
    store = MemoryStore()
    monitors: list[Monitor] = []
    try:
        for e in engines if size > 1 and liveness_timeout > 0 else []:
            monitors.append(Monitor.attach(e, lambda: PrefixStore("job", store),
                                           liveness_timeout))
    except BaseException:  # nothing started is left running
        for m in monitors:
            m.stop(exiting=True)
        for e in engines:
            e.close()
        raise
    selector = Selector(constants.DEFAULTS, tuple(algorithms))
    results: list[Any] = [None] * size
    failures: dict[int, BaseException] = {}
    texts: dict[int, str] = {}

    def body(rank: int) -> None:
        try:
            results[rank] = fn(world_of(engines[rank], selector), *args)
        except BaseException as exc:
            failures[rank] = exc
            texts[rank] = traceback.format_exc()
            hub.fail(rank, f"it raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True)
               for r in range(size)]
    _enter()
    try:
        for t in threads:
            t.start()
        _join(threads, hub, timeout)
    finally:
        _leave()
        problems = [p for p in (e.exit_check() for e in engines) if p] if not failures else []
        for m in monitors:
            m.stop(exiting=True)
        for e in engines:
            e.close()
        store.close()
    if failures:
        rank = min(failures, key=lambda r: (isinstance(failures[r], (PeerFailure, CommBroken)),
                                             r))
        raise RankFailed(rank, texts[rank])
    if problems:
        raise MismatchError(problems[0])
    return results


def _join(threads: list[threading.Thread], hub: Hub, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = [r for r, t in enumerate(threads) if t.is_alive()]
    if not late:
        return
    for r in late:  # their waits now fail (PeerFailure) and their threads end
        hub.fail(r, "run_threads timed out")
    for t in threads:
        t.join(10.0)
    raise TimeoutError(f"run_threads: rank(s) {', '.join(map(str, late))} of {len(threads)} "
                       f"had not finished after {timeout:g} s")


def _enter() -> None:
    global _running, _saved_interval
    with _switch_lock:
        if _running == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL)
        _running += 1


def _leave() -> None:
    global _running
    with _switch_lock:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)
