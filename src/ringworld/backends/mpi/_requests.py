"""Requests of the MPI backend: ringworld :class:`~ringworld.Request` objects over MPI requests.

Two kinds:

* :class:`MpiRequest` wraps an ``MPI.Request`` (sends, collectives): ``done`` tests it,
  ``wait(None)`` blocks in ``MPI.Wait``, ``wait(t)`` polls until the deadline.
* :class:`LazyRecv` is a receive matched by this process with ``MPI.Improbe`` before any byte
  lands, so a message larger than the buffer raises :class:`~ringworld.TruncationError` and
  leaves the buffer untouched (MPI would write part of it), and object receives learn the size
  first. Pending lazy receives of one communicator are matched in posting order
  (:class:`Matcher`), which keeps MPI's matching order between receives.

All of them share one :class:`Poller` per world, the stand-in for the native engine that
``ringworld.wait_all`` and friends call.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar, cast

from mpi4py import MPI

from ringworld.comm.requests import Request, Status
from ringworld.errors import CommError, Timeout, TruncationError

if TYPE_CHECKING:
    from ringworld.comm.engine import Engine

T = TypeVar("T")
SPINS = 200          # polls before a waiting loop starts to sleep
MAX_SLEEP = 0.001    # longest sleep between polls, seconds


class Poller:
    """Waits for conditions with a deadline; the engine-like object MPI-backend requests use.

    Cost: one ``cond()`` per poll; after :data:`SPINS` polls it sleeps up to
    :data:`MAX_SLEEP` s between polls (ranks may outnumber cores).
    """

    def __init__(self, rank: int, timeout: float | None) -> None:
        self.rank = rank
        self.timeout = timeout
        self.matchers: weakref.WeakSet[Matcher] = weakref.WeakSet()

    def busy(self) -> bool:
        """Whether some communicator has lazy receives waiting for a message. A wait must
        then poll (and match them) instead of blocking inside MPI: a send or collective may
        need one of those receives to start first (irecv; isend; wait)."""
        return any(m.pending for m in self.matchers)

    def progress(self) -> bool:
        """Match arrived messages to pending lazy receives on every communicator."""
        for m in list(self.matchers):
            if m.pending:
                m.progress()
        return False

    def wait_for(self, cond: Callable[[], bool], timeout: float | None,
                 describe: Callable[[], str],
                 depends: Callable[[Collection[int]], int | None] | None = None) -> None:
        """Poll ``cond`` until it holds.

        Raises:
            Timeout: not within ``timeout`` s (None: the default timeout; both None: never).
        """
        limit = self.timeout if timeout is None else timeout
        if limit is not None and limit < 0:
            raise ValueError(f"timeout={limit} must be >= 0 or None")
        deadline = None if limit is None else time.monotonic() + limit
        polls = 0
        while not cond():
            self.progress()
            polls += 1
            if polls > SPINS:
                if deadline is not None and time.monotonic() > deadline:
                    raise Timeout(f"{describe()}: not complete after {limit:g} s (MPI backend, "
                                  f"rank {self.rank})")
                time.sleep(min(MAX_SLEEP, 1e-5 * (polls - SPINS)))


def make_status(st: Any, cancelled: bool = False) -> Status:
    """A ringworld Status from an ``MPI.Status``."""
    return Status(st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE), cancelled)


class MpiRequest(Request[T]):
    """A nonblocking MPI operation; ``finish(status)`` gives the result once it completed."""

    __slots__ = ("_done", "_finish", "_keep", "_req", "_what")

    def __init__(self, poller: Poller, req: Any, what: str,
                 finish: Callable[[Any], T] | None = None, keep: object = None) -> None:
        super().__init__(cast("Engine", poller))
        self._req = req
        self._what = what
        self._finish = finish
        self._keep = keep  # buffers, datatypes and ops MPI uses until completion
        self._done = False

    def _complete(self, st: Any) -> None:
        self._done = True
        try:
            self._result = self._finish(st) if self._finish is not None else None
        except BaseException as exc:
            self._error = exc
        self._keep = None

    @property
    def done(self) -> bool:
        if not self._done:
            st = MPI.Status()
            if self._req.Test(st):
                self._complete(st)
        return self._done

    def describe(self) -> str:
        return self._what

    def wait(self, timeout: float | None = None) -> T:
        """Block until complete (``MPI.Wait`` when no timeout applies) and return the result.

        Raises:
            Timeout: not complete within ``timeout`` s (the operation stays in flight: a timed
                out collective leaves its communicator unusable, as in MPI).
        """
        poller = cast(Poller, self._engine)
        if not self._done:
            if timeout is None and poller.timeout is None and not poller.busy():
                st = MPI.Status()
                self._req.Wait(st)
                self._complete(st)
            else:
                poller.wait_for(lambda: self.done, timeout, self.describe)
        return self._value()

    def cancel(self) -> bool:
        """Sends and collectives cannot be cancelled here; returns False."""
        return False


def _matches(source: int, tag: int, st: Status) -> bool:
    return (source in (MPI.ANY_SOURCE, st.source)) and (tag in (MPI.ANY_TAG, st.tag))


class Matcher:
    """Matching for one communicator's lazy receives, as MPI orders it.

    Messages are taken off MPI in arrival order (``Improbe`` of any source and tag, so each
    sender's messages stay in send order) into :attr:`unexpected`; each is given to the oldest
    pending receive it matches, or waits there for a later receive or probe.
    """

    __slots__ = ("__weakref__", "comm", "pending", "unexpected")

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.pending: list[LazyRecv[Any]] = []
        self.unexpected: list[tuple[Any, Status]] = []

    def idle(self) -> bool:
        """Whether no receive is pending and no message was taken off MPI unreceived."""
        return not self.pending and not self.unexpected

    def progress(self) -> None:
        """Take arrived messages off MPI and give them to pending receives, oldest first.
        Cost: one ``Improbe`` per arrived message plus one that finds none."""
        while True:
            st = MPI.Status()
            msg = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            if msg is None:
                break
            self.unexpected.append((msg, make_status(st)))
        if not self.pending or not self.unexpected:
            return
        still = []
        for r in self.pending:
            for i, (msg, st) in enumerate(self.unexpected):
                if _matches(r.source, r.tag, st):
                    del self.unexpected[i]
                    r.start(msg, st)
                    break
            else:
                still.append(r)
        self.pending = still

    def find(self, source: int, tag: int) -> Status | None:
        """The Status of the first unreceived message matching ``(source, tag)``, or None."""
        self.progress()
        for _, st in self.unexpected:
            if _matches(source, tag, st):
                return st
        return None


class LazyRecv(Request[T]):
    """A receive matched with ``Improbe``, then received with ``Message.Irecv``.

    ``buf`` is a writable uint8 view of the receive buffer, or None to allocate the message's
    size (object receives); ``finish(data, status)`` gives the result.
    """

    __slots__ = ("_buf", "_data", "_done", "_finish", "_matcher", "_req", "_st", "_what",
                 "source", "tag")

    def __init__(self, poller: Poller, matcher: Matcher, source: int, tag: int,
                 buf: Any, finish: Callable[[Any, Status], T], what: str) -> None:
        super().__init__(cast("Engine", poller))
        self._matcher = matcher
        self.source, self.tag = source, tag
        self._buf = buf
        self._finish = finish
        self._what = what
        self._req: Any = None
        self._data: Any = None
        self._st: Status | None = None
        self._done = False
        matcher.pending.append(self)

    def start(self, msg: Any, st: Status) -> None:
        """Receive the matched message ``msg`` (nonblocking)."""
        self._st = st
        nbytes = st.nbytes
        if self._buf is None:
            self._data = bytearray(nbytes)
        elif nbytes > len(self._buf):
            self._data = bytearray(nbytes)  # consume the message, leave the buffer untouched
            self._error = TruncationError(nbytes, len(self._buf), self._what)
        else:
            self._data = self._buf[:nbytes]
        self._req = msg.Irecv([self._data, nbytes, MPI.BYTE])

    @property
    def done(self) -> bool:
        if self._done:
            return True
        if self._req is None:
            self._matcher.progress()
            if self._req is None:
                return False
        if self._req.Test():
            self._complete()
        return self._done

    def _complete(self) -> None:
        self._done = True
        self.status = self._st
        if self._error is None:
            assert self._st is not None
            try:
                self._result = self._finish(self._data, self._st)
            except BaseException as exc:
                self._error = exc
        self._data = self._buf = None

    def describe(self) -> str:
        return self._what

    def wait(self, timeout: float | None = None) -> T:
        """Block until received and return the result.

        Raises:
            Timeout: nothing arrived within ``timeout`` s (the receive is withdrawn, so no
                data lands later); TruncationError: the message is larger than the buffer.
        """
        poller = cast(Poller, self._engine)
        if not self._done:
            try:
                poller.wait_for(lambda: self.done, timeout, self.describe)
            except Timeout:
                if self.cancel():
                    raise
                poller.wait_for(lambda: self.done, None, self.describe)
        return self._value()

    def cancel(self) -> bool:
        """Withdraw the receive if no message matched it yet; return whether it was."""
        if self._done or self._req is not None:
            return False
        self._matcher.progress()
        if self._req is not None:
            return False
        self._matcher.pending = [r for r in self._matcher.pending if r is not self]
        self._done = True
        self._error = CommError(f"{self._what} was cancelled")
        self.status = Status(self.source, self.tag, 0, True)
        return True
