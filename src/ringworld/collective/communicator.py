"""The full communicator: point-to-point plus every collective, and communicator management.

Buffer collectives take numpy arrays (or anything with the buffer protocol) of any contiguous
dtype; counts come from the buffers' sizes, in elements. ``IN_PLACE`` as the send buffer takes
the input from the receive buffer, as in MPI. Every collective has a blocking form and a
nonblocking ``i`` form returning a :class:`Request`; several may be in flight at once on one
communicator (each carries its own sequence number). ``algorithm=`` forces an algorithm by name
(see :mod:`ringworld.algorithms.registry`); otherwise the cost model chooses, and the choice is
left in :attr:`Communicator.last_algorithm`.

Object collectives (``bcast_obj``, ``allreduce_obj``, ...) are in :class:`ObjectCollectives`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from ringworld._lazy import LazyModule
from ringworld.algorithms.registry import HIERARCHICAL, SHM
from ringworld.algorithms.schedule import Spec
from ringworld.collective.core import OpLike
from ringworld.collective.management import CommManagement
from ringworld.collective.markers import IN_PLACE, UNDEFINED
from ringworld.comm import ops
from ringworld.comm.ops import Op
from ringworld.comm.requests import (
    CompletedRequest,
    Request,
)
from ringworld.errors import CommRevoked, MismatchError, PeerFailure

if TYPE_CHECKING:
    import numpy as np

    from ringworld.algorithms import executor
    from ringworld.algorithms import shm_collectives as shm
    from ringworld.collective import buffers as bufs
    from ringworld.collective.buffers import Array
else:  # imported on the first collective call: init() and point-to-point never load numpy
    np = LazyModule("numpy", globals(), "np")
    executor = LazyModule("ringworld.algorithms.executor", globals(), "executor")
    shm = LazyModule("ringworld.algorithms.shm_collectives", globals(), "shm")
    bufs = LazyModule("ringworld.collective.buffers", globals(), "bufs")


__all__ = ["IN_PLACE", "UNDEFINED", "Communicator"]


class Communicator(CommManagement):
    """A group of ranks with point-to-point messaging and the full collective set."""

    # ------------------------------------------------------------------ bcast
    def bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None,
              timeout: float | None = None) -> None:
        """Copy ``buf`` of ``root`` into ``buf`` of every rank.

        Cost: binomial tree for small messages, pipelined ring or scatter+allgather for large.

        Raises:
            TypeError / ValueError: bad ``buf``, ``root`` or ``algorithm``.
            Timeout, PeerFailure, TruncationError (ranks disagree on the size).
        """
        if algorithm is None and (sig := self._again("bcast", buf, buf, root)) is not None:
            self._in_windows(shm.bcast, self._shm("bcast", timeout, sig=sig), buf, root)
            return
        self._bcast(buf, root, algorithm, True, timeout)

    def ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request[None]:
        """Start a broadcast; ``buf`` must not be touched until the request completes."""
        return self._bcast(buf, root, algorithm, False, None)

    def _bcast(self, buf: Any, root: int, algorithm: str | None, blocking: bool,
               timeout: float | None) -> Request[None]:
        root = self._root(root)
        a = bufs.as_array(buf, "buf", writable=self.rank != root)
        algo = self._choose("bcast", a.nbytes, algorithm, blocking=blocking)
        if algo == SHM:
            self._in_windows(shm.bcast, self._shm("bcast", timeout, a.nbytes, (root,)), a, root)
            self._keep("bcast", buf, buf, a, a, root, a.nbytes, (root,))
            return CompletedRequest(self._engine, None)
        seg = max(1, self.selector.segment_bytes // max(1, a.itemsize))
        return self._go("bcast", algo, Spec(self.size, self.rank, a.size, root, segment=seg),
                        [bufs.EMPTY_U8.view(a.dtype), a], None, blocking, timeout)

    # ------------------------------------------------------------------ reductions
    def reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Combine every rank's ``sendbuf`` with ``op`` into ``recvbuf`` of ``root``.

        ``recvbuf`` matters only at the root (None elsewhere); ``IN_PLACE`` at the root takes
        its input from ``recvbuf``.

        Raises:
            TypeError / ValueError: bad buffers, op, root or algorithm.
            Timeout, PeerFailure, TruncationError.
        """
        self._reduce(sendbuf, recvbuf, op, root, algorithm, True, timeout)

    def ireduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a reduce; buffers must not be touched until the request completes."""
        return self._reduce(sendbuf, recvbuf, op, root, algorithm, False, None)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike, root: int, algorithm: str | None,
                blocking: bool, timeout: float | None) -> Request[None]:
        root = self._root(root)
        if self.rank == root:
            try:
                rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
                sb = rb if sendbuf is IN_PLACE else bufs.as_array(sendbuf, "sendbuf")
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
            except (TypeError, ValueError) as exc:
                self._refuse_reduce(exc, sendbuf, op, algorithm, blocking)
        else:
            sb = bufs.as_array(sendbuf, "sendbuf")
            rb = bufs.EMPTY_U8.view(sb.dtype)
        o = self._op(op, sb)
        algo = self._choose("reduce", sb.nbytes, algorithm, commutative=o.commutative,
                            blocking=blocking)
        if algo == SHM:
            kind = (sb.dtype, o.name, root)
            self._in_windows(shm.reduce, self._shm("reduce", timeout, sb.nbytes, kind),
                             sb, rb, o, root)
            return CompletedRequest(self._engine, None)
        return self._go("reduce", algo, Spec(self.size, self.rank, sb.size, root,
                                             commutative=o.commutative),
                        [sb, rb], o, blocking, timeout)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """Combine every rank's ``sendbuf`` with ``op``; every rank gets the result.

        ``sendbuf`` may be ``IN_PLACE`` (input taken from ``recvbuf``). Results are bitwise
        identical on every rank. Cost: recursive doubling for small vectors, Rabenseifner or
        ring (2n(p-1)/p bytes sent per rank) for large ones.

        Raises:
            TypeError / ValueError: bad buffers, op or algorithm.
            Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._small_allreduce(sendbuf, recvbuf, op, timeout):
            return
        self._allreduce(sendbuf, recvbuf, op, algorithm, True, timeout)

    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allreduce; buffers must not be touched until the request completes."""
        return self._allreduce(sendbuf, recvbuf, op, algorithm, False, None)

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike, algorithm: str | None,
                   blocking: bool, timeout: float | None) -> Request[None]:
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        sb = rb if sendbuf is IN_PLACE else bufs.as_array(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
        o = self._op(op, rb)
        if blocking and o.commutative and self._use_hierarchy(rb.nbytes, algorithm):
            self.last_algorithm = HIERARCHICAL
            self._hierarchical_allreduce(sb, rb, o, timeout)
            return CompletedRequest(self._engine, None)
        algo = self._choose("allreduce", rb.nbytes, algorithm, commutative=o.commutative,
                            blocking=blocking)
        if algo == SHM:
            kind = (rb.dtype, o.name)
            self._in_windows(shm.allreduce, self._shm("allreduce", timeout, rb.nbytes, kind),
                             sb, rb, o)
            return CompletedRequest(self._engine, None)
        return self._go("allreduce", algo, Spec(self.size, self.rank, rb.size,
                                                commutative=o.commutative),
                        [sb, rb], o, blocking, timeout)

    def _use_hierarchy(self, nbytes: int, algorithm: str | None) -> bool:
        """Whether a blocking allreduce runs hierarchically (the selector decides; kept per
        power-of-two size class, as the decision may measure the link between hosts)."""
        key = (algorithm, nbytes.bit_length())
        found = self._hier_choice.get(key)
        if found is None:
            found = self._hier_choice[key] = self.selector.use_hierarchy(
                self._host_sizes(), float(nbytes), algorithm, self._interhost_bandwidth)
        return found

    def _interhost_bandwidth(self) -> float:
        """Bytes/s between the first ranks of the first two hosts, measured once (see
        :func:`ringworld.tuning.measure.link_bandwidth`) and agreed by every rank. Collective.
        """
        if self._link_bw is None:
            from ringworld.tuning.measure import link_bandwidth

            _, leaders = self._hierarchy()
            bw = math.inf if leaders is None else link_bandwidth(leaders)
            self._link_bw = float(self.bcast_obj(bw, root=0))
        return self._link_bw

    def _hierarchy(self) -> tuple[Self, Self | None]:
        """(this rank's host communicator, the communicator of host leaders or None); made
        on first use, collectively."""
        if self._hier is None:
            hosts, order = self._hosts()
            color = order.index(hosts[self.rank])
            local = self.split(color, self.rank, name=f"{self.name}.host{color}")
            assert local is not None
            leaders = self.split(0 if local.rank == 0 else None, self.rank,
                                 name=f"{self.name}.leaders")
            self._hier = (local, leaders)
        return self._hier

    def _hierarchical_allreduce(self, sb: Array, rb: Array, o: Op,
                                timeout: float | None) -> None:
        """Reduce within each host (shared memory), allreduce among the hosts' first ranks
        (TCP), bcast within each host: the slow links carry 2n(h-1)/h bytes for h hosts
        instead of 2n(p-1)/p per rank. Commutative ops only (the order of combining changes).
        """
        local, leaders = self._hierarchy()
        send = IN_PLACE if (sb is rb and local.rank == 0) else sb
        try:
            local.reduce(send, rb, o, root=0, timeout=timeout)
            if leaders is not None and leaders.size > 1:
                leaders.allreduce(IN_PLACE, rb, o, timeout=timeout)
            local.bcast(rb, root=0, timeout=timeout)
        except BaseException as exc:
            # the steps this rank will not make: the host's ranks would wait in them for good
            # (a leader that failed among the leaders never broadcasts to its host)
            for sub in (local, leaders):
                if sub is not None:
                    sub._leave_next(exc)
            raise

    def _leave_next(self, exc: BaseException) -> None:
        """This rank will not make its next collective on this communicator (the composite
        call it was a step of failed with ``exc``): tell the members, whose waits in it fail
        with the first failure instead of waiting for good."""
        if self._arena is not None:
            self._arena.abandon(exc)
        if isinstance(exc, MismatchError | CommRevoked) or getattr(exc, "from_left", False):
            return  # these reach every member anyway
        kind = f"PeerFailure:{exc.rank}" if isinstance(exc, PeerFailure) else ""
        self._engine.report_left(self.coll_context, self._chan.seq,
                                 f"a composite collective with {type(exc).__name__}: {exc}",
                                 kind)

    def reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                             algorithm: str | None = None,
                             timeout: float | None = None) -> None:
        """Reduce ``sendbuf`` (p blocks of ``len(recvbuf)``) and give rank i block i.

        With ``IN_PLACE`` the input is ``recvbuf`` (p blocks) and the result its first block.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if (algorithm is None and (sig := self._again("reduce_scatter_block", sendbuf, recvbuf,
                                                      op)) is not None):
            self._in_windows(shm.reduce_scatter_block,
                             self._shm("reduce_scatter_block", timeout, sig=sig),
                             sendbuf, recvbuf, self._op(op, sendbuf))
            return
        self._reduce_scatter(sendbuf, recvbuf, None, op, algorithm, True, timeout)

    def ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                              algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter_block."""
        return self._reduce_scatter(sendbuf, recvbuf, None, op, algorithm, False, None)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                       op: OpLike = ops.SUM, *, algorithm: str | None = None,
                       timeout: float | None = None) -> None:
        """Reduce ``sendbuf`` (blocks of ``counts[i]``) and give rank i block i.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._reduce_scatter(sendbuf, recvbuf, counts, op, algorithm, True, timeout)

    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                        op: OpLike = ops.SUM, *, algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter."""
        return self._reduce_scatter(sendbuf, recvbuf, counts, op, algorithm, False, None)

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None,
                        op: OpLike, algorithm: str | None, blocking: bool,
                        timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        coll = "reduce_scatter" if counts is not None else "reduce_scatter_block"
        finish: Callable[[], None] | None = None
        if sendbuf is IN_PLACE:
            sb = rb
            c = (bufs.int_list(counts, p, "counts") if counts is not None
                 else (bufs.blocks_of(rb, p, "recvbuf"),) * p)
            bufs.check_len(sb, sum(c), "recvbuf", "IN_PLACE input: the sum of all blocks")
            out = executor.aligned_empty(c[r], rb.dtype)
            dest = rb[: c[r]]

            def finish() -> None:
                np.copyto(dest, out)
        else:
            sb = bufs.as_array(sendbuf, "sendbuf")
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            c = (bufs.int_list(counts, p, "counts") if counts is not None else (rb.size,) * p)
            bufs.check_len(sb, sum(c), "sendbuf", "the sum of all blocks")
            bufs.check_len(rb, c[r], "recvbuf", "this rank's block")
            out = rb
        o = self._op(op, sb)
        algo = self._choose(coll, sb.nbytes // max(1, p), algorithm, commutative=o.commutative,
                            equal_blocks=counts is None, blocking=blocking)
        if algo == SHM:
            kind = (sb.dtype, o.name)
            self._in_windows(shm.reduce_scatter_block, self._shm(coll, timeout, sb.nbytes, kind),
                             sb, out, o)
            if finish is None and counts is None:
                self._keep(coll, sendbuf, recvbuf, sb, rb, op, sb.nbytes, kind)
            if finish is not None:
                finish()
            return CompletedRequest(self._engine, None)
        spec = Spec(p, r, c[0] if c else 0, counts=c if counts is not None else None,
                    commutative=o.commutative)
        return self._go(coll, algo, spec, [sb, out], o, blocking, timeout, finish)

    def scan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Inclusive prefix reduction: rank i gets ``op`` over ranks 0..i, in rank order.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._scan("scan", sendbuf, recvbuf, op, algorithm, True, timeout)

    def iscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
              algorithm: str | None = None) -> Request[None]:
        """Start a scan."""
        return self._scan("scan", sendbuf, recvbuf, op, algorithm, False, None)

    def exscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Exclusive prefix reduction: rank i gets ``op`` over ranks 0..i-1 (rank 0: untouched).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._scan("exscan", sendbuf, recvbuf, op, algorithm, True, timeout)

    def iexscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                algorithm: str | None = None) -> Request[None]:
        """Start an exscan."""
        return self._scan("exscan", sendbuf, recvbuf, op, algorithm, False, None)

    def _scan(self, coll: str, sendbuf: Any, recvbuf: Any, op: OpLike, algorithm: str | None,
              blocking: bool, timeout: float | None) -> Request[None]:
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        sb = rb if sendbuf is IN_PLACE else bufs.as_array(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
        o = self._op(op, rb)
        algo = self._choose(coll, rb.nbytes, algorithm, commutative=o.commutative)
        return self._go(coll, algo, Spec(self.size, self.rank, rb.size,
                                         commutative=o.commutative),
                        [sb, rb], o, blocking, timeout)

    # ------------------------------------------------------------------ gather / scatter
    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Collect every rank's ``sendbuf`` into ``recvbuf`` of ``root`` (block i from rank i).

        ``recvbuf`` matters only at the root; ``IN_PLACE`` at the root means its block is
        already in place.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._gather(sendbuf, recvbuf, root, algorithm, True, timeout)

    def igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a gather."""
        return self._gather(sendbuf, recvbuf, root, algorithm, False, None)

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, algorithm: str | None,
                blocking: bool, timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        root = self._root(root)
        if r == root:
            try:
                rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
                n = bufs.blocks_of(rb, p, "recvbuf")
                sb = (rb[r * n : (r + 1) * n] if sendbuf is IN_PLACE
                      else bufs.as_array(sendbuf, "sendbuf"))
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
            except (TypeError, ValueError) as exc:
                self._refuse("gather", exc)
        else:
            sb = bufs.as_array(sendbuf, "sendbuf")
            rb = bufs.EMPTY_U8.view(sb.dtype)
            n = sb.size
        algo = self._choose("gather", sb.nbytes, algorithm)
        return self._go("gather", algo, Spec(p, r, n, root), [sb, rb], None, blocking, timeout)

    def gatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                displs: Sequence[int] | None = None, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Gather blocks of different sizes: rank i's ``sendbuf`` lands at ``displs[i]``.

        ``counts``/``displs`` (elements; displs default packed) matter only at the root.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._gatherv(sendbuf, recvbuf, counts, displs, root, algorithm, True, timeout)

    def igatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                 displs: Sequence[int] | None = None, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a gatherv."""
        return self._gatherv(sendbuf, recvbuf, counts, displs, root, algorithm, False, None)

    def _gatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None,
                 displs: Sequence[int] | None, root: int, algorithm: str | None,
                 blocking: bool, timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        root = self._root(root)
        if r == root:
            try:
                rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
                if counts is None:
                    raise TypeError("counts is required at the root")
                c, d = bufs.layout(counts, displs, p, rb, "counts", "displs", "recvbuf")
                sb = (rb[d[r] : d[r] + c[r]] if sendbuf is IN_PLACE
                      else bufs.as_array(sendbuf, "sendbuf"))
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(sb, c[r], "sendbuf", "counts[root]")
            except (TypeError, ValueError) as exc:
                self._refuse("gatherv", exc)
            spec = Spec(p, r, c[r], root, counts=c, displs=d)
        else:
            sb = bufs.as_array(sendbuf, "sendbuf")
            rb = bufs.EMPTY_U8.view(sb.dtype)
            spec = Spec(p, r, sb.size, root)
        algo = self._choose("gatherv", sb.nbytes, algorithm)
        return self._go("gatherv", algo, spec, [sb, rb], None, blocking, timeout)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Send block i of ``root``'s ``sendbuf`` to rank i's ``recvbuf``.

        ``sendbuf`` matters only at the root; ``IN_PLACE`` as ``recvbuf`` at the root leaves
        its own block where it is.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._scatter(sendbuf, recvbuf, root, algorithm, True, timeout)

    def iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a scatter."""
        return self._scatter(sendbuf, recvbuf, root, algorithm, False, None)

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, algorithm: str | None,
                 blocking: bool, timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        root = self._root(root)
        if r == root:
            try:
                sb = bufs.as_array(sendbuf, "sendbuf")
                n = bufs.blocks_of(sb, p, "sendbuf")
                rb = (sb[r * n : (r + 1) * n] if recvbuf is IN_PLACE
                      else bufs.as_array(recvbuf, "recvbuf", writable=True))
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, n, "recvbuf", "sendbuf holds size blocks of this length")
            except (TypeError, ValueError) as exc:
                self._refuse("scatter", exc)
        else:
            rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
            sb = bufs.EMPTY_U8.view(rb.dtype)
            n = rb.size
        algo = self._choose("scatter", rb.nbytes, algorithm)
        return self._go("scatter", algo, Spec(p, r, n, root), [sb, rb], None, blocking, timeout)

    def scatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                 displs: Sequence[int] | None = None, root: int = 0, *,
                 algorithm: str | None = None, timeout: float | None = None) -> None:
        """Scatter blocks of different sizes: rank i receives ``counts[i]`` from ``displs[i]``.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._scatterv(sendbuf, recvbuf, counts, displs, root, algorithm, True, timeout)

    def iscatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                  displs: Sequence[int] | None = None, root: int = 0, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start a scatterv."""
        return self._scatterv(sendbuf, recvbuf, counts, displs, root, algorithm, False, None)

    def _scatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None,
                  displs: Sequence[int] | None, root: int, algorithm: str | None,
                  blocking: bool, timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        root = self._root(root)
        if r == root:
            try:
                sb = bufs.as_array(sendbuf, "sendbuf")
                if counts is None:
                    raise TypeError("counts is required at the root")
                c, d = bufs.layout(counts, displs, p, sb, "counts", "displs", "sendbuf")
                rb = (sb[d[r] : d[r] + c[r]] if recvbuf is IN_PLACE
                      else bufs.as_array(recvbuf, "recvbuf", writable=True))
                bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
                bufs.check_len(rb, c[r], "recvbuf", "counts[root]")
            except (TypeError, ValueError) as exc:
                self._refuse("scatterv", exc)
            spec = Spec(p, r, c[r], root, counts=c, displs=d)
        else:
            rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
            sb = bufs.EMPTY_U8.view(rb.dtype)
            spec = Spec(p, r, rb.size, root)
        algo = self._choose("scatterv", rb.nbytes, algorithm)
        return self._go("scatterv", algo, spec, [sb, rb], None, blocking, timeout)

    # ------------------------------------------------------------------ allgather
    def allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Every rank gets every rank's ``sendbuf``: block i of ``recvbuf`` from rank i.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if (algorithm is None
                and (sig := self._again("allgather", sendbuf, recvbuf, None)) is not None):
            self._in_windows(shm.allgather, self._shm("allgather", timeout, sig=sig),
                             sendbuf, recvbuf)
            return
        self._allgather(sendbuf, recvbuf, None, None, algorithm, True, timeout)

    def iallgather(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allgather."""
        return self._allgather(sendbuf, recvbuf, None, None, algorithm, False, None)

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                   displs: Sequence[int] | None = None, *, algorithm: str | None = None,
                   timeout: float | None = None) -> None:
        """Allgather of blocks of different sizes (``counts[i]`` at ``displs[i]``).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._allgather(sendbuf, recvbuf, counts, displs, algorithm, True, timeout)

    def iallgatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                    displs: Sequence[int] | None = None, *,
                    algorithm: str | None = None) -> Request[None]:
        """Start an allgatherv."""
        return self._allgather(sendbuf, recvbuf, counts, displs, algorithm, False, None)

    def _allgather(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None,
                   displs: Sequence[int] | None, algorithm: str | None, blocking: bool,
                   timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        if counts is None:
            n = bufs.blocks_of(rb, p, "recvbuf")
            sb = rb[r * n : (r + 1) * n] if sendbuf is IN_PLACE else bufs.as_array(sendbuf,
                                                                               "sendbuf")
            bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
            coll, spec = "allgather", Spec(p, r, n)
            equal = True
        else:
            c, d = bufs.layout(counts, displs, p, rb, "counts", "displs", "recvbuf")
            sb = (rb[d[r] : d[r] + c[r]] if sendbuf is IN_PLACE
                  else bufs.as_array(sendbuf, "sendbuf"))
            bufs.check_len(sb, c[r], "sendbuf", "counts[rank]")
            coll, spec = "allgatherv", Spec(p, r, c[r], counts=c, displs=d)
            equal = False
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        algo = self._choose(coll, sb.nbytes, algorithm, equal_blocks=equal, blocking=blocking)
        if algo == SHM:
            self._in_windows(shm.allgather, self._shm(coll, timeout, rb.nbytes, (rb.dtype,)),
                             sb, rb)
            if counts is None:
                self._keep(coll, sendbuf, recvbuf, sb, rb, None, rb.nbytes, (rb.dtype,))
            return CompletedRequest(self._engine, None)
        return self._go(coll, algo, spec, [sb, rb], None, blocking, timeout)

    # ------------------------------------------------------------------ alltoall
    def alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                 timeout: float | None = None) -> None:
        """Block j of rank i's ``sendbuf`` goes to block i of rank j's ``recvbuf``.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if (algorithm is None
                and (sig := self._again("alltoall", sendbuf, recvbuf, None)) is not None):
            self._in_windows(shm.alltoall, self._shm("alltoall", timeout, sig=sig),
                             sendbuf, recvbuf)
            return
        self._alltoall(sendbuf, recvbuf, algorithm, True, timeout)

    def ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start an alltoall."""
        return self._alltoall(sendbuf, recvbuf, algorithm, False, None)

    def _alltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str | None, blocking: bool,
                  timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        n = bufs.blocks_of(rb, p, "recvbuf")
        sb = rb.copy() if sendbuf is IN_PLACE else bufs.as_array(sendbuf, "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        bufs.check_len(sb, rb.size, "sendbuf", "the size of recvbuf")
        algo = self._choose("alltoall", sb.nbytes // p, algorithm, blocking=blocking)
        if algo == SHM:
            kind = (rb.dtype,)
            self._in_windows(shm.alltoall, self._shm("alltoall", timeout, rb.nbytes, kind), sb, rb)
            self._keep("alltoall", sendbuf, recvbuf, sb, rb, None, rb.nbytes, kind)
            return CompletedRequest(self._engine, None)
        return self._go("alltoall", algo, Spec(p, r, n), [sb, rb], None, blocking, timeout)

    def alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                  recvcounts: Sequence[int], sdispls: Sequence[int] | None = None,
                  rdispls: Sequence[int] | None = None, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Alltoall with per-peer counts and displacements (elements; default packed).

        With ``IN_PLACE`` the send side uses ``recvcounts``/``rdispls`` (as MPI).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._alltoallv(sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls, algorithm,
                        True, timeout)

    def ialltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                   recvcounts: Sequence[int], sdispls: Sequence[int] | None = None,
                   rdispls: Sequence[int] | None = None, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallv."""
        return self._alltoallv(sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls,
                               algorithm, False, None)

    def _alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                   recvcounts: Sequence[int], sdispls: Sequence[int] | None,
                   rdispls: Sequence[int] | None, algorithm: str | None, blocking: bool,
                   timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        rc, rd = bufs.layout(recvcounts, rdispls, p, rb, "recvcounts", "rdispls", "recvbuf")
        if sendbuf is IN_PLACE:
            sb, sc, sd = rb.copy(), rc, rd
        else:
            sb = bufs.as_array(sendbuf, "sendbuf")
            sc, sd = bufs.layout(sendcounts, sdispls, p, sb, "sendcounts", "sdispls", "sendbuf")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        if sc[r] != rc[r]:
            raise ValueError(f"sendcounts[{r}]={sc[r]} but recvcounts[{r}]={rc[r]}: this rank's "
                             "block to itself must have one size")
        algo = self._choose("alltoallv", sb.nbytes // p, algorithm)
        spec = Spec(p, r, 0, counts=sc, displs=sd, rcounts=rc, rdispls=rd)
        return self._go("alltoallv", algo, spec, [sb, rb], None, blocking, timeout)

    def alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """The most general alltoall: one buffer per peer each way, of any dtype and size.

        ``sendbufs[j]`` goes to rank j, ``recvbufs[i]`` receives from rank i; the byte sizes
        of matching buffers must agree.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._alltoallw(sendbufs, recvbufs, algorithm, True, timeout)

    def ialltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallw."""
        return self._alltoallw(sendbufs, recvbufs, algorithm, False, None)

    def _alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any],
                   algorithm: str | None, blocking: bool,
                   timeout: float | None) -> Request[None]:
        p, r = self.size, self.rank
        sends = [bufs.as_array(b, f"sendbufs[{i}]").view(np.uint8)
                 for i, b in enumerate(bufs.seq(sendbufs, p, "sendbufs"))]
        recvs = [bufs.as_array(b, f"recvbufs[{i}]", writable=True).view(np.uint8)
                 for i, b in enumerate(bufs.seq(recvbufs, p, "recvbufs"))]
        bufs.check_len(recvs[r], sends[r].size, f"recvbufs[{r}]", f"the bytes of sendbufs[{r}]")
        algo = self._choose("alltoallw", sum(s.nbytes for s in sends) // p, algorithm)
        spec = Spec(p, r, 0, counts=tuple(s.size for s in sends),
                    rcounts=tuple(b.size for b in recvs))
        none = bufs.EMPTY_U8
        return self._go("alltoallw", algo, spec, [none, none, none, *sends, *recvs], None,
                        blocking, timeout)


