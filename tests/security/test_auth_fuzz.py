"""The authentication handshake: property and fuzz tests of every step, without sockets."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringworld import auth
from ringworld.errors import AuthenticationError

SECRET = b"security-suite-secret-0123456789"
FUZZ = settings(max_examples=400, deadline=None, database=None)

secrets_ = st.binary(min_size=1, max_size=64)


def test_sizes_are_the_documented_ones() -> None:
    assert (auth.HELLO_BYTES, auth.REPLY_BYTES, auth.PROOF_BYTES) == (24, 56, 32)


@FUZZ
@given(secret=secrets_)
def test_a_full_exchange_authenticates_both_sides(secret: bytes) -> None:
    challenge = auth.Challenge(secret)
    reply, expected = auth.answer_challenge(secret, challenge.hello)
    auth.check_proof(challenge.verify(reply), expected)


@FUZZ
@given(mine=secrets_, theirs=secrets_)
def test_a_different_secret_fails_on_both_sides(mine: bytes, theirs: bytes) -> None:
    if hmac.new(mine, b"", hashlib.sha256).digest() == hmac.new(
            theirs, b"", hashlib.sha256).digest():
        return  # HMAC pads short keys: equal after padding means the same key
    challenge = auth.Challenge(mine)
    reply, expected = auth.answer_challenge(theirs, challenge.hello)
    with pytest.raises(AuthenticationError, match="wrong job secret"):
        challenge.verify(reply)
    # and an acceptor with the wrong secret cannot fake its proof to a connector
    fake = auth.Challenge(theirs)
    reply, expected = auth.answer_challenge(mine, fake.hello)
    forged = hmac.new(theirs, b"A" + reply[8:24] + fake.hello[8:], hashlib.sha256).digest()
    with pytest.raises(AuthenticationError):
        auth.check_proof(forged, expected)


@FUZZ
@given(reply=st.binary(max_size=80))
def test_any_reply_bytes_are_refused_cleanly(reply: bytes) -> None:
    with pytest.raises(AuthenticationError):
        auth.Challenge(SECRET).verify(reply)


@FUZZ
@given(body=st.binary(min_size=48, max_size=48))
def test_right_magic_random_body_is_refused(body: bytes) -> None:
    with pytest.raises(AuthenticationError, match="wrong job secret"):
        auth.Challenge(SECRET).verify(auth.MAGIC + body)


@FUZZ
@given(hello=st.one_of(st.binary(max_size=40),
                       st.binary(min_size=16, max_size=16).map(lambda n: auth.MAGIC + n)))
def test_any_hello_is_answered_or_refused_cleanly(hello: bytes) -> None:
    try:
        reply, expected = auth.answer_challenge(SECRET, hello)
    except AuthenticationError:
        assert len(hello) != auth.HELLO_BYTES or not hello.startswith(auth.MAGIC)
        return
    assert len(reply) == auth.REPLY_BYTES and len(expected) == auth.PROOF_BYTES


@FUZZ
@given(proof=st.binary(max_size=40))
def test_any_proof_but_the_right_one_is_refused(proof: bytes) -> None:
    challenge = auth.Challenge(SECRET)
    _, expected = auth.answer_challenge(SECRET, challenge.hello)
    if proof == expected:
        return
    with pytest.raises(AuthenticationError):
        auth.check_proof(proof, expected)


@FUZZ
@given(flip=st.integers(0, auth.REPLY_BYTES * 8 - 1))
def test_every_bit_of_the_reply_matters(flip: int) -> None:
    challenge = auth.Challenge(SECRET)
    reply, _ = auth.answer_challenge(SECRET, challenge.hello)
    bad = bytearray(reply)
    bad[flip // 8] ^= 1 << (flip % 8)
    with pytest.raises(AuthenticationError):
        challenge.verify(bytes(bad))


def test_a_recorded_reply_replayed_to_a_new_challenge_fails() -> None:
    recorded = auth.Challenge(SECRET)
    reply, _ = auth.answer_challenge(SECRET, recorded.hello)
    recorded.verify(reply)  # the original exchange is fine
    for _ in range(200):
        with pytest.raises(AuthenticationError, match="wrong job secret"):
            auth.Challenge(SECRET).verify(reply)


def test_a_recorded_proof_replayed_to_a_new_connector_fails() -> None:
    challenge = auth.Challenge(SECRET)
    reply, expected = auth.answer_challenge(SECRET, challenge.hello)
    proof = challenge.verify(reply)
    auth.check_proof(proof, expected)
    _, expected_again = auth.answer_challenge(SECRET, challenge.hello)  # same hello, new nonce
    with pytest.raises(AuthenticationError):
        auth.check_proof(proof, expected_again)


def test_a_connector_reply_cannot_be_reflected_as_an_acceptor_proof() -> None:
    challenge = auth.Challenge(SECRET)
    reply, expected = auth.answer_challenge(SECRET, challenge.hello)
    with pytest.raises(AuthenticationError):
        auth.check_proof(reply[auth.HELLO_BYTES :], expected)


def test_nonces_are_fresh() -> None:
    hellos = {auth.Challenge(SECRET).hello for _ in range(1000)}
    assert len(hellos) == 1000


# --------------------------------------------------------------------- non-blocking acceptor


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    b.settimeout(5)
    return a, b


def test_nonblocking_acceptor_reads_exactly_the_reply() -> None:
    server, client = _pair()
    with server, client:
        hs = auth.AcceptHandshake(server, SECRET, deadline=0.0)
        assert hs.advance() is False  # hello sent, nothing read yet
        done: list[BaseException | None] = []

        def connect() -> None:
            try:
                auth.connect_handshake(client, SECRET)
                client.sendall(b"NEXT-PROTOCOL")
                done.append(None)
            except BaseException as exc:
                done.append(exc)

        t = threading.Thread(target=connect)
        t.start()
        server.settimeout(5)
        for _ in range(1000):
            server.setblocking(False)
            if hs.advance():
                break
            threading.Event().wait(0.002)
        else:
            pytest.fail("handshake did not finish")
        t.join(5)
        assert done == [None]
        server.settimeout(5)
        assert server.recv(100) == b"NEXT-PROTOCOL"  # nothing after the reply was consumed


def test_nonblocking_acceptor_refuses_a_wrong_secret_after_reading_only_the_reply() -> None:
    server, client = _pair()
    with server, client:
        hs = auth.AcceptHandshake(server, SECRET, deadline=0.0)
        hs.advance()
        hello = client.recv(auth.HELLO_BYTES)
        reply, _ = auth.answer_challenge(b"wrong-secret", hello)
        client.sendall(reply + b"GET-SOMETHING" * 100)
        with pytest.raises(AuthenticationError):
            for _ in range(1000):
                hs.advance()
                threading.Event().wait(0.002)
        server.setblocking(True)
        server.settimeout(1)
        assert server.recv(13) == b"GET-SOMETHING"  # the rest was never read


def test_nonblocking_acceptor_reports_a_hangup() -> None:
    server, client = _pair()
    with server:
        hs = auth.AcceptHandshake(server, SECRET, deadline=0.0)
        hs.advance()
        client.sendall(b"x" * 10)
        client.close()
        with pytest.raises(ConnectionError):
            for _ in range(1000):
                hs.advance()
                threading.Event().wait(0.002)


# --------------------------------------------------------------------- where listeners bind


@pytest.mark.parametrize("host", ["", "localhost", "127.0.0.1", "127.3.4.5", "::1", "[::1]"])
def test_loopback_names(host: str) -> None:
    assert auth.is_loopback(host)
    assert auth.listen_host(host, b"x") in (auth.LOOPBACK, host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "example.org"])
def test_non_loopback_binds_need_the_job_secret(host: str) -> None:
    assert not auth.is_loopback(host)
    with pytest.raises(ValueError, match="job secret"):
        auth.listen_host(host, b"short")
    with pytest.raises(ValueError, match="job secret"):
        auth.listen_host(host, b"")
    assert auth.listen_host(host, SECRET) == host


def test_an_unnamed_host_binds_loopback() -> None:
    assert auth.listen_host("", SECRET) == "127.0.0.1"
    with pytest.raises(ValueError):
        auth.listen_host("127.0.0.1", b"")
