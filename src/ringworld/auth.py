"""Mutual challenge-response authentication with the job secret, for every TCP connection.

Both sides prove knowledge of the secret with HMAC-SHA256 over fresh nonces before any other byte is
read, so an unauthenticated peer can make a process read at most the fixed-size handshake.

Wire (all fixed size)::

    acceptor  -> connector : MAGIC(8) nonce_a(16)
    connector -> acceptor  : MAGIC(8) nonce_c(16) hmac(secret, "C" + nonce_a + nonce_c)(32)
    acceptor  -> connector : hmac(secret, "A" + nonce_c + nonce_a)(32)   or REJECT(32 zero bytes)

The acceptor answers a wrong reply that has the right magic with :data:`REJECT` before it hangs
up, so a connector can tell "wrong secret" (final) from "hung up" (a listener shedding load:
worth a retry); a reply without the magic gets silence.

Each side's MAC covers a nonce the *other* side just drew, so a recorded handshake replayed
against a new connection fails; the role labels ``C``/``A`` stop one side's proof from being
reflected back as the other's. The secret never crosses the wire. This authenticates the ends;
it does not encrypt or protect the stream against an on-path attacker (see docs/architecture.md).

The pieces come in three forms: sans-IO (:class:`Challenge`, :func:`answer_challenge`,
:func:`check_proof`; the fuzz tests drive these), blocking for the connector
(:func:`connect_handshake`) and non-blocking for the acceptor, a server that must never wait on
one client (:class:`AcceptHandshake`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket

from ringworld._sockutil import recv_exact
from ringworld.errors import AuthenticationError

MAGIC = b"RWAUTH01"
NONCE_BYTES = 16
MAC_BYTES = 32
#: acceptor -> connector, first message.
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
#: connector -> acceptor.
REPLY_BYTES = HELLO_BYTES + MAC_BYTES
#: acceptor -> connector, last message.
PROOF_BYTES = MAC_BYTES
#: the acceptor's answer to a wrong reply (an HMAC is never all zeros in practice).
REJECT = bytes(MAC_BYTES)
#: shortest secret accepted for a listener reachable from other hosts (job secrets have 32).
MIN_REMOTE_SECRET_BYTES = 16
LOOPBACK = "127.0.0.1"


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


# --------------------------------------------------------------------- where to listen


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine: ``""``, ``localhost`` or a loopback address."""
    if host in ("", "localhost", "127.0.0.1", "::1", "[::1]"):
        return True  # the common cases, without importing ipaddress (start-up time)
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def listen_host(host: str, secret: bytes) -> str:
    """The address a listener asked to bind ``host`` binds: loopback for ``""``, else ``host``.

    Raises:
        ValueError: ``secret`` is empty, or shorter than :data:`MIN_REMOTE_SECRET_BYTES` while
            ``host`` is not loopback (a listener other hosts can reach needs the job secret).
    Cost: no I/O (a host name is not resolved).
    """
    if not isinstance(secret, bytes | bytearray) or not secret:
        raise ValueError("a listener needs the job secret (non-empty bytes)")
    if not host:
        return LOOPBACK
    if not is_loopback(host) and len(secret) < MIN_REMOTE_SECRET_BYTES:
        raise ValueError(
            f"binding {host!r} (not loopback) needs the job secret: at least "
            f"{MIN_REMOTE_SECRET_BYTES} bytes, got {len(secret)}")
    return host


# --------------------------------------------------------------------- sans-IO pieces


class Challenge:
    """The acceptor's side of one handshake, without I/O: send :attr:`hello`, then
    :meth:`verify` the connector's reply and send the proof it returns."""

    __slots__ = ("_nonce", "_secret", "hello")

    def __init__(self, secret: bytes) -> None:
        self._secret = bytes(secret)
        self._nonce = os.urandom(NONCE_BYTES)
        self.hello = MAGIC + self._nonce

    def verify(self, reply: bytes) -> bytes:
        """Check the connector's :data:`REPLY_BYTES`-byte reply; return our proof to send.

        Raises:
            AuthenticationError: wrong length, magic or MAC (a wrong secret or a replay).
        Cost: two HMAC-SHA256 over 33 bytes.
        """
        if len(reply) != REPLY_BYTES:
            raise AuthenticationError(
                f"handshake reply has {len(reply)} bytes, expected {REPLY_BYTES}")
        if reply[: len(MAGIC)] != MAGIC:
            raise AuthenticationError("peer is not a Ringworld process (bad handshake magic)")
        nonce_c = bytes(reply[len(MAGIC) : HELLO_BYTES])
        if not hmac.compare_digest(bytes(reply[HELLO_BYTES:]),
                                   _mac(self._secret, b"C", self._nonce, nonce_c)):
            raise AuthenticationError("peer failed authentication: wrong job secret")
        return _mac(self._secret, b"A", nonce_c, self._nonce)


