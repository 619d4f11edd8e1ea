"""The TCP transport: one authenticated stream socket per peer, driven without blocking (but
for two reads: a wait on a large payload from a lone peer blocks in it, see
TcpTransport._block; and a blocking receive on a contended host sleeps in its socket's read,
see TcpTransport.take_eager).

Bootstrap (:meth:`TcpTransport.create`, in :mod:`.tcp_bootstrap`): every rank connects to every
lower rank and accepts every higher one; each connection is authenticated with the job secret,
then both ends exchange a :data:`HELLO` (rank, world size, options) before any frame.

Framing, per message::

    HEADER(magic u16, version u16, flags u32, context u32, tag i64, nbytes u64)
    lead zero bytes   payload bytes   trail zero bytes

Every frame is a multiple of :data:`FRAME_ALIGN` (64) bytes long, and payloads of at least
:data:`LEAD_MIN_BYTES` start :data:`FRAME_ALIGN` bytes into their frame: ``lead`` is 36 for those
and 0 for smaller ones, ``trail`` rounds the frame up (:func:`frame_padding`; both ends derive the
padding from ``nbytes``, so it costs nothing in the header). Why: Linux copies a TCP send into the
sending thread's page fragment, which restarts at offset 0 whenever its page is free again and
otherwise continues where the last send ended; with every frame a multiple of 64 bytes, frames and
so large payloads start on 64-byte boundaries of those pages either way, and the receiver copies
from the same pages. Kernel copies (``rep movsb``) run 2-3x faster when source and destination
are both cache-line aligned: with the old 28-byte header every payload sat 28 bytes off, and a
16 MiB loopback ping-pong moved 1.5 GB/s instead of 2.5-3.5 GB/s. User buffers must be 64-byte
aligned to profit (as the benchmark's are); a send interrupted by a full socket buffer may resume
misaligned for its rest if the receiver drained everything meanwhile (rare: the sender retries
while the tail of what it sent is still queued).

With per-frame checksums on (``checksum=True``; ``RINGWORLD_TCP_CHECKSUM=1``), an 8-byte
:data:`CHECK` (CRC-32 of the payload, CRC-32 of the header and that) follows the header and the
lead shrinks to 28 bytes, so alignment is kept. The receiver verifies the header's CRC before it
trusts any field, and the payload's before it completes the message; a mismatch fails the peer
with :class:`PeerFailure` ("data corrupted in transit"). Off, the frame path pays one flag test.

The wire format's constants and padding helpers live in :mod:`.tcp_wire` (re-exported here).

Sending gathers ``[header, *segments, trail]`` into one ``sendmsg``; what the kernel does not take
is queued per peer as memoryview slices (no copies) and pushed by :meth:`TcpTransport.poll`.
Receiving runs a per-peer state machine: read a header (validated), hand an :class:`Incoming` to
the communicator, then receive the payload straight into the buffer it names (``read_into``) or
into an owned one (``detach``; a large detached payload first waits one poll for a receive to
claim it, see :meth:`_TcpIncoming.detach`); only then is the next header read. Small messages are
read through a per-peer staging buffer, so one ``recv`` can pick up many of them; padding is
skipped there.
"""

from __future__ import annotations

import itertools
import selectors
import socket
import struct
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NoReturn

from ringworld._sockutil import consume_sent
from ringworld.errors import PeerFailure, TransportError
from ringworld.store.base import Store
from ringworld.transport.base import (
    DONE,
    BufferedIncoming,
    Deliver,
    Incoming,
    OnDone,
    SendHandle,
    Transport,
)
from ringworld.transport.cpus import CpuWatch
from ringworld.transport.tcp_bootstrap import SEND_BUFFER_BYTES, connect_world
from ringworld.transport.tcp_wire import (
    _ALIGN_MASK,
    _CHECKED_HEADER,
    _LEAD_BYTES,
    _TRAILS,
    CHECK,
    FRAME_ALIGN,
    HEADER,
    HELLO,
    HELLO_MAGIC,
    LEAD_MIN_BYTES,
    MAGIC,
    MAX_MESSAGE_BYTES,
    OPT_CHECKSUM,
    VERSION,
    checked_header,
    frame_padding,
)

