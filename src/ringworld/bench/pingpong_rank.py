"""Rank side of ``ringworld bench pingpong``: one set of timing loops, three backends.

Ranks 0 and 1 measure; any further ranks only join the final barrier.

``latency``  buffer ping-pong; half round trip per size (median of repeats), and size / half-RTT
``stream``   windowed streaming bandwidth like OSU's osu_bw: a window of isends, then one ack;
             and the CPU both ranks used meanwhile (CPU time of all their threads / wall time)
``object``   ``send_obj``/``recv_obj`` of a small dict, half round trip

Backends (chosen with ``--backend``, imported lazily so this file needs only numpy):

``ringworld``  the native API, under ``ringworld run``
``mpi4py``     ``MPI.COMM_WORLD``, under ``mpiexec`` (file path form; Ringworld is not imported)
``ringworld-mpi``  the mpi4py backend's calls through ``ringworld.MPI``, under ``ringworld run``
``socket``     a plain Python TCP stream (NODELAY, 8-byte length prefix): the floor for TCP

Every payload is checked: data is unique per 8-byte word (a bijection of index and seed),
receive buffers are overwritten with a sentinel before each repeat, the last message of every
repeat is compared on both sides, and one untimed exchange per size checks the received count.
Rank 0 writes the results, with the count of wrong bytes, counts and objects, as JSON.
"""

from __future__ import annotations

import argparse
import json
import pickle
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Bytes = npt.NDArray[np.uint8]

TAG_DATA = 1
TAG_ACK = 2
TAG_OBJ = 3
TAG_SYNC = 4
TAG_REPORT = 5
TAG_CPU = 6

ALIGN = 64  # bytes; numpy's default 16-byte alignment makes copies much slower at some sizes
SENTINEL = 0xA5
GOLDEN = 0x9E3779B97F4A7C15  # odd, so i -> (i + seed) * GOLDEN is a bijection mod 2**64
ITER_BUDGET_BYTES = 256 << 20  # bytes moved per timed repeat, at most, before iterations shrink
WINDOW_MAX = 64  # osu_bw's window
WINDOW_MIN = 4
WINDOW_BYTES = 256 << 20  # memory held by one window, at most (above WINDOW_MIN messages)
SOCKET_SMALL = 64 << 10  # socket backend: header and payload in one sendall up to this size
LATENCY_SEED = 0x51


# --------------------------------------------------------------------------------------------
# Data and checking


def aligned(nbytes: int) -> Bytes:
    """An uninitialised uint8 array of ``nbytes`` starting on an ``ALIGN``-byte boundary."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGN
    return raw[offset : offset + nbytes]


def pattern(nbytes: int, seed: int) -> Bytes:
    """Bytes unique per 8-byte word, distinct for each seed."""
    words = np.arange((nbytes + 7) // 8, dtype=np.uint64)
    words += np.uint64(seed << 40)
    words *= np.uint64(GOLDEN)
    return words.view(np.uint8)[:nbytes]


def small_object(seq: int) -> dict[str, Any]:
    """The small dict of the object ping-pong."""
    return {"kind": "pingpong", "seq": seq, "values": [1.5, 2.5, 3.5], "name": "small"}


@dataclass(slots=True)
class Checker:
    """Running totals of what was verified and what was wrong."""

    checks: int = 0
    wrong_bytes: int = 0
    wrong_counts: int = 0
    wrong_objects: int = 0

    def data(self, got: Bytes, expected: Bytes) -> None:
        """Compare a received buffer with what should be in it."""
        self.checks += 1
        self.wrong_bytes += int(np.count_nonzero(got != expected))

    def count(self, got: int, expected: int) -> None:
        """Compare a received byte count."""
        self.checks += 1
        self.wrong_counts += int(got != expected)

    def obj(self, got: object, expected: object) -> None:
        """Compare a received object."""
        self.checks += 1
        self.wrong_objects += int(got != expected)

    def merge(self, other: dict[str, int]) -> None:
        """Add another rank's totals."""
        self.checks += other["checks"]
        self.wrong_bytes += other["wrong_bytes"]
        self.wrong_counts += other["wrong_counts"]
        self.wrong_objects += other["wrong_objects"]

    @property
    def errors(self) -> int:
        """Everything found wrong."""
        return self.wrong_bytes + self.wrong_counts + self.wrong_objects


