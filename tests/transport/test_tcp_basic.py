"""TcpTransport between endpoints created in threads of this process (MemoryStore rendezvous)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from ringworld.errors import (
    AuthenticationError,
    BootstrapError,
    PeerFailure,
    TransportError,
)
from ringworld.store import MemoryStore
from ringworld.transport.base import DONE, Incoming, SendHandle
from ringworld.transport.tcp import HEADER, MAGIC, VERSION, TcpTransport

SECRET = b"tcp-transport-test-secret"


def create_world(
    size: int, secrets: Sequence[bytes] | None = None, timeout: float = 10.0,
) -> list[TcpTransport | BaseException]:
    """Bootstrap ``size`` endpoints in threads; each slot holds a transport or the error."""
    store = MemoryStore()
    out: list[TcpTransport | BaseException] = [RuntimeError("thread hung")] * size

    def body(rank: int) -> None:
        secret = SECRET if secrets is None else secrets[rank]
        try:
            out[rank] = TcpTransport.create(rank, size, store, secret, timeout=timeout)
        except BaseException as exc:
            out[rank] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return out


@pytest.fixture
def world() -> Iterator[Callable[[int], list[TcpTransport]]]:
    made: list[TcpTransport] = []

    def make(size: int) -> list[TcpTransport]:
        result = create_world(size)
        made.extend(t for t in result if isinstance(t, TcpTransport))
        for item in result:
            if isinstance(item, BaseException):
                raise item
        return made[-size:]

    try:
        yield make
    finally:
        for t in made:
            t.close()


@dataclass
class Inbox:
    """Collects messages: read straight into fresh buffers, or detached for later."""

    detach: bool = False
    done: list[tuple[int, int, int, int, bytes]] = field(default_factory=list)
    kept: list[Incoming] = field(default_factory=list)

    def deliver(self, inc: Incoming) -> None:
        if self.detach:
            self.kept.append(inc.detach())
            return
        buf = bytearray(inc.nbytes)
        env = (inc.source, inc.context, inc.tag, inc.flags)
        inc.read_into(memoryview(buf), lambda: self.done.append((*env, bytes(buf))))


def pump(
    pairs: Sequence[tuple[TcpTransport, Inbox]], until: Callable[[], bool], timeout: float = 20.0,
) -> None:
    """Poll every endpoint until ``until()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            pytest.fail("pump timed out")
        moved = False
        for t, inbox in pairs:
            moved = t.poll(inbox.deliver) or moved
        if not moved:
            pairs[0][0].wait_event(0.002)


