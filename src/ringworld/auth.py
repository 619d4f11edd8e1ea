"""Mutual challenge-response authentication with the job secret, for every TCP connection.

Both sides prove knowledge of the secret with HMAC-SHA256 over fresh nonces before any other byte is
read, so an unauthenticated peer can make a process read at most the fixed-size handshake.

Wire (all fixed size)::

    acceptor  -> connector : MAGIC(8) nonce_a(16)
    connector -> acceptor  : MAGIC(8) nonce_c(16) hmac(secret, "C" + nonce_a + nonce_c)(32)
    acceptor  -> connector : hmac(secret, "A" + nonce_c + nonce_a)(32)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

from ringworld._sockutil import recv_exact
from ringworld.errors import AuthenticationError

MAGIC = b"RWAUTH01"
_NONCE = 16
_MAC = 32


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    try:
        return recv_exact(sock, n, "connection closed during authentication")
    except ConnectionResetError as exc:
        raise AuthenticationError(str(exc)) from exc


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def accept_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate a freshly accepted connection (the acceptor's side).

    Raises:
        AuthenticationError: the peer did not prove knowledge of ``secret``.
        OSError: the socket failed (including a socket timeout).
    """
    nonce_a = os.urandom(_NONCE)
    sock.sendall(MAGIC + nonce_a)
    reply = _recv_exact(sock, len(MAGIC) + _NONCE + _MAC)
    if reply[: len(MAGIC)] != MAGIC:
        raise AuthenticationError("peer is not a Ringworld process (bad handshake magic)")
    nonce_c = reply[len(MAGIC) : len(MAGIC) + _NONCE]
    if not hmac.compare_digest(reply[len(MAGIC) + _NONCE :], _mac(secret, b"C", nonce_a, nonce_c)):
        raise AuthenticationError("peer failed authentication: wrong job secret")
    sock.sendall(_mac(secret, b"A", nonce_c, nonce_a))


def connect_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate a freshly connected socket (the connector's side).

    Raises:
        AuthenticationError: the acceptor did not prove knowledge of ``secret``.
        OSError: the socket failed (including a socket timeout).
    """
    hello = _recv_exact(sock, len(MAGIC) + _NONCE)
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthenticationError("server is not a Ringworld process (bad handshake magic)")
    nonce_a = hello[len(MAGIC) :]
    nonce_c = os.urandom(_NONCE)
    sock.sendall(MAGIC + nonce_c + _mac(secret, b"C", nonce_a, nonce_c))
    proof = _recv_exact(sock, _MAC)
    if not hmac.compare_digest(proof, _mac(secret, b"A", nonce_c, nonce_a)):
        raise AuthenticationError("server failed authentication: wrong job secret")
