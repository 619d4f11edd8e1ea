"""The TCP transport under attack and corruption: frame-header fuzzing, hello fuzzing, per-frame
checksums against injected bit flips (in a relay and through a live proxy), and the bootstrap
listener against strangers (wrong secret, replays, idle and flooding connections)."""

from __future__ import annotations

import contextlib
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringworld import auth
from ringworld.errors import AuthenticationError, BootstrapError, PeerFailure
from ringworld.store import MemoryStore
from ringworld.transport import tcp, tcp_bootstrap
from ringworld.transport.base import Incoming
from ringworld.transport.tcp import HEADER, MAGIC, VERSION, TcpTransport

SECRET = b"security-suite-secret-0123456789"
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

u32 = st.integers(0, (1 << 32) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
BIG = 1 << 20  # messages claiming more are not received by the fuzz harness


class Huge(Exception):
    """A well-formed header announced a message larger than the harness receives."""


class Sink:
    """A deliver callback that receives every message into its own buffer."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int, int, bytes]] = []

    def __call__(self, inc: Incoming) -> None:
        if inc.nbytes > BIG:
            raise Huge(inc.nbytes)
        buf = bytearray(inc.nbytes)
        env = (inc.context, inc.tag, inc.flags)
        inc.read_into(memoryview(buf), lambda: self.done.append((*env, bytes(buf))))


def frame(payload: bytes, context: int = 1, tag: int = 2, flags: int = 0,
          checksum: bool = False, magic: int = MAGIC, version: int = VERSION,
          nbytes: int | None = None) -> bytes:
    """One frame exactly as the transport writes it (``nbytes`` may lie)."""
    n = len(payload) if nbytes is None else nbytes
    header = HEADER.pack(magic, version, flags, context, tag, n)
    if checksum:
        head, trail = tcp.checked_header(header, [memoryview(payload)], n)
    else:
        lead, trail = tcp.frame_padding(n)
        head = header + bytes(lead)
    return head + payload + bytes(trail)


def drain(t: TcpTransport, sink: Sink, limit: float = 5.0) -> BaseException | None:
    """Poll until the peer fails (returned) or ``limit`` passes (None)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if not t.poll(sink):
                t.wait_event(0.005)
        except (PeerFailure, Huge) as exc:
            return exc
    return None


def feed(data: bytes, checksum: bool) -> tuple[BaseException | None, Sink]:
    """Hand ``data`` then EOF to a transport as rank 1's stream; return what it made of it."""
    mine, theirs = socket.socketpair()
    t = TcpTransport(0, {1: mine}, checksum=checksum)
    sink = Sink()
    try:
        def write() -> None:
            # the transport may close its end on a bad frame before reading everything
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                theirs.sendall(data)
                theirs.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=write)
        writer.start()
        err = drain(t, sink)
        writer.join(5)
        return err, sink
    finally:
        t.close()
        theirs.close()


ALLOWED = ("protocol error", "connection closed", "data corrupted in transit", "reset")


