"""The communicator: a group of ranks with private message contexts, and point-to-point calls.

Buffer calls (``send``/``recv``/...) move the bytes of anything with the buffer protocol and
receive into a buffer the caller provides. Object calls (``send_obj``/``recv_obj``/...) move any
picklable value with pickle protocol 5; numpy arrays inside travel out-of-band. Blocking and
nonblocking forms are separate methods; nonblocking ones return a :class:`Request`.

Each communicator owns two context ids: one for point-to-point traffic, one for its collectives,
so user tags can never match internal traffic and communicators never see each other's messages.
"""

from __future__ import annotations

import operator
import pickle
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Self, TypeVar

from ringworld.comm import foreign
from ringworld.comm import serialize as objects
from ringworld.comm.channel import Channel, ObjectRecvRequest
from ringworld.comm.engine import SELF_CONTEXT, Engine
from ringworld.comm.hooks import observable, observed
from ringworld.comm.requests import (
    ANY_SOURCE,
    ANY_TAG,
    FLAG_SYNC,
    TAG_UB,
    BufferRecvRequest,
    CompletedRequest,
    RecvRequest,
    Request,
    SendRequest,
    Status,
    _new_status,
    wait_all,
)
from ringworld.errors import CommError

T = TypeVar("T")


def send_view(buf: Any, name: str = "buf") -> memoryview:
    """A flat byte view of ``buf`` for sending (no copy).

    Raises:
        TypeError: ``buf`` does not support the buffer protocol, or holds Python objects (an
            object array's bytes are pointers, meaningless in another process).
        ValueError: ``buf`` is not contiguous.
    """
    mv: memoryview | None
    try:
        mv = memoryview(buf)
    except (TypeError, ValueError):  # (numpy refuses datetime64's buffer with ValueError)
        mv = None
    if mv is not None and "O" not in mv.format:
        try:  # the common case: a C-contiguous buffer as bytes (a cast of another one
            # raises TypeError; 0.05 us less than testing first)
            return mv.cast("B")
        except (TypeError, ValueError):  # (strided, or a shape with a zero: tested below)
            pass
    if mv is None:
        np = sys.modules.get("numpy")  # a numpy array implies numpy is imported already
        if np is None or not isinstance(buf, np.ndarray):
            adopted = foreign.host_array(buf, name)  # a torch tensor, a DLPack object, ...
            if adopted is not None:
                np, buf = sys.modules["numpy"], adopted
        if np is not None and isinstance(buf, np.ndarray):  # e.g. datetime64: no buffer format
            if not buf.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous (got a strided array of shape "
                                 f"{buf.shape})") from None
            flat: memoryview = buf.view(np.uint8).reshape(-1).data  # read-only stays so
            return flat
        raise TypeError(f"{name} must support the buffer protocol (numpy array, bytes, "
                        f"bytearray, ...) or be a host tensor (DLPack), got "
                        f"{type(buf).__name__}") from None
    if holds_objects(mv.format):
        raise TypeError(f"{name} holds Python objects (buffer format {mv.format!r}): their "
                        "bytes are pointers, meaningless in another process; move them with "
                        "send_obj and recv_obj, or use an array of numbers")
    if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous:
        return mv
    if not mv.nbytes:  # (cast refuses a shape with a zero in it, as (0, 3))
        return memoryview(b"") if mv.readonly else memoryview(bytearray())
    if not mv.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got a strided buffer of shape "
                         f"{mv.shape})")
    return mv.cast("B")


def holds_objects(fmt: str) -> bool:
    """Whether a buffer of format ``fmt`` (struct syntax with PEP 3118's extensions, as numpy
    writes it) holds Python object pointers: an ``O`` code, not within a field's ``:name:``.
    Cost: a substring test; a regular expression only where an ``O`` appears."""
    return "O" in fmt and "O" in re.sub(r":[^:]*:", "", fmt)


