"""The TCP transport's bootstrap: listen, publish, connect, accept, authenticate, say hello.

:func:`connect_world` (behind :meth:`ringworld.transport.tcp.TcpTransport.create`) has every rank
listen on ``(bind, 0)``, publish ``tcp/addr/<rank>`` in the store, connect to every lower rank
and accept every higher one. Each connection is authenticated with the job secret
(:mod:`ringworld.auth`) before anything else is read; then the connector sends a
:data:`~ringworld.transport.tcp_wire.HELLO` (its rank, the world size and its options) which the
acceptor validates and echoes with its own, so both ends know whom they talk to and agree on
checksums. The listener runs every pending handshake concurrently without blocking, each under
:data:`HANDSHAKE_TIMEOUT`, at most :data:`MAX_PENDING_HANDSHAKES` at once (an arrival beyond that
sheds the oldest), so idle or flooding strangers cannot keep the real ranks out.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Callable, Collection

from ringworld._sockutil import recv_exact
from ringworld.auth import AcceptHandshake, connect_handshake, listen_host
from ringworld.errors import AuthenticationError, BootstrapError, StoreTimeout
from ringworld.store.base import Store
from ringworld.transport.tcp_wire import HELLO, HELLO_MAGIC, OPT_CHECKSUM, VERSION

#: SO_SNDBUF requested for every peer socket (the kernel doubles it); the receive buffer is left
#: to the kernel's autotuning. A small send buffer keeps the bytes in flight, and so the kernel's
#: page fragments, cache-hot: on loopback 1 MiB beat 4 MiB by 15-30% for 16-64 MiB messages
#: (4 MiB, the usual ``wmem_max``, was the slowest size measured), and it still covers the
#: bandwidth-delay product of a LAN (2 MiB per round trip).
SEND_BUFFER_BYTES = 1 << 20
#: seconds an accepted bootstrap connection gets to authenticate and say hello.
HANDSHAKE_TIMEOUT = 5.0
#: bootstrap connections that may be authenticating at once; more shed the oldest.
MAX_PENDING_HANDSHAKES = 128


def connect_world(
    rank: int, size: int, store: Store, secret: bytes, bind: str, timeout: float | None,
    checksum: bool, peers: Collection[int] | None,
) -> dict[int, socket.socket]:
    """Connect ``rank`` to its peers as :meth:`~ringworld.transport.tcp.TcpTransport.create`
    documents (arguments, cost and errors alike); return the sockets by peer rank."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a world of size {size}")
    if not secret:
        raise ValueError("the job secret must be non-empty bytes")
    bind = listen_host(bind, secret)
    options = OPT_CHECKSUM if checksum else 0
    deadline = None if timeout is None else time.monotonic() + timeout

    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    socks: dict[int, socket.socket] = {}
    try:
        _size_buffers(listener)
        try:
            listener.bind((bind, 0))
            listener.listen(max(size, 128))
        except OSError as exc:
            raise BootstrapError(f"rank {rank}: cannot listen on {bind}: {exc}") from exc
        host, port = listener.getsockname()[:2]
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        store.set(f"tcp/addr/{rank}", f"{host}:{port}".encode())
        hello = _Hello(rank, size, options)
        wanted = set(range(size)) - {rank} if peers is None else set(peers) - {rank}
        for peer in sorted(p for p in wanted if p < rank):
            socks[peer] = _connect_peer(hello, peer, store, secret, deadline, timeout)
        _accept_peers(listener, hello, secret, socks, deadline, timeout,
                      {p for p in wanted if p > rank})
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        listener.close()
    return socks