# --------------------------------------------------------------------------------------------
# Backends: bound methods of the library itself, so the timed loops add no wrapper calls


@dataclass(frozen=True, slots=True)
class Ops:
    """The point-to-point surface the kernels use (positional ``buf, peer, tag``)."""

    library: str
    rank: int
    size: int
    send: Callable[[Bytes, int, int], object]
    recv: Callable[[Bytes, int, int], object]
    recv_count: Callable[[Bytes, int, int], int]
    isend: Callable[[Bytes, int, int], object]
    irecv: Callable[[Bytes, int, int], object]
    wait_all: Callable[[list[Any]], object]
    send_obj: Callable[[Any, int, int], object]
    recv_obj: Callable[..., Any]  # keywords source=, tag=
    barrier: Callable[[], object]
    close: Callable[[], object]


def ringworld_ops() -> Ops:
    """Ops over Ringworld's world communicator (started by ``ringworld run``)."""
    from importlib.metadata import version

    import ringworld

    comm = ringworld.init()

    def recv_count(buf: Bytes, source: int, tag: int) -> int:
        return comm.recv(buf, source, tag).nbytes

    return Ops(
        library=f"ringworld {version('ringworld')}",
        rank=comm.rank,
        size=comm.size,
        send=comm.send,
        recv=comm.recv,
        recv_count=recv_count,
        isend=comm.isend,
        irecv=comm.irecv,
        wait_all=ringworld.wait_all,
        send_obj=comm.send_obj,
        recv_obj=comm.recv_obj,
        barrier=comm.barrier,
        close=ringworld.finalize,
    )


def mpi4py_ops(through_ringworld: bool = False) -> Ops:
    """Ops over mpi4py's ``COMM_WORLD`` (started by ``mpiexec``), or the same calls through
    ``ringworld.MPI`` (``through_ringworld``: started by ``ringworld run``)."""
    import importlib

    MPI: Any = importlib.import_module(  # noqa: N806 (the name mpi4py programs use)
        "ringworld.MPI" if through_ringworld else "mpi4py.MPI")
    comm = MPI.COMM_WORLD

    def recv_count(buf: Bytes, source: int, tag: int) -> int:
        status = MPI.Status()
        comm.Recv(buf, source, tag, status)
        return int(status.Get_count(MPI.BYTE))

    if through_ringworld:
        from importlib.metadata import version

        library = f"ringworld {version('ringworld')} (ringworld.MPI)"
    else:
        first = " ".join(MPI.Get_library_version().splitlines()[0].split())
        library = f"{first} (mpi4py {_mpi4py_version()})"
    return Ops(
        library=library,
        rank=comm.Get_rank(),
        size=comm.Get_size(),
        send=comm.Send,
        recv=comm.Recv,
        recv_count=recv_count,
        isend=comm.Isend,
        irecv=comm.Irecv,
        wait_all=MPI.Request.Waitall,
        send_obj=comm.send,
        recv_obj=comm.recv,
        barrier=comm.Barrier,
        close=lambda: None,
    )


def _mpi4py_version() -> str:
    import mpi4py

    return str(mpi4py.__version__)


_HEADER = struct.Struct("<Q")


class _PendingRecv:
    """A socket receive deferred to ``wait_all`` (the stream keeps messages in order)."""

    __slots__ = ("buf",)

    def __init__(self, buf: Bytes) -> None:
        self.buf = buf


