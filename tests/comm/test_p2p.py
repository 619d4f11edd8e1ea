"""Point-to-point semantics: every world size 1-8 with ranks as threads (the fast tier), and
world sizes 2 and 5 over real processes on both transports."""

from __future__ import annotations

import time

import numpy as np
import pytest

import ringworld
from ringworld import ANY_SOURCE, ANY_TAG, Communicator, Status
from ringworld.testing import run_processes, run_ranks

TRANSPORTS = ["shm", "tcp"]
#: (transport, world size): threads at every size of interest, real processes at two
WORLDS = [("threads", p) for p in (1, 2, 3, 5, 8)] + [(t, p) for t in TRANSPORTS for p in (2, 5)]
worlds = pytest.mark.parametrize(("transport", "size"), WORLDS,
                                 ids=[f"{t}-p{p}" for t, p in WORLDS])
DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128, np.bool_]


def data(rank: int, n: int, dtype: type = np.int64, salt: int = 0) -> np.ndarray:
    """Unique per element and per rank, so a wrong offset or source shows."""
    base = np.arange(n, dtype=np.int64) * 7 + rank * 1_000_003 + salt * 31
    if dtype is np.bool_:
        return (base % 3 == 0).astype(np.bool_)
    return (base % 1_000).astype(dtype) if np.dtype(dtype).itemsize < 4 else base.astype(dtype)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------- ring exchanges of buffers
def _ring_buffers(comm: Communicator) -> list[str]:
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    checked = []
    for dtype in DTYPES:
        for n in (0, 1, 7, 1000, 70_001):
            out = data(comm.rank, n, dtype)
            got = np.empty(n, dtype)
            st = comm.sendrecv(out, right, got, left, sendtag=3, recvtag=3)
            assert st.source == left and st.tag == 3
            assert st.nbytes == out.nbytes and st.count(dtype) == n
            np.testing.assert_array_equal(got, data(left, n, dtype))
            checked.append(f"{np.dtype(dtype)}x{n}")
    # 2-D arrays and bytes-like objects
    mat = data(comm.rank, 12, np.float64).reshape(3, 4)
    got2 = np.empty((3, 4))
    comm.sendrecv(mat, right, got2, left)
    np.testing.assert_array_equal(got2, data(left, 12, np.float64).reshape(3, 4))
    raw = bytearray(9)
    comm.sendrecv(f"rank{comm.rank:05d}".encode(), right, raw, left)
    assert raw == f"rank{left:05d}".encode()
    return checked


@worlds
def test_ring_buffers_every_dtype(size: int, transport: str) -> None:
    out = run_ranks(size, _ring_buffers, transport=transport, timeout=90)
    assert len(out) == size and all(len(o) == len(DTYPES) * 5 for o in out)


