"""A blocking receive over TCP takes its message straight from the staged stream
(TcpTransport.take_eager): every size up to the direct-read bound lands whole and right, and
the frames after it still parse; a message it may not take (another context or tag, larger
than the buffer, larger than the bound, checksums on, sends queued; of another length than a
collective's block asks) is left whole for the general path; where the engine says the host
is contended (``sleepy``) the take sleeps in the socket's read and is woken by the data; a
peer that closes meanwhile fails at the next poll.
Through the engine and communicator (two ranks as threads over one TCP pair), receives of every
kind return what was sent, spinning or sleeping."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from ringworld.comm.engine import Engine
from ringworld.errors import PeerFailure, TruncationError
from ringworld.testing.threads import world_of
from ringworld.transport import tcp
from ringworld.transport.base import Incoming
from ringworld.transport.tcp import TcpTransport

SIZES = [0, 1, 8, 63, 64, 100, 4095, 4096, 5000, 65536]


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def _transports(checksum: bool = False) -> tuple[TcpTransport, TcpTransport]:
    a, b = _tcp_pair()
    return TcpTransport(0, {1: a}, checksum=checksum), TcpTransport(1, {0: b}, checksum=checksum)


@pytest.fixture
def pair() -> Iterator[tuple[TcpTransport, TcpTransport]]:
    ta, tb = _transports()
    try:
        yield ta, tb
    finally:
        ta.close()
        tb.close()


def _data(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed * 97) % 251).astype(np.uint8)


def _send(t: TcpTransport, dest: int, context: int, tag: int, data: np.ndarray,
          flags: int = 0) -> None:
    h = t.isend(dest, context, tag, flags, [memoryview(data)], data.nbytes)
    deadline = time.monotonic() + 10
    while not h.done:  # (a small frame goes at once; a large one needs the peer to read)
        assert time.monotonic() < deadline
        t.poll(lambda inc: inc.detach())


def _take(t: TcpTransport, source: int, context: int, tag: int,
          dest: memoryview | None) -> tuple[int, int, int, bytes | None] | int | None:
    """take_eager until it takes or declines (0: nothing yet, as the engine would go on)."""
    deadline = time.monotonic() + 10
    while True:
        got = t.take_eager(source, context, tag, dest, 64)
        if got != 0 or time.monotonic() > deadline:
            return got


class _Kept:
    """Delivers every message into an owned buffer; ``got`` lists (context, tag, bytes)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int, bytes]] = []

    def __call__(self, inc: Incoming) -> None:
        buf = bytearray(inc.nbytes)
        inc.read_into(memoryview(buf),
                      lambda: self.got.append((inc.context, inc.tag, bytes(buf))))


def _drain(t: TcpTransport, want: int) -> list[tuple[int, int, bytes]]:
    kept = _Kept()
    deadline = time.monotonic() + 10
    while len(kept.got) < want:
        assert time.monotonic() < deadline, kept.got
        t.poll(kept)
    return kept.got


@pytest.mark.parametrize("sleepy", [False, True], ids=["polling", "sleeping"])
def test_every_size_is_taken_whole_and_the_stream_stays_in_step(
        pair: tuple[TcpTransport, TcpTransport], sleepy: bool) -> None:
    ta, tb = pair
    if sleepy:
        tb.sleepy = lambda: True
    for i, n in enumerate(SIZES):
        data = _data(n, i)
        _send(ta, 1, 4, 100 + i, data, flags=i)
        dest = np.full(n + 3, 0xEE, np.uint8)  # (longer than the message: the rest untouched)
        got = _take(tb, 0, 4, 100 + i, memoryview(dest))
        assert got == (100 + i, i, n, None), (n, got)
        assert np.array_equal(dest[:n], data) and (dest[n:] == 0xEE).all(), n
    # several frames staged by one read: each taken in turn, ANY_TAG (-1) too
    batch = [_data(n, 50 + n) for n in (8, 5000, 3)]
    for k, data in enumerate(batch):
        _send(ta, 1, 4, k, data)
    for k, data in enumerate(batch):
        dest = np.zeros(data.nbytes, np.uint8)
        assert _take(tb, 0, 4, -1, memoryview(dest)) == (k, 0, data.nbytes, None)
        assert np.array_equal(dest, data)
    # no buffer: the payload comes back as bytes
    _send(ta, 1, 6, 9, _data(12, 7))
    assert _take(tb, 0, 6, 9, None) == (9, 0, 12, _data(12, 7).tobytes())
    # the general path reads on in step with what the takes left
    _send(ta, 1, 4, 1, _data(70, 1))
    assert _drain(tb, 1) == [(4, 1, _data(70, 1).tobytes())]


