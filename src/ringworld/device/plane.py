"""A Ringworld communicator's calls on device buffers, run by NCCL.

:class:`Plane` belongs to one host communicator (made on its first device call). It holds an NCCL
communicator of the same ranks, made lazily: rank 0 draws NCCL's unique id and the host
communicator broadcasts it; the NCCL communicator is nonblocking, so its set-up, its calls and
its waits all run under Ringworld's deadlines and failure detection, and any of them can abort it.

**The check beside the GPU work.** Every device call also posts, on the host communicator, a
nonblocking allgather of a 128-byte record: what this rank called (collective, count, type, op,
root, counts) or the error it raised before enqueueing. The NCCL work is enqueued first and the
record travels while the GPU works, so the check adds no host round trip to a call's critical
path (the first call of a plane waits for its check, since it also makes the NCCL communicator).
The request's ``wait`` ends when both the GPU work (a CUDA event) and the check are done: ranks
that disagree get :class:`MismatchError` naming every rank's call, instead of a hung kernel; a
dead peer (the monitor), a revoked communicator or the deadline abort the NCCL communicator and
raise ``PeerFailure``/``CommRevoked``/``Timeout`` on every rank. After an abort the next device
call makes a fresh NCCL communicator, so a refused call leaves the communicator usable.

Streams: a call runs on the stream of :func:`device_stream` (``ringworld.device_stream``: a
``with`` block of this thread), else the
array library's current stream (torch's, CuPy's), else the default stream. ``wait()`` waits for
the call's work on that stream; later work on the same stream is ordered after it anyway.

Cost per call: the argument description (a microsecond or two), the NCCL enqueue, one CUDA event
record, and the host allgather of 128 bytes per rank (a few microseconds of host work).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from ringworld.comm.requests import Request
from ringworld.device import buffers, cuda, nccl
from ringworld.device.buffers import DeviceArray
from ringworld.device.p2p import Links
from ringworld.errors import CommError, DeviceError, MismatchError, Timeout

RECORD = 128  # bytes of one rank's record in the check
_local = threading.local()


@contextlib.contextmanager
def device_stream(handle: Any) -> Iterator[int]:
    """Run this thread's device calls in the block on ``handle`` (an int, a torch or CuPy
    stream, a ``__cuda_stream__`` object). Raises: TypeError (not a stream)."""
    s = buffers.stream_handle(handle)
    before = getattr(_local, "stream", None)
    _local.stream = s
    try:
        yield s
    finally:
        _local.stream = before


class Host(Protocol):
    """What the plane needs of its host communicator."""

    @property
    def size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    name: str

    @property
    def world_ranks(self) -> tuple[int, ...]: ...

    def bcast_obj(self, obj: Any, root: int = 0, *, timeout: float | None = None) -> Any: ...

    def iallgather(self, sendbuf: Any, recvbuf: Any) -> Request[None]: ...


class Prepared(NamedTuple):
    """One device call, checked: its record (what the ranks must agree on), its device, its
    stream, and ``enqueue(comm, stream)`` that puts its NCCL work on the stream."""

    what: str
    record: str
    device: int
    stream: int
    enqueue: Callable[[Any, int], None]
    keep: tuple[DeviceArray, ...]
    #: (bytes sent to each rank, bytes expected from each rank; -1: none), where those are
    #: each rank's own (the v-collectives' counts): the check compares them pair by pair
    flows: tuple[Sequence[int], Sequence[int]] | None = None


def _record(text: str) -> bytes:
    data = text.encode()[: RECORD - 1]
    return data + b"\0" * (RECORD - len(data))


class Plane:
    """The NCCL side of one host communicator (see the module)."""

    def __init__(self, host: Host, engine: Any, timeout: Callable[[], float | None]) -> None:
        self.host = host
        self.engine = engine
        self._timeout = timeout  # the communicator's default timeout, read at each call
        self.comm: Any = None  # NCCL's communicator, None until made (and after an abort)
        self.device = -1
        self.generation = 0  # bumped at each abort: requests of an aborted comm know it
        self._links: Links | None = None

    @property
    def links(self) -> Links:
        """The device point-to-point links (made by the first device message)."""
        if self._links is None:
            self._links = Links(self.host)
        return self._links

    # ------------------------------------------------------------------ NCCL communicator
    def _make(self, device: int, timeout: float | None) -> None:
        """Make the NCCL communicator on ``device`` (collective over the host communicator).
        Raises: DeviceError, Timeout, PeerFailure."""
        b = nccl.load()
        uid = bytes(b.get_unique_id()) if self.host.rank == 0 else None
        uid = self.host.bcast_obj(uid, 0, timeout=timeout)
        config = b.Config()
        config.blocking = 0  # set-up and calls return at once: Ringworld's waits bound them
        config.comm_name = self.host.name
        with cuda.on(device):
            # the binding's ncclCommInitRankScalable with one id: nccl4py's own init path
            comm = nccl.check(f"making the NCCL communicator of {self.host.name}",
                              b.comm_init_rank_scalable, self.host.size, self.host.rank, 1,
                              bytearray(uid), config.ptr)
        self.comm, self.device = comm, device
        self._settle(f"making the NCCL communicator of {self.host.name} on GPU {device}", timeout)

    def _settle(self, what: str, timeout: float | None) -> None:
        """Wait until the nonblocking NCCL communicator is no longer in progress (after its
        set-up or a call that returned in progress). Raises: DeviceError, Timeout, PeerFailure
        (the communicator aborted first)."""
        b = nccl.load()
        comm = self.comm
        state: list[int] = [7]

        def ready() -> bool:
            state[0] = int(b.comm_get_async_error(comm))
            return state[0] != 7  # ncclInProgress

        if not ready():
            try:
                self.engine.wait_for(ready, timeout, lambda: what)
            except BaseException:
                self.abort()
                raise
        if state[0] != 0:
            text = b.get_last_error(comm) or b.get_error_string(state[0])
            self.abort()
            raise DeviceError(f"{what}: NCCL: {text}", state[0])

    def abort(self) -> None:
        """Abort the NCCL communicator (its queued work ends); the next call makes a new one."""
        comm, self.comm = self.comm, None
        if comm is not None:
            self.generation += 1
            with contextlib.suppress(Exception):
                nccl.load().comm_abort(comm)

    def close(self) -> None:
        """Free the NCCL communicators (abort: the host communicator is closing)."""
        self.abort()
        if self._links is not None:
            self._links.close()

    def revoked(self) -> BaseException | None:
        """The revocation of the host communicator (``comm.revoke()`` on some rank), if any."""
        revoked = self.engine.revoked
        if not revoked:
            return None
        why: BaseException | None = revoked.get(getattr(self.host, "coll_context", None))
        return why if why is not None else revoked.get(getattr(self.host, "context", None))

    def async_error(self) -> str | None:
        """NCCL's asynchronous error on the communicator (a network or remote failure), else
        None."""
        if self.comm is None:
            return None
        b = nccl.load()
        code = int(b.comm_get_async_error(self.comm))
        if code in (0, 7):
            return None
        return f"NCCL: {b.get_last_error(self.comm) or b.get_error_string(code)} ({code})"

    # ------------------------------------------------------------------ running a call
    def run(self, prepare: Callable[[], Prepared], blocking: bool,
            timeout: float | None) -> Request[None]:
        """Check a device call (``prepare()``), enqueue it, post its check; wait if
        ``blocking``. Raises: what ``prepare`` raises (after telling the other ranks),
        DeviceUnavailable, DeviceError, MismatchError, Timeout, PeerFailure."""
        timeout = self._timeout() if timeout is None else timeout
        error: BaseException | None = None
        call: Prepared | None = None
        try:
            call = prepare()
        except Exception as exc:  # any refusal: the other ranks learn of it from the check
            error = exc
        first = self.comm is None
        if call is not None and not first:
            try:
                self._enqueue(call, timeout)
            except DeviceError as exc:
                error = exc
        # a rank about to make the NCCL communicator says so: one that kept an old one (a
        # failed call it never waited for) would otherwise enqueue while this one waits for it
        text = (f"error: {type(error).__name__}: {error}" if error is not None
                else call.record + (" (new NCCL communicator)" if first else "")
                if call is not None else "error")
        check = Check(self.host, _record(text), None if call is None else call.flows)
        if error is not None or call is None:
            with contextlib.suppress(Exception):  # the user's error is the one to raise
                check.wait(self.engine, timeout)  # the others learn of the refusal
            self.abort()
            raise error if error is not None else RuntimeError("no call")
        if first:
            check.wait(self.engine, timeout)
            check.compare(self, call.what)
            self._make(call.device, timeout)
            self._enqueue(call, timeout)
        with cuda.on(self.device):  # an event belongs to the device current at its creation
            event = cuda.Event()
            event.record(call.stream)
        req = DeviceRequest(self, event, check, call)
        if blocking:
            req.wait(timeout)
        return req

    def _enqueue(self, call: Prepared, timeout: float | None) -> None:
        if call.device != self.device:
            raise DeviceError(f"{call.what}: the buffers are on GPU {call.device}, and this "
                              f"communicator's NCCL communicator is on GPU {self.device} (one "
                              "process drives one GPU per communicator: split or dup the "
                              "communicator for another)")
        b = nccl.load()
        with cuda.on(self.device):
            try:
                call.enqueue(self.comm, call.stream)
            except Exception as exc:
                if type(exc).__name__ == "NCCLError":
                    raise nccl.error(exc, call.what) from exc
                raise
            if int(b.comm_get_async_error(self.comm)) == 7:
                self._settle(call.what, timeout)


class Check:
    """The host allgather of every rank's record of one device call."""

    __slots__ = ("_mine", "_out", "_req", "_size", "compared")

    def __init__(self, host: Host, mine: bytes,
                 flows: tuple[Sequence[int], Sequence[int]] | None = None) -> None:
        import numpy as np

        p = self._size = host.size
        counts = np.full(2 * p, -1, dtype=np.int64)
        if flows is not None:
            counts[:p], counts[p:] = flows
        self._mine = np.concatenate([np.frombuffer(mine, dtype=np.uint8),
                                     counts.view(np.uint8)])
        self._out = np.zeros(self._mine.size * p, dtype=np.uint8)
        self._req = host.iallgather(self._mine, self._out)
        self.compared = False

    @property
    def done(self) -> bool:
        return self._req.done

    def test(self) -> bool:
        return self._req.test()

    def depends(self, dead: Collection[int]) -> int | None:
        return self._req.depends(dead)

    def wait(self, engine: Any, timeout: float | None) -> None:
        self._req.wait(timeout)

    def records(self) -> list[str]:
        rows = self._out.reshape(self._size, -1)
        return [bytes(row[:RECORD]).rstrip(b"\0").decode(errors="replace") for row in rows]

    def flows(self) -> Any:
        """Each rank's (sent to, expected from) bytes per rank: an int64 array (p, 2, p)."""
        import numpy as np

        rows = self._out.reshape(self._size, -1)[:, RECORD:]
        return np.ascontiguousarray(rows).view(np.int64).reshape(self._size, 2, self._size)

    def compare(self, plane: Plane, what: str) -> None:
        """Raise MismatchError (after aborting the NCCL work) unless every rank made the
        same call, none refused it, and every rank expects from each other what it sends."""
        self.compared = True
        records = self.records()
        if all(r == records[0] for r in records) and not records[0].startswith("error"):
            wrong = self._flow_mismatch()
            if wrong is None:
                return
            plane.abort()
            raise MismatchError(f"{what} on {plane.host.name}: {wrong}; the call was "
                                "abandoned on every rank")
        plane.abort()
        refused = [(i, r) for i, r in enumerate(records) if r.startswith("error")]
        if refused:
            i, r = refused[0]
            raise MismatchError(f"{what} on {plane.host.name}: rank {i} refused its part "
                                f"({r.removeprefix('error: ')}); the call was abandoned on "
                                "every rank")
        calls = "; ".join(f"rank {i}: {r}" for i, r in enumerate(records))
        raise MismatchError(f"{what} on {plane.host.name}: the ranks made different device "
                            f"calls ({calls})")

    def _flow_mismatch(self) -> str | None:
        """The first pair of ranks whose counts disagree (rank i sends s bytes to rank j,
        which expects r), or None."""
        f = self.flows()
        sent, expected = f[:, 0, :], f[:, 1, :].T  # expected[i, j]: what j expects from i
        bad = (sent >= 0) & (expected >= 0) & (sent != expected)
        if not bad.any():
            return None
        i, j = (int(v) for v in next(zip(*bad.nonzero(), strict=True)))
        return (f"rank {i} sends {int(sent[i, j])} bytes to rank {j}, which expects "
                f"{int(expected[i, j])} (the counts must agree between every pair)")