@st.composite
def streams(draw: st.DrawFn, checksum: bool) -> bytes:
    """Well-formed frames, lying headers, garbage, concatenated and cut anywhere."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["ok", "ok", "lie", "garbage"]))
        if kind == "garbage":
            parts.append(draw(st.binary(max_size=120)))
            continue
        payload = draw(st.binary(max_size=300) | st.sampled_from([b"p" * 5000, b"q" * 70_000]))
        nbytes = None
        magic, version = MAGIC, VERSION
        if kind == "lie":
            nbytes = draw(st.one_of(st.integers(0, 6000), st.integers(BIG, (1 << 64) - 1)))
            magic = draw(st.sampled_from([MAGIC, MAGIC ^ 1, 0]))
            version = draw(st.sampled_from([VERSION, VERSION + 1, 0]))
        parts.append(frame(payload, draw(u32), draw(i64), draw(u32), checksum, magic, version,
                           nbytes))
    data = b"".join(parts)
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@FUZZ
@given(data=streams(checksum=False))
def test_frame_decoder_fuzz(data: bytes) -> None:
    check_outcome(data, checksum=False)


@FUZZ
@given(data=streams(checksum=True))
def test_checked_frame_decoder_fuzz(data: bytes) -> None:
    check_outcome(data, checksum=True)


def check_outcome(data: bytes, checksum: bool) -> None:
    err = feed(data, checksum)[0]
    assert err is not None, "the transport neither failed the peer nor saw the EOF"
    if isinstance(err, PeerFailure):
        assert err.rank == 1
        assert any(s in err.detail for s in ALLOWED), err.detail
    else:  # a well-formed (and, with checksums, verified) header announcing a big message
        assert isinstance(err, Huge)
        assert BIG < err.args[0] <= tcp.MAX_MESSAGE_BYTES


def test_well_formed_frames_are_delivered_intact() -> None:
    payloads = [b"", b"x", bytes(range(256)) * 20, b"y" * 70_000]
    for checksum in (False, True):
        data = b"".join(frame(p, 7, -3, 9, checksum) for p in payloads)
        err, sink = feed(data, checksum)
        assert isinstance(err, PeerFailure) and "closed by the peer" in err.detail
        assert sink.done == [(7, -3, 9, p) for p in payloads]


@pytest.mark.parametrize("bad, why", [
    (frame(b"abc", magic=0x1234), "bad frame header"),
    (frame(b"abc", version=VERSION + 1), "bad frame header"),
    (HEADER.pack(MAGIC, VERSION, 0, 0, 0, tcp.MAX_MESSAGE_BYTES + 1), "exceeds the bound"),
    (frame(b"abc")[:10], "in the middle of a message"),
    (frame(b"z" * 5000)[:3000], "in the middle of a message"),
])
def test_malformed_or_truncated_frames_name_the_peer(bad: bytes, why: str) -> None:
    err, _ = feed(bad, checksum=False)
    assert isinstance(err, PeerFailure) and err.rank == 1
    assert why in str(err) and "peer rank 1" in str(err)


# --------------------------------------------------------------------- hello


@FUZZ
@given(raw=st.one_of(
    st.binary(max_size=24),
    st.builds(tcp.HELLO.pack, st.sampled_from([tcp.HELLO_MAGIC, 0]),
              st.sampled_from([VERSION, 1]), u32, st.sampled_from([4, 5, 1 << 31]),
              st.sampled_from([0, 1, 2]))))
def test_hello_decoder_fuzz(raw: bytes) -> None:
    mine = tcp_bootstrap._Hello(2, 4, 0)
    try:
        rank = mine.check(raw)
    except ConnectionError:
        return
    assert 0 <= rank < 4 and rank != 2


# --------------------------------------------------------------------- checksums vs bit flips


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """sendall, except that the receiver may close its end first (it stops at a bad frame)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def relay(checksum: bool, payloads: list[bytes], flip: int | None) -> tuple[
        BaseException | None, Sink, int]:
    """Send ``payloads`` 0 -> 1, flipping stream bit ``flip`` on the way; return the outcome
    at the receiver and the stream length in bytes."""
    s_a, raw_a = socket.socketpair()
    s_b, raw_b = socket.socketpair()
    sender = TcpTransport(0, {1: s_a}, checksum=checksum)
    receiver = TcpTransport(1, {0: s_b}, checksum=checksum)
    try:
        handles = [sender.isend(1, 1, i, 0, [memoryview(p)], len(p))
                   for i, p in enumerate(payloads)]
        stream = bytearray()
        raw_a.settimeout(5)
        while not all(h.done for h in handles):
            sender.poll(Sink())
            raw_a.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                stream += raw_a.recv(1 << 20)
        raw_a.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while chunk := raw_a.recv(1 << 20):
                stream += chunk
        if flip is not None:
            stream[flip // 8] ^= 1 << (flip % 8)
        writer = threading.Thread(target=_send_quietly, args=(raw_b, bytes(stream)))
        writer.start()
        sink = Sink()
        deadline = time.monotonic() + 5
        err: BaseException | None = None
        while len(sink.done) < len(payloads) and time.monotonic() < deadline:
            try:
                if not receiver.poll(sink):
                    receiver.wait_event(0.005)
            except (PeerFailure, Huge) as exc:
                err = exc
                break
        writer.join(5)
        return err, sink, len(stream)
    finally:
        sender.close()
        receiver.close()
        raw_a.close()
        raw_b.close()


PAYLOADS = [b"", b"hello", bytes(range(256)) * 40, bytes(reversed(range(256))) * 300]
STREAM_BYTES = relay(True, PAYLOADS, None)[2]


@settings(max_examples=250, deadline=None, database=None)
@given(flip=st.integers(0, STREAM_BYTES * 8 - 1))
def test_checksums_catch_any_bit_flip(flip: int) -> None:
    err, sink, _ = relay(True, PAYLOADS, flip)
    if err is None:  # the flip hit padding: then every message must be intact
        assert [d for *_, d in sink.done] == PAYLOADS
        return
    assert isinstance(err, PeerFailure), err
    assert err.rank == 0 and "data corrupted in transit" in err.detail
    assert all(d == PAYLOADS[i] for i, (*_, d) in enumerate(sink.done))


def test_without_checksums_a_payload_flip_goes_unnoticed() -> None:
    """The control: the flip is real, and only the checksum notices it."""
    _, _, n = relay(False, PAYLOADS, None)
    err, sink, _ = relay(False, PAYLOADS, (n - 200) * 8 + 3)
    assert err is None
    assert [d for *_, d in sink.done][:3] == PAYLOADS[:3]
    assert sink.done[3][3] != PAYLOADS[3]
    err, _, _ = relay(True, PAYLOADS, (n - 200) * 8 + 3)
    assert isinstance(err, PeerFailure) and "payload checksum mismatch" in err.detail


# --------------------------------------------------------------------- live bootstrap


def create_world(size: int, store: MemoryStore, checksum: list[bool] | None = None,
                 timeout: float = 10.0, secrets: list[bytes] | None = None,
                 start: Callable[[int], None] | None = None) -> list[TcpTransport | BaseException]:
    out: list[TcpTransport | BaseException] = [RuntimeError("hung")] * size

    def body(rank: int) -> None:
        if start is not None:
            start(rank)
        try:
            out[rank] = TcpTransport.create(
                rank, size, store, SECRET if secrets is None else secrets[rank],
                timeout=timeout, checksum=False if checksum is None else checksum[rank])
        except BaseException as exc:
            out[rank] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 15)
    return out


