"""Single-copy rendezvous over shared memory: when a large message is read straight from the
sender's memory, when it is streamed instead, and the fallback when the kernel refuses."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from test_conformance import Sink, payload, pump, world

from ringworld.transport import cma
from ringworld.transport.base import Transport
from ringworld.transport.shm import ShmTransport

BIG = 3_000_001  # above the eager limit, not a multiple of a page or a chunk


@pytest.fixture
def pair() -> Iterator[list[ShmTransport]]:
    ts = world("shm", 2)
    assert all(isinstance(t, ShmTransport) for t in ts)
    yield [t for t in ts if isinstance(t, ShmTransport)]
    for t in ts:
        t.close()


def _exchange(a: Transport, b: Transport, segs: list[bytes]) -> tuple[bytes, bytes]:
    """Both ranks send the same segments to each other at once; return what each received."""
    total = sum(len(s) for s in segs)
    sa, sb = Sink(), Sink()
    ha = a.isend(1, 0, 7, 0, [memoryview(s) for s in segs], total)
    hb = b.isend(0, 0, 7, 0, [memoryview(s) for s in segs], total)
    pump([a, b], [sa, sb], lambda: sa.done == 1 and sb.done == 1 and ha.done and hb.done)
    return bytes(sa.got[0][4]), bytes(sb.got[0][4])


def test_an_exchange_reads_straight_from_the_sender(pair: list[ShmTransport]) -> None:
    a, b = pair
    big = payload(3, BIG)
    for _ in range(3):
        got_a, got_b = _exchange(a, b, [big])
        assert got_a == big == got_b
    assert a.single_copy_reads == 3 and b.single_copy_reads == 3
    assert not a._pending_rts and not b._pending_rts  # every send was finished by its FIN


def test_one_way_traffic_is_read_too(pair: list[ShmTransport]) -> None:
    a, b = pair
    big = payload(4, BIG)
    sink = Sink()
    h = a.isend(1, 0, 1, 0, [memoryview(big)], BIG)
    pump([a, b], [Sink(), sink], lambda: sink.done == 1 and h.done)
    assert bytes(sink.got[0][4]) == big
    assert b.single_copy_reads == 1 and a.single_copy_reads == 0
    assert not a._pending_rts


def test_several_segments_stream(pair: list[ShmTransport]) -> None:
    a, b = pair
    segs = [payload(5, 1_000_000), payload(6, 1_500_003)]
    got_a, got_b = _exchange(a, b, segs)
    assert got_a == b"".join(segs) == got_b
    assert a.single_copy_reads == 0 and b.single_copy_reads == 0


def test_a_refused_read_falls_back_to_streaming_for_good(
        pair: list[ShmTransport], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    calls: list[int] = []

    def refuse(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        calls.append(nbytes)
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(cma, "read", refuse)
    big = payload(7, BIG)
    for _ in range(2):
        got_a, got_b = _exchange(a, b, [big])
        assert got_a == big == got_b
    assert not a.single_copy and not b.single_copy
    assert len(calls) <= 2  # each rank asked the kernel once at most, then stopped asking
    assert a.single_copy_reads == 0 and b.single_copy_reads == 0


def test_single_copy_can_be_turned_off(pair: list[ShmTransport]) -> None:
    a, b = pair
    a.single_copy = b.single_copy = False  # what RINGWORLD_SHM_SINGLE_COPY=0 sets at creation
    big = payload(8, BIG)
    got_a, got_b = _exchange(a, b, [big])
    assert got_a == big == got_b
    assert a.single_copy_reads == 0 and b.single_copy_reads == 0


def test_a_blocking_receive_takes_a_large_message_straight_from_the_sender(
        pair: list[ShmTransport]) -> None:
    a, b = pair
    big = payload(9, BIG)
    h = a.isend(1, 4, 21, 3, [memoryview(big)], BIG)
    dest = bytearray(BIG + 5)
    small = bytearray(BIG - 1)
    deadline = 200
    got: object = 0
    while got == 0 and deadline:  # until the request-to-send has landed
        deadline -= 1
        assert b.take_eager(0, 4, 22, memoryview(dest), 1000) in (0, None)  # other tag
        assert b.take_eager(0, 4, 21, memoryview(small), 1000) in (0, None)  # too small
        got = b.take_eager(0, 4, 21, memoryview(dest), 1000)
    assert got == (21, 3, BIG, None)
    assert bytes(dest[:BIG]) == big and dest[BIG:] == b"\0" * 5
    assert b.single_copy_reads == 1
    pump([a, b], [Sink(), Sink()], lambda: h.done)  # the sender completes on the FIN
    assert not a._pending_rts


def test_a_peer_copier_moves_bytes_both_ways_and_names_its_failures(
        pair: list[ShmTransport]) -> None:
    import numpy as np

    from ringworld.errors import TransportError

    src = (np.arange(5000) * 7 % 251).astype(np.uint8)
    dst = np.zeros(5000, np.uint8)
    read, write = pair[0].peer_copier(1, False), pair[0].peer_copier(1, True)
    read(src.ctypes.data, dst.ctypes.data, src.nbytes)  # (the pair shares this process)
    assert np.array_equal(dst, src)
    dst[:] = 0
    write(dst.ctypes.data, src.ctypes.data, src.nbytes)
    assert np.array_equal(dst, src)
    with pytest.raises(TransportError, match="reading rank 1's memory failed"):
        read(8, dst.ctypes.data, 16)  # an unmapped address of the peer
    with pytest.raises(TransportError, match="writing rank 1's memory failed"):
        write(8, src.ctypes.data, 16)
    with pytest.raises(TransportError, match="not a peer"):
        pair[0].peer_copier(5, False)
