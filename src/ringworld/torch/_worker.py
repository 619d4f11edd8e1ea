"""The one thread that drives this process's Ringworld engine on behalf of torch.

The engine is not thread-safe, while torch calls a process group from any thread (the
autograd engine, future callbacks, the user's). So every Ringworld call of the backend runs on
one daemon thread, in the order the calls were made (the order torch requires every rank to
keep), as torch's MPI backend does::

    caller threads ──submit(task)──▶ FIFO ──▶ worker: run task ──▶ blocking collective, or
                                                 │                  start isend/irecv ──▶ pending
                                                 └── between tasks: test pending requests,
                                                     complete their futures

Collectives run as blocking calls (the shared-memory path is the fast one and only exists
blocking); point-to-point operations only start here and complete later, so a ``recv`` waiting
for a peer never holds up the collectives behind it. While requests are pending the worker
sleeps in short slices on the queue, releasing the GIL for the threads that compute.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ringworld.comm.requests import Request
from ringworld.errors import Timeout

T = TypeVar("T")

#: Shortest and longest sleep of the worker while point-to-point requests are pending (s).
POLL_MIN = 20e-6
POLL_MAX = 1e-3


@dataclass(slots=True)
class _Pending:
    request: Request[Any]
    done: Callable[[Any, BaseException | None], None]
    deadline: float | None
    what: str


class _Call:
    """A task submitted with :meth:`Worker.call`: its result, error and completion event."""

    __slots__ = ("error", "event", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.event = threading.Event()

    def __call__(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.event.set()


class Worker:
    """A FIFO of tasks run by one daemon thread, plus the point-to-point requests in flight."""

    def __init__(self) -> None:
        # queue.Queue, not SimpleQueue: CPython 3.11's SimpleQueue.get(timeout=t) can block for
        # ever. When its lock is free (a put() released it while no get() waited) but the queue
        # is empty, get() takes the lock, recomputes the time left, and if t has passed by
        # then (the thread was descheduled) waits on the lock with a negative timeout, which
        # means no timeout. The worker polls with timeouts of 20 us to 1 ms while requests
        # are pending, so it was hit: about one 3-rank torch send/recv job in 500 hung, the
        # worker asleep with a receive pending and its message already delivered.
        self._tasks: queue.Queue[Callable[[], None]] = queue.Queue()
        self._pending: list[_Pending] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="ringworld-torch", daemon=True)
        self._thread.start()

    @property
    def on_worker(self) -> bool:
        """Whether the calling thread is the worker itself."""
        return threading.current_thread() is self._thread

    def submit(self, task: Callable[[], None]) -> None:
        """Queue ``task`` (it must not raise: it reports its own errors). Cost: one queue put."""
        self._tasks.put(task)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker after every task queued before it; return or raise its result.

        Called on the worker itself (from a future callback) it runs the queue up to and
        including ``fn`` inline.
        """
        task = _Call(fn)
        self.submit(task)
        self.wait_for(task.event)
        if task.error is not None:
            raise task.error
        result: T = task.result
        return result

    def wait_for(self, event: threading.Event, timeout: float | None = None) -> bool:
        """Wait until ``event`` is set; on the worker thread, run tasks meanwhile (no deadlock)."""
        if not self.on_worker:
            return event.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._step(POLL_MAX)
        return True

    def watch(self, request: Request[Any], done: Callable[[Any, BaseException | None], None],
              timeout: float | None, what: str) -> None:
        """On the worker: call ``done(result, error)`` once ``request`` completes (or times out)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._pending.append(_Pending(request, done, deadline, what))

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread once the tasks queued before this call have run, and join it (the
        process's own worker lives as long as the process; this is for workers made apart).

        Raises:
            Timeout: the thread did not end within ``timeout`` seconds.
        """

        def end() -> None:
            self._stopped = True

        self.submit(end)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise Timeout(f"the ringworld-torch worker did not stop within {timeout:g} s")

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while not self._stopped:
            self._step(None)

    def _step(self, block: float | None) -> None:
        """Run one queued task, or wait up to ``block`` s (None: until one comes) for one.

        Pending requests are tested before every wait; while any are pending the waits are
        short slices, doubling from POLL_MIN to POLL_MAX.
        """
        poll = POLL_MIN
        while True:
            if self._pending:
                self._test_pending()
            wait = block if not self._pending else poll if block is None else min(poll, block)
            try:
                task = self._tasks.get(timeout=wait)
            except queue.Empty:
                if block is not None:
                    return
                poll = min(2 * poll, POLL_MAX)
                continue
            task()
            return

    def _test_pending(self) -> None:
        pending, self._pending = self._pending, []
        now = time.monotonic()
        still: list[_Pending] = []
        for p in pending:
            try:
                finished = p.request.test()
                if not finished and p.deadline is not None and now > p.deadline:
                    p.request.cancel()
                    raise Timeout(f"{p.what} did not complete within its timeout")
                result = p.request.wait() if finished else None
            except BaseException as exc:
                p.done(None, exc)
                continue
            if finished:
                p.done(result, None)
            else:
                still.append(p)
        self._pending = still + self._pending  # callbacks may have started new requests


_lock = threading.Lock()
_worker: Worker | None = None


def worker() -> Worker:
    """The process's worker, started on first use."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = Worker()
        return _worker