def _size_buffers(sock: socket.socket) -> None:
    """Size a socket's send buffer (set before connect/listen, so accepted sockets inherit it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)


_HELLO_CLOSED = "connection closed during the hello exchange"


class _Hello:
    """What this rank says in its hello: rank, world size, options."""

    __slots__ = ("options", "rank", "size")

    def __init__(self, rank: int, size: int, options: int) -> None:
        self.rank, self.size, self.options = rank, size, options

    def pack(self) -> bytes:
        return HELLO.pack(HELLO_MAGIC, VERSION, self.rank, self.size, self.options)

    def check(self, raw: bytes) -> int:
        """Return the rank in a peer's hello ``raw``.

        Raises:
            ConnectionError: the hello is malformed, or disagrees on world size or options.
        """
        if len(raw) != HELLO.size:
            raise ConnectionError(f"bad hello ({len(raw)} bytes, expected {HELLO.size})")
        magic, version, rank, peer_size, options = HELLO.unpack(raw)
        if magic != HELLO_MAGIC or version != VERSION:
            raise ConnectionError(f"bad hello (magic {magic:#x}, version {version}; "
                                  f"expected {HELLO_MAGIC:#x}, {VERSION})")
        if peer_size != self.size:
            raise ConnectionError(f"peer thinks the world has {peer_size} ranks, not {self.size}")
        if not rank < peer_size or rank == self.rank:
            raise ConnectionError(f"peer claims rank {rank} in a world of {peer_size}")
        if options != self.options:
            raise _OptionsMismatch(
                f"rank {rank} has per-frame checksums {_onoff(options)}, rank {self.rank} "
                f"{_onoff(self.options)}: set RINGWORLD_TCP_CHECKSUM alike on every rank")
        return int(rank)


class _OptionsMismatch(ConnectionError):
    """The peer's hello is fine but its options differ (the acceptor still answers it, so the
    connector can report the difference too)."""


def _onoff(options: int) -> str:
    return "on" if options & OPT_CHECKSUM else "off"


def _connect_peer(
    hello: _Hello, peer: int, store: Store, secret: bytes, deadline: float | None,
    timeout: float | None,
) -> socket.socket:
    """Look ``peer`` up in the store, connect and authenticate (retrying refused or shed
    connections until ``deadline``), exchange hellos."""
    rank = hello.rank

    def left() -> float | None:
        return None if deadline is None else max(deadline - time.monotonic(), 0.001)

    try:
        raw = store.get(f"tcp/addr/{peer}", left())
    except StoreTimeout as exc:
        raise BootstrapError(
            f"rank {rank}: rank {peer} did not publish its TCP address within {timeout} s"
        ) from exc
    host, _, port_text = raw.decode().rpartition(":")
    port = int(port_text)
    delay = 0.01
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            _size_buffers(sock)
            sock.settimeout(left())
            sock.connect((host, port))
            connect_handshake(sock, secret)
            break
        except AuthenticationError as exc:
            sock.close()
            raise AuthenticationError(f"rank {rank} -> rank {peer}: {exc}") from exc
        except OSError as exc:  # refused (not listening yet), or shed before the challenge
            sock.close()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise BootstrapError(
                    f"rank {rank}: cannot connect to rank {peer} at {host}:{port} within "
                    f"{timeout} s: {exc}") from exc
            time.sleep(delay)
            delay = min(2 * delay, 0.25)
        except BaseException:
            sock.close()
            raise
    try:
        sock.settimeout(left())
        sock.sendall(hello.pack())
        answer = hello.check(recv_exact(sock, HELLO.size, _HELLO_CLOSED))
        if answer != peer:
            raise ConnectionError(f"the listener at {host}:{port} is rank {answer}")
    except OSError as exc:
        sock.close()
        raise BootstrapError(
            f"rank {rank}: connecting to rank {peer} at {host}:{port} failed: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    return sock


class _Pending:
    """An accepted bootstrap connection: authenticating, then reading the peer's hello."""

    __slots__ = ("addr", "got", "hello", "hs")

    def __init__(self, hs: AcceptHandshake, addr: str) -> None:
        self.hs = hs
        self.addr = addr
        self.hello: bytearray | None = None  # set once authenticated
        self.got = 0

    def advance(self, mine: _Hello) -> int | None:
        """Progress without blocking; return the peer's rank once its hello checks out.

        Raises:
            AuthenticationError, OSError: the peer failed the handshake, hello, or hung up.
        """
        if self.hello is None:
            if not self.hs.advance():
                return None
            self.hello = bytearray(HELLO.size)
        sock = self.hs.sock
        try:
            n = sock.recv_into(memoryview(self.hello)[self.got :])
        except (BlockingIOError, InterruptedError):
            return None
        if n == 0:
            raise ConnectionResetError(_HELLO_CLOSED)
        self.got += n
        if self.got < HELLO.size:
            return None
        return mine.check(bytes(self.hello))


