"""Point-to-point messages of device buffers: NCCL sends and receives, matched on the host.

NCCL matches a link's sends and receives in the order they are enqueued, with no tags; MPI
matches by source and tag. So each device send also sends the receiver a small host message, its
*envelope*, with the user's tag: the receiver matches the envelope as any host message (source,
tag), learns the size, and only then enqueues its NCCL receive. Envelopes carry a per-link
sequence number, and receives are handed to their link in the order the messages were sent,
whatever order they were posted or waited in, so no receive takes another message's bytes; one
whose message follows a message no receive has matched yet waits for it (its timeout says so).
A message larger than the buffer is received into scratch and dropped, and the receive raises
:class:`TruncationError` (the sender is not left hanging).

Links are NCCL communicators of two ranks, one per direction (sender rank 0), made by the first
message: its envelope carries the NCCL unique id. Everything is nonblocking: a request advances
when polled (``test``, ``wait``, ``wait_all``) through (envelope) -> (link ready) -> (NCCL work
enqueued, a CUDA event recorded) -> done; a link's operations are enqueued in order. A dead peer,
a deadline or an NCCL error aborts the link.

Receives name their source (``ANY_SOURCE`` is refused: NCCL must know the peer to enqueue).
Cost: one host message (about 50 bytes; 180 with the first message's id) per device message.
"""

from __future__ import annotations

import contextlib
import struct
from collections import deque
from collections.abc import Collection
from typing import Any

from ringworld.comm.requests import ANY_SOURCE, Request, Status
from ringworld.device import buffers, cuda, nccl
from ringworld.device.buffers import DeviceArray
from ringworld.errors import DeviceError, MismatchError, TruncationError

MAGIC = b"RWdv"
ENVELOPE = struct.Struct("<4sQQ16s")  # magic, sequence number, bytes, element type
UID = 128
BYTES = nccl.DTYPES["uint8"]