def arrays_overlap(a: Any, b: Any) -> bool:
    """Whether two numpy arrays share memory. Cost: an identity test and two attribute reads
    (two arrays that own their memory own different memory); a bounds test, exact for
    contiguous arrays (about 0.2 us), only where either is a view."""
    return a is b or ((a.base is not None or b.base is not None)
                      and bool(sys.modules["numpy"].may_share_memory(a, b)))


def may_overlap(a: Any, b: Any) -> bool:
    """Whether two buffers may share memory (a send that must read a copy: the receive may
    write first). Cost: 0.1 us for two numpy arrays that own their memory; about 1 us for
    views or other buffers (a bounds test through numpy, if it is loaded: else any two views
    of one exporter count as overlapping). Device and DLPack buffers: False (not read here)."""
    if a is b:
        return True
    np = sys.modules.get("numpy")
    if np is not None and type(a) is np.ndarray and type(b) is np.ndarray:
        return arrays_overlap(a, b)
    try:
        va, vb = memoryview(a), memoryview(b)
    except (TypeError, ValueError):
        return False
    if np is not None:
        try:
            return bool(np.may_share_memory(va, vb))
        except (TypeError, ValueError):  # (a buffer format numpy does not read)
            pass
    return va.obj is vb.obj


def _as_int(value: Any, name: str) -> int:
    """``value`` as a Python int (numpy integers accepted); TypeError naming ``name`` if not."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def recv_view(buf: Any, name: str = "buf") -> memoryview:
    """A flat writable byte view of ``buf`` for receiving into (no copy).

    Raises:
        TypeError: ``buf`` does not support the buffer protocol or is read-only.
        ValueError: ``buf`` is not contiguous.
    """
    mv = send_view(buf, name)
    if mv.readonly:
        raise TypeError(f"{name} is read-only ({type(buf).__name__}); receive into a writable "
                        "buffer such as a numpy array or bytearray")
    return mv


class FreedRanks(tuple[int, ...]):
    """The rank map of a freed communicator: every lookup raises CommError, so the calls that
    map a rank (every send, receive and probe) refuse at no cost to the open ones."""

    _name: str

    def __new__(cls, name: str) -> FreedRanks:
        self = super().__new__(cls)
        self._name = name
        return self

    def refuse(self) -> CommError:
        """The error every use of a freed communicator raises."""
        return CommError(f"{self._name} was freed; it cannot be used any more")

    def __getitem__(self, i: Any) -> Any:
        raise self.refuse()

    def __iter__(self) -> Iterator[int]:
        raise self.refuse()


@observed
class PointToPoint:
    """A group of ranks that exchange messages; ranks are numbered 0..size-1 within it."""

    def __init__(self, engine: Engine, ranks: Sequence[int], context: int,
                 name: str = "") -> None:
        self._engine = engine
        self._ranks = tuple(ranks)   # communicator rank -> world rank
        self.size = len(self._ranks)
        self.context = context
        self.coll_context = context + 1
        self.name = name or f"comm{context // 2}"
        # what collective algorithms use of this communicator (see comm.channel); it also
        # holds the world -> communicator rank map, shared with the point-to-point calls
        self._chan = Channel(engine, self._ranks, self.coll_context, self.name)
        if self._chan.rank < 0:
            raise ValueError(f"world rank {engine.rank} is not a member of ranks={ranks}")
        self.rank = self._chan.rank
        self._to_comm = self._chan.to_comm
        engine.comm_names[self.coll_context] = self.name

    def __repr__(self) -> str:
        return f"<Communicator {self.name} rank {self.rank} of {self.size}>"

    # ------------------------------------------------------------------ helpers
    def _world(self, rank: int, name: str) -> int:
        if type(rank) is int and 0 <= rank < self.size:
            return self._ranks[rank]
        rank = _as_int(rank, name)
        if not 0 <= rank < self.size:
            raise ValueError(f"{name}={rank} is out of range for {self.name} of size "
                             f"{self.size} (valid: 0..{self.size - 1})")
        return self._ranks[rank]

    def _source(self, source: int) -> int:
        if source == ANY_SOURCE:
            if type(self._ranks) is FreedRanks:  # (a wildcard maps no rank)
                raise self._ranks.refuse()
            return ANY_SOURCE
        return self._world(source, "source")

    @staticmethod
    def _send_tag(tag: int) -> int:
        if type(tag) is int and 0 <= tag <= TAG_UB:
            return tag
        tag = _as_int(tag, "tag")
        if not 0 <= tag <= TAG_UB:
            raise ValueError(f"tag={tag!r} must be an int in 0..{TAG_UB}")
        return tag

    @staticmethod
    def _recv_tag(tag: int) -> int:
        if tag == ANY_TAG:
            return ANY_TAG
        tag = _as_int(tag, "tag")
        if not 0 <= tag <= TAG_UB:
            raise ValueError(f"tag={tag!r} must be ANY_TAG or an int in 0..{TAG_UB}")
        return tag

    def self_comm(self) -> Self:
        """A communicator holding only this rank (MPI's COMM_SELF); no traffic to create."""
        return type(self)(self._engine, (self._engine.rank,), SELF_CONTEXT, "self")

    @property
    def world_ranks(self) -> tuple[int, ...]:
        """The world rank of each rank of this communicator, in rank order."""
        return self._ranks

    @property
    def supports_shared_memory(self) -> bool:
        """Whether every rank of this communicator can map memory of every other."""
        return self._chan.supports_shared_memory

    @property
    def oversubscribed(self) -> bool:
        """Whether this job has more ranks than this host has cores (then waits spin little)."""
        return self._chan.oversubscribed

    # ------------------------------------------------------------------ buffers
    def _device_send(self, exc: foreign.DeviceBuffer, buf: Any, dest: int,
                     tag: int) -> Request[None]:
        """Start a send of a device buffer: the device plane's (the full communicator has
        one; this one refuses with ``exc``)."""
        raise exc

    def _device_recv(self, exc: foreign.DeviceBuffer, buf: Any, source: int,
                     tag: int) -> Request[Status]:
        """Start a receive into a device buffer (see :meth:`_device_send`)."""
        raise exc

    @observable("p2p", start=True)
    def isend(self, buf: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start sending the bytes of ``buf`` to ``dest``; the buffer must not change until done.

        Cost: small messages are copied once into the transport and complete at once; large
        ones are streamed to the receiver once it has posted a matching receive.

        Raises:
            TypeError / ValueError: bad ``buf``, ``dest`` or ``tag``.
        """
        try:
            view = send_view(buf, "buf")
        except foreign.DeviceBuffer as exc:
            return self._device_send(exc, buf, dest, tag)
        req = self._post_send(dest, tag, 0, (view,), len(view), view)
        return CompletedRequest(self._engine, None) if req is None else req

    @observable("p2p")
    def send(self, buf: Any, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send the bytes of ``buf`` to ``dest``; returns when ``buf`` may be reused.

        Raises:
            TypeError / ValueError: bad ``buf``, ``dest`` or ``tag``.
            Timeout, PeerFailure: see :meth:`Request.wait`.
        """
        # (send_view's common case and _post_send inline: a small send's cost is its Python
        # frames; see recv for what it gains)
        try:
            mv = memoryview(buf)
            view: memoryview | None = mv.cast("B") if "O" not in mv.format else None
        except (TypeError, ValueError):
            view = None
        if view is None:  # (send_view says why, or takes it another way)
            try:
                view = send_view(buf, "buf")
            except foreign.DeviceBuffer as exc:
                self._device_send(exc, buf, dest, tag).wait(timeout)
                return
        if type(dest) is int and 0 <= dest < self.size:
            w = self._ranks[dest]
        else:
            w = self._world(dest, "dest")
        if type(tag) is not int or not 0 <= tag <= TAG_UB:
            tag = self._send_tag(tag)
        engine = self._engine
        if engine.calm:
            t = engine.route[w]
            if t is not None and t.send_eager(w, self.context, tag, 0, (view,), len(view)):
                return
        h = engine.isend(w, self.context, tag, 0, (view,), len(view))
        if not h.done:
            SendRequest(engine, h, w, view, self.context).wait(timeout)

    def _send_blocking(self, dest: int, tag: int, flags: int, segments: Sequence[memoryview],
                       nbytes: int, keep: object, timeout: float | None) -> None:
        """Send an encoded message and wait until its buffers (``keep``) may be reused."""
        req = self._post_send(dest, tag, flags, segments, nbytes, keep)
        if req is not None:
            req.wait(timeout)

    def _post_send(self, dest: int, tag: int, flags: int, segments: Sequence[memoryview],
                   nbytes: int, keep: object) -> SendRequest | None:
        """Hand an encoded message to the transport; None if it is already sent, else its
        request (``keep``: what holds its buffers until then).

        A small message goes straight into the transport when nothing has failed: no handle,
        no checks beyond these.

        Raises:
            TypeError / ValueError: bad ``dest`` or ``tag``.
            CommBroken, PeerFailure: as ``Engine.isend``.
        """
        if type(dest) is int and 0 <= dest < self.size:
            w = self._ranks[dest]
        else:
            w = self._world(dest, "dest")
        if type(tag) is not int or not 0 <= tag <= TAG_UB:
            tag = self._send_tag(tag)
        engine = self._engine
        if engine.calm:
            t = engine.route[w]
            if t is not None and t.send_eager(w, self.context, tag, flags, segments, nbytes):
                return None
        h = engine.isend(w, self.context, tag, flags, segments, nbytes)
        return None if h.done else SendRequest(engine, h, w, keep, self.context)

    @observable("p2p", start=True)
    def irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request[Status]:
        """Start receiving a message into ``buf``; ``wait()`` returns its :class:`Status`.

        Raises:
            TypeError / ValueError: bad ``buf``, ``source`` or ``tag``.
        """
        try:
            view = recv_view(buf, "buf")
        except foreign.DeviceBuffer as exc:
            return self._device_recv(exc, buf, source, tag)
        src = (self._ranks[source] if type(source) is int and 0 <= source < self.size
               else self._source(source))
        req = BufferRecvRequest(self._engine, self.context, src,
                                tag if type(tag) is int and 0 <= tag <= TAG_UB
                                else self._recv_tag(tag), view, self._to_comm)
        self._engine.post(req)
        return req

    @observable("p2p")
    def recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
             timeout: float | None = None) -> Status:
        """Receive a message into ``buf`` and return its :class:`Status`.

        Raises:
            TruncationError: the message is larger than ``buf`` (``buf`` is left untouched).
            Timeout, PeerFailure: see :meth:`Request.wait`.
        """
        # (recv_view's common case and Engine.take_direct inline, as send does its own: np=2,
        # 8 bytes, old and new code alternating, three jobs each: ping-pong 2.02-2.08 -> 1.94-1.99
        # us a half round trip, a stream of sends 1.84-1.99 -> 1.53-1.70 us a message)
        try:
            mv = memoryview(buf)
            view: memoryview | None = mv.cast("B") if "O" not in mv.format else None
        except (TypeError, ValueError):
            view = None
        if view is None or view.readonly:
            try:
                view = recv_view(buf, "buf")
            except foreign.DeviceBuffer as exc:
                status: Status = self._device_recv(exc, buf, source, tag).wait(timeout)
                return status
        engine = self._engine
        if type(source) is int and 0 <= source < self.size:
            src = self._ranks[source]
        else:
            src = self._source(source)
            source = self._to_comm(src)  # a numpy integer as a plain int, for the status
        rtag = tag if type(tag) is int and -1 <= tag <= TAG_UB else self._recv_tag(tag)
        if src >= 0 and engine.calm:
            t = engine.route[src]
            context = self.context
            # (take_direct's conditions: nothing posted or queued here could claim it first)
            if (t is not None and t.supports_take_eager and not engine.posted.get(context)
                    and not engine.unexpected.get(context)):
                got = t.take_eager(src, context, rtag, view, engine.recv_spin)
                if type(got) is tuple:
                    if got[1] & FLAG_SYNC:  # matched here: the sender waits for this
                        engine.acknowledge(src, context, got[0])
                    return _new_status(Status, (source, got[0], got[2], False))
        return _post_and_wait(
            BufferRecvRequest(engine, self.context, src, rtag, view, self._to_comm), timeout)

    @observable("p2p")
    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int = ANY_SOURCE,
                 sendtag: int = 0, recvtag: int = ANY_TAG, *,
                 timeout: float | None = None) -> Status:
        """Send ``sendbuf`` to ``dest`` and receive into ``recvbuf`` at once (no deadlock).

        The two buffers may share memory (the same array, say): then the bytes sent are a
        copy, taken first (as MPI's ``Sendrecv_replace``).

        Raises:
            As :meth:`send` and :meth:`recv`.
        """
        if may_overlap(sendbuf, recvbuf):  # (the receive may land before the send has read)
            sendbuf = bytes(send_view(sendbuf, "sendbuf"))
        r = self.irecv(recvbuf, source, recvtag)
        s = self.isend(sendbuf, dest, sendtag)
        wait_all([s, r], timeout)
        assert r.status is not None
        return r.status

    @observable("p2p", start=True)
    def issend(self, buf: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start a synchronous send of ``buf``: the request completes once a receive on
        ``dest`` has matched the message (not merely once it is buffered), as MPI_Issend.

        Cost: one empty acknowledgement message back from the receiver.

        Raises:
            TypeError / ValueError: bad ``buf``, ``dest`` or ``tag``.
        """
        view = send_view(buf, "buf")
        w = self._world(dest, "dest")
        return self._engine.isend_sync(w, self.context, self._send_tag(tag), 0, (view,),
                                       len(view), view)

    @observable("p2p")
    def ssend(self, buf: Any, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` synchronously: return once a receive on ``dest`` has matched it.

        Raises:
            TypeError / ValueError: bad ``buf``, ``dest``, ``tag`` or ``timeout``.
            Timeout: no receive matched it in time (the message stays sent).
            PeerFailure: ``dest`` failed first.
        """
        self.issend(buf, dest, tag).wait(timeout)

    # ------------------------------------------------------------------ objects
    @observable("p2p", start=True)
    def issend_obj(self, obj: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start a synchronous send of a picklable value (see :meth:`issend`)."""
        w = self._world(dest, "dest")
        t = self._send_tag(tag)
        segments, nbytes, flags, keep = objects.encode(obj)
        return self._engine.isend_sync(w, self.context, t, flags, segments, nbytes,
                                       (segments, keep))

    @observable("p2p")
    def ssend_obj(self, obj: Any, dest: int, tag: int = 0, *,
                  timeout: float | None = None) -> None:
        """Send a picklable value synchronously (see :meth:`ssend`)."""
        self.issend_obj(obj, dest, tag).wait(timeout)

    @observable("p2p", start=True)
    def isend_obj(self, obj: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start sending a picklable value to ``dest``.

        Raises:
            ValueError: bad ``dest`` or ``tag``.
            pickle errors: ``obj`` cannot be pickled.
        """
        w = self._world(dest, "dest")
        t = self._send_tag(tag)
        segments, nbytes, flags, keep = objects.encode(obj)
        h = self._engine.isend(w, self.context, t, flags, segments, nbytes)
        return SendRequest(self._engine, h, w, (segments, keep), self.context)

    @observable("p2p")
    def send_obj(self, obj: Any, dest: int, tag: int = 0, *,
                 timeout: float | None = None) -> None:
        """Send a picklable value to ``dest`` (numpy arrays inside go out-of-band, uncopied).

        Raises:
            As :meth:`isend_obj`, plus Timeout and PeerFailure while waiting.
        """
        segments, nbytes, flags, keep = objects.encode(obj)
        self._send_blocking(dest, tag, flags, segments, nbytes, (segments, keep), timeout)

    @observable("p2p", start=True)
    def irecv_obj(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request[Any]:
        """Start receiving a value; ``wait()`` returns it, ``status`` says where it came from."""
        req = ObjectRecvRequest(self._engine, self.context, self._source(source),
                                self._recv_tag(tag), None, self._to_comm)
        self._engine.post(req)
        return req

    @observable("p2p")
    def recv_obj(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                 timeout: float | None = None) -> Any:
        """Receive a value sent with :meth:`send_obj` and return it.

        Raises:
            Timeout, PeerFailure: see :meth:`Request.wait`.
            CommError: the matched message was a buffer, not an object.
        """
        engine = self._engine
        src = (self._ranks[source] if type(source) is int and 0 <= source < self.size
               else self._source(source))
        rtag = tag if type(tag) is int and 0 <= tag <= TAG_UB else self._recv_tag(tag)
        if src >= 0:
            got = engine.take_direct(self.context, src, rtag, None, engine.recv_spin)
            if got is not None:
                payload = got[3]
                assert payload is not None
                if got[1] == objects.FLAG_OBJ:
                    return pickle.loads(payload)
                return objects.decode(memoryview(payload), got[1])
        return _post_and_wait(
            ObjectRecvRequest(engine, self.context, src, rtag, None, self._to_comm), timeout)

    @observable("p2p")
    def sendrecv_obj(self, obj: Any, dest: int, source: int = ANY_SOURCE, sendtag: int = 0,
                     recvtag: int = ANY_TAG, *, timeout: float | None = None) -> Any:
        """Send ``obj`` to ``dest`` and receive a value at once; return the received value."""
        r = self.irecv_obj(source, recvtag)
        s = self.isend_obj(obj, dest, sendtag)
        return wait_all([s, r], timeout)[1]

    # ------------------------------------------------------------------ probing
    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """Status of a message that a receive with (source, tag) would match now, else None."""
        src = self._source(source)
        t = self._recv_tag(tag)
        self._engine.progress()
        m = self._engine.find_unexpected(self.context, src, t)
        return None if m is None else Status(self._to_comm(m.source), m.tag, m.nbytes)

    @observable("p2p")
    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
              timeout: float | None = None) -> Status:
        """Block until a message matching (source, tag) is available; return its status.

        Raises:
            Timeout, PeerFailure: as for receives.
        """
        src = self._source(source)
        t = self._recv_tag(tag)
        engine = self._engine
        if engine.find_unexpected(self.context, src, t) is None:
            probe_req = RecvRequest[Any](engine, self.context, src, t, None, self._to_comm)
            engine.wait_for(lambda: engine.find_unexpected(self.context, src, t) is not None,
                            timeout, lambda: f"probe for source {source}, tag {tag}",
                            probe_req.depends)
        m = engine.find_unexpected(self.context, src, t)
        assert m is not None
        return Status(self._to_comm(m.source), m.tag, m.nbytes)


def _post_and_wait(req: RecvRequest[T], timeout: float | None) -> T:
    """Post a blocking receive, spin briefly, then wait; withdraw it on timeout or failure."""
    engine = req._engine
    engine.post(req)
    if not req._done:
        engine.spin(req, engine.recv_spin)
        if not req._done:
            return req.wait_or_cancel(timeout)
    return req._value()


