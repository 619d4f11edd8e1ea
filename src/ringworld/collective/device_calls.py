"""The collective table for device buffers: each collective's arguments checked into a device
call (:class:`~ringworld.device.plane.Prepared`) that the NCCL plane runs.

One function per host prepare function of :mod:`ringworld.collective.calls`, with the same
arguments, found through :data:`TABLE`. The checks and their messages are the host table's
(counts, displacements, in-place forms, as in MPI); what the ranks must agree on goes into the
call's record, which the plane's check compares across ranks. NCCL's five collectives run
natively; the rest are NCCL sends and receives in one group call. Buffers must all be on one GPU
(a host buffer beside a device buffer is a TypeError); reductions take NCCL's ops only.

Cost: describing the buffers and a few checks (microseconds); no host round trip.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ringworld.collective import buffers as bufs
from ringworld.collective import calls
from ringworld.collective.markers import IN_PLACE
from ringworld.comm import ops
from ringworld.device import buffers, cuda, nccl
from ringworld.device.buffers import DeviceArray
from ringworld.device.plane import Prepared, active_stream, given_stream

BYTES = nccl.DTYPES["uint8"]  # what the collectives that only move data move
_BUILTIN = {id(ops.SUM): "sum", id(ops.PROD): "prod", id(ops.MAX): "max", id(ops.MIN): "min"}


class Frame(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def _root(self, root: int) -> int: ...


class _Args:
    """A call's device buffers, described: one GPU, one stream."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.arrays: list[DeviceArray] = []
        self.stream: int | None = given_stream()  # else the first buffer's library's
        self.device: int | None = None
        self.first = ""

    def take(self, obj: Any, name: str, writable: bool = False) -> DeviceArray:
        """``obj`` described. Raises: TypeError (host memory, read-only, another GPU...)."""
        if obj is None or obj is IN_PLACE:
            raise TypeError(f"{self.what}: {name} is required here (got {obj!r})")
        a = buffers.describe(obj, name, self.stream)
        if a is None:
            raise TypeError(f"{self.what}: {name} is in host memory, and the call's other "
                            "buffers are on a GPU: one call takes buffers of one kind (move "
                            "it to the GPU, or the others to the host)")
        if writable and a.readonly:
            raise TypeError(f"{self.what}: {name} is read-only")
        if self.stream is None:
            self.stream = active_stream([a])
        if a.device >= 0:
            if self.device is None:
                self.device, self.first = a.device, name
            elif a.device != self.device:
                raise TypeError(f"{self.what}: {name} is on GPU {a.device} and {self.first} "
                                f"on GPU {self.device}: one call's buffers must be on one GPU")
        self.arrays.append(a)
        return a

    def dtype(self, a: DeviceArray, name: str) -> int:
        return nccl.dtype(a.dtype, f"{self.what}: {name}")

    def done(self, record: str, enqueue: Callable[[Any, int], None],
             flows: tuple[list[int], list[int]] | None = None) -> Prepared:
        """The checked call. Asks CUDA which GPU holds buffers that do not say (after every
        other check, so that argument errors are found first, with or without a GPU).

        Raises:
            TypeError: buffers on two GPUs. DeviceUnavailable: no CUDA driver or device.
        """
        nccl.load()  # a call with no NCCL here fails now, saying how to install it
        for a in self.arrays:
            if a.device < 0:
                device = cuda.pointer_device(a.ptr) if a.ptr else (
                    self.device if self.device is not None else cuda.current_device())
                if self.device is None:
                    self.device = device
                elif device != self.device:
                    raise TypeError(f"{self.what}: the buffers are on GPUs {self.device} and "
                                    f"{device}: one call's buffers must be on one GPU")
        assert self.device is not None and self.stream is not None
        return Prepared(self.what, record, self.device, self.stream, enqueue,
                        tuple(self.arrays), flows)