__all__ = [
    "CHECK", "FRAME_ALIGN", "HEADER", "HELLO", "HELLO_MAGIC", "LEAD_MIN_BYTES", "MAGIC",
    "MAX_MESSAGE_BYTES", "OPT_CHECKSUM", "SEND_BUFFER_BYTES", "VERSION", "TcpTransport",
    "checked_header", "frame_padding",
]

_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_WAITALL = getattr(socket, "MSG_WAITALL", 0)
_SEND_NOW = _NOSIGNAL | _DONTWAIT
#: a wait may block in the read of the payload it waits on (see TcpTransport._block): the
#: sockets are blocking, and every other call says MSG_DONTWAIT
_CAN_BLOCK = bool(_DONTWAIT and _WAITALL and hasattr(socket, "SO_RCVLOWAT"))
#: seconds such a read blocks at most (SO_RCVTIMEO), and the bytes that must have arrived
#: before it wakes (SO_RCVLOWAT, set for the read only)
BLOCK_SLICE = 0.002
BLOCK_LOWAT = 1 << 20
TAKE_POLLS = 64  # reads that do not block in take_eager (the engine's spin looks at the CPUs)
TAKE_BYTES = 64 << 10  # the largest payload take_eager takes (larger: the general path)
_IOV_MAX = 512
_STAGE_BYTES = 256 << 10
_DIRECT_BYTES = 64 << 10  # payload rests at least this big are received straight into place
_DEFER_BYTES = 64 << 10  # detached payloads at least this big wait one poll for a receive
_READ_BUDGET = 64 << 20  # bytes read from one peer per poll, so one sender cannot starve others
_WANT_HEADER, _WANT_PAYLOAD = 0, 1


class _Peer:
    """Connection state of one peer."""

    __slots__ = (
        "big", "buffered", "crc", "deferred", "failed", "handles", "on_done", "queued", "rank",
        "rend", "rpos", "sendq", "sent", "skip", "sock", "stage", "stage_view", "state",
        "target", "tpos", "trail", "want_write",
    )

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.failed: str | None = None
        # sending: bytes queued / sent through ``sendq`` since the start; handles end offsets
        self.sendq: deque[memoryview] = deque()
        self.queued = 0
        self.sent = 0
        self.handles: deque[tuple[int, SendHandle]] = deque()
        self.want_write = False
        # receiving
        self.stage = bytearray(_STAGE_BYTES)
        self.stage_view = memoryview(self.stage)
        self.rpos = 0
        self.rend = 0
        self.skip = 0  # padding bytes to drop before the payload / the next header
        self.trail = 0  # padding after the current payload
        self.state = _WANT_HEADER
        self.target: memoryview | None = None
        self.tpos = 0
        self.on_done: OnDone | None = None
        self.buffered: BufferedIncoming | None = None
        self.deferred: _DeferredIncoming | None = None  # detached, payload not yet read
        self.crc = 0  # the current payload's CRC-32 (checksums on)
        self.big = False  # the last message read by poll was too large for take_eager


class _TcpIncoming(Incoming):
    """A message whose header has arrived; its payload is still in the peer's stream."""

    __slots__ = ("_decided", "_peer")

    def __init__(
        self, peer: _Peer, context: int, tag: int, flags: int, nbytes: int,
    ) -> None:
        super().__init__(peer.rank, context, tag, flags, nbytes)
        self._peer = peer
        self._decided = False

    def _decide(self) -> _Peer:
        if self._decided:
            raise RuntimeError("read_into()/detach() may be called once per message")
        self._decided = True
        return self._peer

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        """Receive the payload straight into ``dest`` while :meth:`TcpTransport.poll` runs.

        Raises:
            ValueError: ``dest`` is read-only or shorter than ``nbytes``.
            RuntimeError: the message was already read or detached.
        """
        view = dest if dest.ndim == 1 and dest.format == "B" else dest.cast("B")
        if view.readonly:
            raise ValueError("read_into() needs a writable buffer")
        if len(view) < self.nbytes:
            raise ValueError(f"read_into() buffer holds {len(view)} bytes, not {self.nbytes}")
        peer = self._decide()
        peer.target = view[: self.nbytes]
        peer.tpos = 0
        peer.on_done = on_done
        peer.buffered = None

    def detach(self) -> Incoming:
        """Keep the message: its payload is received into an owned buffer (one copy later).

        A payload of at least :data:`_DEFER_BYTES` stays in the socket until the next
        :meth:`TcpTransport.poll` first: a receive posted before then (typically right after the
        wait that polled the header in returns) gets it straight into its buffer, with no copy,
        no allocation. Only then is it buffered, so it holds nothing up for longer than that.

        Raises:
            RuntimeError: the message was already read or detached.
        """
        peer = self._decide()
        if self.nbytes >= _DEFER_BYTES:
            deferred = _DeferredIncoming(self)
            peer.deferred = deferred
            return deferred
        return _buffer(peer, self)


