"""Heartbeats through the job store: find ranks that stop responding, and explain timeouts.

A daemon thread per rank, on a store connection of its own, every ``interval`` seconds:
- bumps this rank's heartbeat counter and publishes its state (what it waits for, the last
  collective it entered on each communicator);
- reads the heartbeat counters of the next few ranks (a ring of watchers: every rank is watched
  by up to :data:`WATCHERS` others, so the store load grows linearly with the job);
- declares a watched rank failed when its counter has not moved for ``liveness_timeout`` seconds
  (a stopped process, a cut link, a machine gone) and tells every rank through the store;
- hands failures found by any rank to the engine, whose waits then raise
  :class:`~ringworld.errors.PeerFailure` naming the rank.
A rank busy computing keeps beating (the thread runs whenever the interpreter switches threads),
so long computations between calls are not failures. A rank that exits normally says so first.

On a timeout, :meth:`Monitor.explain` reads every rank's published state, so the error says which
ranks entered the collective and which are missing, and what each of them is doing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ringworld.errors import PeerFailure, RingworldError
from ringworld.store.base import Store

WATCHERS = 3            # ranks each rank watches (the next ones in rank order)
DEFAULT_LIVENESS = 20.0  # seconds without a heartbeat before a rank is declared failed
_PREFIX = "rw/mon/"


def _beat_key(rank: int) -> str:
    return f"{_PREFIX}beat/{rank}"


def _state_key(rank: int) -> str:
    return f"{_PREFIX}state/{rank}"


class Monitor:
    """The heartbeat thread of one rank (see the module docstring).

    ``connect()`` opens the thread's own store connection. Cost: about ``3 + WATCHERS`` store
    round trips per interval per rank; nothing on the communication path.
    """

    def __init__(self, engine: Any, connect: Callable[[], Store], liveness_timeout: float,
                 interval: float | None = None) -> None:
        if liveness_timeout <= 0:
            raise ValueError(f"liveness_timeout={liveness_timeout!r} must be positive")
        self.engine = engine
        self.rank: int = engine.rank
        self.size: int = engine.size
        self.liveness = liveness_timeout
        self.interval = interval if interval is not None else min(1.0, liveness_timeout / 4)
        self._connect = connect
        self._store: Store | None = None
        self._stop = threading.Event()
        self._seen_failures = 0
        self._declared: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="ringworld-monitor", daemon=True)
        self.error: BaseException | None = None  # why the thread stopped early, if it did

    def start(self) -> None:
        """Connect and start beating; the first beat is published before this returns.

        Raises:
            StoreError: the store cannot be reached.
        """
        self._store = self._connect()
        self._beat(self._store)
        self._thread.start()

    def stop(self, exiting: bool = True) -> None:
        """Stop the thread; with ``exiting``, tell the others this rank left on purpose."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval + 1)
        store = self._store
        self._store = None
        if store is None:
            return
        try:
            if exiting:
                store.set(_state_key(self.rank), json.dumps({"exited": True}).encode())
        except RingworldError:
            pass
        finally:
            store.close()

    # ------------------------------------------------------------------ thread
    def _watched(self) -> list[int]:
        return [(self.rank + k) % self.size for k in range(1, min(WATCHERS, self.size - 1) + 1)]

    def _state(self) -> dict[str, Any]:
        e = self.engine
        state: dict[str, Any] = {"t": time.time(), "entered": dict(e.entered)}
        waiting = e.waiting
        if waiting is not None:
            try:
                state["waiting"] = waiting()[:300]
            except Exception as exc:  # racing the main thread: report, never fail the beat
                state["waiting"] = f"(unavailable: {type(exc).__name__})"
            state["since"] = e.waiting_since
        return state

    def _beat(self, store: Store) -> None:
        store.add(_beat_key(self.rank), 1)
        store.set(_state_key(self.rank), json.dumps(self._state()).encode())

    def _run(self) -> None:
        store = self._store
        assert store is not None
        watched = self._watched()
        last: dict[int, tuple[int, float]] = {}
        prev = time.monotonic()
        try:
            while not self._stop.wait(self.interval):
                now = time.monotonic()
                if now - prev > self.liveness / 2:
                    last.clear()  # this rank itself was stopped: nobody's silence counts
                prev = now
                self._beat(store)
                for r in watched:
                    if r in self._declared or r in self.engine.dead:
                        continue
                    count = store.add(_beat_key(r), 0)
                    seen = last.get(r)
                    if seen is None or seen[0] != count:
                        last[r] = (count, now)
                    elif now - seen[1] > self.liveness and not self._exited(store, r):
                        self._declare(store, r, now - seen[1])
                self._collect(store)
        except RingworldError as exc:
            if not self._stop.is_set():
                self.error = exc  # the store (launcher) is gone: the job is ending anyway

    def _exited(self, store: Store, rank: int) -> bool:
        try:
            raw = store.get(_state_key(rank), timeout=0.5)
        except RingworldError:
            return False
        try:
            return bool(json.loads(raw).get("exited"))
        except (ValueError, AttributeError):
            return False

    def _declare(self, store: Store, rank: int, silent: float) -> None:
        self._declared.add(rank)
        detail = (f"not responding: no heartbeat for {silent:.1f} s (liveness timeout "
                  f"{self.liveness:g} s; stopped, hung in native code, or cut off)")
        i = store.add(f"{_PREFIX}dead/count", 1)
        store.set(f"{_PREFIX}dead/{i}", json.dumps({"rank": rank, "detail": detail,
                                                    "by": self.rank}).encode())

    def _collect(self, store: Store) -> None:
        count = store.add(f"{_PREFIX}dead/count", 0)
        while self._seen_failures < count:
            self._seen_failures += 1
            try:
                raw = store.get(f"{_PREFIX}dead/{self._seen_failures}", timeout=2.0)
                info = json.loads(raw)
                rank, detail = int(info["rank"]), str(info["detail"])
            except (RingworldError, ValueError, KeyError, TypeError):
                continue
            if rank != self.rank:
                self._declared.add(rank)
                self.engine.remote_failures.append(
                    PeerFailure(rank, f"{detail} (found by rank {info.get('by')})"))

    # ------------------------------------------------------------------ diagnosis
    def explain(self, what: str) -> str:
        """Every rank's state as of its last heartbeat; for a collective that timed out, which
        ranks entered it and which did not. Cost: one store round trip per rank (0.5 s bound).
        """
        store = self._store
        if store is None:
            return ""
        current = self.engine.current
        states: dict[int, dict[str, Any] | None] = {}
        for r in range(self.size):
            try:
                states[r] = json.loads(store.get(_state_key(r), timeout=0.5))
            except (RingworldError, ValueError):
                states[r] = None
        lines = []
        if current is not None:
            ctx, seq, name, ranks = current
            if f"#{seq} on {name}" in what:
                arrived: list[int] = []
                missing: list[int] = []
                for i, w in enumerate(ranks):
                    st = states.get(w)
                    got = None if st is None else st.get("entered", {}).get(str(ctx))
                    (arrived if got is not None and got >= seq else missing).append(i)
                lines.append(f"ranks of {name} that entered #{seq}: {arrived or 'none'}; "
                             f"missing: {missing or 'none'} (as of their last heartbeat)")
        now = time.time()
        for r, st in states.items():
            if st is None:
                lines.append(f"  rank {r}: no state published")
            elif st.get("exited"):
                lines.append(f"  rank {r}: exited")
            elif "waiting" in st:
                since = st.get("since")
                for_s = f" for {now - since:.1f} s" if isinstance(since, float) else ""
                lines.append(f"  rank {r}: waiting{for_s} on {st['waiting']}")
            else:
                lines.append(f"  rank {r}: not in a communication call (computing?)")
        return "\n".join(lines)
