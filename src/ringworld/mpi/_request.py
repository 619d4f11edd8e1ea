"""``MPI.Request``: mpi4py's request API over native ``ringworld.Request[Any]`` objects.

A request is *active* (a native request in flight), *complete* (finished, its status and result
held until a Wait/Test hands them out) or *null*. Handing out a completion makes the request null,
as MPI does: afterwards ``request == MPI.REQUEST_NULL`` and ``bool(request)`` is false.
Waiting on or testing a null request completes at once with an empty status.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import ringworld
from ringworld.mpi._constants import ANY_SOURCE, ANY_TAG, PROC_NULL, UNDEFINED
from ringworld.mpi._status import Status


class _Kind:
    """What a request's native completes with. Plain class constants: an enum member's
    lookup took 60 ns of every nonblocking call, a sixth of the layer's cost there."""

    SEND = "send"
    RECV_BUF = "recv_buf"
    RECV_OBJ = "recv_obj"
    COLL = "collective"


class _Done:
    """The outcome of a finished operation, kept until handed out (never changed: the
    constants below are shared). A plain class: a frozen dataclass's ``__init__`` took 0.6 us
    of every received ``Wait``, most of the layer's cost there."""

    __slots__ = ("cancelled", "nbytes", "result", "source", "tag")

    def __init__(self, source: int, tag: int, nbytes: int, cancelled: bool = False,
                 result: Any = None) -> None:
        self.source = source
        self.tag = tag
        self.nbytes = nbytes
        self.cancelled = cancelled
        self.result = result

    def fill(self, status: Status | None) -> None:
        if status is not None:
            status._set(self.source, self.tag, self.nbytes, self.cancelled)


EMPTY_DONE = _Done(ANY_SOURCE, ANY_TAG, 0)
_CANCELLED = _Done(ANY_SOURCE, ANY_TAG, 0, cancelled=True)
PROC_NULL_DONE = _Done(PROC_NULL, ANY_TAG, 0)  # a receive from PROC_NULL


def _status_list(statuses: list[Status] | None, n: int) -> list[Status] | None:
    """Grow a caller's statuses list to ``n`` entries (as mpi4py does) and return it."""
    if statuses is not None:
        statuses.extend(Status() for _ in range(n - len(statuses)))
    return statuses


