"""The handle torch gets back from every operation of the ringworld process group."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringworld.errors import Timeout
from ringworld.torch._worker import Worker


class Work(dist.Work):  # type: ignore[misc]  # torch's class: Any to mypy
    """One operation queued on the worker: ``wait()`` blocks until it is done, ``get_future()``
    returns a ``torch.futures.Future`` of its output tensors (set on the worker thread, so
    ``then`` callbacks run there, as with Gloo).

    Raises (from ``wait``, and set on the future): the operation's error, e.g. ``Timeout``,
    ``PeerFailure`` or ``ValueError``.
    """

    def __init__(self, worker: Worker, what: str, outputs: Any) -> None:
        super().__init__()
        self._worker = worker
        self._what = what
        self._outputs = outputs
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._source = -1
        self._future: torch.futures.Future[Any] = torch.futures.Future()

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._done.is_set() else "pending"
        return f"<ringworld Work {self._what} {state}>"

    def finish(self, error: BaseException | None = None, source: int = -1) -> None:
        """Complete the work (on the worker): wake waiters, then settle the future."""
        self._error = error
        self._source = source
        self._done.set()  # before the future: its callbacks may wait() on this work
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the operation is done; ``timeout`` of 0 waits as long as it takes.

        Raises:
            Timeout: not done within a positive ``timeout``.
            the operation's own error, if it failed.
        """
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._worker.wait_for(self._done, seconds if seconds > 0 else None):
            raise Timeout(f"ringworld {self._what}: not done after {seconds:g} s")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        """The future of the output tensors (a list, as Gloo's); completes with the work."""
        return self._future

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not); does not block."""
        return self._done.is_set()

    def is_success(self) -> bool:
        """Whether the operation has finished without error."""
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        """The operation's error, once it has failed; None otherwise."""
        return self._error

    def result(self) -> Any:
        """The output tensors (after :meth:`wait`)."""
        return self._outputs

    def synchronize(self) -> None:
        """Nothing to do for CPU tensors (no streams)."""

    def source_rank(self) -> int:
        """The rank a receive took its message from (``recv`` from any source), else -1."""
        return self._source

    def _source_rank(self) -> int:
        return self._source
