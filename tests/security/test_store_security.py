"""The TCP store under attack: decoder fuzzing, live malformed frames, bad secrets, replays,
idle and flooding unauthenticated clients. After each, a real client must still be served."""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringworld import auth
from ringworld.errors import AuthenticationError, StoreTimeout
from ringworld.launch.job import JobStore
from ringworld.store import TCPStore, TCPStoreServer, wire

SECRET = b"security-suite-secret-0123456789"
FUZZ = settings(max_examples=300, deadline=None, database=None)
LIVE = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

u16 = st.integers(0, (1 << 16) - 1)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)


def request_header(magic: int = wire.REQUEST_MAGIC, version: int = wire.VERSION, op: int = 1,
                   nkeys: int = 1, value_len: int = 0, timeout: float = -1.0,
                   amount: int = 0) -> bytes:
    return wire.REQUEST.pack(magic, version, op, nkeys, value_len, timeout, amount)


headers = st.builds(
    request_header,
    magic=st.one_of(st.just(wire.REQUEST_MAGIC), u32),
    version=st.one_of(st.just(wire.VERSION), u16),
    op=st.one_of(st.integers(0, 6), u16),
    nkeys=st.one_of(st.sampled_from([0, 1, 2, wire.MAX_WAIT_KEYS, wire.MAX_WAIT_KEYS + 1]), u32),
    value_len=st.one_of(
        st.sampled_from([0, 1, 64, wire.MAX_VALUE_BYTES, wire.MAX_VALUE_BYTES + 1]), u64),
    timeout=st.floats(allow_nan=True, allow_infinity=True),
    amount=i64,
)


# --------------------------------------------------------------------- pure decoders


@FUZZ
@given(raw=st.one_of(headers, st.binary(max_size=48)))
def test_request_header_decoder_returns_bounded_values_or_refuses(raw: bytes) -> None:
    try:
        head = wire.parse_request_header(raw)
    except wire.ProtocolError:
        return
    assert head.op in wire.OP_NAMES
    assert 1 <= head.nkeys <= (wire.MAX_WAIT_KEYS if head.op == wire.OP_WAIT else 1)
    assert head.value_len <= (wire.MAX_VALUE_BYTES if head.op == wire.OP_SET else 0)
    assert head.timeout == -1.0 or 0 <= head.timeout < math.inf


@FUZZ
@given(lens=st.lists(st.one_of(st.integers(0, 64), u32), min_size=0, max_size=40),
       junk=st.binary(max_size=3))
def test_key_length_decoder_returns_bounded_values_or_refuses(lens: list[int],
                                                              junk: bytes) -> None:
    raw = struct.pack(f"<{len(lens)}I", *lens) + junk
    try:
        got = wire.parse_key_lengths(raw)
    except wire.ProtocolError:
        assert junk or not lens or max(lens) > wire.MAX_KEY_BYTES or (
            sum(lens) > wire.MAX_KEYS_BYTES)
        return
    assert list(got) == lens
    assert max(got) <= wire.MAX_KEY_BYTES and sum(got) <= wire.MAX_KEYS_BYTES


@FUZZ
@given(raw=st.binary(max_size=64), lens=st.lists(st.integers(0, 70), max_size=6))
def test_key_decoder_returns_text_or_refuses(raw: bytes, lens: list[int]) -> None:
    try:
        keys = wire.decode_keys(raw, lens)
    except wire.ProtocolError:
        return
    assert [len(k.encode()) for k in keys] == lens


@FUZZ
@given(raw=st.one_of(
    st.binary(max_size=40),
    st.builds(wire.RESPONSE.pack, st.one_of(st.just(wire.RESPONSE_MAGIC), u32),
              st.one_of(st.just(wire.VERSION), u16), st.integers(0, 5), u64, i64)))
def test_response_header_decoder_returns_bounded_values_or_refuses(raw: bytes) -> None:
    try:
        status, value_len, _ = wire.parse_response_header(raw)
    except ConnectionError:
        return
    assert status in (wire.STATUS_OK, wire.STATUS_TIMEOUT, wire.STATUS_ERROR)
    assert value_len <= wire.MAX_VALUE_BYTES + wire.MAX_KEYS_BYTES


# --------------------------------------------------------------------- a live server


@pytest.fixture(scope="module")
def server() -> Iterator[TCPStoreServer]:
    with TCPStoreServer(SECRET) as srv:
        srv.start()
        yield srv


def assert_serves(srv: TCPStoreServer, key: str = "health") -> None:
    host, port = srv.address
    with TCPStore(host, port, SECRET, timeout=5) as client:
        client.set(key, b"ok")
        assert client.get(key, timeout=5) == b"ok"
        assert client.add("health-counter", 1) >= 1


def authenticated(srv: TCPStoreServer) -> socket.socket:
    sock = socket.create_connection(srv.address, timeout=5)
    auth.connect_handshake(sock, SECRET)
    return sock