class Link:
    """A two-rank NCCL communicator for one direction between two ranks."""

    def __init__(self, peer: int, world_peer: int, device: int, uid: bytes, me: int) -> None:
        b = nccl.load()
        config = b.Config()
        config.blocking = 0
        self.peer, self.world_peer, self.device = peer, world_peer, device
        with cuda.on(device):
            self.comm: Any = nccl.check("making a device link", b.comm_init_rank_scalable, 2,
                                        me, 1, bytearray(uid), config.ptr)
        self.queue: deque[LinkRequest] = deque()  # requests not yet enqueued, in order
        self.next_seq = 0  # sends: the next envelope's number; receives: the one expected

    def ready(self) -> bool:
        """Whether the link takes operations now. Raises: DeviceError (it failed)."""
        if self.comm is None:
            raise DeviceError(f"the device link with rank {self.peer} was aborted")
        b = nccl.load()
        state = int(b.comm_get_async_error(self.comm))
        if state == 7:
            return False
        if state != 0:
            text = b.get_last_error(self.comm) or b.get_error_string(state)
            self.abort()
            raise DeviceError(f"device link with rank {self.peer}: NCCL: {text}", state)
        return True

    def advance(self) -> None:
        """Enqueue the queued operations, in order, while the link takes them."""
        while self.queue and self.ready():
            self.queue.popleft().enqueue()

    def abort(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            with contextlib.suppress(Exception):
                nccl.load().comm_abort(comm)
        for r in self.queue:
            r.fail(DeviceError(f"the device link with rank {self.peer} was aborted"))
        self.queue.clear()


class Links:
    """A host communicator's device links (see the module)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.out: dict[int, Link] = {}  # by destination rank
        self.into: dict[int, Link] = {}  # by source rank
        self.posted: dict[int, list[LinkRequest]] = {}  # receives not on a link yet, by source
        self.expect: dict[int, int] = {}  # the next message's number, by source

    def close(self) -> None:
        for link in (*self.out.values(), *self.into.values()):
            link.abort()
        self.out.clear()
        self.into.clear()

    def _array(self, obj: Any, name: str, writable: bool) -> tuple[DeviceArray, int, int]:
        a = buffers.describe(obj, name)
        if a is None:
            raise TypeError(f"{name} is in host memory")  # (only device buffers come here)
        if writable and a.readonly:
            raise TypeError(f"{name} is read-only")
        device = a.device
        if device < 0:
            device = cuda.pointer_device(a.ptr) if a.ptr else cuda.current_device()
        from ringworld.device.plane import active_stream

        return a, device, active_stream([a])

    def send(self, obj: Any, dest: int, tag: int) -> LinkRequest:
        """Start sending device buffer ``obj`` to ``dest`` (its envelope leaves now)."""
        a, device, stream = self._array(obj, "buf", False)
        if not 0 <= dest < self.host.size:
            raise ValueError(f"dest={dest} is not a rank of {self.host.name}")
        link = self.out.get(dest)
        if link is not None and link.comm is None:  # aborted: the next message makes another
            link = None
        uid = b""
        if link is None:
            uid = bytes(nccl.load().get_unique_id())
        elif link.device != device:
            raise TypeError(f"buf is on GPU {device}; this rank's link to rank {dest} is on "
                            f"GPU {link.device}")
        seq = 0 if link is None else link.next_seq
        envelope = ENVELOPE.pack(MAGIC, seq, a.nbytes, a.dtype.encode()[:16]) + uid
        self.host.send(envelope, dest, tag)  # small: buffered at once
        if link is None:
            link = self.out[dest] = Link(dest, self.host.world_ranks[dest], device, uid, 0)
        link.next_seq = seq + 1
        req = LinkRequest(self, link, "send", a, stream, a.nbytes, None)
        link.queue.append(req)
        req.test()
        return req

    def recv(self, obj: Any, source: int, tag: int) -> LinkRequest:
        """Start receiving into device buffer ``obj`` from ``source``."""
        if source == ANY_SOURCE:
            raise TypeError("device receives name their source: NCCL enqueues a receive "
                            "from one peer (ANY_SOURCE is for host buffers)")
        if not 0 <= source < self.host.size:
            raise ValueError(f"source={source} is not a rank of {self.host.name}")
        a, device, stream = self._array(obj, "buf", True)
        envelope = bytearray(ENVELOPE.size + UID)
        pending = self.host.irecv(envelope, source, tag)
        req = LinkRequest(self, None, "recv", a, stream, 0, (pending, envelope, source, device))
        self.posted.setdefault(source, []).append(req)
        req.test()
        return req

    def sort_in(self, source: int) -> None:
        """Hand the receives from ``source`` whose envelopes have arrived to its link, in the
        order the messages were sent (their sequence numbers), whatever order the receives
        were posted or polled in; a receive whose message follows one not yet received waits
        for it."""
        reqs = self.posted.get(source, [])
        for r in list(reqs):
            if r._seq is None and r._envelope[0].done:
                try:
                    self._parse(r)
                except Exception as exc:
                    reqs.remove(r)
                    r.fail(exc)
        while reqs:
            expected = self.expect.get(source, 0)
            nxt = next((r for r in reqs if r._seq == expected or (r._uid and r._seq == 0)),
                       None)
            if nxt is None:
                return
            reqs.remove(nxt)
            device = nxt._envelope[3]
            if nxt._uid:  # the sender's first message on a new link
                old = self.into.get(source)
                if old is not None:
                    old.abort()
                self.into[source] = Link(source, self.host.world_ranks[source], device,
                                         nxt._uid, 1)
            link = self.into.get(source)
            if link is None:
                nxt.fail(MismatchError(f"a device message from rank {source} came before "
                                       "its link"))
                continue
            seq = nxt._seq
            assert seq is not None
            self.expect[source] = seq + 1
            nxt._envelope = None
            nxt._link = link
            link.queue.append(nxt)

    def _parse(self, req: LinkRequest) -> None:
        """Read a matched envelope into ``req`` (size, status, sequence number, link id)."""
        pending, envelope, source, _ = req._envelope
        status: Status = pending.wait()
        magic = bytes(envelope[:4]) if status.nbytes >= ENVELOPE.size else b""
        if magic != MAGIC:
            raise MismatchError(f"a device receive from rank {source} (tag {status.tag}) "
                                "matched a host message: device and host messages between two "
                                "ranks need different tags")
        _, seq, nbytes, _dtype = ENVELOPE.unpack_from(envelope)
        req._seq, req._uid = int(seq), bytes(envelope[ENVELOPE.size:status.nbytes])
        req.nbytes = int(nbytes)
        req._result = Status(source, status.tag, int(nbytes))
        req.status = req._result


class LinkRequest(Request[Any]):
    """A device message in flight; ``wait()`` returns None (send) or its Status (receive)."""

    __slots__ = ("_arr", "_envelope", "_event", "_finished", "_kind", "_link", "_links",
                 "_scratch", "_seq", "_stream", "_uid", "nbytes")

    def __init__(self, links: Links, link: Link | None, kind: str, arr: DeviceArray,
                 stream: int, nbytes: int, envelope: Any) -> None:
        super().__init__(links.host._engine)
        self._links, self._link, self._kind, self._arr = links, link, kind, arr
        self._stream, self.nbytes, self._envelope = stream, nbytes, envelope
        self._event: cuda.Event | None = None
        self._scratch = 0
        self._finished = False
        self._seq: int | None = None  # a receive's message number, once its envelope is read
        self._uid = b""

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._finished = True

    def enqueue(self) -> None:
        """Put the NCCL send or receive on the link (called in the link's order)."""
        link = self._link
        assert link is not None
        b = nccl.load()
        peer = 1 if self._kind == "send" else 0
        ptr = self._arr.ptr
        with cuda.on(link.device):
            if self._kind == "recv" and self.nbytes > self._arr.nbytes:
                self._scratch = ptr = cuda.scratch(self.nbytes, self._stream)
            fn = b.send if self._kind == "send" else b.recv
            nccl.check(f"device {self._kind}", fn, ptr, self.nbytes, BYTES, peer, link.comm,
                       self._stream)
            if self._scratch:
                cuda.release(self._scratch, self._stream)
            event = cuda.Event()
            event.record(self._stream)
        self._event = event

    @property
    def done(self) -> bool:
        if self._finished:
            return True
        try:
            return self._advance()
        except Exception as exc:  # (an interrupt is the caller's, not the message's)
            if self._link is not None:
                self._link.abort()
            self.fail(exc)
            return True

    def _advance(self) -> bool:
        if self._link is None:  # a receive waiting for its envelope, or for its turn
            self._links.sort_in(self._envelope[2])
            if self._finished:
                return True
            if self._link is None:
                return False
        link = self._link
        assert link is not None
        if self._event is None:
            link.advance()
            if self._event is None:
                return False
        if not self._event.done():
            return False
        self._finished = True
        self._arr = self._arr._replace(keep=None)
        if self._kind == "recv" and self.nbytes > self._arr.nbytes:
            self._error = TruncationError(self.nbytes, self._arr.nbytes, "device receive")
        return True

    def describe(self) -> str:
        peer = self._link.peer if self._link is not None else self._envelope[2]
        what = f"device {self._kind} with rank {peer} of {self._links.host.name}"
        if self._link is None and self._seq is not None:
            what += (f" (its message {self._seq} waits for the earlier ones from rank {peer} "
                     "to be received: device messages between two ranks arrive in the order "
                     "sent)")
        return what

    def depends(self, dead: Collection[int]) -> int | None:
        peer = (self._link.world_peer if self._link is not None
                else self._links.host.world_ranks[self._envelope[2]])
        return peer if peer in dead else None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the message has moved. Raises: Timeout, PeerFailure (the link is
        aborted first), MismatchError, TruncationError, DeviceError."""
        try:
            return super().wait(timeout)
        except BaseException:
            if self._link is not None and not self._finished:
                self._link.abort()
            raise