class Request:
    """A nonblocking operation; ``Request()`` is a null request like ``MPI.REQUEST_NULL``."""

    __slots__ = ("_done", "_kind", "_native")

    def __init__(self) -> None:
        self._native: ringworld.Request[Any] | None = None
        self._kind = _Kind.SEND
        self._done: _Done | None = None

    @classmethod
    def _wrap(cls, native: ringworld.Request[Any], kind: str) -> Request:
        request = object.__new__(cls)  # (every field set here: no __init__ call per request)
        request._native = native
        request._kind = kind
        request._done = None
        return request

    @classmethod
    def _completed(cls, done: _Done) -> Request:
        request = object.__new__(cls)  # (as _wrap's: a small Isend returns one of these)
        request._native = None
        request._kind = _Kind.SEND
        request._done = done
        return request

    def __bool__(self) -> bool:
        return self._native is not None or self._done is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or (not self and not other)  # all null requests are equal

    __hash__ = None  # type: ignore[assignment]  # a mutable handle, unhashable as in mpi4py

    def __repr__(self) -> str:
        state = "active" if self._native is not None else "complete" if self._done else "null"
        return f"<MPI.Request {self._kind} {state}>"

    # -- internal state transitions ---------------------------------------------------------

    def _finish(self, result: Any) -> None:
        """Record the completion of the native request, whose wait() returned ``result``."""
        native = self._native
        self._native = None
        if self._kind == _Kind.RECV_BUF:
            st: ringworld.Status | None = result
            result = None
        elif self._kind == _Kind.RECV_OBJ and native is not None:
            st = native.status
        else:
            self._done = EMPTY_DONE
            return
        if st is None:
            self._done = _Done(ANY_SOURCE, ANY_TAG, 0, result=result)
        else:
            self._done = _Done(st.source, st.tag, st.nbytes, st.cancelled, result)

    def _ready(self) -> bool:
        """Complete the request if it has finished; true if complete (not null)."""
        if self._native is not None and self._native.test():
            self._finish(self._native.wait())
        return self._done is not None

    def _block(self) -> None:
        if self._native is not None:
            self._finish(self._native.wait())

    def _release(self, status: Status | None) -> Any:
        """Hand out the completion (empty for a null request) and become null."""
        done = self._done if self._done is not None else EMPTY_DONE
        self._done = None
        done.fill(status)
        return done.result

    # -- single request ---------------------------------------------------------------------

    def Wait(self, status: Status | None = None) -> Literal[True]:
        """Wait for completion; fill ``status`` if given."""
        if status is None:  # the common call: nothing to hand out
            native = self._native
            if native is not None:
                native.wait()
            self._native = self._done = None  # released (a persistent request: inactive)
            return True
        self._block()
        self._release(status)
        return True

    def wait(self, status: Status | None = None) -> Any:
        """Wait for completion and return the received object (None for sends)."""
        self._block()
        return self._release(status)

    def Test(self, status: Status | None = None) -> bool:
        """Return whether the operation is complete; if so, fill ``status`` and become null."""
        if self._native is not None and not self._ready():
            return False
        self._release(status)
        return True

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        """Return ``(True, obj)`` if complete (becoming null), else ``(False, None)``."""
        if self._native is not None and not self._ready():
            return False, None
        return True, self._release(status)

    def Get_status(self, status: Status | None = None) -> bool:
        """Like ``Test`` but leaves the request as it is."""
        if self._native is not None and not self._ready():
            return False
        (self._done if self._done is not None else EMPTY_DONE).fill(status)
        return True

    def Cancel(self) -> None:
        """Try to cancel; a later Wait reports ``Is_cancelled()`` if it took effect."""
        if self._native is not None and self._native.cancel():
            self._native = None
            self._done = _CANCELLED

    cancel = Cancel

    def Free(self) -> None:
        """Make the request null; an operation in flight still runs to completion."""
        self._native = None
        self._done = None

    # -- several requests -------------------------------------------------------------------

    @staticmethod
    def _wait_all(requests: Sequence[Request]) -> None:
        active = [r for r in requests if r._native is not None]
        if active:
            results = ringworld.wait_all([r._native for r in active if r._native is not None])
            for request, result in zip(active, results, strict=True):
                request._finish(result)

    @staticmethod
    def _wait_any(requests: Sequence[Request]) -> int:
        """Complete one request; return its index, or UNDEFINED if all are null."""
        active: list[tuple[int, ringworld.Request[Any]]] = []
        for i, request in enumerate(requests):
            if request._done is not None:
                return i
            if request._native is not None:
                active.append((i, request._native))
        if not active:
            return UNDEFINED
        j, result = ringworld.wait_any([native for _, native in active])
        i = active[j][0]
        requests[i]._finish(result)
        return i

    @staticmethod
    def _release_some(
        requests: Sequence[Request], statuses: list[Status] | None
    ) -> tuple[list[int], list[Any]]:
        indices = [i for i, r in enumerate(requests) if r._ready()]
        slots = _status_list(statuses, len(requests))
        objs = [
            requests[i]._release(slots[k] if slots is not None else None)
            for k, i in enumerate(indices)
        ]
        return indices, objs

    @classmethod
    def Waitall(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> Literal[True]:
        """Wait for every request; ``statuses[i]`` receives request i's status."""
        if statuses is not None:
            cls.waitall(requests, statuses)
            return True
        # the common call: nothing to hand out, so no completion records are made
        one = None
        for r in requests:
            native = r._native
            if native is not None:
                if one is not None:  # (one wait for all: a dead peer any needs fails it at once)
                    ringworld.wait_all([q._native for q in requests if q._native is not None])
                    break  # (it raises before any request is released, as waitall)
                one = native
        else:
            if one is not None:  # (an exchange's receive, its send gone at once: 0.2 us less)
                one.wait()
        for r in requests:
            r._native = r._done = None  # released (a persistent request: inactive)
        return True

    @classmethod
    def waitall(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> list[Any]:
        """Wait for every request; return the received objects in order."""
        cls._wait_all(requests)
        slots = _status_list(statuses, len(requests))
        return [r._release(slots[i] if slots is not None else None) for i, r in enumerate(requests)]

    @classmethod
    def Waitany(cls, requests: Sequence[Request], status: Status | None = None) -> int:
        """Wait for one request; return its index (``UNDEFINED`` if all are null)."""
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        """Wait for one request; return ``(index, obj)`` (``(UNDEFINED, None)`` if all null)."""
        index = cls._wait_any(requests)
        if index == UNDEFINED:
            EMPTY_DONE.fill(status)
            return UNDEFINED, None
        return index, requests[index]._release(status)

    @classmethod
    def Waitsome(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> list[int] | None:
        """Wait for at least one request; return the completed indices (None if all null)."""
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> tuple[list[int] | None, list[Any] | None]:
        """Wait for at least one request; return ``(indices, objs)`` (Nones if all null)."""
        if cls._wait_any(requests) == UNDEFINED:
            return None, None
        return cls._release_some(requests, statuses)

    @classmethod
    def Testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """If every request is complete, hand all out and return True; else change nothing."""
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> tuple[bool, list[Any] | None]:
        """Return ``(True, objs)`` if every request is complete, else ``(False, None)``."""
        complete = [r._ready() or not r for r in requests]  # progress every request
        if not all(complete):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Testany(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """Return ``(index, True)`` for a complete request, ``(UNDEFINED, flag)`` otherwise.

        ``flag`` is True when every request is null.
        """
        index, flag, _ = cls.testany(requests, status)
        return index, flag

    @classmethod
    def testany(
        cls, requests: Sequence[Request], status: Status | None = None
    ) -> tuple[int, bool, Any]:
        """Return ``(index, True, obj)`` for a complete request, or ``(UNDEFINED, flag, None)``.

        ``flag`` is True when every request is null.
        """
        if not any(requests):
            EMPTY_DONE.fill(status)
            return UNDEFINED, True, None
        for i, request in enumerate(requests):
            if request._ready():
                return i, True, request._release(status)
        return UNDEFINED, False, None

    @classmethod
    def Testsome(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> list[int] | None:
        """Return the indices of complete requests (maybe empty; None if all are null)."""
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(
        cls, requests: Sequence[Request], statuses: list[Status] | None = None
    ) -> tuple[list[int] | None, list[Any] | None]:
        """Return ``(indices, objs)`` of complete requests (Nones if all are null)."""
        if not any(requests):
            return None, None
        return cls._release_some(requests, statuses)


REQUEST_NULL = Request()
