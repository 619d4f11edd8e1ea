"""The transport contract, checked identically for every transport (shm, tcp, inproc).

Endpoints of one world live in threads of the test process (rendezvous through a MemoryStore;
the in-process transport's endpoints share one Hub); failure of a peer process is checked with
a forked child (shm and tcp only: in-process peers are threads).
"""

from __future__ import annotations

import os
import secrets
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from ringworld.errors import PeerFailure
from ringworld.store.memory import MemoryStore
from ringworld.store.tcp import TCPStore, TCPStoreServer
from ringworld.transport.base import Incoming, Transport
from ringworld.transport.inproc import Hub
from ringworld.transport.shm import FRAME, ShmTransport
from ringworld.transport.tcp import HEADER, TcpTransport

KINDS = ["shm", "tcp", "inproc"]
PROCESS_KINDS = ["shm", "tcp"]  # transports between processes
SECRET = b"conformance-secret-0123456789abcd"


def make(kind: str, rank: int, size: int, store: object, job: str) -> Transport:
    if kind == "shm":
        return ShmTransport.create(rank, size, store, job, timeout=20)  # type: ignore[arg-type]
    return TcpTransport.create(rank, size, store, SECRET, timeout=20)  # type: ignore[arg-type]


def world(kind: str, size: int) -> list[Transport]:
    if kind == "inproc":
        return list(Hub(size).endpoints())
    store = MemoryStore()
    job = f"conf{os.getpid()}x{secrets.token_hex(3)}"
    out: list[Transport | None] = [None] * size
    errors: list[BaseException] = []

    def start(r: int) -> None:
        try:
            out[r] = make(kind, r, size, store, job)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pair(kind: str) -> Iterator[list[Transport]]:
    ts = world(kind, 2)
    yield ts
    for t in ts:
        t.close()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("ringworld-conf")]


class Sink:
    """Collects arriving messages: matched into fresh buffers, or detached when told to."""

    def __init__(self, detach: bool = False) -> None:
        self.detach = detach
        self.got: list[tuple[int, int, int, int, bytearray]] = []
        self.done = 0
        self.kept: list[Incoming] = []

    def __call__(self, inc: Incoming) -> None:
        if self.detach:
            self.kept.append(inc.detach())
            return
        buf = bytearray(inc.nbytes)
        self.got.append((inc.source, inc.context, inc.tag, inc.flags, buf))
        inc.read_into(memoryview(buf), self._one_done)

    def _one_done(self) -> None:
        self.done += 1