@contextlib.contextmanager
def closing_all(items: list[TcpTransport | BaseException]) -> Iterator[list[TcpTransport]]:
    try:
        for item in items:
            if isinstance(item, BaseException):
                raise item
        yield [t for t in items if isinstance(t, TcpTransport)]
    finally:
        for item in items:
            if isinstance(item, TcpTransport):
                item.close()


def address(store: MemoryStore, rank: int) -> tuple[str, int]:
    host, _, port = store.get(f"tcp/addr/{rank}", 10).decode().rpartition(":")
    return host, int(port)


def exchange(a: TcpTransport, b: TcpTransport, payload: bytes) -> bytes:
    a.isend(b.rank, 0, 0, 0, [memoryview(payload)], len(payload))
    sink = Sink()
    deadline = time.monotonic() + 10
    while not sink.done:
        assert time.monotonic() < deadline
        a.poll(Sink())
        if not b.poll(sink):
            b.wait_event(0.005)
    return sink.done[0][3]


class FlipProxy:
    """Forwards one TCP connection, flipping one bit at ``offset`` of the client's stream."""

    def __init__(self, upstream: tuple[str, int], offset: int | None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.upstream = upstream
        self.offset = offset
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, flip: int | None) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if flip is not None and seen <= flip < seen + len(data):
                    buf = bytearray(data)
                    buf[flip - seen] ^= 0x10
                    data = bytes(buf)
                seen += len(data)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _run(self) -> None:
        with self.listener:
            client, _ = self.listener.accept()
        with client, socket.create_connection(self.upstream) as server:
            back = threading.Thread(target=self._pump, args=(server, client, None), daemon=True)
            back.start()
            self._pump(client, server, self.offset)
            back.join(30)


@pytest.mark.parametrize("checksum", [True, False])
def test_a_bit_flipped_by_a_proxy_is_caught_with_checksums(checksum: bool) -> None:
    store = MemoryStore()
    # rank 1 reaches rank 0 through the proxy: the store entry is swapped before rank 1 looks
    flip_at = auth.REPLY_BYTES + tcp.HELLO.size + 64 + 1000

    def start(rank: int) -> None:
        if rank == 1:
            proxy = FlipProxy(address(store, 0), flip_at)
            store.set("tcp/addr/0", f"127.0.0.1:{proxy.address[1]}".encode())

    made = create_world(2, store, [checksum] * 2, start=start)
    with closing_all(made) as (t0, t1):
        payload = bytes(range(256)) * 4096
        if checksum:
            with pytest.raises(PeerFailure, match="data corrupted in transit") as info:
                exchange(t1, t0, payload)
            assert info.value.rank == 1
        else:
            got = exchange(t1, t0, payload)
            assert got != payload and len(got) == len(payload)


def test_checksum_settings_must_agree_and_both_sides_say_why() -> None:
    made = create_world(2, MemoryStore(), [True, False], timeout=2.0)
    try:
        assert isinstance(made[0], BootstrapError) and "checksums off, rank 0 on" in str(made[0])
        assert isinstance(made[1], BootstrapError) and "RINGWORLD_TCP_CHECKSUM" in str(made[1])
    finally:
        for item in made:
            if isinstance(item, TcpTransport):
                item.close()


EXPLODED = threading.Event()


def explode() -> None:
    EXPLODED.set()