class _DeferredIncoming(Incoming):
    """A detached large message whose payload still waits in the socket (see ``detach``)."""

    __slots__ = ("_kept", "_peer", "_read")

    def __init__(self, inc: _TcpIncoming) -> None:
        super().__init__(inc.source, inc.context, inc.tag, inc.flags, inc.nbytes)
        self._peer = inc._peer
        self._kept: BufferedIncoming | None = None
        self._read = False

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        """Receive the payload into ``dest``: straight from the socket if it is still there.

        Raises:
            ValueError: ``dest`` is read-only or shorter than ``nbytes``.
            RuntimeError: the message was already read.
        """
        if self._kept is not None:
            self._kept.read_into(dest, on_done)
            return
        view = _target_view(dest, self.nbytes)
        if self._read:
            raise RuntimeError("read_into() may be called once per message")
        self._read = True
        peer = self._peer
        peer.deferred = None
        _receive_into(peer, view, on_done)

    def detach(self) -> Incoming:
        return self

    def buffer(self) -> None:
        """Start receiving the payload into an owned buffer (the transport's next poll)."""
        self._peer.deferred = None
        self._kept = _buffer(self._peer, self)


def _target_view(dest: memoryview, nbytes: int) -> memoryview:
    """The first ``nbytes`` of ``dest`` as a flat byte view, checked for ``read_into``."""
    view = dest if dest.ndim == 1 and dest.format == "B" else dest.cast("B")
    if view.readonly:
        raise ValueError("read_into() needs a writable buffer")
    if len(view) < nbytes:
        raise ValueError(f"read_into() buffer holds {len(view)} bytes, the message has {nbytes}")
    return view[:nbytes]


def _receive_into(peer: _Peer, view: memoryview, on_done: OnDone) -> None:
    """Receive ``peer``'s current payload into ``view`` (exactly its length)."""
    peer.target = view
    peer.tpos = 0
    peer.on_done = on_done
    peer.buffered = None


def _buffer(peer: _Peer, inc: Incoming) -> BufferedIncoming:
    """Receive the current message's payload into an owned buffer; return its holder."""
    kept = BufferedIncoming(inc.source, inc.context, inc.tag, inc.flags, inc.nbytes)
    peer.target = memoryview(kept.data)
    peer.tpos = 0
    peer.on_done = None
    peer.buffered = kept
    return kept


def _drop(peer: _Peer, n: int) -> None:
    """Skip ``n`` padding bytes: those staged now, the rest (``peer.skip``) as they arrive."""
    avail = peer.rend - peer.rpos
    if n <= avail:
        peer.rpos += n
    else:
        peer.rpos = peer.rend
        peer.skip = n - avail


