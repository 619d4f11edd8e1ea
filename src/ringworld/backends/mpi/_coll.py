"""Buffer collectives of the MPI backend: each native call as one nonblocking MPI call.

Every collective starts the MPI ``I``-form (``Iallreduce``, ...) and returns a
:class:`~ringworld.backends.mpi._requests.MpiRequest`; the blocking form waits on it
(``MPI.Wait`` when no timeout applies). Data-moving collectives move bytes (``MPI.BYTE``,
counts and displacements scaled by the item size), so any dtype works; reductions use
:func:`ringworld.backends.mpi._ops.reduction`. Arguments are checked as the native communicator
checks them (``ValueError``/``TypeError`` naming the argument). ``algorithm=`` is accepted and
ignored: the MPI library chooses (``last_algorithm`` is ``"mpi"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ringworld.backends.mpi._base import ALGORITHM, Base, translating
from ringworld.backends.mpi._ops import reduction
from ringworld.backends.mpi._requests import MpiRequest
from ringworld.collective import buffers as bufs
from ringworld.comm import ops
from ringworld.comm.requests import Request

OpLike = ops.Op | str
Counts = Sequence[int]


def _scaled(values: Sequence[int], itemsize: int) -> list[int]:
    return [v * itemsize for v in values]


@translating
class Collectives(Base):
    """The buffer collectives (blocking and ``i`` forms)."""

    def _go(self, req: Any, what: str, keep: object, blocking: bool,
            timeout: float | None) -> Request[None]:
        self.last_algorithm = ALGORITHM
        r: MpiRequest[None] = MpiRequest(self._poller, req, f"{what} on {self.name!r}",
                                         keep=keep)
        if blocking:
            r.wait(timeout)
        return r

    def _red(self, op: OpLike, a: bufs.Array, n: int) -> tuple[Any, Any, Any]:
        dt, mop = reduction(ops.resolve(op), a.dtype)
        return dt, mop, [a.view(np.uint8), n, dt]

    # ------------------------------------------------------------------ barrier, bcast
    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Wait until every rank has entered. Raises: Timeout."""
        self._barrier(True, timeout)

    def ibarrier(self, *, algorithm: str | None = None) -> Request[None]:
        """Start a barrier."""
        return self._barrier(False, None)

    def _barrier(self, blocking: bool, timeout: float | None) -> Request[None]:
        return self._go(self._c.Ibarrier(), "barrier", None, blocking, timeout)

    def bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None,
              timeout: float | None = None) -> None:
        """Broadcast ``buf`` from ``root`` into every rank's ``buf`` (in place)."""
        self._bcast(buf, root, True, timeout)

    def ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request[None]:
        """Start a bcast."""
        return self._bcast(buf, root, False, None)

    def _bcast(self, buf: Any, root: int, blocking: bool, timeout: float | None) -> Request[None]:
        root = self._root(root)
        a = self._arr(buf, "buf", writable=self.rank != root)
        spec = self._bytes(a)
        return self._go(self._c.Ibcast(spec, root), "bcast", spec, blocking, timeout)

    # ------------------------------------------------------------------ reductions
    def reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """``op`` over every rank's ``sendbuf`` into ``recvbuf`` at ``root`` (None elsewhere)."""
        self._reduce(sendbuf, recvbuf, op, root, True, timeout)

    def ireduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a reduce."""
        return self._reduce(sendbuf, recvbuf, op, root, False, None)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike, root: int, blocking: bool,
                timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            rb = self._arr(recvbuf, "recvbuf", writable=True)
            sb = None if self._in_place(sendbuf) else self._arr(sendbuf, "sendbuf")
            if sb is not None:
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
            _, mop, rspec = self._red(op, rb, rb.size)
            sspec = MPI.IN_PLACE if sb is None else [sb.view(np.uint8), rb.size, rspec[2]]
        else:
            sb = self._arr(sendbuf, "sendbuf")
            _, mop, sspec = self._red(op, sb, sb.size)
            rspec = None
        req = self._c.Ireduce(sspec, rspec, mop, root)
        return self._go(req, "reduce", (sspec, rspec, mop), blocking, timeout)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """``op`` over every rank's ``sendbuf`` into every rank's ``recvbuf``."""
        self._allreduce(sendbuf, recvbuf, op, True, timeout)

    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allreduce."""
        return self._allreduce(sendbuf, recvbuf, op, False, None)

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike, blocking: bool,
                   timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        sspec = self._same(sendbuf, rb, rb.size)
        _, mop, rspec = self._red(op, rb, rb.size)
        if sspec is not MPI.IN_PLACE:
            sspec = [sspec, rb.size, rspec[2]]
        req = self._c.Iallreduce(sspec, rspec, mop)
        return self._go(req, "allreduce", (sspec, rspec, mop), blocking, timeout)

    def _same(self, sendbuf: Any, rb: bufs.Array, n: int) -> Any:
        """IN_PLACE, or ``sendbuf``'s bytes after checking its dtype and size (``n``)."""
        if self._in_place(sendbuf):
            return MPI.IN_PLACE
        sb = self._arr(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        bufs.check_len(sb, n, "sendbuf", "as recvbuf needs")
        return sb.view(np.uint8)

    def reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Reduce ``size * len(recvbuf)`` elements; rank i gets block i."""
        self._rsb(sendbuf, recvbuf, op, True, timeout)

    def ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                              algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter_block."""
        return self._rsb(sendbuf, recvbuf, op, False, None)

    def _rsb(self, sendbuf: Any, recvbuf: Any, op: OpLike, blocking: bool,
             timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        n = rb.size // self.size if self._in_place(sendbuf) else rb.size
        sspec = self._same(sendbuf, rb, n * self.size)
        _, mop, rspec = self._red(op, rb, n)
        if sspec is not MPI.IN_PLACE:
            sspec = [sspec, rspec[2]]  # mpi4py takes the count per block from the size
        req = self._c.Ireduce_scatter_block(sspec, rspec, mop)
        return self._go(req, "reduce_scatter_block", (sspec, rspec, mop), blocking, timeout)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Counts, op: OpLike = ops.SUM,
                       *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Reduce ``sum(counts)`` elements; rank i gets the ``counts[i]`` after block i-1."""
        self._rs(sendbuf, recvbuf, counts, op, True, timeout)

    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                        op: OpLike = ops.SUM, *, algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter."""
        return self._rs(sendbuf, recvbuf, counts, op, False, None)

    def _rs(self, sendbuf: Any, recvbuf: Any, counts: Counts, op: OpLike, blocking: bool,
            timeout: float | None) -> Request[None]:
        c = list(bufs.int_list(counts, self.size, "counts"))
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        if not self._in_place(sendbuf):
            bufs.check_len(rb, c[self.rank], "recvbuf", f"counts[{self.rank}]")
        sspec = self._same(sendbuf, rb, sum(c))
        _, mop, rspec = self._red(op, rb, c[self.rank])
        if sspec is not MPI.IN_PLACE:
            sspec = [sspec, rspec[2]]
        req = self._c.Ireduce_scatter(sspec, rspec, c, mop)
        return self._go(req, "reduce_scatter", (sspec, rspec, mop), blocking, timeout)

    def scan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Inclusive prefix reduction: rank i gets ``op`` over ranks 0..i."""
        self._scan(sendbuf, recvbuf, op, False, True, timeout)

    def iscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
              algorithm: str | None = None) -> Request[None]:
        """Start a scan."""
        return self._scan(sendbuf, recvbuf, op, False, False, None)

    def exscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Exclusive prefix reduction: rank i gets ``op`` over ranks 0..i-1 (rank 0 untouched)."""
        self._scan(sendbuf, recvbuf, op, True, True, timeout)

    def iexscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                algorithm: str | None = None) -> Request[None]:
        """Start an exscan."""
        return self._scan(sendbuf, recvbuf, op, True, False, None)

    def _scan(self, sendbuf: Any, recvbuf: Any, op: OpLike, exclusive: bool, blocking: bool,
              timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        sspec = self._same(sendbuf, rb, rb.size)
        target = rb
        if exclusive and self.rank == 0:  # MPI leaves it undefined; ringworld leaves it alone
            target = np.empty_like(rb)
            if sspec is MPI.IN_PLACE:
                sspec = rb.view(np.uint8)
        _, mop, rspec = self._red(op, target, rb.size)
        if sspec is not MPI.IN_PLACE:
            sspec = [sspec, rb.size, rspec[2]]
        call = self._c.Iexscan if exclusive else self._c.Iscan
        req = call(sspec, rspec, mop)
        return self._go(req, "exscan" if exclusive else "scan", (sspec, rspec, mop), blocking,
                        timeout)

    # ------------------------------------------------------------------ gather / scatter
    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Every rank's ``sendbuf`` into block i of ``recvbuf`` at ``root``."""
        self._gather(sendbuf, recvbuf, root, True, timeout)

    def igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a gather."""
        return self._gather(sendbuf, recvbuf, root, False, None)

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, blocking: bool,
                timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            rb = self._arr(recvbuf, "recvbuf", writable=True)
            n = bufs.blocks_of(rb, self.size, "recvbuf")
            sb = self._same(sendbuf, rb, n)
            sspec = sb if sb is MPI.IN_PLACE else [sb, n * rb.itemsize, MPI.BYTE]
            rspec = self._block(rb, n)
        else:
            sspec, rspec = self._bytes(self._arr(sendbuf, "sendbuf")), None
        req = self._c.Igather(sspec, rspec, root)
        return self._go(req, "gather", (sspec, rspec), blocking, timeout)

    def gatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                displs: Counts | None = None, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Gather blocks of different sizes; ``counts``/``displs`` (elements) at the root."""
        self._gatherv(sendbuf, recvbuf, counts, displs, root, True, timeout)

    def igatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                 displs: Counts | None = None, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a gatherv."""
        return self._gatherv(sendbuf, recvbuf, counts, displs, root, False, None)

    def _gatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None,
                 displs: Counts | None, root: int, blocking: bool,
                 timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            rb = self._arr(recvbuf, "recvbuf", writable=True)
            if counts is None:
                raise TypeError("counts is required at the root")
            c, d = bufs.layout(counts, displs, self.size, rb, "counts", "displs", "recvbuf")
            sb = self._same(sendbuf, rb, c[root])
            sspec = sb if sb is MPI.IN_PLACE else [sb, sb.nbytes, MPI.BYTE]
            isz = rb.itemsize
            rspec = [rb.view(np.uint8), (_scaled(c, isz), _scaled(d, isz)), MPI.BYTE]
        else:
            sspec, rspec = self._bytes(self._arr(sendbuf, "sendbuf")), None
        req = self._c.Igatherv(sspec, rspec, root)
        return self._go(req, "gatherv", (sspec, rspec), blocking, timeout)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Block i of ``sendbuf`` at ``root`` into rank i's ``recvbuf``."""
        self._scatter(sendbuf, recvbuf, root, True, timeout)

    def iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a scatter."""
        return self._scatter(sendbuf, recvbuf, root, False, None)

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, blocking: bool,
                 timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            sb = self._arr(sendbuf, "sendbuf")
            n = bufs.blocks_of(sb, self.size, "sendbuf")
            sspec = self._block(sb, n)
            if self._in_place(recvbuf):
                rspec: Any = MPI.IN_PLACE
            else:
                rb = self._arr(recvbuf, "recvbuf", writable=True)
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, n, "recvbuf", "one block of sendbuf")
                rspec = self._bytes(rb)
        else:
            sspec, rspec = None, self._bytes(self._arr(recvbuf, "recvbuf", writable=True))
        req = self._c.Iscatter(sspec, rspec, root)
        return self._go(req, "scatter", (sspec, rspec), blocking, timeout)

    def scatterv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                 displs: Counts | None = None, root: int = 0, *,
                 algorithm: str | None = None, timeout: float | None = None) -> None:
        """Scatter blocks of different sizes; ``counts``/``displs`` (elements) at the root."""
        self._scatterv(sendbuf, recvbuf, counts, displs, root, True, timeout)

    def iscatterv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                  displs: Counts | None = None, root: int = 0, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start a scatterv."""
        return self._scatterv(sendbuf, recvbuf, counts, displs, root, False, None)

    def _scatterv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None,
                  displs: Counts | None, root: int, blocking: bool,
                  timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            sb = self._arr(sendbuf, "sendbuf")
            if counts is None:
                raise TypeError("counts is required at the root")
            c, d = bufs.layout(counts, displs, self.size, sb, "counts", "displs", "sendbuf")
            isz = sb.itemsize
            sspec: Any = [sb.view(np.uint8), (_scaled(c, isz), _scaled(d, isz)), MPI.BYTE]
            if self._in_place(recvbuf):
                rspec: Any = MPI.IN_PLACE
            else:
                rb = self._arr(recvbuf, "recvbuf", writable=True)
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, c[root], "recvbuf", f"counts[{root}]")
                rspec = self._bytes(rb)
        else:
            sspec, rspec = None, self._bytes(self._arr(recvbuf, "recvbuf", writable=True))
        req = self._c.Iscatterv(sspec, rspec, root)
        return self._go(req, "scatterv", (sspec, rspec), blocking, timeout)

    # ------------------------------------------------------------------ allgather, alltoall
    def allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Every rank's ``sendbuf`` into block i of every rank's ``recvbuf``."""
        self._allgather(sendbuf, recvbuf, True, timeout)

    def iallgather(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allgather."""
        return self._allgather(sendbuf, recvbuf, False, None)

    def _allgather(self, sendbuf: Any, recvbuf: Any, blocking: bool,
                   timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        n = bufs.blocks_of(rb, self.size, "recvbuf")
        sb = self._same(sendbuf, rb, n)
        sspec = sb if sb is MPI.IN_PLACE else [sb, n * rb.itemsize, MPI.BYTE]
        rspec = self._block(rb, n)
        req = self._c.Iallgather(sspec, rspec)
        return self._go(req, "allgather", (sspec, rspec), blocking, timeout)

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                   displs: Counts | None = None, *, algorithm: str | None = None,
                   timeout: float | None = None) -> None:
        """Allgather with per-rank ``counts``/``displs`` (elements)."""
        self._allgatherv(sendbuf, recvbuf, counts, displs, True, timeout)

    def iallgatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                    displs: Counts | None = None, *,
                    algorithm: str | None = None) -> Request[None]:
        """Start an allgatherv."""
        return self._allgatherv(sendbuf, recvbuf, counts, displs, False, None)

    def _allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts, displs: Counts | None,
                    blocking: bool, timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        c, d = bufs.layout(counts, displs, self.size, rb, "counts", "displs", "recvbuf")
        sb = self._same(sendbuf, rb, c[self.rank])
        sspec = sb if sb is MPI.IN_PLACE else [sb, sb.nbytes, MPI.BYTE]
        isz = rb.itemsize
        rspec = [rb.view(np.uint8), (_scaled(c, isz), _scaled(d, isz)), MPI.BYTE]
        req = self._c.Iallgatherv(sspec, rspec)
        return self._go(req, "allgatherv", (sspec, rspec), blocking, timeout)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                 timeout: float | None = None) -> None:
        """Block j of rank i's ``sendbuf`` into block i of rank j's ``recvbuf``."""
        self._alltoall(sendbuf, recvbuf, True, timeout)

    def ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start an alltoall."""
        return self._alltoall(sendbuf, recvbuf, False, None)

    def _alltoall(self, sendbuf: Any, recvbuf: Any, blocking: bool,
                  timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        n = bufs.blocks_of(rb, self.size, "recvbuf")
        sb = self._same(sendbuf, rb, rb.size)
        sspec = sb if sb is MPI.IN_PLACE else [sb, n * rb.itemsize, MPI.BYTE]
        rspec = self._block(rb, n)
        req = self._c.Ialltoall(sspec, rspec)
        return self._go(req, "alltoall", (sspec, rspec), blocking, timeout)

    def alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Counts, recvcounts: Counts,
                  sdispls: Counts | None = None, rdispls: Counts | None = None, *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """Alltoall with per-peer counts and displacements (elements; default packed)."""
        self._alltoallv(sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls, True,
                        timeout)

    def ialltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Counts, recvcounts: Counts,
                   sdispls: Counts | None = None, rdispls: Counts | None = None, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallv."""
        return self._alltoallv(sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls,
                               False, None)

    def _alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Counts, recvcounts: Counts,
                   sdispls: Counts | None, rdispls: Counts | None, blocking: bool,
                   timeout: float | None) -> Request[None]:
        rb = self._arr(recvbuf, "recvbuf", writable=True)
        rc, rd = bufs.layout(recvcounts, rdispls, self.size, rb, "recvcounts", "rdispls",
                             "recvbuf")
        isz = rb.itemsize
        if self._in_place(sendbuf):
            sspec: Any = MPI.IN_PLACE
        else:
            sb = self._arr(sendbuf, "sendbuf")
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            sc, sd = bufs.layout(sendcounts, sdispls, self.size, sb, "sendcounts", "sdispls",
                                 "sendbuf")
            if sc[self.rank] != rc[self.rank]:
                raise ValueError(f"sendcounts[{self.rank}]={sc[self.rank]} but recvcounts["
                                 f"{self.rank}]={rc[self.rank]}: this rank's block to itself "
                                 "must have one size")
            sspec = [sb.view(np.uint8), (_scaled(sc, isz), _scaled(sd, isz)), MPI.BYTE]
        rspec = [rb.view(np.uint8), (_scaled(rc, isz), _scaled(rd, isz)), MPI.BYTE]
        req = self._c.Ialltoallv(sspec, rspec)
        return self._go(req, "alltoallv", (sspec, rspec), blocking, timeout)

    def alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """One buffer per peer each way, of any dtype and size (byte sizes must agree).

        Cost: packs the send buffers into one and unpacks the received bytes (two copies),
        around one ``Ialltoallv``.
        """
        self._alltoallw(sendbufs, recvbufs, True, timeout)

    def ialltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallw (the receive buffers are filled when it completes)."""
        return self._alltoallw(sendbufs, recvbufs, False, None)

    def _alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], blocking: bool,
                   timeout: float | None) -> Request[None]:
        p = self.size
        sends = [self._arr(b, f"sendbufs[{i}]").view(np.uint8)
                 for i, b in enumerate(bufs.seq(sendbufs, p, "sendbufs"))]
        recvs = [self._arr(b, f"recvbufs[{i}]", writable=True).view(np.uint8)
                 for i, b in enumerate(bufs.seq(recvbufs, p, "recvbufs"))]
        bufs.check_len(recvs[self.rank], sends[self.rank].size, f"recvbufs[{self.rank}]",
                       f"the bytes of sendbufs[{self.rank}]")
        packed = np.concatenate(sends) if sends else bufs.EMPTY_U8
        scratch = np.empty(sum(r.size for r in recvs), dtype=np.uint8)
        sc, rc = [s.size for s in sends], [r.size for r in recvs]
        sspec = [packed, (sc, None), MPI.BYTE]
        rspec = [scratch, (rc, None), MPI.BYTE]
        self.last_algorithm = ALGORITHM

        def unpack(_: Any) -> None:
            at = 0
            for r in recvs:
                r[:] = scratch[at : at + r.size]
                at += r.size

        req: MpiRequest[None] = MpiRequest(self._poller, self._c.Ialltoallv(sspec, rspec),
                                           f"alltoallw on {self.name!r}", unpack,
                                           (sspec, rspec))
        if blocking:
            req.wait(timeout)
        return req
