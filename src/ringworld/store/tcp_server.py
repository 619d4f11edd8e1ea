"""The authenticated TCP store's server: one selector thread serving every client.

Every accepted connection first runs the authentication handshake
(:class:`ringworld.auth.AcceptHandshake`, non-blocking) under a deadline of
:data:`HANDSHAKE_TIMEOUT` seconds; at most :data:`MAX_PENDING_HANDSHAKES` may be pending, and a
new arrival beyond that sheds the oldest pending one, so neither idle nor flooding
unauthenticated clients can starve a real one (whose handshake takes one round trip). Only an
authenticated connection has its requests read (wire format: :mod:`ringworld.store.tcp`);
``get``/``wait`` on a missing key park the request server-side until the key is set or the
timeout passes. The client, :class:`ringworld.store.tcp.TCPStore`, lives beside it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import selectors
import socket
import threading
import time
from collections import deque
from types import TracebackType

from ringworld._sockutil import consume_sent
from ringworld.auth import AcceptHandshake, listen_host
from ringworld.errors import AuthenticationError, StoreError
from ringworld.store.memory import SLEEP_SLICE, parse_counter
from ringworld.store.wire import (
    OP_ADD,
    OP_GET,
    OP_SET,
    REQUEST,
    RESPONSE,
    RESPONSE_MAGIC,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_TIMEOUT,
    VERSION,
    ProtocolError,
    VersionMismatch,
    decode_keys,
    parse_key_lengths,
    parse_request_header,
)

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

#: seconds an accepted connection gets to complete the authentication handshake.
HANDSHAKE_TIMEOUT = 5.0
#: connections that may be authenticating at once; an arrival beyond this sheds the oldest.
MAX_PENDING_HANDSHAKES = 128
_ACCEPTS_PER_WAKEUP = 256
_IOV_BATCH = 64
#: counters of :meth:`TCPStoreServer.stats`.
STAT_NAMES = ("authenticated", "auth_failed", "handshake_timeouts", "handshakes_shed",
              "protocol_errors", "requests")
_REQUESTS_PER_WAKEUP = 64


class _ProtocolError(Exception):
    """A client broke the wire protocol; its connection is dropped (and the reason logged)."""


def _warn(msg: str, *args: object) -> None:
    """Log a warning (logging is imported on first use: ranks' start-up skips its 10 ms)."""
    import logging

    # the logger the store has always warned on (documented; the client module's name)
    logging.getLogger("ringworld.store.tcp").warning(msg, *args)


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a closed client"
    return f"{host}:{port}"


class _ClientGone(Exception):
    """The client closed its connection."""


class _Waiter:
    """A parked ``get``/``wait`` request."""

    __slots__ = ("active", "conn", "deadline", "keys", "missing", "op", "timeout")

    def __init__(
        self, conn: _Conn, op: int, keys: list[str], missing: set[str], timeout: float,
    ) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.missing = missing
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout >= 0 else math.inf
        self.active = True


class _Conn:
    """Server-side state of one authenticated connection."""

    __slots__ = (
        "amount", "buf", "closed", "events", "got", "header", "keys", "lens", "nkeys", "op",
        "out", "paused", "sock", "stage", "target", "timeout", "value_len", "waiter",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.header = bytearray(REQUEST.size)
        self.closed = False
        self.events = 0
        self.out: deque[memoryview] = deque()
        self.waiter: _Waiter | None = None
        self.paused = False
        self.op = self.nkeys = self.value_len = self.amount = 0
        self.timeout = -1.0
        self.lens: tuple[int, ...] = ()
        self.keys: list[str] = []
        self.stage = 0
        self.buf = self.header
        self.target = memoryview(self.header)
        self.got = 0

    def expect(self, stage: int, buf: bytearray) -> None:
        """Read ``len(buf)`` bytes into ``buf`` next, then run ``stage``'s check."""
        self.stage = stage
        self.buf = buf
        self.target = memoryview(buf)
        self.got = 0


_HEADER, _LENS, _KEYS, _VALUE = range(4)


class TCPStoreServer:
    """Serve a store to authenticated clients from one daemon thread.

    ``start()`` binds and returns the address; ``close()`` stops the thread and closes every
    socket. Cost per request: O(key bytes + value bytes) plus one ``sendmsg``; a blocked ``get``
    or ``wait`` costs nothing until a key it waits for is set or its timeout passes.
    """

    def __init__(
        self, secret: bytes, host: str = "127.0.0.1", port: int = 0, *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_pending: int = MAX_PENDING_HANDSHAKES,
    ) -> None:
        """Prepare (but do not bind) a server on ``host`` (``""``: loopback).

        Raises:
            ValueError: ``secret`` is empty (or too short for a non-loopback ``host``, see
                :func:`ringworld.auth.listen_host`), or a limit is not positive.
        """
        self._host = listen_host(host, secret)
        if not handshake_timeout > 0 or max_pending < 1:
            raise ValueError(f"handshake_timeout={handshake_timeout!r} and "
                             f"max_pending={max_pending!r} must be positive")
        self._secret = bytes(secret)
        self._port = port
        self._handshake_timeout = float(handshake_timeout)
        self._max_pending = int(max_pending)
        self._address: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        # socket -> handshake, oldest first (all share one timeout, so also by deadline)
        self._pending: dict[socket.socket, AcceptHandshake] = {}
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._data: dict[str, bytes | bytearray] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._conns: set[_Conn] = set()
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    # ----------------------------------------------------------------- lifecycle (any thread)

    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; return ``(host, port)``.

        Raises:
            StoreError: binding failed (chained from the ``OSError``), or already started/closed.
        """
        with self._lock:
            if self._closed or self._thread is not None:
                raise StoreError("TCPStoreServer.start() may be called once, before close()")
            family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
            try:
                listener = socket.create_server(
                    (self._host, self._port), family=family, backlog=4096)
            except OSError as exc:
                raise StoreError(
                    f"cannot listen on {self._host}:{self._port} for the store: {exc}") from exc
            listener.setblocking(False)
            self._listener = listener
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._sel = selectors.DefaultSelector()
            self._sel.register(listener, selectors.EVENT_READ, "listener")
            self._sel.register(self._wake_r, selectors.EVENT_READ, "wakeup")
            host, port = listener.getsockname()[:2]
            self._address = (str(host), int(port))
            self._thread = threading.Thread(
                target=self._serve, name=f"ringworld-store-{port}", daemon=True)
            self._thread.start()
            return self._address

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on. Raises ``RuntimeError`` before ``start()``."""
        if self._address is None:
            raise RuntimeError("TCPStoreServer.address is known only after start()")
        return self._address

    def stats(self) -> dict[str, int]:
        """Counters since start (names in :data:`STAT_NAMES`): connections authenticated,
        refused for a wrong secret or a broken handshake, timed out or shed while
        authenticating, dropped for a protocol error, and requests served. Cost: O(1)."""
        return dict(self._stats)

    def close(self) -> None:
        """Stop serving: close every connection and the listener, join the thread; idempotent.

        Clients blocked in a request see the connection close and raise :class:`StoreError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake_locked()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> TCPStoreServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _wake_locked(self) -> None:
        if self._wake_w is not None:
            # OSError: the pipe is full (a wakeup is pending anyway) or already torn down.
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    # ----------------------------------------------------------------- handshakes

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of descriptors: try again on the next wakeup
                return
            if len(self._pending) >= self._max_pending:
                self._shed_oldest()
            try:
                hs = AcceptHandshake(
                    sock, self._secret, time.monotonic() + self._handshake_timeout)
            except OSError:
                sock.close()
                continue
            self._pending[sock] = hs
            self._sel.register(sock, selectors.EVENT_READ, hs)
            self._step_handshake(hs)

    def _step_handshake(self, hs: AcceptHandshake) -> None:
        try:
            done = hs.advance()
        except AuthenticationError:
            self._end_handshake(hs.sock, "auth_failed")
            return
        except OSError:
            self._end_handshake(hs.sock, "auth_failed")
            return
        assert self._sel is not None
        if not done:
            self._sel.modify(hs.sock, selectors.EVENT_READ | (
                selectors.EVENT_WRITE if hs.wants_write else 0), hs)
            return
        self._sel.unregister(hs.sock)
        del self._pending[hs.sock]
        self._stats["authenticated"] += 1
        try:
            hs.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            hs.sock.close()
            return
        conn = _Conn(hs.sock)
        self._conns.add(conn)
        self._update(conn)

    def _shed_oldest(self) -> None:
        """Make room: finish the oldest handshake if its reply is already here, else drop it."""
        sock, hs = next(iter(self._pending.items()))
        self._step_handshake(hs)
        if sock in self._pending:
            self._end_handshake(sock, "handshakes_shed")

    def _end_handshake(self, sock: socket.socket, reason: str) -> None:
        """Close a pending handshake's connection and count it under ``reason``."""
        del self._pending[sock]
        self._stats[reason] += 1
        if self._sel is not None:
            self._sel.unregister(sock)
        sock.close()

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        while self._pending:
            sock, hs = next(iter(self._pending.items()))
            if hs.deadline > now:
                return
            self._end_handshake(sock, "handshake_timeouts")

    # ----------------------------------------------------------------- the serving thread

    def _serve(self) -> None:
        sel = self._sel
        assert sel is not None
        try:
            while not self._closed:
                for key, mask in sel.select(self._select_timeout()):
                    data = key.data
                    if isinstance(data, _Conn):
                        self._service(data, mask)
                    elif isinstance(data, AcceptHandshake):
                        if data.sock in self._pending:
                            self._step_handshake(data)
                    elif data == "listener":
                        self._accept()
                    else:
                        self._drain_wakeups()
                self._expire()
                self._expire_handshakes()
        finally:
            self._teardown()

    def _select_timeout(self) -> float | None:
        while self._deadlines and not self._deadlines[0][2].active:
            heapq.heappop(self._deadlines)
        first = self._deadlines[0][0] if self._deadlines else math.inf
        if self._pending:
            first = min(first, next(iter(self._pending.values())).deadline)
        if first == math.inf:
            return None
        return min(SLEEP_SLICE, max(0.0, first - time.monotonic()))

    def _drain_wakeups(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _teardown(self) -> None:
        with self._lock:
            self._closed = True
        for sock in list(self._pending):
            sock.close()
        self._pending.clear()
        for conn in list(self._conns):
            self._drop(conn)
        if self._sel is not None:
            self._sel.close()
        for owned in (self._listener, self._wake_r, self._wake_w):
            if owned is not None:
                owned.close()

    def _update(self, conn: _Conn) -> None:
        """Register ``conn`` for the events it needs now."""
        assert self._sel is not None
        events = (0 if conn.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if conn.out else 0)
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        waiter = conn.waiter
        if waiter is not None:
            waiter.active = False
            for key in waiter.missing:
                lst = self._waiters.get(key)
                if lst is not None:
                    lst[:] = [w for w in lst if w is not waiter]
                    if not lst:
                        del self._waiters[key]
        if conn.events and self._sel is not None:
            self._sel.unregister(conn.sock)
        conn.events = 0
        conn.out.clear()
        conn.sock.close()

    def _service(self, conn: _Conn, mask: int) -> None:
        if conn.closed:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(conn)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._read(conn)
        except _ProtocolError as exc:
            # Only authenticated clients get here, so logging each one cannot be used to flood.
            self._stats["protocol_errors"] += 1
            _warn("store %s:%d: dropped the connection from %s: protocol error: %s",
                         *self.address, _peer_name(conn.sock), exc)
            self._drop(conn)
        except (OSError, _ClientGone):
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        if conn.waiter is not None:
            # A request is parked: watch only for the client going away.
            try:
                if not conn.sock.recv(1, socket.MSG_PEEK):
                    raise _ClientGone
            except (BlockingIOError, InterruptedError):
                return
            conn.paused = True
            self._update(conn)
            return
        handled = 0
        while conn.waiter is None and not conn.closed and handled < _REQUESTS_PER_WAKEUP:
            if conn.got < len(conn.target):
                try:
                    n = conn.sock.recv_into(conn.target[conn.got:])
                except (BlockingIOError, InterruptedError):
                    return
                if n == 0:
                    raise _ClientGone
                conn.got += n
                if conn.got < len(conn.target):
                    continue
            handled += self._advance(conn)

    def _advance(self, conn: _Conn) -> int:
        """The current stage is complete: validate it and move on. Return 1 per request run."""
        if conn.stage == _HEADER:
            try:
                head = parse_request_header(conn.header)
            except VersionMismatch as exc:
                self._reply(conn, STATUS_ERROR, str(exc).encode())  # a client that can say why
                raise _ProtocolError(str(exc)) from None
            except ProtocolError as exc:
                raise _ProtocolError(str(exc)) from None
            conn.op, conn.nkeys, conn.value_len = head.op, head.nkeys, head.value_len
            conn.timeout, conn.amount = head.timeout, head.amount
            conn.expect(_LENS, bytearray(4 * head.nkeys))
            return 0
        try:
            if conn.stage == _LENS:
                conn.lens = parse_key_lengths(conn.target)
                conn.expect(_KEYS, bytearray(sum(conn.lens)))
                return 0
            if conn.stage == _KEYS:
                conn.keys = decode_keys(conn.target, conn.lens)
                conn.expect(_VALUE, bytearray(conn.value_len))
                return 0
        except ProtocolError as exc:
            raise _ProtocolError(str(exc)) from None
        value = conn.buf
        conn.expect(_HEADER, conn.header)
        self._stats["requests"] += 1
        self._execute(conn, value)
        return 1

    # ----------------------------------------------------------------- requests

    def _execute(self, conn: _Conn, value: bytearray) -> None:
        op, keys = conn.op, conn.keys
        if op == OP_SET:
            self._data[keys[0]] = value
            self._reply(conn, STATUS_OK)
            self._notify(keys[0])
        elif op == OP_ADD:
            try:
                total = parse_counter(keys[0], self._data.get(keys[0])) + conn.amount
            except StoreError as exc:
                self._reply(conn, STATUS_ERROR, str(exc).encode())
                return
            if not _I64_MIN <= total <= _I64_MAX:
                self._reply(conn, STATUS_ERROR,
                            f"counter {keys[0]!r} would overflow 64 bits".encode())
                return
            self._data[keys[0]] = str(total).encode("ascii")
            self._reply(conn, STATUS_OK, amount=total)
            self._notify(keys[0])
        else:
            missing = {k for k in keys if k not in self._data}
            if not missing:
                self._answer(conn, op, keys)
            elif conn.timeout == 0:
                self._reply(conn, STATUS_TIMEOUT, "\n".join(sorted(missing)).encode())
            else:
                waiter = _Waiter(conn, op, keys, missing, conn.timeout)
                conn.waiter = waiter
                for k in missing:
                    self._waiters.setdefault(k, []).append(waiter)
                if waiter.deadline != math.inf:
                    heapq.heappush(self._deadlines, (waiter.deadline, next(self._seq), waiter))

    def _answer(self, conn: _Conn, op: int, keys: list[str]) -> None:
        if op == OP_GET:
            self._reply(conn, STATUS_OK, self._data[keys[0]])
        else:
            self._reply(conn, STATUS_OK)

    def _notify(self, key: str) -> None:
        for waiter in self._waiters.pop(key, ()):
            if not waiter.active:
                continue
            waiter.missing.discard(key)
            if not waiter.missing:
                self._finish(waiter)
                self._answer(waiter.conn, waiter.op, waiter.keys)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(self._deadlines)
            if not waiter.active:
                continue
            for k in waiter.missing:
                lst = self._waiters.get(k)
                if lst is not None:
                    lst[:] = [w for w in lst if w is not waiter]
                    if not lst:
                        del self._waiters[k]
            self._finish(waiter)
            self._reply(waiter.conn, STATUS_TIMEOUT, "\n".join(sorted(waiter.missing)).encode())

    def _finish(self, waiter: _Waiter) -> None:
        """Unpark the connection of a completed waiter."""
        waiter.active = False
        conn = waiter.conn
        conn.waiter = None
        if conn.paused and not conn.closed:
            conn.paused = False
            self._update(conn)

    def _reply(
        self, conn: _Conn, status: int, value: bytes | bytearray = b"", amount: int = 0,
    ) -> None:
        if conn.closed:
            return
        conn.out.append(memoryview(RESPONSE.pack(
            RESPONSE_MAGIC, VERSION, status, len(value), amount)))
        if value:
            conn.out.append(memoryview(value))
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        """Send queued replies without blocking; drop ``conn`` if its socket fails."""
        out = conn.out
        try:
            while out:
                batch = list(itertools.islice(out, _IOV_BATCH))
                sent = conn.sock.sendmsg(batch)
                consume_sent(out, sent)
                if sent < sum(len(b) for b in batch):
                    break  # the socket buffer is full: wait for writability
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return
        self._update(conn)