def read_until_closed(sock: socket.socket, limit: float = 5.0) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the connection open."""
    sock.settimeout(limit)
    out = bytearray()
    try:
        while chunk := sock.recv(1 << 16):
            out += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {limit} s")
    return bytes(out)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Requests from well-formed to garbage, often cut short."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    head = draw(headers)
    nkeys = draw(st.integers(0, 4))
    lens = draw(st.lists(st.one_of(st.integers(0, 12), u32), min_size=nkeys, max_size=nkeys))
    body = struct.pack(f"<{nkeys}I", *lens) + draw(st.binary(max_size=80))
    frame = head + body
    cut = draw(st.one_of(st.none(), st.integers(0, len(frame))))
    return frame if cut is None else frame[:cut]


@LIVE
@given(frame=frames())
def test_live_server_survives_any_frame(server: TCPStoreServer, frame: bytes) -> None:
    with authenticated(server) as sock:
        with contextlib.suppress(OSError):  # the server may hang up before all is sent
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
        reply = read_until_closed(sock)
    # whatever came back is made of well-formed replies
    while reply:
        _, value_len, _ = wire.parse_response_header(reply[: wire.RESPONSE.size])
        reply = reply[wire.RESPONSE.size + value_len :]
    assert_serves(server)


def test_live_fuzzing_reached_the_request_parser(server: TCPStoreServer) -> None:
    before = server.stats()
    for frame in (b"\xff" * 40, request_header(op=99), request_header(nkeys=2),
                  request_header(op=wire.OP_GET, value_len=1), request_header(timeout=math.nan)):
        with authenticated(server) as sock:
            sock.sendall(frame + b"\0" * 8)
            assert read_until_closed(sock) == b""
    after = server.stats()
    assert after["protocol_errors"] - before["protocol_errors"] == 5
    assert_serves(server)


@pytest.mark.parametrize("frame", [
    request_header(value_len=wire.MAX_VALUE_BYTES + 1),
    request_header(value_len=(1 << 64) - 1),
    request_header(op=wire.OP_WAIT, nkeys=(1 << 32) - 1),
    request_header() + struct.pack("<I", wire.MAX_KEY_BYTES + 1),
    request_header(op=wire.OP_WAIT, nkeys=2) + struct.pack("<2I", 4000, 4000) + b"",
])
def test_oversized_lengths_close_only_that_connection(
    server: TCPStoreServer, frame: bytes,
) -> None:
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as bystander:
        bystander.set("bystander", b"here")
        with authenticated(server) as sock:
            sock.sendall(frame)
            if frame.endswith(struct.pack("<2I", 4000, 4000)):
                sock.shutdown(socket.SHUT_WR)  # within bounds: then truncated
            assert read_until_closed(sock) == b""
        assert bystander.get("bystander", timeout=5) == b"here"


def test_truncated_request_then_hangup_is_dropped(server: TCPStoreServer) -> None:
    frame = request_header(value_len=1000) + struct.pack("<I", 9) + b"truncated" + b"v" * 10
    with authenticated(server) as sock:
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        assert read_until_closed(sock) == b""
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as client, pytest.raises(StoreTimeout):
        client.get("truncated", timeout=0.01)
    assert_serves(server)


def test_protocol_errors_are_logged_clearly(
    server: TCPStoreServer, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="ringworld.store.tcp"):
        with authenticated(server) as sock:
            sock.sendall(request_header(op=77))
            read_until_closed(sock)
        deadline = time.monotonic() + 5
        while "unknown op 77" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "protocol error: unknown op 77" in caplog.text
    assert "dropped the connection from 127.0.0.1:" in caplog.text


# --------------------------------------------------------------------- unauthenticated clients


def set_frame(key: str, value: bytes) -> bytes:
    raw = key.encode()
    return request_header(value_len=len(value)) + struct.pack("<I", len(raw)) + raw + value


@pytest.mark.parametrize("secret", [b"wrong-secret-wrong-secret-wrong!", b"x", b""])
def test_wrong_or_missing_secret_parses_zero_frames(
    server: TCPStoreServer, secret: bytes,
) -> None:
    before = server.stats()
    with socket.create_connection(server.address, timeout=5) as sock:
        hello = sock.recv(auth.HELLO_BYTES)
        reply, _ = auth.answer_challenge(secret, hello)
        sock.sendall(reply + set_frame("intruder", b"pwned") * 3)
        assert read_until_closed(sock) in (b"", auth.REJECT)  # no proof, at most a rejection
    with socket.create_connection(server.address, timeout=5) as sock:  # no handshake at all
        sock.sendall(set_frame("intruder", b"pwned") * 3)
        assert read_until_closed(sock)[: len(auth.MAGIC)] == auth.MAGIC
    after = server.stats()
    assert after["auth_failed"] - before["auth_failed"] == 2
    assert after["requests"] == before["requests"]
    assert after["protocol_errors"] == before["protocol_errors"]
    host, port = server.address
    with TCPStore(host, port, SECRET, timeout=5) as client, pytest.raises(TimeoutError):
        client.get("intruder", timeout=0.05)


def test_the_store_client_names_the_store_on_a_wrong_secret(server: TCPStoreServer) -> None:
    host, port = server.address
    with pytest.raises(AuthenticationError, match=f"{host}:{port}"):
        TCPStore(host, port, b"not-the-secret-not-the-secret!!", timeout=5)


def test_a_recorded_session_replayed_is_refused(server: TCPStoreServer) -> None:
    host, port = server.address
    with socket.create_connection(server.address, timeout=5) as sock:  # the recorded session
        hello = sock.recv(auth.HELLO_BYTES)
        reply, expected = auth.answer_challenge(SECRET, hello)
        recorded = reply + set_frame("replayed", b"original")
        sock.sendall(recorded)
        auth.check_proof(sock.recv(auth.PROOF_BYTES), expected)
        status, _, _ = wire.parse_response_header(sock.recv(wire.RESPONSE.size))
        assert status == wire.STATUS_OK
    with TCPStore(host, port, SECRET, timeout=5) as client:
        client.set("replayed", b"changed since")
        before = server.stats()
        for _ in range(3):
            with socket.create_connection(server.address, timeout=5) as sock:
                sock.recv(auth.HELLO_BYTES)
                sock.sendall(recorded)
                assert read_until_closed(sock) in (b"", auth.REJECT)
        after = server.stats()
        assert after["auth_failed"] - before["auth_failed"] == 3
        assert after["requests"] == before["requests"]
        assert client.get("replayed", timeout=5) == b"changed since"


def test_idle_and_dripping_strangers_are_dropped_after_the_handshake_timeout() -> None:
    with TCPStoreServer(SECRET, handshake_timeout=0.5) as srv:
        srv.start()
        idle = socket.create_connection(srv.address, timeout=5)
        drip = socket.create_connection(srv.address, timeout=5)
        start = time.monotonic()
        with idle, drip:
            drip.recv(auth.HELLO_BYTES)
            for _ in range(8):  # progress does not extend the deadline
                try:
                    drip.send(auth.MAGIC[:1])
                except OSError:
                    break
                time.sleep(0.1)
            read_until_closed(drip)
            read_until_closed(idle)
            elapsed = time.monotonic() - start
        assert 0.4 < elapsed < 3.0, elapsed
        assert srv.stats()["handshake_timeouts"] == 2
        assert_serves(srv)


def test_a_flood_of_idle_strangers_cannot_keep_a_real_client_out() -> None:
    with TCPStoreServer(SECRET, handshake_timeout=60, max_pending=16) as srv:
        srv.start()
        flood = [socket.create_connection(srv.address, timeout=5) for _ in range(200)]
        try:
            start = time.monotonic()
            assert_serves(srv)
            assert time.monotonic() - start < 3.0
            assert srv.stats()["handshakes_shed"] >= 200 - 16
        finally:
            for sock in flood:
                sock.close()


def test_a_continuous_flood_cannot_starve_real_clients() -> None:
    with TCPStoreServer(SECRET, handshake_timeout=60) as srv:  # default max_pending
        srv.start()
        stop = threading.Event()
        opened = [0]

        def flood() -> None:
            held: list[socket.socket] = []
            while not stop.is_set():
                try:
                    held.append(socket.create_connection(srv.address, timeout=5))
                except OSError:
                    time.sleep(0.01)
                    continue
                opened[0] += 1
                if len(held) > 400:
                    held.pop(0).close()
            for sock in held:
                sock.close()

        attackers = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
        for t in attackers:
            t.start()
        try:
            time.sleep(0.3)
            start = time.monotonic()
            for i in range(10):
                assert_serves(srv, key=f"real-{i}")
            elapsed = time.monotonic() - start
        finally:
            stop.set()
            for t in attackers:
                t.join(10)
        assert opened[0] > srv.stats()["authenticated"]  # the flood really ran
        assert srv.stats()["handshakes_shed"] > 0
        assert elapsed < 20, elapsed


# --------------------------------------------------------------------- where the store listens


def test_the_store_listens_on_loopback_unless_told_otherwise() -> None:
    for srv in (TCPStoreServer(SECRET), TCPStoreServer(SECRET, host="")):
        with srv:
            assert srv.start()[0] == "127.0.0.1"
    with JobStore(SECRET) as job:
        assert job.address.startswith("127.0.0.1:")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1"])
def test_a_non_loopback_store_needs_the_job_secret(host: str) -> None:
    with pytest.raises(ValueError, match="job secret"):
        TCPStoreServer(b"tiny", host=host)
    with pytest.raises(ValueError, match="job secret"):
        JobStore(b"tiny", host)
    with pytest.raises(ValueError):
        TCPStoreServer(b"", host="127.0.0.1")