def _accept_peers(
    listener: socket.socket, hello: _Hello, secret: bytes, socks: dict[int, socket.socket],
    deadline: float | None, timeout: float | None, expected: set[int],
) -> None:
    """Accept one authenticated connection from every rank in ``expected`` into ``socks``.

    All pending handshakes run at once without blocking (see the module docstring). Connections
    that fail authentication, time out, say a bad hello, or repeat a rank are closed and ignored
    (their reasons end up in the timeout error).
    """
    rank = hello.rank
    expected = set(expected)
    if not expected:
        return
    rejected: list[str] = []
    pending: dict[socket.socket, _Pending] = {}  # oldest first
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)

    def reject(sock: socket.socket, why: str) -> None:
        item = pending.pop(sock)
        rejected.append(f"{item.addr}: {why}")
        del rejected[:-20]
        sel.unregister(sock)
        sock.close()

    try:
        while expected:
            now = time.monotonic()
            _expire_pending(pending, reject, now)
            wait = None if deadline is None else deadline - now
            if wait is not None and wait <= 0:
                why = f"; rejected: {'; '.join(rejected[-5:])}" if rejected else ""
                raise BootstrapError(
                    f"rank {rank}: ranks {sorted(expected)} did not connect within {timeout} s"
                    f"{why}")
            if pending:
                first = next(iter(pending.values())).hs.deadline - now
                wait = first if wait is None else min(wait, first)
            for key, _ in sel.select(wait):
                item = key.data
                if item is None:
                    _accept_some(listener, secret, sel, pending, reject)
                    continue
                assert isinstance(item, _Pending)
                peer = _advance_pending(item, hello, expected, sel, pending, reject, rejected)
                if peer is not None:
                    socks[peer] = item.hs.sock
                    expected.discard(peer)
    finally:
        for sock in pending:
            sock.close()
        sel.close()


def _expire_pending(
    pending: dict[socket.socket, _Pending], reject: Callable[[socket.socket, str], None],
    now: float,
) -> None:
    """Reject the pending connections (oldest first) whose handshake deadline has passed."""
    while pending:
        sock, item = next(iter(pending.items()))
        if item.hs.deadline > now:
            break
        reject(sock, f"no handshake within {HANDSHAKE_TIMEOUT} s")


def _advance_pending(
    item: _Pending, hello: _Hello, expected: set[int], sel: selectors.BaseSelector,
    pending: dict[socket.socket, _Pending], reject: Callable[[socket.socket, str], None],
    rejected: list[str],
) -> int | None:
    """Advance a ready pending connection; return the peer's rank once it is accepted.

    Accepted: its hello checked out and was answered, and its socket left ``pending`` and
    ``sel``. None: still pending, already gone, or rejected (closed, its reason noted).
    """
    sock = item.hs.sock
    if sock not in pending:
        return None
    try:
        peer = item.advance(hello)
        if peer is not None and peer not in expected:
            raise ConnectionError(f"unexpected or duplicate rank {peer}")
    except _OptionsMismatch as exc:
        with contextlib.suppress(OSError):
            sock.send(hello.pack())
        reject(sock, str(exc))
        return None
    except (AuthenticationError, OSError) as exc:
        reject(sock, str(exc))
        return None
    if peer is None:
        sel.modify(sock, selectors.EVENT_READ | (
            selectors.EVENT_WRITE if item.hs.wants_write else 0), item)
        return None
    del pending[sock]
    sel.unregister(sock)
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT)
        sock.sendall(hello.pack())
    except OSError as exc:
        rejected.append(f"{item.addr}: {exc}")
        sock.close()
        return None
    return peer


def _accept_some(
    listener: socket.socket, secret: bytes, sel: selectors.BaseSelector,
    pending: dict[socket.socket, _Pending], reject: Callable[[socket.socket, str], None],
) -> None:
    """Accept what is waiting (up to a batch), shedding the oldest pending beyond the cap."""
    for _ in range(MAX_PENDING_HANDSHAKES):
        try:
            sock, addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # e.g. out of descriptors: try again on the next wakeup
            return
        if len(pending) >= MAX_PENDING_HANDSHAKES:
            reject(next(iter(pending)), "shed: too many pending handshakes")
        try:
            hs = AcceptHandshake(sock, secret, time.monotonic() + HANDSHAKE_TIMEOUT)
        except OSError:
            sock.close()
            continue
        item = _Pending(hs, f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr))
        pending[sock] = item
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, item)