class SocketLink:
    """Two ranks over one TCP connection: length-prefixed messages, nothing more."""

    def __init__(self, sock: socket.socket, rank: int) -> None:
        self.sock = sock
        self.rank = rank
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _recv_exact(self, view: memoryview) -> None:
        while view.nbytes:
            n = self.sock.recv_into(view)
            if n == 0:
                raise ConnectionError("peer closed the benchmark socket")
            view = view[n:]

    def send(self, buf: Bytes, dest: int, tag: int) -> None:
        """Send one message (``dest`` and ``tag`` are implied by the stream)."""
        if buf.nbytes <= SOCKET_SMALL:
            self.sock.sendall(_HEADER.pack(buf.nbytes) + buf.tobytes())
        else:
            self.sock.sendall(_HEADER.pack(buf.nbytes))
            self.sock.sendall(buf.data)

    def recv_count(self, buf: Bytes, source: int, tag: int) -> int:
        """Receive the next message into ``buf``; returns its length."""
        header = bytearray(_HEADER.size)
        self._recv_exact(memoryview(header))
        (n,) = _HEADER.unpack(header)
        if n > buf.nbytes:
            raise ValueError(f"message of {n} bytes does not fit a {buf.nbytes}-byte buffer")
        self._recv_exact(buf.data[:n])
        return int(n)

    def isend(self, buf: Bytes, dest: int, tag: int) -> None:
        """Send at once (the receiver reads in order, so this cannot deadlock a window)."""
        self.send(buf, dest, tag)

    def irecv(self, buf: Bytes, source: int, tag: int) -> _PendingRecv:
        """Defer the receive to ``wait_all``."""
        return _PendingRecv(buf)

    def wait_all(self, handles: list[Any]) -> None:
        """Complete deferred receives in posting order."""
        for h in handles:
            if isinstance(h, _PendingRecv):
                self.recv_count(h.buf, 1 - self.rank, TAG_DATA)

    def send_obj(self, obj: Any, dest: int, tag: int) -> None:
        """Pickle (protocol 5) and send."""
        data = pickle.dumps(obj, protocol=5)
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def recv_obj(self, source: int, tag: int) -> Any:
        """Receive and unpickle."""
        header = bytearray(_HEADER.size)
        self._recv_exact(memoryview(header))
        (n,) = _HEADER.unpack(header)
        data = bytearray(n)
        self._recv_exact(memoryview(data))
        return pickle.loads(data)

    def barrier(self) -> None:
        """Exchange an empty message each way."""
        empty = aligned(0)
        self.send(empty, 1 - self.rank, TAG_SYNC)
        self.recv_count(empty, 1 - self.rank, TAG_SYNC)


def socket_ops(rank: int, port: int | None, listen_fd: int | None) -> Ops:
    """Ops over a plain TCP connection: rank 1 accepts on ``listen_fd``, rank 0 connects."""
    if rank == 1:
        if listen_fd is None:
            raise ValueError("socket rank 1 needs --socket-fd")
        with socket.socket(fileno=listen_fd) as listener:
            sock, _ = listener.accept()
    else:
        if port is None:
            raise ValueError("socket rank 0 needs --socket-port")
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.settimeout(None)
    link = SocketLink(sock, rank)
    return Ops(
        library=f"python {sys.version.split()[0]} sockets (TCP loopback, NODELAY)",
        rank=rank,
        size=2,
        send=link.send,
        recv=link.recv_count,
        recv_count=link.recv_count,
        isend=link.isend,
        irecv=link.irecv,
        wait_all=link.wait_all,
        send_obj=link.send_obj,
        recv_obj=link.recv_obj,
        barrier=link.barrier,
        close=sock.close,
    )


# --------------------------------------------------------------------------------------------
# Kernels (ranks 0 and 1 only)