class DeviceRequest(Request[None]):
    """A device call in flight: done when its GPU work has finished and its check agreed."""

    __slots__ = ("_call", "_check", "_event", "_generation", "_plane")

    def __init__(self, plane: Plane, event: cuda.Event, check: Check, call: Prepared) -> None:
        super().__init__(plane.engine)
        self._plane, self._event, self._check, self._call = plane, event, check, call
        self._generation = plane.generation

    @property
    def done(self) -> bool:
        if self._check is None:  # settled
            return True
        check = self._check
        if check.done and not check.compared:
            try:
                check.compare(self._plane, self._call.what)
            except MismatchError as exc:
                self._settle(exc)
                return True
        if self._plane.generation != self._generation:  # aborted under it
            self._settle(DeviceError(f"{self._call.what}: abandoned (the NCCL communicator "
                                     "was aborted by an earlier failure)"))
            return True
        if check.done and self._event.done():
            self._settle(None)
            return True
        revoked = self._plane.revoked()
        if revoked is not None:
            self._plane.abort()
            self._settle(revoked)
            return True
        error = self._plane.async_error()
        if error is not None:
            self._plane.abort()
            self._settle(DeviceError(f"{self._call.what}: {error}"))
            return True
        return False

    def _settle(self, error: BaseException | None) -> None:
        self._error = error
        self._check = None  # type: ignore[assignment]
        self._call = self._call._replace(keep=())  # the buffers are free to go

    def describe(self) -> str:
        return f"{self._call.what} on {self._plane.host.name} (GPU {self._plane.device})"

    def depends(self, dead: Collection[int]) -> int | None:
        """Any dead member: the GPU work needs every rank until it is done."""
        if self._check is None:
            return None
        return next((w for w in self._plane.host.world_ranks if w in dead), None)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the call's GPU work is done and every rank agreed.

        Raises:
            MismatchError: the ranks made different calls, or one refused its part.
            Timeout, PeerFailure, CommRevoked: the NCCL communicator is aborted first.
            DeviceError: NCCL failed.
        """
        try:
            super().wait(timeout)
        except (CommError, TimeoutError) as exc:
            if not isinstance(exc, MismatchError):
                self._plane.abort()
            if isinstance(exc, Timeout):
                raise Timeout(f"{exc} (the GPU work was abandoned: the NCCL communicator "
                              "is aborted)") from None
            raise


def given_stream() -> int | None:
    """The stream of this thread's :func:`device_stream` block, or None outside one."""
    given = getattr(_local, "stream", None)
    return None if given is None else int(given)


def active_stream(arrays: Sequence[DeviceArray]) -> int:
    """The stream a call on ``arrays`` runs on (see the module)."""
    given = getattr(_local, "stream", None)
    if given is not None:
        return int(given)
    return buffers.current_stream(arrays[0])
