"""Buffer collectives of the MPI backend: each native call as one nonblocking MPI call.

The arguments are checked by the collective table (:mod:`ringworld.collective.calls`), exactly as
the native communicator checks them, into a :class:`~ringworld.collective.calls.Call`; this
module's runner then starts the MPI ``I``-form (``Iallreduce``, ...) for it and returns a
:class:`~ringworld.backends.mpi._requests.MpiRequest`; the blocking form waits on it
(``MPI.Wait`` when no timeout applies). Data-moving collectives move bytes (``MPI.BYTE``,
counts and displacements scaled by the item size), so any dtype works; reductions use
:func:`ringworld.backends.mpi._ops.reduction`; an ``IN_PLACE`` call is MPI's ``IN_PLACE``.
``algorithm=`` is accepted and ignored: the MPI library chooses (``last_algorithm`` is
``"mpi"``). A root's refusal of its own arguments is raised there only (as MPI does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ringworld.backends.mpi._base import ALGORITHM, Base, translating
from ringworld.backends.mpi._ops import reduction
from ringworld.backends.mpi._requests import MpiRequest
from ringworld.collective import buffers as bufs
from ringworld.collective import calls
from ringworld.collective.calls import Call
from ringworld.comm import ops
from ringworld.comm.requests import Request

OpLike = ops.Op | str
Counts = Sequence[int]
# a started MPI call: (its request, what MPI uses until it completes, what to run then)
Started = tuple[Any, Any, Callable[[Any], None] | None]


def _scaled(values: Sequence[int], itemsize: int) -> list[int]:
    return [v * itemsize for v in values]


def _vector(a: bufs.Array, counts: Sequence[int], displs: Sequence[int] | None) -> Any:
    """A v-buffer as bytes: counts and displacements (elements) scaled to bytes."""
    isz = a.itemsize
    d = None if displs is None else _scaled(displs, isz)
    return [a.view(np.uint8), (_scaled(counts, isz), d), MPI.BYTE]


@translating
class Collectives(Base):
    """The buffer collectives (blocking and ``i`` forms)."""

    def _run(self, prepare: Callable[..., Call], args: tuple[Any, ...], blocking: bool,
             timeout: float | None) -> Request[None]:
        """Check a call with the collective table and start it on MPI (see the module)."""
        try:
            call = prepare(self, *args)
        except calls.Refused as exc:
            refused = exc  # raised outside the handler: the user sees the error alone
        else:
            req, keep, finish = _STARTS[call.collective](self, call)
            return self._go(req, call.collective, keep, blocking, timeout, finish)
        raise refused.error

    def _op(self, op: OpLike, *arrays: bufs.Array) -> ops.Op:
        """``op`` resolved and checked on the first non-empty array's dtype (as the native
        communicator checks it). Raises: TypeError / ValueError."""
        return self._calls.op(op, *arrays)

    def _go(self, req: Any, what: str, keep: object, blocking: bool, timeout: float | None,
            finish: Callable[[Any], None] | None = None) -> Request[None]:
        self.last_algorithm = ALGORITHM
        r: MpiRequest[None] = MpiRequest(self._poller, req, f"{what} on {self.name!r}", finish,
                                         keep)
        if blocking:
            r.wait(timeout)
        return r

    def _barrier(self, blocking: bool, timeout: float | None) -> Request[None]:
        return self._go(self._c.Ibarrier(), "barrier", None, blocking, timeout)

    # -- one MPI call per collective: (request, what MPI uses until it completes) ----------
    def _bcast(self, c: Call) -> Started:
        spec = self._bytes(c.arrays[1])
        return self._c.Ibcast(spec, c.spec.root), spec, None

    def _reduction(self, c: Call) -> tuple[Any, Any, Any, Any]:
        """(send spec, datatype, MPI op, receive array) of a reduction."""
        assert c.op is not None
        sb, rb = c.arrays[0], c.arrays[1]
        dt, mop = reduction(c.op, sb.dtype)
        send = MPI.IN_PLACE if c.in_place else [sb.view(np.uint8), sb.size, dt]
        return send, dt, mop, rb

    def _reduce(self, c: Call) -> Started:
        send, dt, mop, rb = self._reduction(c)
        recv = [rb.view(np.uint8), c.spec.n, dt] if self.rank == c.spec.root else None
        return self._c.Ireduce(send, recv, mop, c.spec.root), (send, recv, mop), None

    def _allreduce(self, c: Call) -> Started:
        send, dt, mop, rb = self._reduction(c)
        recv = [rb.view(np.uint8), c.spec.n, dt]
        return self._c.Iallreduce(send, recv, mop), (send, recv, mop), None

    def _reduce_scatter(self, c: Call) -> Started:
        send, dt, mop, rb = self._reduction(c)
        counts = c.spec.counts or (c.spec.n,) * self.size
        mine = counts[self.rank]
        if c.in_place:  # MPI's in-place form: the whole input in recvbuf, the result first
            rb = c.arrays[0]
            if c.spec.counts is not None:  # mpi4py counts an in-place reduce_scatter's
                mine = sum(counts)  # recvbuf as the whole input (a block one's per block)
        else:
            send = [send[0], dt]  # mpi4py takes the count per block from the size
        recv = [rb.view(np.uint8), mine, dt]
        if c.spec.counts is None:
            req = self._c.Ireduce_scatter_block(send, recv, mop)
        else:
            req = self._c.Ireduce_scatter(send, recv, list(counts), mop)
        return req, (send, recv, mop), None

    def _scan(self, c: Call) -> Started:
        send, dt, mop, rb = self._reduction(c)
        target = rb
        if c.collective == "exscan" and self.rank == 0:  # MPI leaves it undefined
            target = np.empty_like(rb)  # ringworld leaves recvbuf alone
            if send is MPI.IN_PLACE:
                send = [rb.view(np.uint8), rb.size, dt]
        recv = [target.view(np.uint8), c.spec.n, dt]
        start = self._c.Iexscan if c.collective == "exscan" else self._c.Iscan
        return start(send, recv, mop), (send, recv, mop), None

    def _gather(self, c: Call) -> Started:
        sb, rb, root = c.arrays[0], c.arrays[1], c.spec.root
        if self.rank != root:
            send, recv = self._bytes(sb), None
        else:
            send = MPI.IN_PLACE if c.in_place else self._bytes(sb)
            recv = ([rb.view(np.uint8), c.spec.n * rb.itemsize, MPI.BYTE]
                    if c.collective == "gather" else
                    _vector(rb, c.spec.counts or (), c.spec.displs))
        start = self._c.Igather if c.collective == "gather" else self._c.Igatherv
        return start(send, recv, root), (send, recv), None

    def _scatter(self, c: Call) -> Started:
        sb, rb, root = c.arrays[0], c.arrays[1], c.spec.root
        if self.rank != root:
            send, recv = None, self._bytes(rb)
        else:
            send = ([sb.view(np.uint8), c.spec.n * sb.itemsize, MPI.BYTE]
                    if c.collective == "scatter" else
                    _vector(sb, c.spec.counts or (), c.spec.displs))
            recv = MPI.IN_PLACE if c.in_place else self._bytes(rb)
        start = self._c.Iscatter if c.collective == "scatter" else self._c.Iscatterv
        return start(send, recv, root), (send, recv), None

    def _allgather(self, c: Call) -> Started:
        sb, rb = c.arrays[0], c.arrays[1]
        send = MPI.IN_PLACE if c.in_place else self._bytes(sb)
        if c.collective == "allgather":
            recv = [rb.view(np.uint8), c.spec.n * rb.itemsize, MPI.BYTE]
            return self._c.Iallgather(send, recv), (send, recv), None
        recv = _vector(rb, c.spec.counts or (), c.spec.displs)
        return self._c.Iallgatherv(send, recv), (send, recv), None

    def _alltoall(self, c: Call) -> Started:
        sb, rb = c.arrays[0], c.arrays[1]
        block = c.spec.n * rb.itemsize
        send = MPI.IN_PLACE if c.in_place else [sb.view(np.uint8), block, MPI.BYTE]
        recv = [rb.view(np.uint8), block, MPI.BYTE]
        return self._c.Ialltoall(send, recv), (send, recv), None

    def _alltoallv(self, c: Call) -> Started:
        s = c.spec
        send = (MPI.IN_PLACE if c.in_place
                else _vector(c.arrays[0], s.counts or (), s.displs))
        recv = _vector(c.arrays[1], s.rcounts or (), s.rdispls)
        return self._c.Ialltoallv(send, recv), (send, recv), None

    def _alltoallw(self, c: Call) -> Started:
        """One ``Ialltoallv`` of the send buffers packed into one; the received bytes are
        unpacked when it completes (two copies)."""
        p = self.size
        sends, recvs = c.arrays[3 : 3 + p], c.arrays[3 + p :]
        packed = np.concatenate(sends) if sends else bufs.EMPTY_U8
        scratch = np.empty(sum(r.size for r in recvs), dtype=np.uint8)
        send = [packed, ([s.size for s in sends], None), MPI.BYTE]
        recv = [scratch, ([r.size for r in recvs], None), MPI.BYTE]

        def unpack(_: Any) -> None:
            at = 0
            for r in recvs:
                r[:] = scratch[at : at + r.size]
                at += r.size

        return self._c.Ialltoallv(send, recv), (send, recv), unpack

    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Wait until every rank has entered. Raises: Timeout."""
        self._barrier(True, timeout)

    def ibarrier(self, *, algorithm: str | None = None) -> Request[None]:
        """Start a barrier."""
        return self._barrier(False, None)

    def bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None,
              timeout: float | None = None) -> None:
        """Broadcast ``buf`` from ``root`` into every rank's ``buf`` (in place)."""
        self._run(calls.bcast, (buf, root), True, timeout)

    def ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request[None]:
        """Start a bcast."""
        return self._run(calls.bcast, (buf, root), False, None)

    def reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """``op`` over every rank's ``sendbuf`` into ``recvbuf`` at ``root`` (None elsewhere)."""
        self._run(calls.reduce, (sendbuf, recvbuf, op, root), True, timeout)

    def ireduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a reduce."""
        return self._run(calls.reduce, (sendbuf, recvbuf, op, root), False, None)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """``op`` over every rank's ``sendbuf`` into every rank's ``recvbuf``."""
        self._run(calls.allreduce, (sendbuf, recvbuf, op), True, timeout)

    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allreduce."""
        return self._run(calls.allreduce, (sendbuf, recvbuf, op), False, None)

    def reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Reduce ``size * len(recvbuf)`` elements; rank i gets block i."""
        self._run(calls.reduce_scatter, (sendbuf, recvbuf, None, op), True, timeout)

    def ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                              algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter_block."""
        return self._run(calls.reduce_scatter, (sendbuf, recvbuf, None, op), False, None)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Counts, op: OpLike = ops.SUM,
                       *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Reduce ``sum(counts)`` elements; rank i gets the ``counts[i]`` after block i-1."""
        self._run(calls.reduce_scatter, (sendbuf, recvbuf, counts, op), True, timeout)

    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                        op: OpLike = ops.SUM, *, algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter."""
        return self._run(calls.reduce_scatter, (sendbuf, recvbuf, counts, op), False, None)

    def scan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Inclusive prefix reduction: rank i gets ``op`` over ranks 0..i."""
        self._run(calls.scan, ("scan", sendbuf, recvbuf, op), True, timeout)

    def iscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
              algorithm: str | None = None) -> Request[None]:
        """Start a scan."""
        return self._run(calls.scan, ("scan", sendbuf, recvbuf, op), False, None)

    def exscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Exclusive prefix reduction: rank i gets ``op`` over ranks 0..i-1 (rank 0 untouched)."""
        self._run(calls.scan, ("exscan", sendbuf, recvbuf, op), True, timeout)

    def iexscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                algorithm: str | None = None) -> Request[None]:
        """Start an exscan."""
        return self._run(calls.scan, ("exscan", sendbuf, recvbuf, op), False, None)

    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Every rank's ``sendbuf`` into block i of ``recvbuf`` at ``root``."""
        self._run(calls.gather, (sendbuf, recvbuf, root), True, timeout)

    def igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a gather."""
        return self._run(calls.gather, (sendbuf, recvbuf, root), False, None)

    def gatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                displs: Counts | None = None, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Gather blocks of different sizes; ``counts``/``displs`` (elements) at the root."""
        self._run(calls.gatherv, (sendbuf, recvbuf, counts, displs, root), True, timeout)

    def igatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                 displs: Counts | None = None, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a gatherv."""
        return self._run(calls.gatherv, (sendbuf, recvbuf, counts, displs, root), False, None)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Block i of ``sendbuf`` at ``root`` into rank i's ``recvbuf``."""
        self._run(calls.scatter, (sendbuf, recvbuf, root), True, timeout)

    def iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a scatter."""
        return self._run(calls.scatter, (sendbuf, recvbuf, root), False, None)

    def scatterv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                 displs: Counts | None = None, root: int = 0, *,
                 algorithm: str | None = None, timeout: float | None = None) -> None:
        """Scatter blocks of different sizes; ``counts``/``displs`` (elements) at the root."""
        self._run(calls.scatterv, (sendbuf, recvbuf, counts, displs, root), True, timeout)

    def iscatterv(self, sendbuf: Any, recvbuf: Any, counts: Counts | None = None,
                  displs: Counts | None = None, root: int = 0, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start a scatterv."""
        return self._run(calls.scatterv, (sendbuf, recvbuf, counts, displs, root), False, None)

    def allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Every rank's ``sendbuf`` into block i of every rank's ``recvbuf``."""
        self._run(calls.allgather, (sendbuf, recvbuf, None, None), True, timeout)

    def iallgather(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allgather."""
        return self._run(calls.allgather, (sendbuf, recvbuf, None, None), False, None)

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                   displs: Counts | None = None, *, algorithm: str | None = None,
                   timeout: float | None = None) -> None:
        """Allgather with per-rank ``counts``/``displs`` (elements)."""
        self._run(calls.allgather, (sendbuf, recvbuf, counts, displs), True, timeout)

    def iallgatherv(self, sendbuf: Any, recvbuf: Any, counts: Counts,
                    displs: Counts | None = None, *,
                    algorithm: str | None = None) -> Request[None]:
        """Start an allgatherv."""
        return self._run(calls.allgather, (sendbuf, recvbuf, counts, displs), False, None)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                 timeout: float | None = None) -> None:
        """Block j of rank i's ``sendbuf`` into block i of rank j's ``recvbuf``."""
        self._run(calls.alltoall, (sendbuf, recvbuf), True, timeout)

    def ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start an alltoall."""
        return self._run(calls.alltoall, (sendbuf, recvbuf), False, None)

    def alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Counts, recvcounts: Counts,
                  sdispls: Counts | None = None, rdispls: Counts | None = None, *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """Alltoall with per-peer counts and displacements (elements; default packed)."""
        self._run(calls.alltoallv, (sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls),
                  True, timeout)

    def ialltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Counts, recvcounts: Counts,
                   sdispls: Counts | None = None, rdispls: Counts | None = None, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallv."""
        return self._run(calls.alltoallv, (sendbuf, recvbuf, sendcounts, recvcounts, sdispls,
                                           rdispls), False, None)

    def alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """One buffer per peer each way, of any dtype and size (byte sizes must agree).

        Cost: packs the send buffers into one and unpacks the received bytes (two copies),
        around one ``Ialltoallv``.
        """
        self._run(calls.alltoallw, (sendbufs, recvbufs), True, timeout)

    def ialltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallw (the receive buffers are filled when it completes)."""
        return self._run(calls.alltoallw, (sendbufs, recvbufs), False, None)


_STARTS: dict[str, Callable[[Collectives, Call], Started]] = {
    "bcast": Collectives._bcast, "reduce": Collectives._reduce,
    "allreduce": Collectives._allreduce, "reduce_scatter": Collectives._reduce_scatter,
    "reduce_scatter_block": Collectives._reduce_scatter, "scan": Collectives._scan,
    "exscan": Collectives._scan, "gather": Collectives._gather, "gatherv": Collectives._gather,
    "scatter": Collectives._scatter, "scatterv": Collectives._scatter,
    "allgather": Collectives._allgather, "allgatherv": Collectives._allgather,
    "alltoall": Collectives._alltoall, "alltoallv": Collectives._alltoallv,
    "alltoallw": Collectives._alltoallw,
}