def byte_view(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")


def payload(seed: int, n: int) -> bytes:
    """Bytes unique to ``seed`` and position."""
    return (np.arange(n, dtype=np.uint32) * 2654435761 + seed).astype(np.uint8).tobytes()


# ------------------------------------------------------------------------- bootstrap


def test_bootstrap_connects_every_pair(world: Callable[[int], list[TcpTransport]]) -> None:
    ts = world(3)
    assert [t.rank for t in ts] == [0, 1, 2]
    assert [t.peers for t in ts] == [(1, 2), (0, 2), (0, 1)]
    assert all(t.name == "tcp" for t in ts)
    # every pair can talk, in both directions
    inboxes = [Inbox() for _ in ts]
    for t in ts:
        for p in t.peers:
            t.isend(p, 1, 10 * t.rank + p, 0, [memoryview(f"{t.rank}->{p}".encode())], 4)
    pump(list(zip(ts, inboxes, strict=True)), lambda: all(len(i.done) == 2 for i in inboxes))
    for rank, inbox in enumerate(inboxes):
        assert sorted(m[4] for m in inbox.done) == sorted(
            f"{p}->{rank}".encode() for p in range(3) if p != rank)


def test_world_of_one_has_no_peers() -> None:
    (t,) = create_world(1)
    assert isinstance(t, TcpTransport)
    try:
        assert t.peers == ()
        assert t.poll(lambda inc: None) is False
        t.check_peers()
    finally:
        t.close()


def test_wrong_secret_is_rejected() -> None:
    result = create_world(2, secrets=[SECRET, b"some-other-secret"], timeout=1.5)
    try:
        assert isinstance(result[1], AuthenticationError)
        assert isinstance(result[0], BootstrapError)
        assert "rank 1" in str(result[0]) or "[1]" in str(result[0])
        assert "rejected" in str(result[0])
    finally:
        for t in result:
            if isinstance(t, TcpTransport):
                t.close()


def test_missing_peer_times_out_with_bootstrap_error() -> None:
    store = MemoryStore()
    start = time.monotonic()
    with pytest.raises(BootstrapError, match="rank 0"):
        TcpTransport.create(1, 2, store, SECRET, timeout=0.5)
    assert time.monotonic() - start < 5


def test_create_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        TcpTransport.create(2, 2, MemoryStore(), SECRET)
    with pytest.raises(ValueError):
        TcpTransport.create(0, 2, MemoryStore(), b"")


# ------------------------------------------------------------------------- messages


def test_order_per_pair_with_mixed_sizes_and_tags(
    world: Callable[[int], list[TcpTransport]],
) -> None:
    ts = world(3)
    inboxes = [Inbox() for _ in ts]
    sizes = [0, 1, 7, 100, 70_000, 3, 1 << 20, 5, 300_000, 2]
    sent: dict[int, list[tuple[int, int, int, bytes]]] = {0: [], 2: []}
    handles: list[SendHandle] = []
    keep: list[bytes] = []
    for i in range(60):
        for src in (0, 2):
            data = payload(1000 * src + i, sizes[i % len(sizes)])
            keep.append(data)
            env = (i % 4, i % 3 - 1, i)
            handles.append(ts[src].isend(1, env[0], env[1], env[2], [memoryview(data)], len(data)))
            sent[src].append((*env, data))
    pairs = list(zip(ts, inboxes, strict=True))
    pump(pairs, lambda: len(inboxes[1].done) == 120 and all(h.done for h in handles))
    for src in (0, 2):
        got = [(c, t, f, d) for s, c, t, f, d in inboxes[1].done if s == src]
        assert got == sent[src]


def test_zero_length_messages(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    inbox = Inbox()
    assert a.isend(1, 3, 4, 5, [], 0) is DONE
    assert a.isend(1, 3, 6, 0, [memoryview(b""), memoryview(b"")], 0) is DONE
    pump([(b, inbox)], lambda: len(inbox.done) == 2)
    assert inbox.done == [(0, 3, 4, 5, b""), (0, 3, 6, 0, b"")]
    detached = Inbox(detach=True)
    a.isend(1, 0, 9, 0, [], 0)
    pump([(b, detached)], lambda: len(detached.kept) == 1)
    fired: list[bool] = []
    detached.kept[0].read_into(memoryview(bytearray(0)), lambda: fired.append(True))
    assert fired == [True]


def test_64_mib_multi_segment_into_numpy(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    parts = [
        np.arange(3 << 20, dtype=np.int64),  # 24 MiB
        np.arange(5 << 20, dtype=np.int64) * -3,  # 40 MiB
        np.frombuffer(b"tail!", dtype=np.uint8),
    ]
    nbytes = sum(p.nbytes for p in parts)
    dest = np.zeros(nbytes + 16, dtype=np.uint8)
    dest[nbytes:] = 0xAB  # must stay untouched
    finished: list[bool] = []

    def deliver(inc: Incoming) -> None:
        assert (inc.source, inc.context, inc.tag, inc.nbytes) == (0, 2, 77, nbytes)
        inc.read_into(memoryview(dest), lambda: finished.append(True))

    handle = a.isend(1, 2, 77, 0, [byte_view(p) for p in parts], nbytes)
    assert handle is not DONE  # far bigger than the socket buffers
    deadline = time.monotonic() + 30
    while not (finished and handle.done):
        assert time.monotonic() < deadline
        if not (a.poll(deliver) | b.poll(deliver)):
            b.wait_event(0.01)
    expected = b"".join(p.tobytes() for p in parts)
    assert dest[:nbytes].tobytes() == expected
    assert (dest[nbytes:] == 0xAB).all()


def test_read_into_typed_multidimensional_buffer(
    world: Callable[[int], list[TcpTransport]],
) -> None:
    a, b = world(2)
    src = np.arange(600, dtype=np.float64).reshape(20, 30) / 7
    dest = np.zeros((20, 30), dtype=np.float64)
    done: list[bool] = []
    a.isend(1, 0, 0, 0, [byte_view(src)], src.nbytes)
    deadline = time.monotonic() + 10
    while not done:
        assert time.monotonic() < deadline
        b.poll(lambda inc: inc.read_into(memoryview(dest), lambda: done.append(True)))
    assert np.array_equal(dest, src)


def test_detach_then_read_into(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    big = payload(5, 16 << 20)
    small = payload(6, 1000)
    h = a.isend(1, 1, 1, 0, [memoryview(big)], len(big))
    a.isend(1, 1, 2, 0, [memoryview(small)], len(small))
    inbox = Inbox(detach=True)
    # Poll until the big message is announced; its payload is then mostly still in flight.
    deadline = time.monotonic() + 10
    while not inbox.kept:
        assert time.monotonic() < deadline
        a.poll(inbox.deliver)
        b.poll(inbox.deliver)
    first = inbox.kept[0]
    assert (first.tag, first.nbytes) == (1, len(big))
    dest = bytearray(len(big))
    fired: list[int] = []
    first.read_into(memoryview(dest), lambda: fired.append(1))  # before it is complete
    pump([(a, Inbox()), (b, inbox)], lambda: bool(fired) and len(inbox.kept) == 2 and h.done)
    assert fired == [1]
    assert dest == big
    second = inbox.kept[1]
    out = bytearray(len(small) + 4)
    second.read_into(memoryview(out), lambda: fired.append(2))
    assert fired == [1, 2]
    assert out[: len(small)] == small and out[len(small) :] == b"\0" * 4


def test_many_small_messages_both_ways(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    n = 5000
    ia, ib = Inbox(), Inbox()
    pairs = [(a, ia), (b, ib)]
    for i in range(n):
        ma = struct.pack("<II", i, 0xA)
        mb = struct.pack("<IIQ", i, 0xB, i * i)
        a.isend(1, 0, i, 0, [memoryview(ma)], len(ma))
        b.isend(0, 0, i, 1, [memoryview(mb)], len(mb))
        if i % 500 == 0:
            for t, inbox in pairs:
                t.poll(inbox.deliver)
    pump(pairs, lambda: len(ia.done) == n and len(ib.done) == n)
    assert [m[4] for m in ib.done] == [struct.pack("<II", i, 0xA) for i in range(n)]
    assert [m[2] for m in ia.done] == list(range(n))
    assert [m[4] for m in ia.done] == [struct.pack("<IIQ", i, 0xB, i * i) for i in range(n)]


def test_queued_sends_complete_in_order(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    big = payload(9, 32 << 20)
    h1 = a.isend(1, 0, 1, 0, [memoryview(big)], len(big))
    inbox = Inbox()
    # Drain the receiver without polling the sender: the sender's socket now has room, but its
    # queued remainder must still go out before anything sent later.
    deadline = time.monotonic() + 10
    while not b.poll(inbox.deliver) and time.monotonic() < deadline:
        b.wait_event(0.01)
    for _ in range(20):
        b.poll(inbox.deliver)
    h2 = a.isend(1, 0, 2, 0, [memoryview(b"after")], 5)
    assert not h1.done and not h2.done  # the small one waits behind the big one
    pump([(a, Inbox()), (b, inbox)], lambda: h2.done and len(inbox.done) == 2)
    assert h1.done
    assert [m[2] for m in inbox.done] == [1, 2]
    assert inbox.done[0][4] == big


# ------------------------------------------------------------------------- misuse


def test_isend_validates_arguments(world: Callable[[int], list[TcpTransport]]) -> None:
    a, _ = world(2)
    with pytest.raises(ValueError, match="not a peer"):
        a.isend(0, 0, 0, 0, [], 0)
    with pytest.raises(ValueError, match="nbytes"):
        a.isend(1, 0, 0, 0, [memoryview(b"abc")], 4)
    with pytest.raises(ValueError, match="envelope"):
        a.isend(1, -1, 0, 0, [], 0)
    with pytest.raises(ValueError, match="envelope"):
        a.isend(1, 0, 1 << 64, 0, [], 0)


def test_deliver_must_read_or_detach(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    a.isend(1, 0, 0, 0, [memoryview(b"x")], 1)
    deadline = time.monotonic() + 10
    with pytest.raises(RuntimeError, match="read_into"):
        while time.monotonic() < deadline:
            b.poll(lambda inc: None)
            b.wait_event(0.01)


def test_read_into_too_small_buffer(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    a.isend(1, 0, 0, 0, [memoryview(b"12345")], 5)
    deadline = time.monotonic() + 10
    with pytest.raises(ValueError, match="4 bytes"):
        while time.monotonic() < deadline:
            b.poll(lambda inc: inc.read_into(memoryview(bytearray(4)), lambda: None))
            b.wait_event(0.01)


def test_read_into_twice_is_an_error(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    a.isend(1, 0, 0, 0, [memoryview(b"x")], 1)

    def deliver(inc: Incoming) -> None:
        inc.detach()
        inc.read_into(memoryview(bytearray(1)), lambda: None)

    deadline = time.monotonic() + 10
    with pytest.raises(RuntimeError, match="once"):
        while time.monotonic() < deadline:
            b.poll(deliver)
            b.wait_event(0.01)


# ------------------------------------------------------------------------- failures and close


def poll_until_failure(t: TcpTransport, timeout: float = 10.0) -> PeerFailure:
    deadline = time.monotonic() + timeout
    inbox = Inbox()
    while time.monotonic() < deadline:
        try:
            if not t.poll(inbox.deliver):
                t.wait_event(0.01)
        except PeerFailure as exc:
            return exc
    pytest.fail("no PeerFailure raised")


def test_peer_close_raises_peer_failure(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b, c = world(3)
    b.close()
    err = poll_until_failure(a)
    assert err.rank == 1
    assert "closed" in str(err)
    with pytest.raises(PeerFailure) as info:
        a.check_peers()
    assert info.value.rank == 1
    with pytest.raises(PeerFailure):
        a.isend(1, 0, 0, 0, [], 0)
    assert poll_until_failure(c).rank == 1
    # The failure is raised once by poll; the surviving peers keep working.
    inbox = Inbox()
    c.isend(0, 0, 5, 0, [memoryview(b"still here")], 10)
    pump([(a, inbox), (c, Inbox())], lambda: len(inbox.done) == 1)
    assert inbox.done[0][4] == b"still here"


def test_peer_close_mid_message(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    big = payload(1, 48 << 20)
    dest = bytearray(len(big))
    announced: list[bool] = []

    def deliver(inc: Incoming) -> None:
        announced.append(True)
        inc.read_into(memoryview(dest), lambda: pytest.fail("message cannot complete"))

    handle = a.isend(1, 0, 0, 0, [memoryview(big)], len(big))
    deadline = time.monotonic() + 10
    while not announced:
        assert time.monotonic() < deadline
        b.poll(deliver)
    assert not handle.done
    a.close()
    deadline = time.monotonic() + 10
    with pytest.raises(PeerFailure, match="middle of a message") as info:
        while time.monotonic() < deadline:
            if not b.poll(deliver):
                b.wait_event(0.01)
    assert info.value.rank == 0


def test_connection_reset_raises_peer_failure(
    world: Callable[[int], list[TcpTransport]],
) -> None:
    a, b = world(2)
    b._peers[0].sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()  # SO_LINGER 0: the close sends RST
    err = poll_until_failure(a)
    assert err.rank == 1
    assert "reset" in str(err) or "closed" in str(err)
    with pytest.raises(PeerFailure):
        a.isend(1, 0, 0, 0, [memoryview(b"x" * (8 << 20))], 8 << 20)


def test_protocol_errors_from_a_raw_peer() -> None:
    for frame, why in [
        (b"\x00" * HEADER.size, "bad frame header"),
        (HEADER.pack(MAGIC, VERSION + 1, 0, 0, 0, 0), "bad frame header"),
        (HEADER.pack(MAGIC, VERSION, 0, 0, 0, (1 << 40) + 1), "exceeds the bound"),
    ]:
        mine, theirs = socket.socketpair()
        t = TcpTransport(0, {1: mine})
        try:
            theirs.sendall(frame)
            with pytest.raises(PeerFailure, match=why) as info:
                poll_until_failure_raising(t)
            assert info.value.rank == 1
        finally:
            t.close()
            theirs.close()


def poll_until_failure_raising(t: TcpTransport) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        t.poll(lambda inc: inc.detach())
        t.wait_event(0.01)


def test_close_is_idempotent(world: Callable[[int], list[TcpTransport]]) -> None:
    a, _ = world(2)
    a.close()
    a.close()
    with pytest.raises(TransportError):
        a.poll(lambda inc: None)
    with pytest.raises(TransportError):
        a.isend(1, 0, 0, 0, [], 0)
    with pytest.raises(TransportError):
        a.check_peers()
    a.wait_event(0.01)


def test_failing_deliver_leaves_a_clear_error(
    world: Callable[[int], list[TcpTransport]],
) -> None:
    a, b = world(2)
    a.isend(1, 0, 0, 0, [memoryview(b"x")], 1)

    def broken(inc: Incoming) -> None:
        raise KeyError("matching engine bug")

    deadline = time.monotonic() + 10
    with pytest.raises(KeyError):
        while time.monotonic() < deadline:
            b.poll(broken)
            b.wait_event(0.01)
    with pytest.raises(RuntimeError, match="neither read nor detached"):
        b.poll(Inbox().deliver)


def test_wait_event_returns_on_arrival(world: Callable[[int], list[TcpTransport]]) -> None:
    a, b = world(2)
    timer = threading.Timer(0.2, lambda: a.isend(1, 0, 0, 0, [memoryview(b"wake")], 4))
    timer.start()
    try:
        start = time.monotonic()
        b.wait_event(10.0)
        assert 0.1 < time.monotonic() - start < 5
    finally:
        timer.join(5)
    start = time.monotonic()
    b.wait_event(5.0)  # data is pending: returns at once, not after the 5 s (however loaded)
    assert time.monotonic() - start < 4