def op_name(op: Any) -> str:
    """A reduction op as NCCL's name. Raises: TypeError (not one NCCL has: user-defined and
    logical ops need host buffers)."""
    name = _BUILTIN.get(id(op))
    if name is not None:
        return name
    if isinstance(op, str) and op.lower() in nccl.OPS:
        return op.lower()
    label = op if isinstance(op, str) else str(getattr(op, "name", type(op).__name__))
    nccl.op(f"{label} (user-defined)" if label in nccl.OPS else label)  # raises TypeError
    raise AssertionError(label)


def _digest(values: Sequence[int] | None) -> str:
    return "-" if values is None else f"{zlib.crc32(repr(tuple(values)).encode()):08x}"


def _b() -> Any:
    return nccl.load()


# ------------------------------------------------------------------ NCCL's own five
def bcast(f: Frame, buf: Any, root: int) -> Prepared:
    root = f._root(root)
    g = _Args("bcast")
    a = g.take(buf, "buf", writable=f.rank != root)

    def enqueue(comm: Any, s: int) -> None:
        _b().broadcast(a.ptr, a.ptr, a.nbytes, BYTES, root, comm, s)
    return g.done(f"bcast n={a.elements} {a.dtype} root={root}", enqueue)


def reduce(f: Frame, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> Prepared:
    root = f._root(root)
    g = _Args("reduce")
    if f.rank == root:
        rb = g.take(recvbuf, "recvbuf", writable=True)
        sb = rb if sendbuf is IN_PLACE else g.take(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        bufs.check_len(rb, sb.elements, "recvbuf", "the size of sendbuf")
    else:
        sb = g.take(sendbuf, "sendbuf")
        rb = sb  # NCCL writes only the root's
    name = op_name(op)
    dt, o = g.dtype(sb, "sendbuf"), nccl.op(name)

    def enqueue(comm: Any, s: int) -> None:
        _b().reduce(sb.ptr, rb.ptr, sb.elements, dt, o, root, comm, s)
    return g.done(f"reduce n={sb.elements} {sb.dtype} op={name} root={root}", enqueue)


def allreduce(f: Frame, sendbuf: Any, recvbuf: Any, op: Any) -> Prepared:
    g = _Args("allreduce")
    rb = g.take(recvbuf, "recvbuf", writable=True)
    sb = rb if sendbuf is IN_PLACE else g.take(sendbuf, "sendbuf")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(rb, sb.elements, "recvbuf", "the size of sendbuf")
    name = op_name(op)
    dt, o = g.dtype(rb, "recvbuf"), nccl.op(name)

    def enqueue(comm: Any, s: int) -> None:
        _b().all_reduce(sb.ptr, rb.ptr, rb.elements, dt, o, comm, s)
    return g.done(f"allreduce n={rb.elements} {rb.dtype} op={name}", enqueue)


def allgather(f: Frame, sendbuf: Any, recvbuf: Any, counts: calls.Counts,
              displs: calls.Counts) -> Prepared:
    p, r = f.size, f.rank
    coll = "allgather" if counts is None else "allgatherv"
    g = _Args(coll)
    rb = g.take(recvbuf, "recvbuf", writable=True)
    if counts is None:
        n = bufs.blocks_of(rb, p, "recvbuf")
        if sendbuf is IN_PLACE:
            sp = rb.at(r * n)
        else:
            sb = g.take(sendbuf, "sendbuf")
            bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            sp = sb.ptr

        def enqueue(comm: Any, s: int) -> None:
            _b().all_gather(sp, rb.ptr, n * rb.itemsize, BYTES, comm, s)
        return g.done(f"allgather n={n} {rb.dtype}", enqueue)
    c, d = bufs.layout(counts, displs, p, rb, "counts", "displs", "recvbuf")
    if sendbuf is IN_PLACE:
        sp = rb.at(d[r])
    else:
        sb = g.take(sendbuf, "sendbuf")
        bufs.check_len(sb, c[r], "sendbuf", "counts[rank]")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        sp = sb.ptr
    sends = [(peer, sp, c[r] * rb.itemsize) for peer in range(p)]
    recvs = _blocks(rb, c, d, range(p))

    def enqueue_v(comm: Any, s: int) -> None:
        _exchange(_b(), comm, s, sends, recvs)
    return g.done(f"allgatherv {rb.dtype} counts={_digest(c)}", enqueue_v)


def reduce_scatter(f: Frame, sendbuf: Any, recvbuf: Any, counts: calls.Counts,
                   op: Any) -> Prepared:
    p, r = f.size, f.rank
    coll = "reduce_scatter" if counts is not None else "reduce_scatter_block"
    g = _Args(coll)
    rb = g.take(recvbuf, "recvbuf", writable=True)
    if sendbuf is IN_PLACE:
        sb = rb
        c = (bufs.int_list(counts, p, "counts") if counts is not None
             else (bufs.blocks_of(rb, p, "recvbuf"),) * p)
        bufs.check_len(sb, sum(c), "recvbuf", "IN_PLACE input: the sum of all blocks")
    else:
        sb = g.take(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        c = bufs.int_list(counts, p, "counts") if counts is not None else (rb.elements,) * p
        bufs.check_len(sb, sum(c), "sendbuf", "the sum of all blocks")
        bufs.check_len(rb, c[r], "recvbuf", "this rank's block")
    name = op_name(op)
    dt, o = g.dtype(rb, "recvbuf"), nccl.op(name)
    offsets = [sum(c[:i]) for i in range(p)]
    in_place = sendbuf is IN_PLACE
    equal = counts is None

    def enqueue(comm: Any, s: int) -> None:
        b = _b()
        # MPI's in-place result lands at the start of recvbuf; NCCL's at this rank's block
        out = rb.at(offsets[r]) if in_place else rb.ptr
        if equal:
            b.reduce_scatter(sb.ptr, out, c[r], dt, o, comm, s)
        else:
            b.group_start()
            try:
                for root in range(p):
                    b.reduce(sb.at(offsets[root]), out if root == r else sb.at(offsets[root]),
                             c[root], dt, o, root, comm, s)
            finally:
                b.group_end()
        if in_place and offsets[r]:
            cuda.copy(rb.ptr, out, c[r] * rb.itemsize, s)
    return g.done(f"{coll} {rb.dtype} op={name} counts={_digest(c)}", enqueue)


# ------------------------------------------------------------------ from sends and receives
def _exchange(b: Any, comm: Any, s: int, sends: Sequence[tuple[int, int, int]],
              recvs: Sequence[tuple[int, int, int]]) -> None:
    """One group call of byte sends (peer, address, bytes) and receives."""
    b.group_start()
    try:
        for peer, ptr, n in sends:
            if n:
                b.send(ptr, n, BYTES, peer, comm, s)
        for peer, ptr, n in recvs:
            if n:
                b.recv(ptr, n, BYTES, peer, comm, s)
    finally:
        b.group_end()


def _flows(p: int, sends: Sequence[tuple[int, int, int]],
           recvs: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """(bytes sent to each rank, bytes expected from each rank; -1 where none) of a call's
    (peer, address, bytes) sends and receives, for the plane's check."""
    sent, expected = [-1] * p, [-1] * p
    for peer, _, n in sends:
        sent[peer] = n
    for peer, _, n in recvs:
        expected[peer] = n
    return sent, expected


def _blocks(base: DeviceArray, counts: Sequence[int], displs: Sequence[int],
            peers: Sequence[int]) -> list[tuple[int, int, int]]:
    return [(i, base.at(displs[i]), counts[i] * base.itemsize) for i in peers]


def gather(f: Frame, sendbuf: Any, recvbuf: Any, root: int) -> Prepared:
    p, r = f.size, f.rank
    root = f._root(root)
    g = _Args("gather")
    if r == root:
        rb = g.take(recvbuf, "recvbuf", writable=True)
        n = bufs.blocks_of(rb, p, "recvbuf")
        sb = None if sendbuf is IN_PLACE else g.take(sendbuf, "sendbuf")
        if sb is not None:
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
        dtype = rb.dtype
        recvs = _blocks(rb, [n] * p, [i * n for i in range(p)], [i for i in range(p) if i != r])

        def enqueue(comm: Any, s: int) -> None:
            if sb is not None:
                cuda.copy(rb.at(r * n), sb.ptr, n * rb.itemsize, s)
            _exchange(_b(), comm, s, (), recvs)
    else:
        sb = g.take(sendbuf, "sendbuf")
        n, dtype = sb.elements, sb.dtype
        sends = [(root, sb.ptr, sb.nbytes)]

        def enqueue(comm: Any, s: int) -> None:
            _exchange(_b(), comm, s, sends, ())
    return g.done(f"gather n={n} {dtype} root={root}", enqueue)


def gatherv(f: Frame, sendbuf: Any, recvbuf: Any, counts: calls.Counts, displs: calls.Counts,
            root: int) -> Prepared:
    p, r = f.size, f.rank
    root = f._root(root)
    g = _Args("gatherv")
    if r == root:
        rb = g.take(recvbuf, "recvbuf", writable=True)
        if counts is None:
            raise TypeError("counts is required at the root")
        c, d = bufs.layout(counts, displs, p, rb, "counts", "displs", "recvbuf")
        sb = None if sendbuf is IN_PLACE else g.take(sendbuf, "sendbuf")
        if sb is not None:
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(sb, c[r], "sendbuf", "counts[root]")
        recvs = _blocks(rb, c, d, [i for i in range(p) if i != r])
        sends: list[tuple[int, int, int]] = []
        dtype = rb.dtype

        def enqueue(comm: Any, s: int) -> None:
            if sb is not None:
                cuda.copy(rb.at(d[r]), sb.ptr, c[r] * rb.itemsize, s)
            _exchange(_b(), comm, s, (), recvs)
    else:
        sb = g.take(sendbuf, "sendbuf")
        sends = [(root, sb.ptr, sb.nbytes)]
        recvs = []
        dtype = sb.dtype

        def enqueue(comm: Any, s: int) -> None:
            _exchange(_b(), comm, s, sends, ())
    # the counts are the root's alone: the check compares them with each rank's size
    return g.done(f"gatherv {dtype} root={root}", enqueue,
                  _flows(p, sends, recvs))


def scatter(f: Frame, sendbuf: Any, recvbuf: Any, root: int) -> Prepared:
    p, r = f.size, f.rank
    root = f._root(root)
    g = _Args("scatter")
    if r == root:
        sb = g.take(sendbuf, "sendbuf")
        n = bufs.blocks_of(sb, p, "sendbuf")
        rb = None if recvbuf is IN_PLACE else g.take(recvbuf, "recvbuf", writable=True)
        if rb is not None:
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(rb, n, "recvbuf", "sendbuf holds size blocks of this length")
        sends = _blocks(sb, [n] * p, [i * n for i in range(p)], [i for i in range(p) if i != r])
        dtype = sb.dtype

        def enqueue(comm: Any, s: int) -> None:
            if rb is not None:
                cuda.copy(rb.ptr, sb.at(r * n), n * sb.itemsize, s)
            _exchange(_b(), comm, s, sends, ())
    else:
        rb = g.take(recvbuf, "recvbuf", writable=True)
        n, dtype = rb.elements, rb.dtype
        recvs = [(root, rb.ptr, rb.nbytes)]

        def enqueue(comm: Any, s: int) -> None:
            _exchange(_b(), comm, s, (), recvs)
    return g.done(f"scatter n={n} {dtype} root={root}", enqueue)


def scatterv(f: Frame, sendbuf: Any, recvbuf: Any, counts: calls.Counts, displs: calls.Counts,
             root: int) -> Prepared:
    p, r = f.size, f.rank
    root = f._root(root)
    g = _Args("scatterv")
    if r == root:
        sb = g.take(sendbuf, "sendbuf")
        if counts is None:
            raise TypeError("counts is required at the root")
        c, d = bufs.layout(counts, displs, p, sb, "counts", "displs", "sendbuf")
        rb = None if recvbuf is IN_PLACE else g.take(recvbuf, "recvbuf", writable=True)
        if rb is not None:
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(rb, c[r], "recvbuf", "counts[root]")
        sends = _blocks(sb, c, d, [i for i in range(p) if i != r])
        recvs: list[tuple[int, int, int]] = []
        dtype = sb.dtype

        def enqueue(comm: Any, s: int) -> None:
            if rb is not None:
                cuda.copy(rb.ptr, sb.at(d[r]), c[r] * sb.itemsize, s)
            _exchange(_b(), comm, s, sends, ())
    else:
        rb = g.take(recvbuf, "recvbuf", writable=True)
        recvs = [(root, rb.ptr, rb.nbytes)]
        sends = []
        dtype = rb.dtype

        def enqueue(comm: Any, s: int) -> None:
            _exchange(_b(), comm, s, (), recvs)
    return g.done(f"scatterv {dtype} root={root}", enqueue,
                  _flows(p, sends, recvs))


def alltoall(f: Frame, sendbuf: Any, recvbuf: Any) -> Prepared:
    p = f.size
    g = _Args("alltoall")
    rb = g.take(recvbuf, "recvbuf", writable=True)
    n = bufs.blocks_of(rb, p, "recvbuf")
    in_place = sendbuf is IN_PLACE
    sb = rb if in_place else g.take(sendbuf, "sendbuf")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(sb, rb.elements, "sendbuf", "the size of recvbuf")
    displs = [i * n for i in range(p)]

    def enqueue(comm: Any, s: int) -> None:
        _all_to_all(comm, s, sb, rb, [n] * p, displs, [n] * p, displs, in_place)
    return g.done(f"alltoall n={n} {rb.dtype}", enqueue)


def _all_to_all(comm: Any, s: int, sb: DeviceArray, rb: DeviceArray, sc: Sequence[int],
                sd: Sequence[int], rc: Sequence[int], rd: Sequence[int], in_place: bool) -> None:
    """Every block to its peer in one group call; in place, the input is copied first (the
    scratch is freed in the stream's order, after the group's work)."""
    p = len(sc)
    copy = 0
    src = sb
    if in_place:
        copy = cuda.scratch(rb.nbytes, s)
        cuda.copy(copy, rb.ptr, rb.nbytes, s)
        src = sb._replace(ptr=copy)
    try:
        _exchange(_b(), comm, s, _blocks(src, sc, sd, range(p)), _blocks(rb, rc, rd, range(p)))
    finally:
        if copy:
            cuda.release(copy, s)


def alltoallv(f: Frame, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
              recvcounts: Sequence[int], sdispls: calls.Counts,
              rdispls: calls.Counts) -> Prepared:
    p, r = f.size, f.rank
    g = _Args("alltoallv")
    rb = g.take(recvbuf, "recvbuf", writable=True)
    rc, rd = bufs.layout(recvcounts, rdispls, p, rb, "recvcounts", "rdispls", "recvbuf")
    in_place = sendbuf is IN_PLACE
    if in_place:
        sb, sc, sd = rb, rc, rd
    else:
        sb = g.take(sendbuf, "sendbuf")
        sc, sd = bufs.layout(sendcounts, sdispls, p, sb, "sendcounts", "sdispls", "sendbuf")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_own_block(sc, rc, r)

    def enqueue(comm: Any, s: int) -> None:
        _all_to_all(comm, s, sb, rb, sc, sd, rc, rd, in_place)
    isz = rb.itemsize
    return g.done(f"alltoallv {rb.dtype}", enqueue,
                  ([n * isz for n in sc], [n * isz for n in rc]))


def alltoallw(f: Frame, sendbufs: Sequence[Any], recvbufs: Sequence[Any]) -> Prepared:
    p, r = f.size, f.rank
    g = _Args("alltoallw")
    sends = [g.take(b, f"sendbufs[{i}]") for i, b in enumerate(bufs.seq(sendbufs, p,
                                                                        "sendbufs"))]
    recvs = [g.take(b, f"recvbufs[{i}]", writable=True)
             for i, b in enumerate(bufs.seq(recvbufs, p, "recvbufs"))]
    if recvs[r].nbytes != sends[r].nbytes:
        raise ValueError(f"recvbufs[{r}] has {recvs[r].nbytes} bytes but {sends[r].nbytes} "
                         f"are needed (the bytes of sendbufs[{r}])")
    out = [(i, a.ptr, a.nbytes) for i, a in enumerate(sends)]
    into = [(i, a.ptr, a.nbytes) for i, a in enumerate(recvs)]

    def enqueue(comm: Any, s: int) -> None:
        _exchange(_b(), comm, s, out, into)
    return g.done("alltoallw", enqueue, _flows(p, out, into))


def scan(f: Frame, coll: str, sendbuf: Any, recvbuf: Any, op: Any) -> Prepared:
    """scan/exscan of torch CUDA tensors or CuPy arrays: every rank's input gathered (NCCL
    allgather into scratch of the array's library), then the prefix reduced by that library's
    kernels on the call's stream. Other device arrays: TypeError (NCCL has no prefix reduction
    and Ringworld has no kernels of its own). Cost: size times the vector in scratch."""
    p, r = f.size, f.rank
    g = _Args(coll)
    rb = g.take(recvbuf, "recvbuf", writable=True)
    sb = rb if sendbuf is IN_PLACE else g.take(sendbuf, "sendbuf")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(rb, sb.elements, "recvbuf", "the size of sendbuf")
    name = op_name(op)
    if name == "avg":
        raise TypeError(f"{coll} has no AVG (MPI's scans take SUM, PROD, MAX, MIN)")
    lib = _library(rb.keep)
    if lib is None:
        raise TypeError(f"{coll} of device buffers needs torch CUDA tensors or CuPy arrays "
                        "(their kernels reduce the prefix: NCCL has no prefix reduction); "
                        f"got {type(rb.keep).__name__}")
    g.dtype(rb, "recvbuf")
    n, src, dst = rb.elements, sb.keep, rb.keep

    def enqueue(comm: Any, s: int) -> None:
        lib.prefix(comm, s, src, dst, n, p, r, name, coll == "exscan")
    return g.done(f"{coll} n={n} {rb.dtype} op={name}", enqueue)


class _Prefix:
    """A prefix reduction in one array library's kernels (see :func:`scan`)."""

    def __init__(self, module: str) -> None:
        self.module = module

    def prefix(self, comm: Any, s: int, src: Any, dst: Any, n: int, p: int, r: int,
               op: str, exclusive: bool) -> None:
        lib = sys.modules[self.module]
        torch = self.module == "torch"
        stream = lib.cuda.ExternalStream(s)
        with (lib.cuda.stream(stream) if torch else stream):
            flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
            if torch:
                every = lib.empty(p * n, dtype=flat_src.dtype, device=flat_src.device)
                sp, ep, isz = flat_src.data_ptr(), every.data_ptr(), flat_src.element_size()
            else:
                every = lib.empty(p * n, dtype=flat_src.dtype)
                sp, ep, isz = flat_src.data.ptr, every.data.ptr, flat_src.itemsize
            _b().all_gather(sp, ep, n * isz, BYTES, comm, s)
            upto = r if exclusive else r + 1
            if upto == 0:
                return  # exscan's rank 0: recvbuf is undefined, as in MPI
            rows = every.reshape(p, n)[:upto]
            reduce = {"sum": "sum", "prod": "prod", "max": "amax" if torch else "max",
                      "min": "amin" if torch else "min"}[op]
            out = getattr(rows, reduce)(0) if torch else getattr(rows, reduce)(axis=0)
            if torch:
                flat_dst.copy_(out.to(flat_dst.dtype))
            else:
                flat_dst[...] = out.astype(flat_dst.dtype)


def _library(obj: Any) -> _Prefix | None:
    module = type(obj).__module__.split(".")[0]
    return _Prefix(module) if module in ("torch", "cupy") and module in sys.modules else None


#: the host table's prepare function -> the device one, for the same arguments
TABLE: dict[Callable[..., Any], Callable[..., Prepared]] = {
    calls.bcast: bcast, calls.reduce: reduce, calls.allreduce: allreduce,
    calls.allgather: allgather, calls.reduce_scatter: reduce_scatter, calls.gather: gather,
    calls.gatherv: gatherv, calls.scatter: scatter, calls.scatterv: scatterv,
    calls.alltoall: alltoall, calls.alltoallv: alltoallv, calls.alltoallw: alltoallw,
    calls.scan: scan,
}
