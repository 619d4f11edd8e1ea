"""The handle torch gets back from every operation of the ringworld process group."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringworld.errors import RingworldError, Timeout
from ringworld.torch._worker import Worker


def torch_error(what: str, exc: BaseException) -> BaseException:
    """How torch users see a failed operation: a communication failure of Ringworld's
    (PeerFailure, Timeout, MismatchError, ...) as torch's ``DistBackendError`` carrying
    Ringworld's message (the rank named) and chained to it; any other error as it is."""
    if isinstance(exc, RingworldError):
        err: BaseException = dist.DistBackendError(
            f"ringworld {what}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err
    return exc


class Work(dist.Work):  # type: ignore[misc]  # torch's class: Any to mypy
    """One operation queued on the worker: ``wait()`` blocks until it is done, ``get_future()``
    returns a ``torch.futures.Future`` of its output tensors (set on the worker thread, so
    ``then`` callbacks run there, as with Gloo).

    Raises (from ``wait``, and set on the future): the operation's error; a communication
    failure (``PeerFailure``, ``Timeout``, ``MismatchError``...) as torch's ``DistBackendError``
    with Ringworld's message (see :func:`torch_error`).
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
        self._after: torch.futures.Future[Any] | None = None

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._done.is_set() else "pending"
        return f"<ringworld Work {self._what} {state}>"

    def after(self, fut: torch.futures.Future[Any]) -> None:
        """Make :meth:`wait` also wait for ``fut`` (the profiler's span closing on the work's
        future), which completes right after the work's own future."""
        self._after = fut

    def finish(self, error: BaseException | None = None, source: int = -1) -> None:
        """Complete the work (on the worker): wake waiters, then settle the future."""
        if error is not None:
            error = torch_error(self._what, error)
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
            DistBackendError: not done within a positive ``timeout`` (from Ringworld's
                Timeout), or the operation's own failure (see the class).
        """
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._worker.wait_for(self._done, seconds if seconds > 0 else None):
            raise torch_error(self._what, Timeout(f"not done after {seconds:g} s"))
        if self._after is not None:
            with contextlib.suppress(Exception):  # it fails as the work did: raised below
                self._after.wait()
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