# ---------------------------------------------------------------- large messages
def _large(comm: Communicator, nbytes: int) -> int:
    if comm.size == 1:
        return 0
    if comm.rank == 0:
        for dest in range(1, comm.size):
            comm.send(data(dest, nbytes // 8 + dest), dest, tag=dest)
        return 0
    buf = np.empty(nbytes // 8 + comm.rank, np.int64)
    st = comm.recv(buf, 0, comm.rank)
    assert st.nbytes == buf.nbytes
    np.testing.assert_array_equal(buf, data(comm.rank, nbytes // 8 + comm.rank))
    return int(buf.nbytes)


@pytest.mark.parametrize("nbytes", [8 << 20, 64 << 20])
def test_multi_megabyte(transport: str, nbytes: int) -> None:
    out = run_processes(3, _large, nbytes, transport=transport, timeout=120)
    assert out[1] == (nbytes // 8 + 1) * 8


# ---------------------------------------------------------------- objects
def _objects(comm: Communicator) -> None:
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    value = {"rank": comm.rank, "name": f"r{comm.rank}", "list": list(range(comm.rank + 3)),
             "arr": data(comm.rank, 5000, np.float64), "small": np.arange(3) + comm.rank,
             "nested": [data(comm.rank, 100_000, np.int32), (None, 1.5)]}
    got = comm.sendrecv_obj(value, right, left, sendtag=1, recvtag=1)
    assert got["rank"] == left and got["name"] == f"r{left}"
    assert got["list"] == list(range(left + 3))
    np.testing.assert_array_equal(got["arr"], data(left, 5000, np.float64))
    np.testing.assert_array_equal(got["small"], np.arange(3) + left)
    np.testing.assert_array_equal(got["nested"][0], data(left, 100_000, np.int32))
    assert got["nested"][1] == (None, 1.5)
    got["arr"][0] = -1.0  # received arrays are writable
    # plain values of every kind
    for v in (None, 0, -(2**70), 3.25, "text", b"\x00\x01", [1, [2]], {"k": (1, 2)}, set(),
              "x" * 200_000):
        comm.send_obj(v, right, tag=2)
        assert comm.recv_obj(left, 2) == v


@worlds
def test_objects(size: int, transport: str) -> None:
    run_ranks(size, _objects, transport=transport, timeout=90)


def test_object_arrays_travel_out_of_band() -> None:
    from ringworld.comm import serialize as objects

    arr = np.arange(100_000, dtype=np.float64)
    segments, total, flags, _keep = objects.encode({"a": arr, "b": 1})
    assert flags & objects.FLAG_OOB
    addresses = [np.frombuffer(s, np.uint8).ctypes.data for s in segments if len(s)]
    assert arr.ctypes.data in addresses  # the array's own memory, not a pickled copy
    assert sum(len(s) for s in segments) == total < arr.nbytes + 4096
    block = np.empty(total, np.uint8)
    at = 0
    for s in segments:
        block[at : at + len(s)] = np.frombuffer(s, np.uint8)
        at += len(s)
    back = objects.decode(memoryview(block), flags)
    np.testing.assert_array_equal(back["a"], arr)
    assert back["a"].ctypes.data >= block.ctypes.data  # a view into the received block


# ---------------------------------------------------------------- tags, wildcards, ordering
def _wildcards(comm: Communicator) -> list[tuple[int, int]]:
    if comm.rank != 0:
        comm.send(np.array([comm.rank, 10 + comm.rank], np.int64), 0, tag=10 + comm.rank)
        comm.barrier()  # rank 0 has taken every buffer message before any object is sent
        comm.send_obj(("obj", comm.rank), 0, tag=50)
        return []
    seen = []
    buf = np.empty(2, np.int64)
    for _ in range(comm.size - 1):
        st = comm.recv(buf, ANY_SOURCE, ANY_TAG)
        assert isinstance(st, Status)
        assert buf[0] == st.source and buf[1] == st.tag == 10 + st.source
        seen.append((st.source, st.tag))
    comm.barrier()
    if comm.size == 1:
        return seen
    req = comm.irecv_obj(ANY_SOURCE, 50)
    got = req.wait()
    assert req.status is not None and got == ("obj", req.status.source)
    for _ in range(comm.size - 2):
        comm.recv_obj(ANY_SOURCE, 50)
    return seen


@worlds
def test_any_source_any_tag(size: int, transport: str) -> None:
    out = run_ranks(size, _wildcards, transport=transport, timeout=60)
    assert sorted(out[0]) == [(r, 10 + r) for r in range(1, size)]


def _ordering(comm: Communicator) -> None:
    # non-overtaking: same source and tag are received in send order, eager and rendezvous mixed
    if comm.size == 1:
        return
    sizes = [8, 100_000, 0, 1, 300_000, 16, 40_000, 5]
    if comm.rank == 0:
        reqs = []
        for dest in range(1, comm.size):
            for i, n in enumerate(sizes * 4):
                reqs.append(comm.isend(data(i, n, np.uint8), dest, tag=7))
                reqs.append(comm.isend(np.array([i], np.int64), dest, tag=8))
        ringworld.wait_all(reqs, timeout=60)
        return
    # receive tag 8 first (they are queued behind tag 7 traffic), then tag 7 in order
    for i in range(len(sizes) * 4):
        one = np.empty(1, np.int64)
        comm.recv(one, 0, 8)
        assert one[0] == i
    for i, n in enumerate(sizes * 4):
        buf = np.empty(n, np.uint8)
        st = comm.recv(buf, 0, 7)
        assert st.nbytes == n
        np.testing.assert_array_equal(buf, data(i, n, np.uint8))


@worlds
def test_non_overtaking(size: int, transport: str) -> None:
    run_ranks(size, _ordering, transport=transport, timeout=90)


# ---------------------------------------------------------------- nonblocking
def _nonblocking(comm: Communicator) -> None:
    n = comm.size
    bufs = [np.empty(1000 + comm.rank, np.int64) for _ in range(n)]
    rreqs = [comm.irecv(bufs[r], r, tag=4) for r in range(n)]   # posted before any send
    sreqs = [comm.isend(data(comm.rank, 1000 + r), r, tag=4) for r in range(n)]
    statuses = ringworld.wait_all(rreqs, timeout=30)
    ringworld.wait_all(sreqs, timeout=30)
    for r in range(n):
        assert statuses[r].source == r
        np.testing.assert_array_equal(bufs[r], data(r, 1000 + comm.rank))
    assert ringworld.test_all(rreqs + sreqs)
    # wait_any / test_any
    big = np.empty(300_000, np.uint8)
    a = comm.irecv(big, (comm.rank - 1) % n, tag=5)
    b = comm.irecv_obj((comm.rank - 1) % n, tag=6)
    comm.send_obj(comm.rank, (comm.rank + 1) % n, tag=6)
    idx, value = ringworld.wait_any([a, b], timeout=30)
    assert idx == 1 and value == (comm.rank - 1) % n
    assert ringworld.test_any([a]) is None  # tag 5 is sent only after the barrier below
    comm.barrier()
    s = comm.isend(data(comm.rank, 300_000, np.uint8), (comm.rank + 1) % n, tag=5)
    st = a.wait(timeout=30)
    s.wait(timeout=30)
    assert st.nbytes == 300_000
    np.testing.assert_array_equal(big, data((comm.rank - 1) % n, 300_000, np.uint8))
    # cancel an unmatched receive
    c = comm.irecv(np.empty(4, np.uint8), ANY_SOURCE, tag=999)
    assert c.cancel() is True
    assert c.done and c.status is not None and c.status.cancelled
    # test() makes progress
    t = comm.irecv_obj((comm.rank - 1) % n, tag=9)
    comm.send_obj("x", (comm.rank + 1) % n, tag=9)
    deadline = time.monotonic() + 30
    while not t.test():
        assert time.monotonic() < deadline
    assert t.wait() == "x"
    comm.barrier()


@worlds
def test_nonblocking(size: int, transport: str) -> None:
    run_ranks(size, _nonblocking, transport=transport, timeout=60)


# ---------------------------------------------------------------- probe
def _probe(comm: Communicator) -> None:
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    comm.send(data(comm.rank, 123, np.int32), right, tag=11)
    st = comm.probe(ANY_SOURCE, 11, timeout=30)
    assert st.source == left and st.tag == 11 and st.nbytes == 123 * 4
    assert comm.iprobe(left, 12) is None
    again = comm.iprobe(left, 11)
    assert again == st  # probing does not consume
    buf = np.empty(st.count(np.int32), np.int32)
    comm.recv(buf, st.source, st.tag)
    np.testing.assert_array_equal(buf, data(left, 123, np.int32))
    assert comm.iprobe(left, 11) is None
    # probe a large (rendezvous) message before receiving it
    comm.send_obj(data(comm.rank, 200_000), right, tag=13)
    st = comm.probe(left, 13, timeout=30)
    assert st.nbytes > 200_000 * 8
    np.testing.assert_array_equal(comm.recv_obj(left, 13), data(left, 200_000))
    comm.barrier()


@worlds
def test_probe(size: int, transport: str) -> None:
    run_ranks(size, _probe, transport=transport, timeout=60)


# ---------------------------------------------------------------- errors
def _errors(comm: Communicator) -> None:
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    buf = np.zeros(4)
    with pytest.raises(ValueError, match=rf"dest={comm.size} is out of range"):
        comm.send(buf, comm.size)
    with pytest.raises(ValueError, match="dest=-3"):
        comm.isend(buf, -3)
    with pytest.raises(ValueError, match="source=99"):
        comm.recv(buf, 99)
    with pytest.raises(ValueError, match="tag=-5"):
        comm.send(buf, right, tag=-5)
    with pytest.raises(ValueError, match="tag="):
        comm.send(buf, right, tag=2**31)
    with pytest.raises(TypeError, match="read-only"):
        comm.recv(b"immutable", left)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.send(np.zeros((4, 4))[:, 1], right)
    strided_bytes = np.zeros(64, np.uint8)[::2]  # 1-D bytes too: no fast path may skip the check
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.send(strided_bytes, right)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.isend(strided_bytes, right)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.recv(strided_bytes, left)
    # the nonblocking forms check as much (their common case is inline too)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.irecv(strided_bytes, left)
    with pytest.raises(TypeError, match="read-only"):
        comm.irecv(b"immutable", left)
    with pytest.raises(ValueError, match="source=99"):
        comm.irecv(buf, 99)
    with pytest.raises(ValueError, match="tag=-5"):
        comm.irecv(buf, left, tag=-5)
    with pytest.raises(ValueError, match="tag=-5"):
        comm.isend(buf, right, tag=-5)
    with pytest.raises(TypeError, match="buffer protocol"):
        comm.isend([1, 2, 3], right)
    with pytest.raises(TypeError, match="buffer protocol"):
        comm.send([1, 2, 3], right)
    with pytest.raises(TypeError, match="dest must be an int"):
        comm.send(buf, "1")  # type: ignore[arg-type]
    # Python objects: their bytes are pointers; received into, they would corrupt memory
    objects = np.array([None, 1.5])
    for call in (lambda: comm.send(objects, right), lambda: comm.isend(objects, right),
                 lambda: comm.ssend(np.zeros(2, "O,f8"), right),
                 lambda: comm.recv(objects, left), lambda: comm.irecv(objects, left)):
        with pytest.raises(TypeError, match="holds Python objects"):
            call()
    assert objects.tolist() == [None, 1.5]
    # ('O' in a field's name is no object: a structured array of numbers travels)
    named = np.zeros(2, [("Ocean", "f8")])
    named["Ocean"] = [comm.rank, 0.5]
    got = np.zeros(2, [("Ocean", "f8")])
    status = comm.sendrecv(named, right, got, left, sendtag=23, recvtag=23)
    assert got["Ocean"].tolist() == [left, 0.5] and status.nbytes == 16
    # truncation: both sizes named, the receive buffer left untouched
    comm.send(np.arange(10, dtype=np.int64), right, tag=21)
    small = np.full(4, -7, np.int64)
    with pytest.raises(ringworld.TruncationError, match=r"80 bytes.*32 bytes") as info:
        comm.recv(small, left, 21)
    assert info.value.message_bytes == 80 and info.value.buffer_bytes == 32
    np.testing.assert_array_equal(small, np.full(4, -7))
    # truncation of a rendezvous-sized message too, then the link still works
    comm.send(np.arange(100_000, dtype=np.int64), right, tag=22)
    with pytest.raises(ringworld.TruncationError):
        comm.recv(np.empty(10, np.int64), left, 22)
    comm.send_obj("after", right, tag=23)
    assert comm.recv_obj(left, 23) == "after"
    # a receive nobody satisfies times out, naming the operation
    t0 = time.monotonic()
    with pytest.raises(ringworld.Timeout, match=r"receive from rank .* tag 77"):
        comm.recv(buf, left, 77, timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 5
    with pytest.raises(TimeoutError):
        comm.recv_obj(left, 78, timeout=0.1)
    comm.barrier()


@worlds
def test_errors(size: int, transport: str) -> None:
    run_ranks(size, _errors, transport=transport, timeout=60)


# ---------------------------------------------------------------- wait_all
WAIT = 30.0


def _wait_all(comm: Communicator) -> None:
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    assert ringworld.wait_all([]) == []
    # results in order, whichever are pending: none, one (the receive), several
    for waits in range(3):
        got = [np.full(3, -1, np.int64) for _ in range(2)]
        recvs = [comm.irecv(got[i], left, tag=40 + i) for i in range(2)]
        if waits == 0:
            comm.barrier()  # (the sends below are buffered: the receives complete first)
        sends = [comm.isend(data(comm.rank, 3, salt=i), right, tag=40 + i) for i in range(2)]
        if waits == 0:
            ringworld.wait_all(sends, WAIT)
            comm.barrier()
        done = ringworld.wait_all(recvs[:waits] + sends + recvs[waits:], WAIT)
        assert [st.tag for st in done[:waits] + done[waits + 2:]] == [40, 41]
        assert done[waits:waits + 2] == [None, None]
        for i in range(2):
            np.testing.assert_array_equal(got[i], data(left, 3, salt=i))
    # a timeout names the receives still pending, one or several
    buf = np.empty(1, np.int64)
    with pytest.raises(ringworld.Timeout, match=r"receive from rank .* tag 51"):
        ringworld.wait_all([comm.irecv(buf, left, tag=51)], timeout=0.2)
    with pytest.raises(ringworld.Timeout, match=r"tag 52; receive from rank .* tag 53"):
        ringworld.wait_all([comm.irecv(buf, left, tag=52), comm.irecv(buf, left, tag=53)],
                           timeout=0.2)
    comm.barrier()
    # a failed request raises its error once the others are complete
    comm.send(np.arange(4, dtype=np.int64), right, tag=54)
    comm.send(np.arange(2, dtype=np.int64), right, tag=55)
    later = np.empty(2, np.int64)
    reqs = [comm.irecv(np.empty(1, np.int64), left, tag=54), comm.irecv(later, left, tag=55)]
    with pytest.raises(ringworld.TruncationError):
        ringworld.wait_all(reqs, WAIT)
    assert reqs[1].done
    np.testing.assert_array_equal(later, np.arange(2))
    comm.barrier()


@pytest.mark.parametrize("size", [2, 3])
def test_wait_all(size: int) -> None:
    run_ranks(size, _wait_all, timeout=60)


# ---------------------------------------------------------------- self messages, zero size
def _self_and_empty(comm: Communicator) -> None:
    comm.send(np.arange(5), comm.rank, tag=1)
    got = np.empty(5, np.int64)
    assert comm.recv(got, comm.rank, 1).source == comm.rank
    np.testing.assert_array_equal(got, np.arange(5))
    comm.send_obj({"me": comm.rank}, comm.rank)
    assert comm.recv_obj(comm.rank) == {"me": comm.rank}
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    st = comm.sendrecv(b"", right, bytearray(), left, sendtag=2, recvtag=2)
    assert st.nbytes == 0 and st.source == left
    # typed and empty arrays of any shape through the blocking calls (small: buffered, so
    # sending to the right before receiving from the left cannot deadlock); datetime64 and
    # timedelta64, whose buffer numpy refuses (ValueError), travel as their bytes
    pair = np.dtype([("a", "f8"), ("b", "i4")])

    def made(q: int) -> list[np.ndarray]:
        return [data(q, 6, np.float64).reshape(2, 3), np.zeros((0, 3)),
                np.zeros((2, 0), np.int32), np.arange(4, dtype=np.complex128) + q,
                np.array([(q, 7)], pair), np.array(float(q)),
                np.array(["2020-01-01", "2021-06-30"], "datetime64[D]") + q,
                np.arange(3, dtype="timedelta64[s]") * (q + 1)]

    for out, want in zip(made(comm.rank), made(left), strict=True):
        comm.send(out, right, tag=4)
        got = np.empty_like(want)
        assert comm.recv(got, left, 4).nbytes == want.nbytes
        np.testing.assert_array_equal(got, want)
        got = np.empty_like(want)
        assert comm.sendrecv(out, right, got, left, sendtag=5, recvtag=5).nbytes == want.nbytes
        np.testing.assert_array_equal(got, want)
    selfc = comm.self_comm()
    assert selfc.size == 1 and selfc.rank == 0
    selfc.send_obj("s", 0)
    assert selfc.recv_obj(0) == "s"


@worlds
def test_self_and_zero_length(size: int, transport: str) -> None:
    run_ranks(size, _self_and_empty, transport=transport, timeout=60)


# ---------------------------------------------------------------- failure of a peer
def _peer_dies_quietly(comm: Communicator) -> float:
    # rank 1 exits cleanly without finishing; rank 0's wait must fail fast, not hang
    if comm.rank == 1:
        return 0.0
    t0 = time.monotonic()
    if comm.rank == 0:
        with pytest.raises(ringworld.PeerFailure, match="peer rank 1"):
            comm.recv_obj(1, 5, timeout=20)
    return time.monotonic() - t0


def test_peer_leaving_early_is_detected_within_seconds(transport: str) -> None:
    out = run_processes(2, _peer_dies_quietly, transport=transport, timeout=30)
    assert out[0] < 2.5


def _large_unmatched(comm: Communicator) -> list[str]:
    """Large messages that arrive before their receive is posted (shared memory: rendezvous)."""
    import time

    from ringworld.comm import engine as engine_mod

    peer = 1 - comm.rank
    n = 1 << 18  # 2 MiB of float64: above the eager limit
    mine = np.arange(n, dtype=np.float64) + comm.rank * n
    got = np.empty(n)
    errors = []
    # both ranks send first, blocking: completes because an unmatched announcement is pulled
    # into a buffer of the receiver's after DEFER_DETACH (sends behave as buffered)
    comm.send(mine, peer, 1, timeout=20)
    comm.recv(got, peer, 1, timeout=20)
    if not np.array_equal(got, np.arange(n, dtype=np.float64) + peer * n):
        errors.append("head-to-head exchange: wrong data")
    # a message waiting unmatched stays an announcement until the delay has passed
    comm.barrier()
    e = comm._engine
    if comm.rank == 0:
        comm.send(mine, 1, 2, timeout=20)
    else:
        deadline = time.monotonic() + 10
        while comm.iprobe(0, 2) is None and time.monotonic() < deadline:
            pass
        queued = e.unexpected[comm.context]
        if comm.transport == "shm":
            if not (queued and queued[0].lazy):
                errors.append(f"not kept lazy: {queued}")
            time.sleep(2 * engine_mod.DEFER_DETACH)
            e.progress()
            if any(m.lazy for m in queued):
                errors.append("not detached after the delay")
        comm.recv(got, 0, 2, timeout=20)
        if not np.array_equal(got, mine - comm.rank * n):
            errors.append("deferred message: wrong data")
    comm.barrier()
    return errors


def test_large_messages_arriving_before_their_receive(transport: str) -> None:
    out = run_processes(2, _large_unmatched, transport=transport, timeout=90)
    assert out == [[], []]
