"""Run a schedule on a communicator: the one place where schedules meet point-to-point.

A :class:`CollectiveRequest` is a small state machine over a :class:`Schedule`: it posts a
step's receives and sends through the communicator's collective surface (``coll_irecv`` /
``coll_isend``, tagged with the collective's sequence number), and when they have all completed
runs the step's local copies and reductions (numpy, in place) and starts the next step. Blocking
collectives start one and run it to the end (``run_inline``); nonblocking ones return it. While
unfinished a nonblocking one is registered with the channel, so every progress call on this
rank (any wait, any test) advances it: a rank blocked elsewhere still forwards what its peers
need.

Algorithms never see transports, nor the engine: this module uses only the public surface of
the communicator's :class:`~ringworld.comm.channel.Channel` (those four methods, the call's
number and checks, its registration, the waits) and of the requests it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ringworld.algorithms.schedule import COPY, Schedule, Step
from ringworld.comm.ops import Op
from ringworld.comm.requests import (
    SEQ_MASK,
    RecvRequest,
    Request,
    check_timeout,
    raise_first_error,
)
from ringworld.errors import (
    CommBroken,
    PeerFailure,
    ShortMessageError,
    TruncationError,
    reaches_every_member,
)

if TYPE_CHECKING:
    from ringworld.comm.channel import Channel

T = TypeVar("T")
Array = np.ndarray[Any, Any]

ALIGN = 64
#: a blocking call's step whose one receive is at most this large sends first, then takes the
#: block as a blocking receive does (:meth:`Channel.coll_take`: no request, no matching); a
#: larger one is posted first, so that its payload lands in place as it arrives
TAKE_BYTES = 65536
_EMPTY = memoryview(bytearray(0))  # writable: zero-length receives (barriers) land here
_NO_DATA: np.ndarray[Any, Any] = np.empty(0, dtype=np.uint8)


def aligned_empty(count: int, dtype: np.dtype[Any]) -> Array:
    """An uninitialised 1-D array of ``count`` elements whose data is 64-byte aligned.

    Cost: one allocation; copies into 16-byte aligned buffers were measured up to 10x slower.
    """
    nbytes = count * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + nbytes].view(dtype)


class Scratch:
    """A reusable aligned scratch area of one communicator (no page faults per call)."""

    __slots__ = ("_buf", "busy")

    def __init__(self) -> None:
        self._buf: Array = np.empty(0, dtype=np.uint8)
        self.busy = False

    def take(self, count: int, dtype: np.dtype[Any]) -> tuple[Array, bool]:
        """``count`` elements of scratch and whether they are the shared area (to give back)."""
        if count == 0:
            return np.empty(0, dtype=dtype), False
        if self.busy:  # another collective in flight holds it: use a private area
            return aligned_empty(count, dtype), False
        nbytes = count * dtype.itemsize
        if self._buf.nbytes < nbytes:
            self._buf = aligned_empty(max(nbytes, 2 * self._buf.nbytes), np.dtype(np.uint8))
        self.busy = True
        return self._buf[:nbytes].view(dtype), True


class CollectiveRequest(Request[T]):
    """A collective in progress; ``wait()`` returns its result (``finish()``'s value)."""

    __slots__ = ("_arrays", "_bytes", "_comm", "_finish", "_finished", "_i", "_op",
                 "_pending", "_registered", "_scratch", "_steps", "_tag", "what")

    def __init__(self, comm: Channel, sched: Schedule, arrays: Sequence[Array],
                 op: Op | None, what: str | tuple[str, str], scratch: Scratch | None = None,
                 finish: Callable[[], T] | None = None, *, inline: bool = False,
                 sig: int = 0) -> None:
        comm.init_request(self)  # Request.__init__, on the communicator's rank
        self._comm = comm
        self._steps = sched.steps
        self._op = op
        self._finish = finish
        self.what = what
        # the call's signature rides in the tag's high bits: the engine fails a receive whose
        # peer sent the same sequence number with another signature (MismatchError); raises
        # before anything is sent if the sequence broke earlier
        self._tag = comm.begin_call(sig)
        arrs = list(arrays)
        while len(arrs) < 3:
            arrs.append(_NO_DATA)
        self._scratch: Scratch | None = None
        if sched.tmp:
            dtype = arrs[1].dtype if arrs[1].size or not arrs[0].size else arrs[0].dtype
            if scratch is not None:
                arrs[2], shared = scratch.take(sched.tmp, dtype)
                self._scratch = scratch if shared else None
            else:
                arrs[2] = aligned_empty(sched.tmp, dtype)
        self._arrays = arrs
        self._bytes: list[memoryview | None] = [None] * len(arrs)  # byte views, made on use
        self._pending: list[Request[Any]] = []
        self._i = 0
        self._finished = False
        self._registered = False
        try:
            if inline:
                return  # run_inline starts the steps
            if self._steps:
                self._start()
            if not self._advance():
                comm.register_call(self._tag, self._poll)
                self._registered = True
        except BaseException as exc:  # the call has its number: fail it as any step's failure
            self._fail(exc)  # (its peers' messages may still come, and are no strays)
            raise

    # ------------------------------------------------------------------ state machine
    def _view(self, buf: int) -> memoryview:
        a = self._arrays[buf]
        if not a.size:
            v = _EMPTY
        else:
            try:
                v = a.data.cast("B")  # the cheapest flat byte view (0.4 us against 1.2)
            except (TypeError, ValueError, NotImplementedError):  # no buffer format (datetime64)
                v = a.view(np.uint8).data
        self._bytes[buf] = v
        return v

    def _start(self) -> None:
        s = self._steps[self._i]
        comm, tag, views, arrays = self._comm, self._tag, self._bytes, self._arrays
        pending = self._pending
        for x in s.recvs:
            k = arrays[x.buf].itemsize
            v = views[x.buf] or self._view(x.buf)
            pending.append(comm.coll_irecv(v[x.start * k : (x.start + x.length) * k], x.peer,
                                           tag))
        self._send(s)

    def _send(self, s: Step) -> None:
        """Start step ``s``'s sends; those not done at once are pending."""
        comm, tag, views, arrays = self._comm, self._tag, self._bytes, self._arrays
        pending = self._pending
        for x in s.sends:
            k = arrays[x.buf].itemsize
            v = views[x.buf] or self._view(x.buf)
            h = comm.coll_isend(v[x.start * k : (x.start + x.length) * k], x.peer, tag)
            if h is not None:
                pending.append(h)

    def _start_taking(self) -> None:
        """Start a step of a blocking run: as :meth:`_start`, but a step with one small
        receive sends first and then takes its block straight from the transport, leaving
        nothing pending, where it has come (else it is posted, as :meth:`_start` posts it)."""
        s = self._steps[self._i]
        if len(s.recvs) != 1:
            self._start()
            return
        x = s.recvs[0]
        k = self._arrays[x.buf].itemsize
        if x.length * k > TAKE_BYTES:
            self._start()
            return
        self._send(s)
        comm, tag, pending = self._comm, self._tag, self._pending
        v = self._bytes[x.buf] or self._view(x.buf)
        v = v[x.start * k : (x.start + x.length) * k]
        if pending or not comm.coll_take(v, x.peer, tag):
            pending.insert(0, comm.coll_irecv(v, x.peer, tag))

    def _run_locals(self) -> None:
        arrays = self._arrays
        op = self._op
        for loc in self._steps[self._i].locals:
            dst = arrays[loc.dbuf][loc.dstart : loc.dstart + loc.length]
            src = arrays[loc.sbuf][loc.sstart : loc.sstart + loc.length]
            if loc.kind == COPY:
                np.copyto(dst, src)
            elif loc.obuf < 0:
                assert op is not None
                op.reduce_into(dst, src, loc.src_left)
            else:
                assert op is not None
                other = arrays[loc.obuf][loc.ostart : loc.ostart + loc.length]
                if loc.src_left:
                    op.combine_into(dst, src, other)
                else:
                    op.combine_into(dst, other, src)

    def _advance(self) -> bool:
        """Move through every step whose transfers are complete; return whether all are."""
        if self._finished:
            return True
        pending = self._pending
        while True:
            for r in pending:
                if not r.done:
                    return False
            raise_first_error(pending)
            pending.clear()
            if self._i < len(self._steps):
                self._run_locals()
                self._i += 1
            if self._i >= len(self._steps):
                self._complete()
                return True
            self._start()

    def _complete(self) -> None:
        self._comm.check_completed(self._tag)  # a stray found meanwhile: this call broke too?
        self._release()
        if self._finish is not None:
            self._result = self._finish()
        self._finished = True

    def _release(self) -> None:
        if self._scratch is not None:
            self._scratch.busy = False
            self._scratch = None
        if self._registered:
            self._registered = False
            self._comm.unregister_call(self._tag, self._poll, self._error is None)

    def _poll(self) -> None:
        """Advance from this rank's progress calls (see ``register_call``); errors are kept for
        ``wait``."""
        try:
            self._advance()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        detail = str(exc)
        if isinstance(exc, ShortMessageError | TruncationError) and not exc.call:
            # a block's receive found it: name the call (its peers learn of it below)
            exc.call = (f"{self._name()} #{self._tag & SEQ_MASK} on {self._comm.name} (rank "
                        f"{self._comm.rank} of {self._comm.size})")
            exc.args = (f"{exc.call}: {detail}",)
        if isinstance(exc, PeerFailure):
            # the rank left without doing its part: every member must learn it, also those
            # waiting on other ranks (a rank leaving with status 0 is no failure to the launcher)
            self._comm.report_failure(exc)
        elif not (reaches_every_member(exc) or isinstance(exc, CommBroken)):
            # members waiting for this rank's part would wait for good (or for their timeout):
            # they fail with this error instead (a broken communicator is the engine's: the
            # failure behind it reaches them as well)
            self._comm.report_left(self._tag,
                                   f"{self._name()} with {type(exc).__name__}: {detail}"[:400])
        self._error = exc
        self._finished = True
        # given up here: messages of this call may still come, and are no strays (see Engine)
        self._comm.abandon_call(self._tag)
        for r in self._pending:
            r.cancel()
        self._release()

    def run_inline(self, timeout: float | None) -> T:
        """Drive the schedule to the end from this call (blocking collectives).

        Not registered with the channel: nothing else needs to advance it. A step waiting for
        one receive spins on the transport first, like a blocking receive. ``timeout`` bounds
        each step's wait.

        Raises:
            As :meth:`wait`.
        """
        comm = self._comm
        steps = self._steps
        pending = self._pending
        try:
            if not steps:
                self._complete()
                return self._value()
            self._start_taking()
            while True:
                if pending:
                    first = pending[0]
                    if len(pending) == 1 and isinstance(first, RecvRequest):
                        # spins on the transport first; raises the receive's error
                        comm.wait_recv(first, self._step_done, timeout, self.describe,
                                       self.depends, (self._tag, self.awaits))
                    else:
                        if not self._step_done():
                            comm.progress_until(self._step_done, timeout, self.describe,
                                                self.depends, (self._tag, self.awaits))
                        raise_first_error(pending)
                    pending.clear()
                self._run_locals()
                self._i += 1
                if self._i >= len(steps):
                    self._complete()
                    return self._value()
                self._start_taking()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _step_done(self) -> bool:
        if all(r.done for r in self._pending):
            return True
        # sends may wait for receivers that never come: fail if the communicator's collective
        # sequence broke at this call or before, or a rank whose part is missing left it
        self._comm.check_call(self._tag)
        return False

    # ------------------------------------------------------------------ Request API
    @property
    def done(self) -> bool:
        if self._finished:
            return True
        try:
            return self._advance()
        except Exception as exc:
            self._fail(exc)
            return True

    def wait(self, timeout: float | None = None) -> T:
        """Wait for the collective; on a timeout or failure its pending receives are withdrawn.

        Raises:
            Timeout: not complete in time (names the collective, step and peers awaited).
            PeerFailure: a member of the communicator failed.
            TruncationError: a message was larger than expected (ranks disagree on counts).
        """
        try:
            if timeout is not None:
                check_timeout(timeout)
            if not self.done:  # (a collective's wait: the monitor judges it, see awaits)
                self._comm.progress_until(lambda: self.done, timeout, self.describe,
                                          self.depends, (self._tag, self.awaits))
            return self._value()
        except BaseException as exc:
            if not self._finished:
                self._fail(exc)
            raise

    def _name(self) -> str:
        what = self.what
        if not isinstance(what, str):  # (collective, algorithm): sized only when needed
            nbytes = max((a.nbytes for a in self._arrays if a is not _NO_DATA), default=0)
            what = f"{what[0]} ({what[1]}, {nbytes} bytes)"
        return what

    def describe(self) -> str:
        waiting = sorted({r.peer for r in self._pending if not r.done})
        who = ", ".join(str(self._comm.to_comm(w)) for w in waiting if w >= 0)
        return (f"{self._name()} #{self._tag & SEQ_MASK} on {self._comm.name} (rank "
                f"{self._comm.rank} of {self._comm.size}), step {self._i + 1} of {len(self._steps)}"
                + (f", waiting for rank(s) {who}" if who else ""))

    def awaits(self, ranks: Collection[int]) -> int | None:
        """A world rank of ``ranks`` from which a receive of this step has had nothing yet, or
        None (called by the monitor's thread: see ``Monitor._left_behind``)."""
        for r in tuple(self._pending):
            if isinstance(r, RecvRequest) and not r.matched and r.source in ranks:
                return r.source
        return None

    def depends(self, dead: Collection[int]) -> int | None:
        """A dead world rank this step still waits for, or None.

        Peers that already did their part here may exit (a finished rank is not a failure);
        a peer that dies while others still wait for it fails them in turn, so failures reach
        every rank that depends on the dead one, directly or not.
        """
        # later steps are checked once they start, when what the dead peer sent before it
        # exited has been matched already
        need = {r.peer for r in self._pending if not r.done}
        # hung, or reported failed by the launcher: the collective never ends without them;
        # name them, the root cause
        failed = self._comm.first_reported()
        if failed is not None:
            return failed
        hit = [w for w in need if w in dead]
        return min(hit) if hit else None