def test_a_message_it_may_not_take_is_left_whole_for_the_general_path(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    ta, tb = pair
    sent = [(4, 2, _data(8, 1)),           # another tag than asked
            (5, 1, _data(8, 2)),           # another context
            (4, 1, _data(100, 3)),         # larger than the buffer given
            (4, 1, _data(tcp._DIRECT_BYTES + 64, 4))]  # beyond the direct-read bound
    asks = [(4, 1, 8), (4, 1, 8), (4, 1, 99), (4, 1, tcp._DIRECT_BYTES + 64)]
    for (ctx, tag, data), (actx, atag, room) in zip(sent, asks, strict=True):
        ta.isend(1, ctx, tag, 0, [memoryview(data)], data.nbytes)  # (ta is polled below)
        assert _take(tb, 0, actx, atag, memoryview(bytearray(room))) is None
        got = []
        kept = _Kept()
        deadline = time.monotonic() + 10
        while not got:
            assert time.monotonic() < deadline
            ta.poll(lambda inc: inc.detach())
            tb.poll(kept)
            got = kept.got
        assert got == [(ctx, tag, data.tobytes())]


def test_an_exact_take_leaves_a_block_of_another_length_to_the_general_path(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    """A collective's block (``exact``) is taken only at its length: a shorter or empty one
    is the general path's to report (ShortMessageError, MismatchError), left whole."""
    ta, tb = pair
    for n, room in ((7, 8), (0, 8), (9, 8)):
        data = _data(n, n)
        _send(ta, 1, 4, 1, data)
        dest = np.full(room, 0xEE, np.uint8)
        assert tb.take_eager(0, 4, 1, memoryview(dest), 64, True) is None
        assert (dest == 0xEE).all()
        assert _drain(tb, 1) == [(4, 1, data.tobytes())]
    data = _data(8, 3)
    _send(ta, 1, 4, 1, data)
    dest = np.zeros(8, np.uint8)
    deadline = time.monotonic() + 10
    while (got := tb.take_eager(0, 4, 1, memoryview(dest), 64, True)) == 0:
        assert time.monotonic() < deadline
    assert got == (1, 0, 8, None) and np.array_equal(dest, data)


def test_after_a_large_message_the_next_is_left_to_the_general_path(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    """A large message read by poll makes the next take decline at once (the next is likely
    large too, and its read is better left to the general wait); a small one read by poll
    lets the takes take again."""
    ta, tb = pair
    big = _data(tcp.TAKE_BYTES + 1, 1)
    ta.isend(1, 4, 1, 0, [memoryview(big)], big.nbytes)
    kept = _Kept()
    deadline = time.monotonic() + 10
    while not kept.got:
        assert time.monotonic() < deadline
        ta.poll(lambda inc: inc.detach())
        tb.poll(kept)
    assert kept.got == [(4, 1, big.tobytes())]
    _send(ta, 1, 4, 2, _data(8, 2))
    time.sleep(0.05)  # (arrived: a take would find it)
    assert tb.take_eager(0, 4, 2, memoryview(bytearray(8)), 64) is None
    assert _drain(tb, 1) == [(4, 2, _data(8, 2).tobytes())]
    _send(ta, 1, 4, 3, _data(8, 3))
    dest = bytearray(8)
    assert _take(tb, 0, 4, 3, memoryview(dest)) == (3, 0, 8, None)
    assert bytes(dest) == _data(8, 3).tobytes()


def test_it_declines_with_checksums_on_or_sends_queued() -> None:
    ta, tb = _transports(checksum=True)
    try:
        _send(ta, 1, 4, 1, _data(8, 1))
        assert _take(tb, 0, 4, 1, memoryview(bytearray(8))) is None  # (the CRC is checked there)
        assert _drain(tb, 1) == [(4, 1, _data(8, 1).tobytes())]
    finally:
        ta.close()
        tb.close()
    ta, tb = _transports()
    try:
        big = _data(24 << 20, 3)  # more than the sockets hold: the rest stays queued in tb
        tb.isend(0, 4, 2, 0, [memoryview(big)], big.nbytes)
        assert tb._peers[0].sendq
        _send(ta, 1, 4, 1, _data(8, 1))
        assert tb.take_eager(0, 4, 1, memoryview(bytearray(8)), 64) is None
    finally:
        ta.close()
        tb.close()


def test_nothing_arrived_gives_zero_and_a_sleeping_take_is_woken_by_the_data(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    ta, tb = pair
    dest = memoryview(bytearray(8))
    assert tb.take_eager(0, 4, 1, dest, 64) == 0  # polled, nothing there
    tb.sleepy = lambda: True
    if tcp._CAN_BLOCK:
        t0 = time.monotonic()
        assert tb.take_eager(0, 4, 1, dest, 64) == 0  # slept one slice, nothing came
        assert time.monotonic() - t0 >= 0.9 * tcp.BLOCK_SLICE  # (in the read: not a poll)
    data = _data(8, 5)
    timer = threading.Timer(0.05, lambda: ta.isend(1, 4, 1, 0, [memoryview(data)], 8))
    timer.start()
    try:
        assert _take(tb, 0, 4, 1, dest) == (1, 0, 8, None)
    finally:
        timer.join()
    assert dest.tobytes() == data.tobytes()


def _frame(context: int, tag: int, payload: bytes) -> bytes:
    """A frame as TcpTransport.isend writes it (checksums off)."""
    head = tcp.HEADER.pack(tcp.MAGIC, tcp.VERSION, 0, context, tag, len(payload))
    lead = tcp.FRAME_ALIGN - len(head) if len(payload) >= tcp.LEAD_MIN_BYTES else 0
    body = head + bytes(lead) + payload
    return body + bytes(-len(body) % tcp.FRAME_ALIGN)


@pytest.mark.parametrize("sleepy", [False, True], ids=["polling", "sleeping"])
def test_a_frame_whose_rest_comes_later_is_read_on_or_left_whole_to_the_general_path(
        pair: tuple[TcpTransport, TcpTransport], sleepy: bool) -> None:
    ta, tb = pair
    tb.sleepy = lambda: sleepy
    payload = _data(5000, 9).tobytes()
    frame = _frame(4, 3, payload)
    raw = ta._peers[1].sock
    raw.sendall(frame[:1000])  # the header and a part of the payload
    dest = bytearray(5000)
    if sleepy and tcp._CAN_BLOCK:  # reads on, asleep in the socket, until the rest is there
        # (each read's slice made 1 s, so that the rest lands within one whatever the load)
        tb._peers[0].sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                     struct.pack("ll", 1, 0))
        timer = threading.Timer(0.05, lambda: raw.sendall(frame[1000:]))
        timer.start()
        try:
            assert _take(tb, 0, 4, 3, memoryview(dest)) == (3, 0, 5000, None)
        finally:
            timer.join()
        assert bytes(dest) == payload
    else:  # polls out: the staged part is left to the general path, which reads the rest
        assert _take(tb, 0, 4, 3, memoryview(dest)) is None
        raw.sendall(frame[1000:])
        assert _drain(tb, 1) == [(4, 3, payload)]
    _send(ta, 1, 4, 1, _data(8, 1))  # and the stream is in step after it
    assert _take(tb, 0, 4, 1, memoryview(dest)) == (1, 0, 8, None)


@pytest.mark.parametrize("sleepy", [False, True], ids=["polling", "sleeping"])
def test_a_peer_that_closes_fails_at_the_next_poll(sleepy: bool) -> None:
    ta, tb = _transports()
    try:
        tb.sleepy = lambda: sleepy
        ta.close()
        assert _take(tb, 0, 4, 1, memoryview(bytearray(8))) is None
        with pytest.raises(PeerFailure) as info:
            tb.poll(lambda inc: inc.detach())
        assert info.value.rank == 0
    finally:
        tb.close()


def test_the_engine_lets_a_lone_transport_sleep_only_when_contended_and_unneeded() -> None:
    ta, tb = _transports()
    e = Engine(1, 2, [tb, None], cpus=[64, 64])
    try:
        assert tb.sleepy() is False  # a quiet host
        e.placement.contended = True  # (as Placement.contended_at finds it, and holds it)
        e.placement.next_look = time.monotonic() + 60
        assert tb.sleepy() is True
        e.background.append(lambda: None)  # a nonblocking collective needs this rank's polls
        assert tb.sleepy() is False
    finally:
        e.close()
        ta.close()


def test_receives_of_every_kind_through_the_communicator() -> None:
    """Two ranks as threads over one TCP pair: recv, ANY_TAG, a synchronous send, objects,
    a truncating receive, each with the receive spinning and sleeping."""
    ta, tb = _transports()
    engines = [Engine(0, 2, [None, ta], 30.0, cpus=[64, 64]),
               Engine(1, 2, [tb, None], 30.0, cpus=[64, 64])]
    out: dict[int, object] = {}

    def rank(r: int) -> None:
        comm = world_of(engines[r], transport="tcp")
        try:
            for sleepy in (False, True):
                engines[r].transports[0].sleepy = lambda s=sleepy: s  # type: ignore[misc]
                for n in SIZES:
                    a = _data(n, n + sleepy)
                    if r == 0:
                        comm.send(a, 1, tag=n % 7)
                        comm.ssend(a[: n // 2].copy(), 1, tag=3)
                        comm.send_obj({"n": n, "x": [1.5, "two"]}, 1, tag=5)
                        comm.send(a, 1, tag=8)
                    else:
                        got = np.zeros(n, np.uint8)
                        st = comm.recv(got, 0, n % 7)
                        assert st.tag == n % 7 and st.nbytes == n and np.array_equal(got, a)
                        half = np.zeros(n // 2, np.uint8)
                        comm.recv(half, 0)  # (ANY_TAG)
                        assert np.array_equal(half, a[: n // 2])
                        assert comm.recv_obj(0, 5) == {"n": n, "x": [1.5, "two"]}
                        if n:  # (refused, the buffer untouched; the message is gone)
                            short = np.full(n - 1, 7, np.uint8)
                            with pytest.raises(TruncationError):
                                comm.recv(short, 0, 8)
                            assert (short == 7).all()
                        else:
                            assert comm.recv(np.zeros(0, np.uint8), 0, 8).nbytes == 0
                comm.barrier()
            out[r] = True
        except BaseException as exc:
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out == {0: True, 1: True}, out
    finally:
        for e in engines:
            e.close()
        ta.close()
        tb.close()
