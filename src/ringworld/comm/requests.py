"""Statuses and requests: the handles of point-to-point operations.

A :class:`Request` completes when its operation has finished locally (a send's buffer may be
reused, a receive's data is in place). ``wait`` blocks (spin, yield, then sleep) and returns the
operation's result; ``test`` makes progress once and says whether it completed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

from ringworld.errors import MismatchError, ShortMessageError, TruncationError
from ringworld.transport.base import Incoming, SendHandle

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from ringworld.comm.engine import Engine

T = TypeVar("T")

ANY_SOURCE = -1
ANY_TAG = -1
TAG_UB = 2**31 - 1
SIG_SHIFT = 32  # collective tags: sequence number | call signature << SIG_SHIFT
SEQ_MASK = (1 << SIG_SHIFT) - 1
FLAG_SYNC = 4  # message flag: a synchronous send, acknowledged when a receive matches it
ACK_CONTEXT = 0x7FFFFFFF  # the acknowledgements' context (tag: context << 32 | tag acknowledged)


class Status(NamedTuple):
    """What a receive or probe found: the sender's rank, the tag and the message size in bytes."""

    source: int
    tag: int
    nbytes: int
    cancelled: bool = False

    def count(self, dtype: DTypeLike = "u1") -> int:
        """Number of ``dtype`` elements in the message (default: bytes).

        Raises:
            ValueError: the byte count is not a multiple of the item size.
        """
        import numpy as np

        size = np.dtype(dtype).itemsize
        if size == 0 or self.nbytes % size:
            raise ValueError(f"message of {self.nbytes} bytes is not a whole number of "
                             f"{np.dtype(dtype)} elements ({size} bytes each)")
        return self.nbytes // size


_new_status = tuple.__new__  # builds a Status without NamedTuple's slower __new__


class Request(Generic[T]):
    """Handle of a nonblocking operation; ``wait()`` returns its result."""

    __slots__ = ("_engine", "_error", "_result", "status")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._error: BaseException | None = None
        self._result: Any = None
        self.status: Status | None = None

    @property
    def done(self) -> bool:
        """Whether the operation has completed (without making progress)."""
        raise NotImplementedError

    def _value(self) -> T:
        if self._error is not None:
            raise self._error
        result: T = self._result
        return result

    def describe(self) -> str:
        """A short description for timeout and failure messages."""
        return type(self).__name__

    @property
    def peer(self) -> int:
        """The world rank this operation sends to or receives from (-1: any, or none)."""
        return -1

    def depends(self, dead: Collection[int]) -> int | None:
        """A dead world rank this operation cannot complete without, or None."""
        return None

    def wait(self, timeout: float | None = None) -> T:
        """Block until the operation completes and return its result.

        Raises:
            Timeout: not complete within ``timeout`` seconds (default: the job's timeout).
            PeerFailure: a peer it depends on failed.
            TruncationError: (receives) the message was larger than the buffer.
            ValueError: ``timeout`` is negative or NaN.
        """
        if timeout is not None:
            check_timeout(timeout)
        if not self.done:
            self._engine.wait_for(lambda: self.done, timeout, self.describe, self.depends)
        return self._value()

    def test(self) -> bool:
        """Make progress once; return whether the operation has completed."""
        if self.done:
            return True
        self._engine.progress()
        return self.done

    def cancel(self) -> bool:
        """Try to cancel; return True if the operation will not happen (only unmatched receives)."""
        return False


class CompletedRequest(Request[T]):
    """A request that completed when it was created (self messages, null processes)."""

    __slots__ = ()

    def __init__(self, engine: Engine, result: T, status: Status | None = None) -> None:
        # (every slot set here, not through Request's __init__: 0.1 us less of every small
        # nonblocking send, which returns one of these)
        self._engine = engine
        self._error = None
        self._result = result
        self.status = status

    @property
    def done(self) -> bool:
        return True


class SendRequest(Request[None]):
    """A send in flight; done once the transport no longer needs the buffer."""

    __slots__ = ("_context", "_dest", "_handle", "_keep")

    def __init__(self, engine: Engine, handle: SendHandle, dest: int, keep: object = None,
                 context: int = -1) -> None:
        super().__init__(engine)
        self._handle = handle
        self._dest = dest
        self._keep = keep  # objects whose buffers the transport still reads
        self._context = context

    @property
    def done(self) -> bool:
        if self._handle.done:
            self._keep = None
            return True
        revoked = self._engine.revoked
        if revoked and self._context in revoked:  # the receiver will never take it
            self._error = revoked[self._context]
            return True
        return False

    def describe(self) -> str:
        return f"send to rank {self._dest}"

    @property
    def peer(self) -> int:
        return self._dest

    def depends(self, dead: Collection[int]) -> int | None:
        return self._dest if self._dest in dead else None