def scaled_iters(base: int, bytes_per_iter: int, minimum: int) -> int:
    """``base`` iterations, fewer when each moves many bytes, never fewer than ``minimum``."""
    if bytes_per_iter <= 0:
        return max(base, minimum)
    return max(minimum, min(base, ITER_BUDGET_BYTES // bytes_per_iter))


def window_for(nbytes: int) -> int:
    """Messages in flight per streaming round."""
    if nbytes == 0:
        return WINDOW_MAX
    return max(WINDOW_MIN, min(WINDOW_MAX, WINDOW_BYTES // nbytes))


def pair_sync(ops: Ops) -> None:
    """Start ranks 0 and 1 together (an empty message each way)."""
    empty = aligned(0)
    peer = 1 - ops.rank
    if ops.rank == 0:
        ops.send(empty, peer, TAG_SYNC)
        ops.recv(empty, peer, TAG_SYNC)
    else:
        ops.recv(empty, peer, TAG_SYNC)
        ops.send(empty, peer, TAG_SYNC)


def run_latency(
    ops: Ops, nbytes: int, iters: int, warmup: int, repeats: int, check: Checker
) -> dict[str, Any]:
    """Buffer ping-pong of ``nbytes``: half round trip in microseconds per repeat."""
    expected = pattern(nbytes, LATENCY_SEED)
    sbuf = aligned(nbytes)
    rbuf = aligned(nbytes)
    sbuf[:] = expected
    send, recv = ops.send, ops.recv
    first = ops.rank == 0

    def loop(n: int) -> int:
        t0 = time.perf_counter_ns()
        if first:
            for _ in range(n):
                send(sbuf, 1, TAG_DATA)
                recv(rbuf, 1, TAG_DATA)
        else:
            for _ in range(n):
                recv(rbuf, 0, TAG_DATA)
                send(rbuf, 0, TAG_DATA)
        return time.perf_counter_ns() - t0

    pair_sync(ops)
    loop(warmup)
    samples: list[float] = []
    for _ in range(repeats):
        rbuf.fill(SENTINEL)
        pair_sync(ops)
        samples.append(loop(iters) / (2 * iters) / 1e3)
        check.data(rbuf, expected)
    # One untimed exchange that also checks the received byte count on both sides.
    rbuf.fill(SENTINEL)
    if first:
        send(sbuf, 1, TAG_DATA)
        check.count(ops.recv_count(rbuf, 1, TAG_DATA), nbytes)
    else:
        check.count(ops.recv_count(rbuf, 0, TAG_DATA), nbytes)
        send(rbuf, 0, TAG_DATA)
    check.data(rbuf, expected)
    half_rtt = statistics.median(samples)
    return {
        "size": nbytes,
        "iters": iters,
        "repeats": repeats,
        "half_rtt_us": half_rtt,
        "min_us": min(samples),
        "pingpong_GBps": nbytes / (half_rtt * 1e3),
        "samples_us": samples,
    }


def run_stream(
    ops: Ops, nbytes: int, iters: int, warmup: int, repeats: int, check: Checker
) -> dict[str, Any]:
    """Windowed streaming from rank 0 to rank 1: GB/s (1e9 bytes/s) per repeat."""
    window = window_for(nbytes)
    first = ops.rank == 0
    bufs = [aligned(nbytes) for _ in range(window)]
    if first:
        for slot, buf in enumerate(bufs):
            buf[:] = pattern(nbytes, slot + 1)
    ack = aligned(4)
    isend, irecv, wait_all, send, recv = ops.isend, ops.irecv, ops.wait_all, ops.send, ops.recv

    def loop(n: int) -> tuple[int, int]:
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        if first:
            for _ in range(n):
                wait_all([isend(b, 1, TAG_DATA) for b in bufs])
                recv(ack, 1, TAG_ACK)
        else:
            for _ in range(n):
                wait_all([irecv(b, 0, TAG_DATA) for b in bufs])
                send(ack, 0, TAG_ACK)
        return time.perf_counter_ns() - t0, time.process_time_ns() - c0

    pair_sync(ops)
    loop(warmup)
    samples: list[float] = []
    rates: list[float] = []
    cpu: list[float] = []  # this process's CPU time (all its threads) / wall time, per repeat
    for _ in range(repeats):
        if not first:
            for buf in bufs:
                buf.fill(SENTINEL)
        pair_sync(ops)
        elapsed, used = loop(iters)
        samples.append(nbytes * window * iters / elapsed)
        rates.append(window * iters / elapsed * 1e3)
        cpu.append(used / elapsed)
        if not first:
            for slot, buf in enumerate(bufs):
                check.data(buf, pattern(nbytes, slot + 1))
    if not first:
        ops.send_obj(cpu, 0, TAG_CPU)
    else:  # both ranks' share per repeat: the cores the transfer kept busy
        cpu = [a + b for a, b in zip(cpu, ops.recv_obj(source=1, tag=TAG_CPU), strict=True)]
    return {
        "size": nbytes,
        "window": window,
        "iters": iters,
        "repeats": repeats,
        "GBps": statistics.median(samples),
        "msg_rate_M": statistics.median(rates),
        "samples_GBps": samples,
        "cpu_cores": statistics.median(cpu),
    }


def run_object(ops: Ops, iters: int, warmup: int, repeats: int, check: Checker) -> dict[str, Any]:
    """Small-dict ``send_obj``/``recv_obj`` ping-pong: half round trip in microseconds."""
    send_obj, recv_obj = ops.send_obj, ops.recv_obj
    first = ops.rank == 0

    def loop(n: int, obj: dict[str, Any]) -> tuple[int, Any]:
        got: Any = None
        t0 = time.perf_counter_ns()
        if first:
            for _ in range(n):
                send_obj(obj, 1, TAG_OBJ)
                got = recv_obj(source=1, tag=TAG_OBJ)
        else:
            for _ in range(n):
                got = recv_obj(source=0, tag=TAG_OBJ)
                send_obj(got, 0, TAG_OBJ)
        return time.perf_counter_ns() - t0, got

    pair_sync(ops)
    loop(warmup, small_object(-1))
    samples: list[float] = []
    for rep in range(repeats):
        obj = small_object(rep)
        pair_sync(ops)
        elapsed, got = loop(iters, obj)
        samples.append(elapsed / (2 * iters) / 1e3)
        check.obj(got, obj)
    return {
        "iters": iters,
        "repeats": repeats,
        "object": repr(small_object(0)),
        "object_bytes": len(pickle.dumps(small_object(0), protocol=5)),
        "half_rtt_us": statistics.median(samples),
        "min_us": min(samples),
        "samples_us": samples,
    }


# --------------------------------------------------------------------------------------------
# Driver of one rank


def measure(ops: Ops, args: argparse.Namespace, check: Checker) -> dict[str, Any]:
    """Run the requested kernels on rank 0 or 1; returns what rank 0 measured."""
    sizes: list[int] = args.sizes
    kernels = set(args.kernels)
    out: dict[str, Any] = {"latency": [], "stream": [], "object": None}
    for nbytes in sizes if "latency" in kernels else []:
        iters = scaled_iters(args.iters, 2 * nbytes, 3)
        warmup = max(1, iters // 10)
        out["latency"].append(run_latency(ops, nbytes, iters, warmup, args.repeats, check))
    for nbytes in sizes if "stream" in kernels else []:
        base = max(2, args.iters // 10)
        iters = scaled_iters(base, nbytes * window_for(nbytes), 2)
        warmup = max(1, iters // 10)
        out["stream"].append(run_stream(ops, nbytes, iters, warmup, args.repeats, check))
    if "object" in kernels:
        out["object"] = run_object(ops, args.iters, max(1, args.iters // 10), args.repeats, check)
    return out


def _sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be >= 0: {text!r}")
    return sizes


def parse_kernels(text: str) -> list[str]:
    """``latency,stream,object`` or any subset."""
    names = [k.strip() for k in text.split(",") if k.strip()]
    unknown = set(names) - {"latency", "stream", "object"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kernels {sorted(unknown)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Arguments of the rank program (the ``bench pingpong`` command fills them in)."""
    p = argparse.ArgumentParser(prog="pingpong_rank", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("ringworld", "ringworld-mpi", "mpi4py", "socket"),
                   default="ringworld")
    p.add_argument("--sizes", type=_sizes, default=[0, 8, 64, 1024, 65536, 1 << 20])
    p.add_argument("--kernels", type=parse_kernels, default=["latency", "stream", "object"])
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="JSON results (default: stdout)")
    p.add_argument("--socket-rank", type=int, choices=(0, 1), default=0)
    p.add_argument("--socket-port", type=int, default=None)
    p.add_argument("--socket-fd", type=int, default=None)
    args = p.parse_args(argv)
    if args.iters < 1 or args.repeats < 1:
        p.error("--iters and --repeats must be at least 1")
    return args


def make_ops(args: argparse.Namespace) -> Ops:
    """Start the chosen backend."""
    if args.backend == "ringworld":
        return ringworld_ops()
    if args.backend in ("mpi4py", "ringworld-mpi"):
        return mpi4py_ops(args.backend == "ringworld-mpi")
    return socket_ops(args.socket_rank, args.socket_port, args.socket_fd)


def main(argv: list[str] | None = None) -> int:
    """Measure; rank 0 writes JSON and returns 3 if any payload was wrong."""
    args = parse_args(argv)
    ops = make_ops(args)
    if ops.size < 2:
        print("pingpong_rank: needs at least 2 ranks", file=sys.stderr)
        return 2
    check = Checker()
    result: dict[str, Any] = {}
    if ops.rank <= 1:
        result = measure(ops, args, check)
        if ops.rank == 1:
            ops.send_obj(asdict(check), 0, TAG_REPORT)
        else:
            check.merge(ops.recv_obj(source=1, tag=TAG_REPORT))
    ops.barrier()
    status = 0
    if ops.rank == 0:
        result.update(library=ops.library, nranks=ops.size, verify=asdict(check))
        text = json.dumps(result, indent=1)
        if args.out is None:
            print(text)
        else:
            args.out.write_text(text)
        if check.errors:
            print(f"pingpong_rank: {check.errors} verification errors: {asdict(check)}",
                  file=sys.stderr)
            status = 3
    ops.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
