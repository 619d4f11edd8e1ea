"""The authenticated TCP store: the client each rank uses, and the wire protocol it speaks.

The server, a selector thread the launcher runs, is :class:`TCPStoreServer` (in
:mod:`.tcp_server`, re-exported here); every connection authenticates with the job secret
(:mod:`ringworld.auth`) before any request is read, and a ``get``/``wait`` on a missing key is
parked server-side until the key is set or its timeout passes.

Wire format (version :data:`VERSION`, all integers little-endian, one request in flight per
connection)::

    request  = REQUEST(magic u32, version u16, op u16, nkeys u32, value_len u64,
                       timeout f64 (< 0: forever), amount i64)
               key_len u32 * nkeys, key bytes (UTF-8) * nkeys, value bytes
    response = RESPONSE(magic u32, version u16, status u16, value_len u64, amount i64)
               value bytes   (GET: the value; TIMEOUT: missing keys, "\\n"-joined; ERROR: text)

Every length is checked against :data:`MAX_KEY_BYTES`, :data:`MAX_KEYS_BYTES`,
:data:`MAX_WAIT_KEYS` and :data:`MAX_VALUE_BYTES` before anything is allocated for it; a frame
that breaks a bound or the magic closes that connection only (the reason is logged as a warning
on the ``ringworld.store.tcp`` logger and counted in :meth:`TCPStoreServer.stats`); the server
keeps serving everyone else.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType

from ringworld._sockutil import consume_sent, recv_exact
from ringworld.auth import connect_handshake
from ringworld.errors import AuthenticationError, StoreError, StoreTimeout
from ringworld.store.base import Store
from ringworld.store.memory import (
    check_amount,
    check_key,
    check_timeout,
    check_value,
    timeout_message,
)
from ringworld.store.tcp_server import (
    _I64_MAX,
    _I64_MIN,
    _IOV_BATCH,
    HANDSHAKE_TIMEOUT,
    MAX_PENDING_HANDSHAKES,
    STAT_NAMES,
    TCPStoreServer,
)
from ringworld.store.wire import (
    MAX_KEY_BYTES,
    MAX_KEYS_BYTES,
    MAX_VALUE_BYTES,
    MAX_WAIT_KEYS,
    OP_ADD,
    OP_GET,
    OP_NAMES,
    OP_SET,
    OP_WAIT,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    STATUS_OK,
    STATUS_TIMEOUT,
    VERSION,
    parse_response_header,
)

__all__ = [
    "HANDSHAKE_TIMEOUT", "MAX_KEYS_BYTES", "MAX_KEY_BYTES", "MAX_PENDING_HANDSHAKES",
    "MAX_VALUE_BYTES", "MAX_WAIT_KEYS", "STAT_NAMES", "VERSION", "TCPStore", "TCPStoreServer",
]

# --------------------------------------------------------------------- client


def _send_all(sock: socket.socket, views: list[memoryview]) -> None:
    """Send every byte of ``views`` with gathered ``sendmsg`` calls (no joining)."""
    pending = deque(v for v in views if len(v))
    while pending:
        consume_sent(pending, sock.sendmsg(list(itertools.islice(pending, _IOV_BATCH))))


_SERVER_CLOSED = "the store server closed the connection"


class TCPStore(Store):
    """A client of :class:`TCPStoreServer`; thread-safe (one request on the wire at a time).

    ``timeout`` bounds connecting (retried until then, since the server may start later), the
    handshake, and ``set``/``add`` round trips; ``get``/``wait`` wait as long as their own
    ``timeout`` (``None``: forever) and the server answers when it runs out. Cost: one round trip
    per call.
    """

    def __init__(
        self, host: str, port: int, secret: bytes, timeout: float | None = 30.0,
    ) -> None:
        """Connect and authenticate.

        Raises:
            AuthenticationError: the server does not know ``secret`` (or rejected ours).
            StoreError: the server could not be reached within ``timeout`` seconds (chained from
                the last ``OSError``).
        """
        self.host = host
        self.port = port
        self.timeout = check_timeout(timeout)
        self._lock = threading.Lock()
        self._closed = False
        self._broken: str | None = None
        self._sock = self._connect(bytes(secret))

    def _connect(self, secret: bytes) -> socket.socket:
        """Connect and authenticate, retrying refused or shed connections until the deadline."""
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        delay = 0.01
        where = f"{self.host}:{self.port}"
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            sock: socket.socket | None = None
            try:
                sock = socket.create_connection((self.host, self.port), timeout=left)
                sock.settimeout(
                    None if deadline is None else max(deadline - time.monotonic(), 0.5))
                connect_handshake(sock, secret)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except AuthenticationError as exc:
                if sock is not None:
                    sock.close()
                raise AuthenticationError(f"store at {where}: {exc}") from exc
            except OSError as exc:
                # refused (not listening yet), shed before its challenge, or timed out
                if sock is not None:
                    sock.close()
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"cannot reach and authenticate with the store at {where} within "
                        f"{self.timeout:g} s: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    def _request(
        self, op: int, keys: Sequence[str], value: bytes, timeout: float | None, amount: int,
    ) -> tuple[bytes, int]:
        """Run one request; return ``(value, amount)`` of an OK reply."""
        encoded = [check_key(k).encode("utf-8") for k in keys]
        for raw in encoded:
            if len(raw) > MAX_KEY_BYTES:
                raise ValueError(
                    f"store key {raw[:40]!r}... is {len(raw)} bytes; the limit is {MAX_KEY_BYTES}")
        if len(encoded) > MAX_WAIT_KEYS or sum(map(len, encoded)) > MAX_KEYS_BYTES:
            raise ValueError(f"too many store keys in one wait ({len(encoded)})")
        if len(value) > MAX_VALUE_BYTES:
            raise ValueError(
                f"store value is {len(value)} bytes; the limit is {MAX_VALUE_BYTES}")
        if not _I64_MIN <= amount <= _I64_MAX:
            raise ValueError(f"add amount {amount} does not fit 64 bits")
        head = b"".join([
            REQUEST.pack(REQUEST_MAGIC, VERSION, op, len(encoded), len(value),
                         -1.0 if timeout is None else timeout, amount),
            struct.pack(f"<{len(encoded)}I", *map(len, encoded)),
            *encoded,
        ])
        if op in (OP_GET, OP_WAIT):
            io_timeout = None if timeout is None or self.timeout is None else (
                timeout + self.timeout)
            if io_timeout is not None and io_timeout > threading.TIMEOUT_MAX:
                io_timeout = None  # past what a socket can wait (centuries): wait for the reply
        else:
            io_timeout = self.timeout
        with self._lock:
            if self._closed:
                raise StoreError(f"the store client for {self.host}:{self.port} is closed")
            if self._broken is not None:
                raise StoreError(
                    f"the connection to the store at {self.host}:{self.port} broke earlier: "
                    f"{self._broken}")
            sock = self._sock
            try:
                sock.settimeout(io_timeout)
                _send_all(sock, [memoryview(head), memoryview(value)])
                status, data, total = self._read_reply(sock)
            except TimeoutError as exc:
                self._broken = f"no reply to {OP_NAMES[op]} within {io_timeout} s"
                raise StoreError(
                    f"the store at {self.host}:{self.port} did not answer {OP_NAMES[op]} "
                    f"within {io_timeout} s") from exc
            except OSError as exc:
                self._broken = str(exc)
                if self._closed:
                    raise StoreError(
                        f"the store client for {self.host}:{self.port} is closed") from exc
                raise StoreError(
                    f"store request {OP_NAMES[op]} to {self.host}:{self.port} failed: {exc}"
                ) from exc
            except BaseException:
                self._broken = "a request was interrupted"
                raise
        if status == STATUS_OK:
            return data, total
        if status == STATUS_TIMEOUT:
            missing = data.decode("utf-8", "replace").split("\n")
            assert timeout is not None
            raise StoreTimeout(timeout_message(missing, timeout))
        raise StoreError(
            f"store at {self.host}:{self.port}: {data.decode('utf-8', 'replace')}")

    def _read_reply(self, sock: socket.socket) -> tuple[int, bytes, int]:
        status, value_len, total = parse_response_header(
            recv_exact(sock, RESPONSE.size, _SERVER_CLOSED))
        return status, recv_exact(sock, value_len, _SERVER_CLOSED), total

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (at most :data:`MAX_VALUE_BYTES`). One round trip.

        Raises:
            StoreError: the connection failed or the client is closed.
            ValueError: ``key`` or ``value`` exceeds the wire bounds.
        """
        self._request(OP_SET, [key], check_value(value), None, 0)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``; the server parks the request until it is set.

        Raises:
            StoreTimeout: ``key`` was not set within ``timeout`` seconds.
            StoreError: the connection failed or the client is closed.
        """
        data, _ = self._request(OP_GET, [key], b"", check_timeout(timeout), 0)
        return data

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key``; return the new value.

        Raises:
            StoreError: the connection failed, or ``key`` holds a non-integer value.
        """
        _, total = self._request(OP_ADD, [key], b"", None, check_amount(amount))
        return total

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set (one round trip, server-side waiting).

        Raises:
            StoreTimeout: some key was not set within ``timeout`` seconds (names the missing).
            StoreError: the connection failed or the client is closed.
        """
        keys = list(keys)
        checked = check_timeout(timeout)
        if keys:
            self._request(OP_WAIT, keys, b"", checked, 0)

    def close(self) -> None:
        """Close the connection; a request blocked in another thread raises StoreError. Idempotent.
        """
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._sock.close()

    def __enter__(self) -> TCPStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