class SyncSendRequest(SendRequest):
    """A synchronous send in flight: done once the buffer is free and a receive on the
    destination has matched the message (the receiver acknowledges the match)."""

    __slots__ = ("acked",)

    def __init__(self, engine: Engine, dest: int, keep: object = None,
                 context: int = -1) -> None:
        super().__init__(engine, _UNSENT, dest, keep, context)
        self.acked = False

    @property
    def done(self) -> bool:
        if self.acked:
            return SendRequest.done.fget(self)  # type: ignore[attr-defined,no-any-return]
        revoked = self._engine.revoked
        if revoked and self._context in revoked:
            self._error = revoked[self._context]
            return True
        return False

    def describe(self) -> str:
        return f"synchronous send to rank {self._dest} (until a receive there matches it)"


class _Unsent:
    done = False


_UNSENT: Any = _Unsent()


class RecvRequest(Request[T]):
    """A posted receive; matched against arriving messages by (source, tag) within a context."""

    __slots__ = ("_done", "_to_comm", "context", "dest", "incoming_flags", "matched", "source",
                 "tag")
    #: whether a message shorter than ``dest`` is an error (a collective's block) or legal
    exact: ClassVar[bool] = False

    def __init__(self, engine: Engine, context: int, source: int, tag: int,
                 dest: memoryview | None, to_comm: Callable[[int], int]) -> None:
        self._engine = engine  # Request.__init__ inlined: receives are the hot path
        self._error = None
        self._result = None
        self.status = None
        self.context = context
        self.source = source   # world rank or ANY_SOURCE
        self.tag = tag
        self.dest = dest       # None: allocate on match (object receives)
        self._to_comm = to_comm
        self._done = False
        self.matched = False
        self.incoming_flags = 0

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> T:
        if timeout is not None:
            check_timeout(timeout)
        if not self._done:
            self._engine.wait_for(lambda: self._done, timeout, self.describe, self.depends)
        return self._value()

    def wait_or_cancel(self, timeout: float | None) -> T:
        """Wait; on a timeout or failure, withdraw the receive so no data lands later."""
        try:
            return self.wait(timeout)
        except BaseException:
            self.cancel()
            raise

    def describe(self) -> str:
        src = "any source" if self.source == ANY_SOURCE else f"rank {self._to_comm(self.source)}"
        tag = ("any tag" if self.tag == ANY_TAG else f"tag {self.tag}" if self.tag <= TAG_UB
               else f"tag {self.tag & SEQ_MASK}")
        return f"receive from {src} with {tag}"

    @property
    def peer(self) -> int:
        return self.source  # ANY_SOURCE is -1

    def depends(self, dead: Collection[int]) -> int | None:
        if self.source != ANY_SOURCE:
            return self.source if self.source in dead else None
        # any source: fails only once no other rank is left to send
        return min(dead) if len(dead) >= self._engine.size - 1 else None

    def bind(self, inc: Incoming) -> None:
        """Take ``inc`` as this receive's message and start moving its payload."""
        self.matched = True
        flags = inc.flags
        if flags & FLAG_SYNC:  # the sender waits for this match
            flags ^= FLAG_SYNC
            self._engine.acknowledge(inc.source, inc.context, inc.tag)
        self.incoming_flags = flags
        self.status = _new_status(Status, (self._to_comm(inc.source), inc.tag, inc.nbytes, False))
        dest = self.dest
        if dest is None:
            self.dest = dest = _aligned(inc.nbytes)
        elif inc.nbytes != len(dest):
            err: Exception | None = None
            if inc.nbytes > len(dest):
                err = TruncationError(inc.nbytes, len(dest), f"from rank {self.status.source}"
                                      + ("" if self.exact else f", tag {inc.tag}"))
            elif self.exact and not inc.nbytes:  # (schedules send no empty blocks): a peer
                # that found this call broken tells this rank so (CallChecks._fail_mismatched)
                err = MismatchError(f"rank {self.status.source} found this collective call "
                                    f"broken (ranks called different collectives: its error "
                                    f"shows both)")
            elif self.exact:  # short: legal for a receive, not for a collective's block
                err = ShortMessageError(
                    f"rank {self.status.source} sent {inc.nbytes} bytes where this rank "
                    f"expects {len(dest)}: the ranks gave different counts for the block")
            if err is not None:  # the caller's buffer is left untouched
                self._error = err
                inc.read_into(_aligned(inc.nbytes), self._complete)
                return
        inc.read_into(dest, self._complete)

    def _complete(self) -> None:
        self._done = True

    def cancel(self) -> bool:
        if self.matched or self._done:
            return False
        if not self._engine.unpost(self):
            return False
        self.status = Status(ANY_SOURCE, ANY_TAG, 0, cancelled=True)
        self._done = True
        return True