def answer_challenge(secret: bytes, hello: bytes) -> tuple[bytes, bytes]:
    """The connector's reply to the acceptor's ``hello``, and the proof to expect back.

    Raises:
        AuthenticationError: ``hello`` has the wrong length or magic.
    Cost: two HMAC-SHA256 over 33 bytes.
    """
    if len(hello) != HELLO_BYTES:
        raise AuthenticationError(f"handshake hello has {len(hello)} bytes, expected {HELLO_BYTES}")
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthenticationError("server is not a Ringworld process (bad handshake magic)")
    nonce_a = bytes(hello[len(MAGIC) :])
    nonce_c = os.urandom(NONCE_BYTES)
    return (MAGIC + nonce_c + _mac(secret, b"C", nonce_a, nonce_c),
            _mac(secret, b"A", nonce_c, nonce_a))


def check_proof(proof: bytes, expected: bytes) -> None:
    """Compare the acceptor's proof with the one :func:`answer_challenge` expects.

    Raises:
        AuthenticationError: they differ (the acceptor does not know the secret).
    """
    if not hmac.compare_digest(bytes(proof), expected):
        raise AuthenticationError("server failed authentication: wrong job secret")


# --------------------------------------------------------------------- blocking forms


def connect_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate a freshly connected blocking socket (the connector's side).

    Raises:
        ConnectionResetError: the listener hung up without a verdict (it sheds load that way;
            worth a retry).
        AuthenticationError: the listener rejected our secret, or did not prove knowledge of
            ``secret`` itself.
        OSError: the socket failed (including a socket timeout).
    """
    hello = recv_exact(sock, HELLO_BYTES, "the listener closed the connection before "
                                          "authentication (overloaded, or not Ringworld)")
    reply, expected = answer_challenge(secret, hello)
    sock.sendall(reply)
    proof = recv_exact(sock, PROOF_BYTES, "the listener closed the connection during "
                                          "authentication (overloaded?)")
    if proof == REJECT:
        raise AuthenticationError("the listener rejected our job secret")
    check_proof(proof, expected)


# --------------------------------------------------------------------- non-blocking acceptor


class AcceptHandshake:
    """The acceptor's side on a non-blocking socket: call :meth:`advance` whenever the socket is
    readable (or writable while :attr:`wants_write`) until it returns True.

    The socket is read exactly :data:`REPLY_BYTES` bytes, never more, so whatever the connector
    sends after the handshake stays in the socket for the protocol that follows.
    """

    __slots__ = ("_challenge", "_got", "_out", "_reply", "deadline", "sock")

    def __init__(self, sock: socket.socket, secret: bytes, deadline: float) -> None:
        """Start on ``sock`` (made non-blocking); ``deadline`` is a ``time.monotonic()`` value
        the owner enforces."""
        sock.setblocking(False)
        self.sock = sock
        self.deadline = deadline
        self._challenge = Challenge(secret)
        self._out = memoryview(self._challenge.hello)
        self._reply = bytearray(REPLY_BYTES)
        self._got = 0

    @property
    def wants_write(self) -> bool:
        """Whether bytes wait to be sent (watch the socket for writability)."""
        return len(self._out) > 0

    def advance(self) -> bool:
        """Make all progress possible without blocking; True once the proof has been sent.

        Raises:
            AuthenticationError: the peer's reply is wrong (the socket has read nothing else).
            ConnectionError: the peer hung up.
            OSError: the socket failed.
        Cost: at most one ``send`` and one ``recv`` per call, plus :meth:`Challenge.verify`.
        """
        if self._out and not self._send():
            return False
        if self._got < REPLY_BYTES:
            try:
                n = self.sock.recv_into(memoryview(self._reply)[self._got :])
            except (BlockingIOError, InterruptedError):
                return False
            if n == 0:
                raise ConnectionResetError("connection closed during authentication")
            self._got += n
            if self._got < REPLY_BYTES:
                return False
            try:
                self._out = memoryview(self._challenge.verify(bytes(self._reply)))
            except AuthenticationError:
                _send_reject(self.sock, self._reply)
                raise
            return self._send()
        return True

    def _send(self) -> bool:
        try:
            n = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return False
        self._out = self._out[n:]
        return not self._out


def _send_reject(sock: socket.socket, reply: bytes | bytearray) -> None:
    """Tell a Ringworld connector (right magic) that its reply was wrong; strangers get silence.
    Best effort: never blocks, ignores errors."""
    if reply[: len(MAGIC)] == MAGIC:
        with contextlib.suppress(OSError):
            sock.send(REJECT, socket.MSG_DONTWAIT)