def pump(ts: list[Transport], sinks: list[Callable[[Incoming], None]],
         until: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError("transport made no progress")
        for t, s in zip(ts, sinks, strict=True):
            t.poll(s)


def payload(i: int, n: int) -> bytes:
    return ((np.arange(n, dtype=np.int64) * 13 + i * 7919) % 251).astype(np.uint8).tobytes()


SIZES = [0, 1, 63, 64, 65, 4096, 40_000, 100_000, 1 << 20, 3_000_001]


def test_fifo_per_pair_with_every_size(pair: list[Transport]) -> None:
    a, b = pair
    sink_a, sink_b = Sink(), Sink()
    msgs = [(i, n) for i, n in enumerate(SIZES * 3)]
    handles = [a.isend(1, 6, 100 + i, i % 4, [memoryview(payload(i, n))], n) for i, n in msgs]
    pump([a, b], [sink_a, sink_b],
         lambda: sink_b.done == len(msgs) and all(h.done for h in handles))
    assert [(g[0], g[1], g[2], g[3]) for g in sink_b.got] == [(0, 6, 100 + i, i % 4)
                                                              for i, _ in msgs]
    for (i, n), g in zip(msgs, sink_b.got, strict=True):
        assert bytes(g[4]) == payload(i, n)


def test_gathered_segments_arrive_as_one_message(pair: list[Transport]) -> None:
    a, b = pair
    parts = [payload(1, 10), b"", payload(2, 70_000), payload(3, 5), payload(4, 200_000)]
    total = sum(len(p) for p in parts)
    sink = Sink()
    h = a.isend(1, 0, 1, 0, [memoryview(p) for p in parts], total)
    pump([a, b], [Sink(), sink], lambda: sink.done == 1 and h.done)
    assert bytes(sink.got[0][4]) == b"".join(parts)


def test_fast_paths_keep_order_and_never_take_what_they_cannot(pair: list[Transport]) -> None:
    """``send_eager`` writes whole messages or nothing; ``take_eager`` takes only the next one,
    and only when it matches; both keep the per-pair order of the general path."""
    a, b = pair
    big = 3_000_001
    assert not a.send_eager(1, 6, 1, 0, [memoryview(payload(0, big))], big)  # too large
    sent = list(enumerate([8, 0, 100, 70_000, 5]))
    handles = []
    for i, n in sent:
        segs = [memoryview(payload(i, n))]
        if not a.send_eager(1, 6, 50 + i, i, segs, n):  # no fast path or no room: general path
            handles.append(a.isend(1, 6, 50 + i, i, segs, n))
    # take_eager: the wrong tag or context is refused without consuming anything
    deadline = time.monotonic() + 10
    order: list[tuple[int, bytes | bytearray]] = []
    sink = Sink()
    while len(order) < len(sent):
        assert time.monotonic() < deadline, "messages did not arrive"
        a.poll(Sink())  # pushes what a queued
        nxt = 50 + len(order)
        assert b.take_eager(0, 7, nxt, None, 5) in (0, None)  # other context
        assert b.take_eager(0, 6, 999, None, 5) in (0, None)  # other tag
        got = b.take_eager(0, 6, nxt, None, 100)
        if isinstance(got, tuple):
            assert got[3] is not None and got[2] == len(got[3])
            order.append((got[0], got[3]))
        elif got is None:  # not takeable (large, or no fast path): the general path
            before = len(sink.got)
            b.poll(sink)
            order.extend((g[2], g[4]) for g in sink.got[before:])
    pump([a, b], [Sink(), sink],
         lambda: sink.done == len(sink.got) and all(h.done for h in handles))
    assert [(tag, bytes(data)) for tag, data in order] == [(50 + i, payload(i, n))
                                                          for i, n in sent]
    if b.supports_take_eager:
        assert len(order) > len(sink.got), "take_eager never took a small message"


def test_both_directions_at_once(pair: list[Transport]) -> None:
    a, b = pair
    sa, sb = Sink(), Sink()
    big = payload(9, 5_000_000)
    ha = a.isend(1, 0, 1, 0, [memoryview(big)], len(big))
    hb = b.isend(0, 0, 1, 0, [memoryview(big)], len(big))
    pump([a, b], [sa, sb], lambda: sa.done == 1 and sb.done == 1 and ha.done and hb.done)
    assert bytes(sa.got[0][4]) == big == bytes(sb.got[0][4])


def test_detached_messages_are_read_later(pair: list[Transport]) -> None:
    a, b = pair
    keep = Sink(detach=True)
    sizes = [0, 10, 50_000, 2_000_000]
    hs = [a.isend(1, 0, i, 0, [memoryview(payload(i, n))], n) for i, n in enumerate(sizes)]
    pump([a, b], [Sink(), keep], lambda: len(keep.kept) == len(sizes) and all(h.done for h in hs))
    # the sender is not held up by a receiver that has not matched: sends completed above
    bufs = [bytearray(n + 3) for n in sizes]
    done: list[int] = []
    for i, inc in enumerate(reversed(keep.kept)):  # read back in any order
        j = len(sizes) - 1 - i
        assert inc.nbytes == sizes[j] and inc.tag == j
        inc.read_into(memoryview(bufs[j]), lambda j=j: done.append(j))
    pump([a, b], [Sink(), Sink()], lambda: len(done) == len(sizes))
    for j, n in enumerate(sizes):
        assert bytes(bufs[j][:n]) == payload(j, n)
        assert bytes(bufs[j][n:]) == b"\0\0\0"  # nothing written past the message


def test_three_ranks_many_small_messages(kind: str) -> None:
    ts = world(kind, 3)
    try:
        sinks = [Sink(), Sink(), Sink()]
        hs = []
        for src in range(3):
            for dst in range(3):
                if src != dst:
                    hs += [ts[src].isend(dst, 2, i, 0, [memoryview(struct.pack("<qq", src, i))],
                                         16) for i in range(500)]
        pump(ts, sinks, lambda: all(s.done == 1000 for s in sinks) and all(h.done for h in hs))
        for dst, s in enumerate(sinks):
            for src in range(3):
                if src != dst:
                    seq = [struct.unpack("<qq", bytes(g[4]))[1] for g in s.got if g[0] == src]
                    assert seq == list(range(500))
    finally:
        for t in ts:
            t.close()


def test_wait_event_honours_its_timeout(pair: list[Transport]) -> None:
    a, _ = pair
    t0 = time.monotonic()
    a.wait_event(0.2)
    assert time.monotonic() - t0 < 1.0


def test_wait_event_wakes_on_arrival(pair: list[Transport]) -> None:
    a, b = pair

    def later() -> None:
        time.sleep(0.3)
        b.isend(0, 0, 0, 0, [memoryview(b"wake")], 4)

    th = threading.Thread(target=later)
    th.start()
    t0 = time.monotonic()
    sink = Sink()
    while not sink.got:
        a.wait_event(5.0)
        a.poll(sink)
        assert time.monotonic() - t0 < 4.0
    th.join()
    assert bytes(sink.got[0][4]) == b"wake"


def test_close_is_idempotent_and_later_use_is_a_transport_error(kind: str) -> None:
    from ringworld.errors import TransportError

    ts = world(kind, 2)
    for t in ts:
        t.close()
        t.close()
    with pytest.raises(TransportError):
        ts[0].isend(1, 0, 0, 0, [memoryview(b"late")], 4)


def test_sizes_beyond_4_gib_fit_the_wire_formats() -> None:
    # multi-gigabyte messages: lengths are 64-bit on both wires
    n = (5 << 30) + 3
    raw = FRAME.pack(2, 0, 0, 1, 64, 64, 7, n)
    assert FRAME.unpack(raw)[7] == n
    fields = HEADER.unpack(HEADER.pack(*([0] * (len(HEADER.format) - 2)), n))
    assert fields[-1] == n


@pytest.mark.skipif(os.environ.get("RINGWORLD_BIG_TESTS") != "1",
                    reason="moves 4.5 GiB through each transport; set RINGWORLD_BIG_TESTS=1")
def test_message_larger_than_4_gib(pair: list[Transport]) -> None:  # pragma: no cover - opt-in
    a, b = pair
    n = (4 << 30) + (1 << 20) + 7
    src = np.ones(n, np.uint8)
    src[-7:] = 5
    dst = np.zeros(n, np.uint8)
    done: list[int] = []

    def take(inc: Incoming) -> None:
        inc.read_into(memoryview(dst), lambda: done.append(1))

    h = a.isend(1, 0, 0, 0, [memoryview(src)], n)
    pump([a, b], [Sink(), take], lambda: bool(done) and h.done, timeout=600)
    assert dst[0] == 1 and (dst[-7:] == 5).all()


def _child_endpoint(kind: str, host: str, port: int, job: str, die: str) -> None:
    store = TCPStore(host, port, SECRET, timeout=20)
    t = make(kind, 1, 2, store, job)
    t.isend(0, 0, 1, 0, [memoryview(b"last words")], 10)
    if die == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


@pytest.mark.parametrize("kind", PROCESS_KINDS)
@pytest.mark.parametrize("die", ["exit", "kill"])
def test_peer_process_death_is_reported_after_its_last_message(kind: str, die: str) -> None:
    server = TCPStoreServer(SECRET)
    host, port = server.start()
    job = f"conf{os.getpid()}d{secrets.token_hex(3)}"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            _child_endpoint(kind, host, port, job, die)
        finally:
            os._exit(1)
    try:
        store = TCPStore(host, port, SECRET, timeout=20)
        t = make(kind, 0, 2, store, job)
        sink = Sink()
        deadline = time.monotonic() + 10
        with pytest.raises(PeerFailure) as info:
            while time.monotonic() < deadline:
                t.poll(sink)
                t.check_peers()
                t.wait_event(0.05)
        assert info.value.rank == 1
        # what it sent before dying is not lost
        while not sink.got and time.monotonic() < deadline:
            t.poll(sink)
        assert sink.got and bytes(sink.got[0][4]) == b"last words"
        with pytest.raises(PeerFailure):
            t.isend(1, 0, 0, 0, [memoryview(b"x")], 1)
        t.close()
        store.close()
    finally:
        os.waitpid(pid, 0)
        server.close()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"ringworld-{job}")]