class TcpTransport(Transport):
    """Messages over one TCP connection per peer; see the module docstring for the protocol.

    Not thread-safe: one thread (the communicator's) drives it. Use :meth:`create` to bootstrap.
    """

    name = "tcp"
    wakes_on_arrival = True  # (wait_event: one epoll_wait on the peers' sockets, or a read)

    def __init__(
        self, rank: int, sockets: Mapping[int, socket.socket], *, checksum: bool = False,
    ) -> None:
        """Take over connected, authenticated ``sockets`` (peer rank -> socket); ``checksum``
        turns per-frame CRC-32 on (every peer must agree; :meth:`create` checks that).

        Raises:
            ValueError: ``sockets`` names ``rank`` itself.
        """
        if rank in sockets:
            raise ValueError(f"rank {rank} cannot be its own peer")
        super().__init__(rank, sorted(sockets))
        self._sel = selectors.DefaultSelector()
        self._peers: dict[int, _Peer] = {}
        self._live: list[_Peer] = []
        self._closed = False
        self._checksum = bool(checksum)
        self._hsize = _CHECKED_HEADER if checksum else HEADER.size
        for peer_rank in self.peers:
            sock = sockets[peer_rank]
            sock.setblocking(_CAN_BLOCK)  # (blocking: only _block's read blocks, see _CAN_BLOCK)
            if _CAN_BLOCK:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                struct.pack("ll", 0, int(BLOCK_SLICE * 1e6)))
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # AF_UNIX pairs work too
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(peer_rank, sock)
            self._peers[peer_rank] = peer
            self._live.append(peer)
            self._sel.register(sock, selectors.EVENT_READ, peer)
        self._local: dict[int, int] = {}  # peer rank -> pid, for those on this host
        self._cpus = CpuWatch()

    def watch_local(self, pids: Mapping[int, int]) -> None:
        """Name the peers on this host (rank -> pid), so that waits can tell when one runs on
        this rank's CPU (:meth:`shares_cpu`): two ranks on one host that talk over TCP are put
        on one CPU by the scheduler now and then (each wakes the other), and a rank that spins
        there keeps its peer off the CPU: pinned so beside a busy process on the other core, an
        8-byte ping-pong took 4 ms a message."""
        self._local = {r: pid for r, pid in pids.items() if r in self._peers}
        self.knows_cpus = bool(self._local)

    def shares_cpu(self, ranks: Iterable[int]) -> bool:
        """Whether a peer of ``ranks`` on this host runs, or waits to run, on this thread's
        CPU (one asleep in its socket's wait needs no CPU: spinning on beside it keeps this
        rank's own wake-up fast). False where that cannot be told (a peer on another host, its
        process out of sight): unlike shared memory's peers, those may well be elsewhere.
        Cost: one ``/proc`` read per peer on this host (about 5 us)."""
        local = self._local
        return self._cpus.shares_cpu([local[r] for r in ranks if r in local], runnable=True,
                                     unknown=False)

    def runnable_peers(self) -> int | None:
        """How many peers on this host run or wait to run now (None: none is known to be
        here). Cost: one ``/proc`` read per peer on this host (about 5 us)."""
        if not self._local:
            return None
        return sum(self._cpus.cpu_of(pid, runnable=True) >= 0 for pid in self._local.values())

    # ----------------------------------------------------------------- bootstrap

    @classmethod
    def create(
        cls, rank: int, size: int, store: Store, secret: bytes, bind: str = "127.0.0.1",
        timeout: float | None = 60.0, *, checksum: bool = False,
        peers: Collection[int] | None = None,
    ) -> TcpTransport:
        """Connect this rank to every other rank of a ``size``-rank world through ``store``
        (or only to ``peers``: those on other hosts when shared memory reaches the rest; every
        rank must pass a consistent choice).

        The listener binds ``bind`` (``""``: loopback) only while the world connects.
        ``checksum`` turns per-frame CRC-32 on; every rank must pass the same.

        Cost: one listener, one store ``set`` plus one ``get`` per lower rank, and per peer one
        TCP connection with a 3-message authentication handshake and a hello exchange.

        Raises:
            ValueError: ``rank``/``size``/``secret`` are invalid (a non-loopback ``bind`` needs the
                job secret, see :func:`ringworld.auth.listen_host`).
            AuthenticationError: a lower rank's listener failed authentication.
            BootstrapError: a peer did not show up (or could not be reached) within ``timeout``.
            StoreError: the store failed.
        """
        return cls(rank, connect_world(rank, size, store, secret, bind, timeout, checksum,
                                       peers), checksum=checksum)

    # ----------------------------------------------------------------- sending

    def isend(
        self, dest: int, context: int, tag: int, flags: int, segments: Sequence[memoryview],
        nbytes: int,
    ) -> SendHandle:
        """Send the frame ``[header, *segments]`` to ``dest`` now as far as the socket takes it.

        Returns :data:`DONE` if everything went out at once, else a handle that :meth:`poll`
        completes. Cost: one ``sendmsg`` (plus up to 99 padding bytes, see the module docstring);
        leftovers are queued as views, never copied.

        Raises:
            PeerFailure: ``dest`` failed earlier or its connection breaks now.
            ValueError: ``dest`` is not a peer, or the envelope/size is out of range.
            TransportError: the transport is closed.
        """
        peer = self._peers.get(dest)
        if peer is None:
            raise ValueError(f"dest {dest} is not a peer of rank {self.rank} ({self.peers})")
        if self._closed:
            raise TransportError("the TCP transport is closed")
        if peer.failed is not None:
            raise PeerFailure(dest, peer.failed)
        total = 0
        for seg in segments:
            total += seg.nbytes
        if total != nbytes:
            raise ValueError(f"segments hold {total} bytes but nbytes is {nbytes}")
        if nbytes > MAX_MESSAGE_BYTES:
            raise ValueError(f"message of {nbytes} bytes exceeds {MAX_MESSAGE_BYTES}")
        try:
            header = HEADER.pack(MAGIC, VERSION, flags, context, tag, nbytes)
        except struct.error as exc:
            raise ValueError(
                f"envelope out of range: context={context} tag={tag} flags={flags}") from exc
        if self._checksum:
            header, trail = checked_header(header, segments, nbytes)
        elif nbytes >= LEAD_MIN_BYTES:  # frame_padding(), inline
            header += _LEAD_BYTES
            trail = -nbytes & _ALIGN_MASK
        else:
            trail = -(HEADER.size + nbytes) & _ALIGN_MASK
        tail = _TRAILS[trail]
        frame = len(header) + nbytes + trail
        sent = 0
        if not peer.sendq and len(segments) < _IOV_MAX - 1:
            try:
                sent = peer.sock.sendmsg([header, *segments, tail], (), _SEND_NOW)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._fail(peer, f"connection reset while sending ({exc})", exc)
            if sent == frame:
                return DONE
        pending = deque([memoryview(header)])
        pending.extend(s if s.ndim == 1 and s.format == "B" else s.cast("B") for s in segments)
        if trail:
            pending.append(tail)
        consume_sent(pending, sent)
        peer.sendq.extend(pending)
        peer.queued += frame - sent
        handle = SendHandle()
        peer.handles.append((peer.queued, handle))
        if not peer.want_write:
            peer.want_write = True
            self._sel.modify(peer.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)
        return handle

    def _flush(self, peer: _Peer) -> bool:
        """Push ``peer``'s queued bytes without blocking; return whether any went out."""
        q = peer.sendq
        progressed = False
        while q:
            batch = list(itertools.islice(q, _IOV_MAX))
            offered = sum(len(b) for b in batch)
            try:
                sent = peer.sock.sendmsg(batch, (), _SEND_NOW)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._fail(peer, f"connection reset while sending ({exc})", exc)
            consume_sent(q, sent)
            peer.sent += sent
            progressed = progressed or sent > 0
            if sent < offered:
                break
        handles = peer.handles
        while handles and handles[0][0] <= peer.sent:
            handles.popleft()[1].done = True
        if not q and peer.want_write:
            peer.want_write = False
            self._sel.modify(peer.sock, selectors.EVENT_READ, peer)
        return progressed

    # ----------------------------------------------------------------- receiving

    def poll(self, deliver: Deliver) -> bool:
        """Push queued sends and read whatever has arrived, delivering each new message.

        Reads at most :data:`_READ_BUDGET` bytes per peer per call. Return whether anything moved.

        Raises:
            PeerFailure: a peer closed or reset its connection, or broke the protocol (raised once
                per peer; :meth:`check_peers` keeps raising it).
            TransportError: the transport is closed.
        """
        if self._closed:
            raise TransportError("the TCP transport is closed")
        progressed = False
        live = self._live
        ready: set[_Peer] | None = None
        if len(live) > 1:  # one epoll_wait instead of a recv_into per peer (most find nothing)
            ready = {key.data for key, _ in self._sel.select(0)}
        for peer in tuple(live):  # deliver callbacks may fail a peer (via isend)
            if peer.failed is not None:
                continue
            if peer.sendq and self._flush(peer):
                progressed = True
            if (ready is not None and peer not in ready and peer.rend == peer.rpos
                    and peer.deferred is None):
                continue  # nothing staged and nothing to read
            if self._receive(peer, deliver):
                progressed = True
        return progressed

    def _receive(self, peer: _Peer, deliver: Deliver) -> bool:
        progressed = False
        budget = _READ_BUDGET
        stage = peer.stage_view
        hsize = self._hsize
        if peer.deferred is not None:  # no receive came for it since the last poll
            peer.deferred.buffer()
        while True:
            if peer.skip:  # frame padding (see the module docstring)
                k = min(peer.skip, peer.rend - peer.rpos)
                peer.rpos += k
                peer.skip -= k
                if peer.skip:
                    if budget <= 0:
                        return progressed
                    n = self._fill(peer)
                    if n == 0:
                        return progressed
                    budget -= n
                    progressed = True
                    continue
            if peer.state == _WANT_HEADER:
                if peer.rend - peer.rpos < hsize:
                    if budget <= 0:
                        return progressed
                    n = self._fill(peer)
                    if n == 0:
                        return progressed
                    budget -= n
                    progressed = True
                    continue
                self._start_message(peer, deliver)
                progressed = True
                if peer.deferred is not None:
                    return True  # its payload waits for a receive until the next poll
                if peer.skip:
                    continue
            target = peer.target
            if target is None:
                raise RuntimeError(
                    f"a message from rank {peer.rank} was neither read nor detached by deliver")
            need = len(target) - peer.tpos
            if need:
                avail = peer.rend - peer.rpos
                if avail:
                    k = min(avail, need)
                    target[peer.tpos : peer.tpos + k] = stage[peer.rpos : peer.rpos + k]
                    peer.rpos += k
                    peer.tpos += k
                    need -= k
                if need:
                    if budget <= 0:
                        return progressed
                    if need >= _DIRECT_BYTES:
                        n = self._recv(peer, target[peer.tpos :])
                        peer.tpos += n
                    else:
                        n = self._fill(peer)
                    if n == 0:
                        return progressed
                    budget -= n
                    progressed = True
                    continue
            self._finish_message(peer)

    def _start_message(self, peer: _Peer, deliver: Deliver) -> None:
        if self._checksum:
            self._check_header(peer)
        magic, version, flags, context, tag, nbytes = HEADER.unpack_from(peer.stage, peer.rpos)
        if magic != MAGIC or version != VERSION:
            self._fail(peer, f"protocol error: bad frame header (magic {magic:#x}, "
                             f"version {version}; expected {MAGIC:#x}, {VERSION})")
        if nbytes > MAX_MESSAGE_BYTES:
            self._fail(peer, f"protocol error: message of {nbytes} bytes exceeds the bound "
                             f"({MAX_MESSAGE_BYTES})")
        hsize = self._hsize
        peer.rpos += hsize
        if nbytes >= LEAD_MIN_BYTES:  # frame_padding(), inline
            peer.trail = -nbytes & _ALIGN_MASK
            lead = FRAME_ALIGN - hsize
            if peer.rend - peer.rpos >= lead:
                peer.rpos += lead
            else:
                _drop(peer, lead)
        else:
            peer.trail = -(hsize + nbytes) & _ALIGN_MASK
        incoming = _TcpIncoming(peer, context, tag, flags, nbytes)
        peer.big = nbytes > TAKE_BYTES
        peer.state = _WANT_PAYLOAD
        deliver(incoming)
        if not incoming._decided:
            raise RuntimeError(
                "the deliver callback must call read_into() or detach() on every message")

    def _check_header(self, peer: _Peer) -> None:
        """Verify the staged header's CRC (checksums on) and remember the payload's."""
        at = peer.rpos + HEADER.size
        crc, check = CHECK.unpack_from(peer.stage, at)
        if zlib.crc32(peer.stage_view[peer.rpos : at + 4]) != check:
            self._fail(peer, "data corrupted in transit: frame header checksum mismatch "
                             "(connection closed)")
        peer.crc = crc

    def _finish_message(self, peer: _Peer) -> None:
        if self._checksum and peer.target is not None and zlib.crc32(peer.target) != peer.crc:
            self._fail(peer, f"data corrupted in transit: payload checksum mismatch in a "
                             f"{len(peer.target)}-byte message (connection closed)")
        peer.state = _WANT_HEADER
        trail = peer.trail
        if trail:
            if peer.rend - peer.rpos >= trail:
                peer.rpos += trail
            else:
                _drop(peer, trail)
        peer.target = None
        kept, on_done = peer.buffered, peer.on_done
        peer.buffered = peer.on_done = None
        if kept is not None:
            kept.mark_complete()
        elif on_done is not None:
            on_done()

    def _fill(self, peer: _Peer) -> int:
        """Read into the staging buffer; return the byte count (0: nothing available)."""
        if peer.rpos:
            self._compact(peer)
        n = self._recv(peer, peer.stage_view[peer.rend :])
        peer.rend += n
        return n

    def _recv(self, peer: _Peer, view: memoryview) -> int:
        """``recv_into`` without blocking; 0 means "nothing now". Raises on EOF/reset."""
        try:
            n = peer.sock.recv_into(view, 0, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._fail(peer, f"connection reset ({exc})", exc)
        if n == 0:
            mid = peer.state == _WANT_PAYLOAD or peer.rend > peer.rpos or peer.skip > 0
            self._fail(peer, "connection closed by the peer"
                             + (" in the middle of a message" if mid else ""))
        return n

    supports_take_eager = True

    def take_eager(self, source: int, context: int, tag: int, dest: memoryview | None,
                   polls: int = 1, exact: bool = False
                   ) -> tuple[int, int, int, bytes | None] | int | None:
        """The next message from ``source`` if small and whole (:meth:`Transport.take_eager`):
        staged, or read by up to ``polls`` (at most TAKE_POLLS) reads that do not block or,
        where :attr:`sleepy` says so, reads that block up to BLOCK_SLICE each, woken by the
        data. Beside a busy process (np=2, 2 cores, 8 B) spinning receives took 19-22 us a
        half round trip, 27-31 us of CPU a round trip and rank; sleeping ones 10-15 and 10-15.
        Quiet, spinning wins (9 us; sleeping 38). Cost: 0.75 us a read finding none."""
        peer = self._peers.get(source)
        if (peer is None or peer.failed is not None or peer.state != _WANT_HEADER or peer.skip
                or peer.deferred is not None or self._checksum or self._closed or peer.big):
            return None  # (big: the next is likely large too, its read better left to _block)
        for p in self._live:
            if p.sendq:
                return None
        hsize = HEADER.size
        polls = min(polls, TAKE_POLLS)
        sleepy: bool | None = None
        while True:
            at = peer.rpos
            if peer.rend - at >= hsize:
                magic, version, flags, ctx, mtag, nbytes = HEADER.unpack_from(peer.stage, at)
                if (magic != MAGIC or version != VERSION or ctx != context
                        or (mtag != tag and tag != -1) or nbytes > TAKE_BYTES
                        or (dest is not None and (nbytes != len(dest) if exact
                                                  else nbytes > len(dest)))):
                    return None
                start = at + (FRAME_ALIGN if nbytes >= LEAD_MIN_BYTES else hsize)
                end = start + nbytes
                if end <= peer.rend:
                    break
            # (the rest of a frame that arrives now: read on, rather than leave the staged part
            # to the general path: 1.8 us more a 64 KiB ping-pong message)
            if at:
                self._compact(peer)
            if sleepy is None:
                sleepy = _CAN_BLOCK and self.sleepy()
            try:
                if sleepy:
                    n = peer.sock.recv_into(peer.stage_view[peer.rend :], 0, 0)
                else:
                    while True:
                        if polls <= 0:
                            return 0 if peer.rend - peer.rpos < hsize else None
                        polls -= 1
                        try:
                            n = peer.sock.recv_into(peer.stage_view[peer.rend :], 0, _DONTWAIT)
                            break
                        except BlockingIOError:
                            pass
            except OSError:  # (a blocking read's timeout; a broken connection: the next poll's)
                return 0 if peer.rend - peer.rpos < hsize else None
            if n == 0:
                return None  # (the peer closed: the next poll fails it)
            peer.rend += n
        payload: bytes | None = None
        if dest is None:
            payload = bytes(peer.stage_view[start:end])
        elif nbytes:
            dest[:nbytes] = peer.stage_view[start:end]
        _drop(peer, end - at + (-(end - at) & _ALIGN_MASK))  # (frame_padding(), inline)
        return mtag, flags, nbytes, payload

    def _compact(self, peer: _Peer) -> None:
        """Move the staged bytes to the front of the staging buffer."""
        avail = peer.rend - peer.rpos
        if avail:
            peer.stage_view[:avail] = bytes(peer.stage_view[peer.rpos : peer.rend])
        peer.rpos, peer.rend = 0, avail

    # ----------------------------------------------------------------- failures, waiting, close

    def _fail(self, peer: _Peer, detail: str, cause: BaseException | None = None) -> NoReturn:
        """Mark ``peer`` failed, close its socket and raise :class:`PeerFailure`."""
        peer.failed = detail
        if peer in self._live:
            self._live.remove(peer)
            self._sel.unregister(peer.sock)
        peer.sock.close()
        peer.sendq.clear()
        raise PeerFailure(peer.rank, detail) from cause

    def check_peers(self) -> None:
        """Raise :class:`PeerFailure` for the lowest failed peer, if any. Cost: O(peers).

        Raises:
            TransportError: the transport is closed.
        """
        if self._closed:
            raise TransportError("the TCP transport is closed")
        for peer in self._peers.values():
            if peer.failed is not None:
                raise PeerFailure(peer.rank, peer.failed)

    def wait_event(self, timeout: float, waiting: Callable[[], bool] | None = None) -> None:
        """Block up to ``timeout`` s until a peer socket is readable (or writable with sends
        queued). Returns at once if staged bytes already hold a header, or a detached payload waits
        to be buffered. Cost: one ``epoll_wait``.
        """
        if self._closed or (waiting is not None and not waiting()):
            return
        for peer in self._live:
            if peer.deferred is not None:
                return
            if peer.state == _WANT_HEADER and peer.rend - peer.rpos >= peer.skip + self._hsize:
                return
        if timeout >= BLOCK_SLICE and len(self._live) == 1 and self._block(self._live[0]):
            return  # (a shorter wait, one near its deadline, sleeps in epoll for just that)
        self._sel.select(max(timeout, 0.0))

    def _block(self, peer: _Peer) -> bool:
        """Where this rank waits on the payload being read from its one peer, with nothing of
        its own queued to send: block in that read, as a blocking socket does, for at most
        BLOCK_SLICE, woken only once BLOCK_LOWAT bytes (or the rest) have arrived; False where
        that does not hold (the caller waits in epoll). Beside a busy process (2 cores), a 16
        MiB stream moved 1.76-1.81 GB/s through epoll waits, 2.8-3.1 through these (quiet:
        3.3-3.5 either way, its waits spin); the loaded wake-ups each moved 381 KiB on average.
        Raises nothing: a broken connection is left to the next poll, which fails the peer."""
        target = peer.target
        if (not _CAN_BLOCK or peer.sendq or peer.state != _WANT_PAYLOAD or target is None
                or peer.skip or peer.rend != peer.rpos
                or len(target) - peer.tpos < _DIRECT_BYTES):
            return False
        sock = peer.sock
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT,
                            min(len(target) - peer.tpos, BLOCK_LOWAT))
            try:
                n = sock.recv_into(target[peer.tpos :], 0, _WAITALL)
            finally:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except OSError:
            return True  # (its timeout; or a broken connection: see above)
        peer.tpos += n  # (0: the peer closed; the next poll's read fails it)
        return True

    def close(self) -> None:
        """Close every peer socket and the selector; idempotent. Queued sends are dropped."""
        if self._closed:
            return
        self._closed = True
        for peer in self._peers.values():
            peer.sock.close()
            peer.sendq.clear()
        self._live.clear()
        self._sel.close()
        self._cpus.close()
