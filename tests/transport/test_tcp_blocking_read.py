"""A wait on a large payload from a lone peer blocks in its read (TcpTransport._block), as a
blocking socket does: the data lands whole and right (checksums on and off), the socket's
wake-up mark is back to one byte afterwards (small messages still wake the waiter), a rank
with sends queued waits in epoll instead, and a peer that closes mid-payload ends the read at
once and fails at the next poll. A wait shorter than the read's slice waits in epoll."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from ringworld.errors import PeerFailure
from ringworld.transport import tcp
from ringworld.transport.base import Incoming
from ringworld.transport.tcp import TcpTransport

pytestmark = pytest.mark.skipif(not tcp._CAN_BLOCK, reason="no MSG_DONTWAIT/SO_RCVLOWAT here")

BIG = 24 << 20  # more than the kernel's socket buffers hold: the read must wait for the rest


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


@pytest.fixture(params=[False, True], ids=["plain", "checksum"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[TcpTransport, TcpTransport]]:
    a, b = _tcp_pair()
    ta = TcpTransport(0, {1: a}, checksum=request.param)
    tb = TcpTransport(1, {0: b}, checksum=request.param)
    try:
        yield ta, tb
    finally:
        ta.close()
        tb.close()


def _lowat(t: TcpTransport) -> int:
    return t._peers[1 - t.rank].sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


class _Into:
    """Delivers each message into a fresh buffer; ``got`` holds the finished ones."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.pending: bytearray | None = None

    def __call__(self, inc: Incoming) -> None:
        buf = self.pending = bytearray(inc.nbytes)
        inc.read_into(memoryview(buf), lambda: self.got.append(bytes(buf)))


def _sender(t: TcpTransport, stop: threading.Event) -> threading.Thread:
    """Push ``t``'s queued sends from a thread until ``stop`` (the receiver waits meanwhile)."""

    def run() -> None:
        while not stop.is_set():
            if not t.poll(lambda inc: inc.detach()):
                t.wait_event(0.001)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_a_wait_reads_the_payload_itself_then_small_messages_still_wake_it(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    ta, tb = pair
    data = (np.arange(BIG // 4, dtype=np.uint32) * 2654435761).view(np.uint8)
    tb.isend(0, 1, 7, 0, [memoryview(data)], BIG)  # (queued: more than the socket takes)
    into = _Into()
    stop = threading.Event()
    th = _sender(tb, stop)
    try:
        while into.pending is None:  # the header, and what has arrived of the payload
            ta.poll(into)
        peer = ta._peers[1]
        before = peer.tpos
        ta.wait_event(tcp.BLOCK_SLICE / 4)  # (shorter than a blocking read may take: epoll)
        assert peer.tpos == before
        read_by_waits = 0
        for _ in range(10_000):
            if into.got:
                break
            before = peer.tpos
            ta.wait_event(0.05)  # (blocks in the payload's read: what it reads is its own)
            read_by_waits += peer.tpos - before
            assert _lowat(ta) == 1
            ta.poll(into)
        assert into.got, "the payload never completed"
        assert read_by_waits > 0, "no wait read the payload: they waited in epoll"
        assert into.got[0] == data.tobytes()
        # a small message after it wakes a waiter (the mark is back to one byte)
        tb.isend(0, 1, 8, 0, [memoryview(b"tail")], 4)
        for _ in range(2000):
            ta.wait_event(0.05)
            ta.poll(into)
            if len(into.got) == 2:
                break
        assert into.got[1:] == [b"tail"]
    finally:
        stop.set()
        th.join(10)


def test_a_rank_with_sends_queued_waits_in_epoll(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    ta, tb = pair
    tb.isend(0, 1, 7, 0, [memoryview(bytes(BIG))], BIG)
    ta.isend(1, 1, 9, 0, [memoryview(bytes(BIG))], BIG)  # (queued on ta's side too)
    into = _Into()
    while into.pending is None:
        ta.poll(into)
        tb.poll(lambda inc: inc.detach())
    assert ta._peers[1].sendq
    assert ta._block(ta._peers[1]) is False  # its sends must move: no read may block them


def test_a_peer_closing_mid_payload_ends_the_read_and_fails_at_the_next_poll(
        pair: tuple[TcpTransport, TcpTransport]) -> None:
    ta, tb = pair
    tb.isend(0, 1, 7, 0, [memoryview(bytes(BIG))], BIG)
    into = _Into()
    while into.pending is None:
        ta.poll(into)
    tb.close()  # (the rest of the payload never comes)
    with pytest.raises(PeerFailure, match="in the middle of a message"):
        for _ in range(10_000):
            ta.wait_event(0.05)  # (returns: the read ends at the close, not after a slice)
            ta.poll(into)