def test_full_shared_memory_is_a_clear_error_not_a_crash(tmp_path: object) -> None:
    import subprocess

    from ringworld.errors import BootstrapError

    mnt = os.path.join(str(tmp_path), "tiny-shm")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        with pytest.raises(BootstrapError, match=r"shared memory|--transport tcp"):
            ShmTransport.create(0, 2, MemoryStore(), "tiny", ring_bytes=1 << 20, timeout=5,
                                shm_dir=mnt)
        assert os.listdir(mnt) == []  # nothing left behind
    finally:
        subprocess.run(["umount", mnt], check=False)


def test_inproc_peer_leaving_is_reported_after_its_last_message() -> None:
    a, b = Hub(2).endpoints()
    b.isend(0, 0, 1, 0, [memoryview(b"last words")], 10)
    b.close()
    sink = Sink()
    with pytest.raises(PeerFailure) as info:
        a.poll(sink)
    assert info.value.rank == 1
    assert bytes(sink.got[0][4]) == b"last words"  # delivered before the failure
    assert not a.poll(sink)  # each failure is raised once by poll ...
    with pytest.raises(PeerFailure):
        a.check_peers()  # ... and always by check_peers
    with pytest.raises(PeerFailure):
        a.isend(1, 0, 0, 0, [memoryview(b"x")], 1)
    assert not a.send_eager(1, 0, 0, 0, [memoryview(b"x")], 1)
    a.close()