class Bomb:
    """Unpickling this records that an object from an unauthenticated peer was deserialized."""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return (explode, ())


def assert_hung_up(sock: socket.socket, challenge: int) -> None:
    """The listener sent its ``challenge`` bytes (still unread), at most a rejection, never a
    proof, then hung up."""
    sock.settimeout(5)
    got = bytearray()
    try:
        while chunk := sock.recv(1 << 10):
            got += chunk
    except ConnectionResetError:
        pass
    assert bytes(got[challenge:]) in (b"", auth.REJECT), got


@pytest.mark.parametrize("attack", ["wrong-secret", "replay", "no-handshake"])
def test_strangers_at_the_bootstrap_listener_are_refused(attack: str) -> None:
    store = MemoryStore()
    hello = tcp.HELLO.pack(tcp.HELLO_MAGIC, VERSION, 1, 2, 0)
    evil = frame(pickle.dumps(Bomb(), protocol=5))
    recorded: list[bytes] = []

    def start(rank: int) -> None:
        if rank != 1:
            return
        host, port = address(store, 0)
        with socket.create_connection((host, port), timeout=5) as sock:
            if attack == "no-handshake":
                sock.sendall(hello + evil)
            else:
                challenge = sock.recv(auth.HELLO_BYTES)
                key = SECRET if attack == "replay" else b"wrong-secret-wrong-secret-wrong!"
                reply, _ = auth.answer_challenge(key, challenge)
                if attack == "replay":  # record a valid answer to one challenge ...
                    recorded.append(reply)
                    sock.close()
                    with socket.create_connection((host, port), timeout=5) as again:
                        again.recv(auth.HELLO_BYTES)
                        again.sendall(recorded[0] + hello + evil)  # ... replay it to another
                        assert_hung_up(again, 0)
                    return
                sock.sendall(reply + hello + evil)
            assert_hung_up(sock, 0 if attack == "wrong-secret" else auth.HELLO_BYTES)

    made = create_world(2, store, start=start)
    with closing_all(made) as (t0, t1):
        assert exchange(t1, t0, b"real") == b"real"
        sink = Sink()
        t0.poll(sink)
        assert sink.done == []
    assert not EXPLODED.is_set()


def test_idle_and_flooding_strangers_cannot_stall_the_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp_bootstrap, "MAX_PENDING_HANDSHAKES", 16)
    store = MemoryStore()
    held: list[socket.socket] = []

    def start(rank: int) -> None:
        if rank == 1:
            where = address(store, 0)
            held.extend(socket.create_connection(where, timeout=5) for _ in range(150))

    try:
        begin = time.monotonic()
        made = create_world(2, store, start=start, timeout=20)
        with closing_all(made) as (t0, t1):
            assert time.monotonic() - begin < 5
            assert exchange(t0, t1, b"through") == b"through"
    finally:
        for sock in held:
            sock.close()


def test_an_idle_stranger_is_dropped_after_the_handshake_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp_bootstrap, "HANDSHAKE_TIMEOUT", 0.5)
    store = MemoryStore()
    box: list[TcpTransport | BaseException] = []

    def only_rank0() -> None:
        try:
            box.append(TcpTransport.create(0, 2, store, SECRET, timeout=2.0))
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=only_rank0, daemon=True)
    t.start()
    with socket.create_connection(address(store, 0), timeout=5) as idle:
        start = time.monotonic()
        idle.settimeout(5)
        assert idle.recv(auth.HELLO_BYTES)[:8] == auth.MAGIC
        assert idle.recv(1) == b""
        assert 0.3 < time.monotonic() - start < 2.5
    t.join(10)
    assert isinstance(box[0], BootstrapError) and "no handshake within" in str(box[0])


# --------------------------------------------------------------------- where ranks listen


def test_ranks_listen_on_loopback_by_default() -> None:
    store = MemoryStore()
    with closing_all(create_world(2, store)):
        assert address(store, 0)[0] == "127.0.0.1"


@pytest.mark.parametrize("bind", ["0.0.0.0", "10.9.8.7"])
def test_a_non_loopback_listener_needs_the_job_secret(bind: str) -> None:
    with pytest.raises(ValueError, match="job secret"):
        TcpTransport.create(0, 2, MemoryStore(), b"short", bind=bind, timeout=1)


def test_wrong_secret_fails_both_ranks_clearly() -> None:
    made = create_world(2, MemoryStore(), secrets=[SECRET, b"another-secret-another-secret!!"],
                        timeout=2.0)
    assert isinstance(made[1], AuthenticationError) and "rank 1 -> rank 0" in str(made[1])
    assert isinstance(made[0], BootstrapError) and "wrong job secret" in str(made[0])