class BufferRecvRequest(RecvRequest[Status]):
    """A receive into a caller's buffer; ``wait()`` returns the :class:`Status`."""

    __slots__ = ()

    def _value(self) -> Status:
        if self._error is not None:
            raise self._error
        assert self.status is not None
        return self.status


class BlockRecvRequest(BufferRecvRequest):
    """A receive of a collective's block: a shorter message fails it with ShortMessageError
    (the sender gave another count for the block), where a receive takes it."""

    __slots__ = ()
    exact = True


ALIGN_FROM = 65536  # buffers at least this large are 64-byte aligned (memcpy speed)


def _aligned(nbytes: int) -> memoryview:
    """A fresh writable buffer of ``nbytes``; 64-byte aligned when large enough to matter."""
    if nbytes < ALIGN_FROM:
        return memoryview(bytearray(nbytes))
    import numpy as np

    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 64
    return raw[start : start + nbytes].data


def _first_dependency(requests: Sequence[Request[Any]], dead: Collection[int]) -> int | None:
    for r in requests:
        if not r.done:
            rank = r.depends(dead)
            if rank is not None:
                return rank
    return None


def raise_first_error(requests: Iterable[Request[Any]]) -> None:
    """Raise the error of the first of ``requests`` (completed ones) that failed, if any.

    Raises:
        That request's error.
    """
    for r in requests:
        if r._error is not None:
            raise r._error


def check_timeout(timeout: float) -> float:
    """``timeout`` (seconds) if it is one: a number >= 0, ``math.inf`` meaning no limit.

    Raises:
        TypeError: not a number.
        ValueError: negative or NaN (a wait with a NaN deadline would never end).
    """
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout={timeout!r} must be a number of seconds or None")
    if not timeout >= 0:  # also NaN
        raise ValueError(f"timeout={timeout!r} must be >= 0 seconds (inf: no limit) or None")
    return float(timeout)


def wait_all(requests: Sequence[Request[Any]], timeout: float | None = None) -> list[Any]:
    """Wait for every request; return their results in order.

    Raises:
        Timeout: some request is not complete within ``timeout`` seconds.
        The first error of a failed request, after all have completed.
    """
    if timeout is not None:
        check_timeout(timeout)
    last = None  # (the common wait: one pending, an exchange's receive, its send gone eagerly)
    for r in requests:  # (loops, not comprehensions: each of those is a call in 3.11)
        if not r.done:
            if last is not None:
                _wait_pending(requests, timeout)
                last = None
                break
            last = r
    if last is not None:
        one = last  # (bound outside the loop, for the condition's closure)
        one._engine.wait_for(lambda: one.done, timeout, one.describe, one.depends)
    results = []
    for r in requests:
        results.append(r._value())  # (raises the first failed request's error)
    return results


def _wait_pending(requests: Sequence[Request[Any]], timeout: float | None) -> None:
    """Wait until every request of several still pending is complete (see wait_all)."""
    pending = [r for r in requests if not r.done]
    pending[0]._engine.wait_for(
        lambda: all(r.done for r in pending), timeout,
        lambda: "; ".join(r.describe() for r in pending if not r.done),
        lambda dead: _first_dependency(pending, dead))


def wait_any(requests: Sequence[Request[Any]], timeout: float | None = None) -> tuple[int, Any]:
    """Wait until some request completes; return its index and result.

    Raises:
        ValueError: ``requests`` is empty.
        Timeout: none completed within ``timeout`` seconds.
    """
    if not requests:
        raise ValueError("requests is empty: wait_any needs at least one request")
    found: list[int] = []

    def any_done() -> bool:
        for i, r in enumerate(requests):
            if r.done:
                found.append(i)
                return True
        return False

    if not any_done():
        requests[0]._engine.wait_for(
            any_done, timeout, lambda: "any of: " + "; ".join(r.describe() for r in requests),
            lambda dead: _first_dependency(requests, dead))
    i = found[0]
    return i, requests[i]._value()


def test_all(requests: Sequence[Request[Any]]) -> bool:
    """Make progress once; return whether every request has completed."""
    if all(r.done for r in requests):
        return True
    requests[0]._engine.progress()
    return all(r.done for r in requests)


def test_any(requests: Sequence[Request[Any]]) -> int | None:
    """Make progress once; return the index of a completed request, or None."""
    for _ in range(2):
        for i, r in enumerate(requests):
            if r.done:
                return i
        if not requests:
            return None
        requests[0]._engine.progress()
    return None