def test_inproc_windows_are_shared_and_peer_copies_land() -> None:
    import ctypes

    from ringworld.errors import TransportError

    a, b = Hub(2).endpoints()
    mine = a.window_create("w", 4096)
    theirs = b.window_attach(0, "w", 4096)
    assert ctypes.addressof(ctypes.c_char.from_buffer(mine)) % 64 == 0
    theirs[100:104] = b"abcd"
    assert bytes(mine[100:104]) == b"abcd"  # one memory, two views
    with pytest.raises(TransportError, match="4096 bytes, not 8"):
        b.window_attach(0, "w", 8)
    with pytest.raises(TransportError, match="exists already"):
        a.window_create("w", 16)
    a.window_unlink("w")
    with pytest.raises(TransportError, match="no window"):
        b.window_attach(0, "w", 4096)  # the name is gone, the mapping is not
    assert bytes(theirs[100:104]) == b"abcd"
    src = np.arange(16, dtype=np.int64)
    dst = np.zeros(16, dtype=np.int64)
    b.read_peer(0, src.ctypes.data, dst.ctypes.data, 64)
    assert (dst[:8] == src[:8]).all() and not dst[8:].any()
    b.write_peer(0, dst.ctypes.data + 64, src.ctypes.data + 64, 64)
    assert (dst == src).all()
    for t in (a, b):
        t.close()
