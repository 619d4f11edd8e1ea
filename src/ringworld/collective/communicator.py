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
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Self

from ringworld._lazy import LazyModule
from ringworld.algorithms import registry
from ringworld.algorithms.registry import HIERARCHICAL, SHM
from ringworld.algorithms.schedule import Spec
from ringworld.algorithms.shm_policy import SMALL
from ringworld.collective.markers import IN_PLACE, UNDEFINED
from ringworld.collective.objects import ObjectCollectives
from ringworld.comm import ops
from ringworld.comm.communicator import _as_int
from ringworld.comm.engine import Engine
from ringworld.comm.ops import Op
from ringworld.comm.requests import (
    SEQ_MASK,
    SIG_SHIFT,
    CompletedRequest,
    Request,
    check_timeout,
    wait_all,
)
from ringworld.errors import CommError, CommRevoked, MismatchError, PeerFailure, Timeout
from ringworld.tuning import constants
from ringworld.tuning.select import Plan, Selector

if TYPE_CHECKING:
    import numpy as np

    from ringworld.algorithms import executor, shm
    from ringworld.collective import buffers as bufs
    from ringworld.collective.buffers import Array
    from ringworld.comm.monitor import Monitor
else:  # imported on the first collective call: init() and point-to-point never load numpy
    np = LazyModule("numpy", globals(), "np")
    executor = LazyModule("ringworld.algorithms.executor", globals(), "executor")
    shm = LazyModule("ringworld.algorithms.shm", globals(), "shm")
    bufs = LazyModule("ringworld.collective.buffers", globals(), "bufs")

__all__ = ["IN_PLACE", "UNDEFINED", "Communicator"]

OpLike = Op | str
_CHECKED_OPS: dict[tuple[OpLike, np.dtype[Any]], Op] = {}  # (op, dtype) pairs known valid


def _gone() -> None:
    """Stands for the weak reference to an ``IN_PLACE`` sendbuf (it matches no array)."""


class Communicator(ObjectCollectives):
    """A group of ranks with point-to-point messaging and the full collective set."""

    def __init__(self, engine: Engine, ranks: Sequence[int], context: int, name: str = "",
                 selector: Selector | None = None, transport: str = "shm") -> None:
        super().__init__(engine, ranks, context, name)
        self.selector = selector or Selector(constants.DEFAULTS)
        self.transport = transport if self.size > 1 else "self"
        self.last_algorithm = ""
        self._scratch: executor.Scratch | None = None  # made on first use (imports numpy)
        self._freed = False
        self._arena: shm.Arena | None = None
        self._small_plans: dict[tuple[Any, ...], tuple[Op, tuple[int, int, str], bool]] = {}
        # the last small allreduce's (weak refs to sendbuf and recvbuf, op, dtype, plan): a
        # loop repeating one call skips the checks (weak, so no user buffer is kept alive)
        self._last_small: tuple[Any, Any, Any, Any, Op, tuple[int, int, str]] | None = None
        # per collective, the last small shared-memory call's (weak refs to its arrays, root or
        # op, dtype, signature): see _again
        self._repeat: dict[str, tuple[Any, Any, Any, Any, tuple[int, int, str]]] = {}
        self._ndarray: Any = None  # numpy's ndarray, once the arena has loaded numpy
        self._agree_round = 0  # agreements (agree, shrink) made on this communicator
        self._hier: tuple[Self, Self | None] | None = None  # (host comm, leaders comm)
        # (algorithm asked for, size class) -> hierarchical allreduce?
        self._hier_choice: dict[tuple[str | None, int], bool] = {}
        self._link_bw: float | None = None  # measured bytes/s between hosts
        hosts, order = self._hosts()
        # each rank's host index when the ranks span hosts (the tuner's topology), else None
        index = {h: i for i, h in enumerate(order)}
        self._layout = tuple(index[h] for h in hosts) if len(order) > 1 else None

    # ------------------------------------------------------------------ plumbing
    def _choose(self, collective: str, nbytes: int, algorithm: str | None, *,
                commutative: bool = True, equal_blocks: bool = True,
                blocking: bool = False) -> str:
        self._check_open()
        name = self.selector.choose(collective, self.size, nbytes, self.transport, algorithm,
                                    commutative=commutative, equal_blocks=equal_blocks,
                                    shm=self._shm_ok(collective, algorithm, blocking),
                                    layout=self._layout)
        self.last_algorithm = name
        return name

    def _shm_ok(self, collective: str, algorithm: str | None, blocking: bool) -> bool:
        """Whether the shared-memory path can run this call (the selector decides whether
        it does): blocking, one host, ranks that map each other's windows."""
        # a barrier alone does not map the shared windows (start-up stays light); any other
        # collective does, once, on its first call
        return (blocking and self.transport == "shm"
                and (self._arena is not None or collective != "barrier"
                     or algorithm == SHM)  # first: a start-up barrier loads no numpy
                and self.size <= shm.MAX_RANKS and self.supports_shared_memory)

    def plan(self, collective: str, nbytes: int, *, algorithm: str | None = None,
             commutative: bool = True, equal_blocks: bool = True,
             blocking: bool = True) -> Plan:
        """How a call of ``collective`` moving ``nbytes`` (the vector; one block for the
        blocked collectives) would run on this communicator now, and why: the decision the
        call itself takes (``print(comm.plan("allreduce", 8))`` shows the algorithm, its
        kind, the reason and every candidate's predicted cost). Local: no traffic; where the
        hierarchical allreduce's decision needs the link between hosts and it has not been
        measured yet (by a call), an unlimited link is assumed.

        Raises:
            ValueError: an unknown collective or ``algorithm``, or one that cannot run the call.
        """
        self._check_open()
        if (collective == "allreduce" and blocking and commutative
                and self.selector.use_hierarchy(
                    self._host_sizes(), float(nbytes), algorithm,
                    lambda: math.inf if self._link_bw is None else self._link_bw)):
            return self.selector.plan(collective, self.size, nbytes, self.transport,
                                      algorithm, hierarchical=True)
        return self.selector.plan(collective, self.size, nbytes, self.transport, algorithm,
                                  commutative=commutative, equal_blocks=equal_blocks,
                                  shm=self._shm_ok(collective, algorithm, blocking),
                                  layout=self._layout)

    def _shm(self, what: str, timeout: float | None, nbytes: int = 0,
             kind: tuple[Any, ...] = (), sig: tuple[int, int, str] | None = None) -> shm.Arena:
        """This communicator's shared-memory arena (mapped on first use: collective).

        ``nbytes`` and ``kind`` (dtype, op, root...) are checked against every rank's at the
        syncs: a disagreement raises MismatchError on every rank instead of corrupting.
        ``sig``: their :meth:`Arena.signature`, when the caller kept it from an earlier call.
        """
        if timeout is not None:
            check_timeout(timeout)  # before the call's number is taken: a local error
        e = self._engine
        if e.mismatched or e.remote_mismatches or e.strays:  # the sequence broke earlier
            e.check_mismatched(self.coll_context)
        if self._arena is None:
            # before the call's number is taken: the set-up's barriers come first, signed with
            # the call, so a rank in another call at the same number is caught as a mismatch
            setup = f"{what} (shm: setting up the shared windows)"
            try:
                self._arena = shm.Arena(self, lambda: self._dissemination(timeout, setup),
                                         self.selector.shm_policy)
            except Timeout as exc:
                raise Timeout(f"{what} (shm) on {self.name}: setting up shared memory: "
                              f"{exc}") from exc
            self.last_algorithm = SHM  # not the barriers that set the windows up
            self._ndarray = np.ndarray
        seq = self.next_seq()  # shared-memory collectives send no messages but keep tags in step
        a = self._arena
        if sig is None:
            a.begin(what, timeout, nbytes, kind, seq)
        else:
            a.begin_signed(what, timeout, sig, seq)
        return a

    def _in_windows(self, run: Callable[..., None], a: shm.Arena, *args: Any) -> None:
        """``run(a, *args)``: a shared-memory collective; one that raises leaves the windows
        unusable, and says so to the peers (:meth:`Arena.abandon`), which raise too instead of
        taking this rank's next call for this one."""
        try:
            run(a, *args)
        except BaseException as exc:
            a.abandon(exc)
            raise

    def _go(self, collective: str, algo: str, spec: Spec, arrays: Sequence[Array],
            op: Op | None, blocking: bool, timeout: float | None,
            finish: Callable[[], None] | None = None) -> Request[None]:
        if timeout is not None:
            check_timeout(timeout)  # before the call's number is taken: a local error
        sched = registry.build(collective, algo, spec)  # cached: schedules are pure
        what = (collective, algo)  # described with its size only if an error needs it
        sig = self._signature(collective, algo, spec, arrays, op)
        if blocking:
            if sched.steps:
                scratch = self._scratch
                if scratch is None:
                    scratch = self._scratch = executor.Scratch()
                req: executor.CollectiveRequest[None] = executor.CollectiveRequest(
                    self, sched, arrays, op, what, scratch, finish, inline=True, sig=sig)
                req.run_inline(timeout)
            else:
                self.next_seq()
                if finish is not None:
                    finish()
            return CompletedRequest(self._engine, None)
        if not sched.steps:
            self.next_seq()
            if finish is not None:
                finish()
            return CompletedRequest(self._engine, None)
        nb: executor.CollectiveRequest[None] = executor.CollectiveRequest(
            self, sched, arrays, op, what, None, finish, sig=sig)
        return nb

    def _signature(self, collective: str, algo: str, spec: Spec, arrays: Sequence[Array],
                   op: Op | None) -> int:
        """A 16-bit hash of what every rank must agree on in this call, carried in the tags of
        its messages so that a disagreement fails as MismatchError instead of hanging or
        corrupting (the engine compares it with the peer's). Cost: one dict lookup."""
        # per-rank sizes of the v/w variants legitimately differ; everything else must agree
        varying = collective.endswith(("v", "w")) or spec.counts is not None
        dtype = None
        if arrays and collective != "alltoallw":
            dtype = (arrays[1] if collective.startswith("scatter") else arrays[0]).dtype
        key = (collective, algo, -1 if varying else spec.n, spec.root, dtype,
               "" if op is None else op.name)
        known = self._engine.signed_calls
        found = known.get(key)
        if found is None:
            text = (f"{collective}(algorithm={algo}, count={'per rank' if varying else spec.n},"
                    f" dtype={dtype}, op={key[5] or '-'}, root={spec.root})")
            found = self._engine.sign(text)
            if len(known) < 4096:
                known[key] = found
        return found

    def _again(self, coll: str, sb: Any, rb: Any, extra: Any) -> tuple[int, int, str] | None:
        """The shared-memory signature of the last ``coll`` if this call repeats it, else None:
        the same array objects (still 1-D, same dtype, ``rb`` still writable) and the same
        ``extra`` (root or op). A repeated call then skips the checks and the algorithm choice,
        which cost more than the copies of small calls and, run with the caches cold after a
        large one, 10-20 us a call. Cost: a few attribute reads.

        Raises:
            CommError / CommRevoked: the communicator was freed or revoked.
        """
        last = self._repeat.get(coll)
        if (last is None or last[0]() is not sb or last[1]() is not rb or last[2] != extra
                or sb.dtype is not last[3] or rb.dtype is not last[3] or sb.ndim != 1
                or rb.ndim != 1 or not rb.flags.writeable):
            return None
        self._check_open()
        self.last_algorithm = SHM
        sig: tuple[int, int, str] = last[4]
        return sig

    def _keep(self, coll: str, sendbuf: Any, recvbuf: Any, sb: Array, rb: Array, extra: Any,
              nbytes: int, kind: tuple[Any, ...]) -> None:
        """Remember a shared-memory call made on the user's own 1-D arrays for :meth:`_again`
        (weakly: no user array is kept alive)."""
        if sb is sendbuf and rb is recvbuf and self._arena is not None:
            sig = self._arena.signature(coll, nbytes, kind)
            self._repeat[coll] = (weakref.ref(sb), weakref.ref(rb), extra, rb.dtype, sig)

    def _op(self, op: OpLike, *bufs: Array) -> Op:
        for b in bufs:
            if b.size:
                key = (op, b.dtype)
                found = _CHECKED_OPS.get(key)
                if found is None:
                    found = ops.resolve(op)
                    found.check_dtype(b.dtype, "the buffers")
                    if len(_CHECKED_OPS) < 1024:
                        _CHECKED_OPS[key] = found
                return found
        return ops.resolve(op)

    def _root(self, root: int) -> int:
        self._world(root, "root")  # validates
        return int(root)

    # ------------------------------------------------------------------ barrier
    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Block until every rank has entered the barrier (dissemination: log2 p rounds).

        Raises:
            Timeout, PeerFailure: a rank did not arrive in time or failed.
        """
        self._barrier(algorithm, True, timeout)

    def ibarrier(self, *, algorithm: str | None = None) -> Request[None]:
        """Start a barrier; the request completes once every rank has entered it."""
        return self._barrier(algorithm, False, None)

    def _barrier(self, algorithm: str | None, blocking: bool,
                 timeout: float | None) -> Request[None]:
        algo = self._choose("barrier", 0, algorithm, blocking=blocking)
        if algo == SHM:
            self._in_windows(shm.barrier, self._shm("barrier", timeout))
            return CompletedRequest(self._engine, None)
        if blocking and self.size > 1:  # without the executor: start-up needs no numpy
            self._dissemination(timeout)
            return CompletedRequest(self._engine, None)
        return self._go("barrier", algo, Spec(self.size, self.rank), [], None, blocking, timeout)

    def _dissemination(self, timeout: float | None,
                       what: str = "barrier(algorithm=dissemination)") -> None:
        """The dissemination barrier's schedule, run directly on zero-byte messages, signed
        with ``what`` (a rank in another call is caught as a mismatch)."""
        if timeout is not None:
            check_timeout(timeout)
        e = self._engine
        tag = self.next_seq() | e.sign(what) << SIG_SHIFT
        e.note_call(self.coll_context, tag)
        if e.mismatched or e.remote_mismatches:  # the sequence broke earlier
            e.check_mismatched(self.coll_context, tag & SEQ_MASK)
        sink = memoryview(bytearray(0))
        for step in registry.build("barrier", "dissemination", Spec(self.size, self.rank)).steps:
            reqs: list[Request[Any]] = [self.coll_irecv(sink, x.peer, tag) for x in step.recvs]
            for x in step.sends:
                h = self.coll_isend(sink, x.peer, tag)
                if h is not None:
                    reqs.append(h)
            try:
                wait_all(reqs, timeout)
            except Timeout as exc:
                raise Timeout(f"barrier #{tag & SEQ_MASK} on {self.name}: {exc}") from exc

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

    def _refuse_reduce(self, exc: TypeError | ValueError, sendbuf: Any, op: OpLike,
                       algorithm: str | None, blocking: bool) -> NoReturn:
        """The root's buffers are wrong: refuse the call on every rank (see :meth:`_refuse`),
        in the shared windows if that is where the others are (the root's own sendbuf tells
        which path they took)."""
        try:
            sb = bufs.as_array(sendbuf, "sendbuf")
            o = self._op(op, sb)
            algo = self._choose("reduce", sb.nbytes, algorithm, commutative=o.commutative,
                                blocking=blocking)
        except (TypeError, ValueError):
            algo = ""
        if algo == SHM:
            root = self.rank
            a = self._shm("reduce", None, sb.nbytes, (sb.dtype, o.name, root))
            a.refuse(self._refusal(a.what, exc), type(exc))
            raise exc
        self._refuse("reduce", exc)

    def _refusal(self, what: str, exc: BaseException) -> str:
        return (f"{what}: the root (world rank {self._ranks[self.rank]}) refused its "
                f"arguments: {type(exc).__name__}: {exc}")

    def _refuse(self, collective: str, exc: TypeError | ValueError) -> NoReturn:
        """Raise ``exc``, an error in arguments that only this rank, the root, checks; the
        other ranks, which cannot see it, are in the call. The root takes the call's number
        as they do and tells them (those waiting for the root raise the same error type,
        naming it), and drops the messages they send it in that call: the communicator stays
        usable on every rank. Cost: two store round trips, on this error path only."""
        seq = self.next_seq()
        e = self._engine
        e.refuse_call(self.coll_context, seq,
                      self._refusal(f"{collective} #{seq} on {self.name}", exc),
                      type(exc).__name__)
        raise exc

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

    def _small_allreduce(self, sendbuf: Any, rb: Any, op: OpLike,
                         timeout: float | None) -> bool:
        """The latency-critical case, checked and run with as little Python as possible.

        A small contiguous array with a built-in op, once the shared windows exist and the cost
        model picks shared memory for this size: one copy, one sync, one ufunc. A call repeated
        on the same arrays (a training loop's) skips the checks, unless the arrays' dtypes were
        reassigned or recvbuf made read-only. Returns False (having done nothing) whenever any
        condition does not hold.
        """
        last = self._last_small
        sb: Any = rb if sendbuf is IN_PLACE else sendbuf
        if (last is not None and last[1]() is rb and op is last[2]
                and (sb is rb or last[0]() is sb) and rb.dtype is last[3] and sb.dtype is last[3]
                and rb.flags.writeable):
            o, sig = last[4], last[5]
        else:
            plan = self._small_plan(sendbuf, rb, op)
            if plan is None:
                return False
            o, sig = plan
        if rb.ndim != 1:
            rb, sb = rb.reshape(-1), sb.reshape(-1)  # views: both are contiguous
        self.last_algorithm = SHM
        a = self._shm("allreduce", timeout, sig=sig)
        try:  # _in_windows inline: the latency-critical path takes no extra call
            shm.allreduce(a, sb, rb, o)
        except BaseException as exc:
            a.abandon(exc)
            raise
        return True

    def _small_plan(self, sendbuf: Any, rb: Any, op: OpLike
                    ) -> tuple[Op, tuple[int, int, str]] | None:
        """The op and shared-memory signature of a small allreduce on these buffers, or None if
        it cannot take the small path; a plan found is kept for the next call (weakly)."""
        if self._arena is None or type(rb) is not self._ndarray:
            return None
        nbytes = rb.nbytes
        if nbytes > SMALL:
            return None
        flags = rb.flags
        if not flags.c_contiguous or not flags.writeable:
            return None
        if sendbuf is not IN_PLACE and (
                type(sendbuf) is not self._ndarray or sendbuf.shape != rb.shape
                or (sendbuf.dtype is not rb.dtype and sendbuf.dtype != rb.dtype)
                or not sendbuf.flags.c_contiguous):
            return None
        key = (op, rb.dtype, nbytes)
        plan = self._small_plans.get(key)
        if plan is None:
            o = ops.resolve(op)
            if not o.is_builtin or o.name in ("maxloc", "minloc") or rb.dtype.hasobject:
                return None
            o.check_dtype(rb.dtype, "recvbuf")
            algo = self.selector.choose("allreduce", self.size, nbytes, self.transport,
                                        commutative=o.commutative, shm=True,
                                        layout=self._layout)
            assert self._arena is not None
            sig = self._arena.signature("allreduce", nbytes, (rb.dtype, o.name))
            plan = self._small_plans[key] = (o, sig, algo == SHM)
        o, sig, use = plan
        if not use:
            return None
        self._last_small = (_gone if sendbuf is IN_PLACE else weakref.ref(sendbuf),
                            weakref.ref(rb), op, rb.dtype, o, sig)
        return o, sig

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

    # ------------------------------------------------------------------ hierarchy
    def _hosts(self) -> tuple[list[str], list[str]]:
        """Each rank's host label, and the hosts in order of their first rank."""
        hosts = [self._engine.hosts[w] for w in self._ranks]
        return hosts, list(dict.fromkeys(hosts))

    def _host_sizes(self) -> list[int]:
        """Ranks of this communicator per host, hosts in order of their first rank."""
        hosts, order = self._hosts()
        return [hosts.count(h) for h in order]

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
        self._engine.report_left(self.coll_context, self._coll_seq,
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

    # ------------------------------------------------------------------ management
    def _agree_context(self, extra: Sequence[int] = ()) -> tuple[int, Array]:
        """Allgather (next free context, *extra) and reserve the agreed context id."""
        mine = np.array([self._engine.next_context, *extra], dtype=np.int64)
        table = np.empty(self.size * mine.size, dtype=np.int64)
        self.allgather(mine, table, algorithm=None)
        rows = table.reshape(self.size, mine.size)
        ctx = int(rows[:, 0].max())
        self._engine.reserve_contexts(ctx)
        return ctx, rows

    def _derive(self, ranks: Sequence[int], context: int, name: str) -> Self:
        return type(self)(self._engine, ranks, context, name, self.selector,
                          self._engine.kind_for(ranks))

    def self_comm(self) -> Self:
        """A communicator holding only this rank (MPI's COMM_SELF); no traffic to create."""
        base = super().self_comm()
        base.selector = self.selector
        return base

    def dup(self, name: str | None = None) -> Self:
        """A new communicator with the same ranks and its own message contexts.

        Collective over this communicator. Cost: one allgather of 8 bytes.

        Raises:
            Timeout, PeerFailure.
        """
        ctx, _ = self._agree_context()
        return self._derive(self._ranks, ctx, name or f"{self.name}.dup")

    def split(self, color: int | None, key: int = 0, name: str | None = None) -> Self | None:
        """Partition into one communicator per ``color``, ranked by (``key``, old rank).

        ``color`` None or :data:`UNDEFINED` returns None on this rank. Collective over this
        communicator. Cost: one allgather of 24 bytes per rank.

        Raises:
            TypeError / ValueError: color or key not an int, or a negative color.
            Timeout, PeerFailure.
        """
        col = UNDEFINED if color is None else int(_as_int(color, "color"))
        if col < 0 and col != UNDEFINED:
            raise ValueError(f"color={color} must be >= 0, None or UNDEFINED")
        k = int(_as_int(key, "key"))
        ctx, rows = self._agree_context((col, k))
        if col == UNDEFINED:
            return None
        members = sorted((int(rows[i, 2]), i) for i in range(self.size) if rows[i, 1] == col)
        return self._derive([self._ranks[i] for _, i in members], ctx,
                            name or f"{self.name}.split{col}")

    def create(self, ranks: Sequence[int], name: str | None = None) -> Self | None:
        """A communicator of ``ranks`` (ranks of this one, in new-rank order); None elsewhere.

        Collective over this communicator: every rank passes the same ``ranks``.

        Raises:
            ValueError: duplicates or out-of-range ranks.  Timeout, PeerFailure.
        """
        group = [int(_as_int(x, "ranks")) for x in ranks]
        if len(set(group)) != len(group) or any(not 0 <= x < self.size for x in group):
            raise ValueError(f"ranks={group} must be distinct ranks in 0..{self.size - 1}")
        pos = {x: i for i, x in enumerate(group)}
        color = 0 if self.rank in pos else None
        return self.split(color, pos.get(self.rank, 0), name or f"{self.name}.create")

    # ------------------------------------------------------------------ fault tolerance
    def failed_ranks(self) -> list[int]:
        """Ranks of this communicator known to have failed (exited or stopped responding).

        Local: what this rank has learned so far (from its transports, its heartbeat monitor
        and the launcher).
        """
        self._engine.check_peers()
        gone = set(self._engine.dead) | self._engine.reported
        return [i for i, w in enumerate(self._ranks) if w in gone]

    def revoke(self) -> None:
        """Make every member's pending and later operations on this communicator fail with
        :class:`~ringworld.CommRevoked` (ULFM's revoke); other communicators keep working.

        This rank's fail at once; the other members' within about 0.3 s (their monitors poll
        the job store). Use it after a failure so that ranks blocked on other members learn of
        it, then :meth:`shrink`. Cost: two store round trips.

        Raises:
            CommError: no job monitor (a job not started by ``ringworld run``, or
                ``RINGWORLD_LIVENESS_TIMEOUT=0``) and more than one rank.
        """
        why = CommRevoked(f"{self.name} was revoked by rank {self.rank}")
        self._engine.revoke((self.context, self.coll_context), why)
        if self.size > 1:
            self._fault_tolerance("revoke").publish_revocation(
                (self.context, self.coll_context), self._ranks, self.name)

    def agree(self, flag: int = 1, *, timeout: float | None = None) -> int:
        """The bitwise AND of ``flag`` over the live members (ULFM's agree), same on all.

        Works on a failed or revoked communicator: members that failed are left out instead of
        blocking it. Collective over the live members. Cost: a few store round trips each.

        Raises:
            Timeout: no agreement within ``timeout`` (default: the job's).
            CommError: no job monitor, or the coordinating rank failed while agreeing.
        """
        result, _, _ = self._agreement("agree", flag, timeout)
        return result

    def shrink(self, name: str | None = None, *, timeout: float | None = None) -> Self:
        """A new communicator of the live members, in rank order (ULFM's shrink).

        Call it on every surviving member after a failure (usually after :meth:`revoke`); the
        result works normally, failed ranks excluded. Collective over the live members. Cost:
        an agreement (a few store round trips each).

        Raises:
            Timeout: no agreement within ``timeout``.
            CommError: no job monitor, or the coordinating rank failed while agreeing.
        """
        _, alive, ctx = self._agreement("shrink", 1, timeout)
        self._engine.reserve_contexts(ctx)
        members = [w for w in self._ranks if w in set(alive)]
        return self._derive(members, ctx, name or f"{self.name}.shrunk")

    def _agreement(self, what: str, flag: int, timeout: float | None
                   ) -> tuple[int, list[int], int]:
        self._agree_round += 1
        if self.size == 1:
            ctx = self._engine.next_context
            return int(flag), [self._ranks[0]], ctx
        members = ",".join(map(str, self._ranks))
        key = f"{self.coll_context}.{zlib.crc32(members.encode()):08x}.{self._agree_round}"
        return self._fault_tolerance(what).agree(
            key, self._ranks, flag, self._engine.next_context,
            self._engine.timeout if timeout is None else timeout)

    def _fault_tolerance(self, what: str) -> Monitor:
        ft: Monitor | None = self._engine.ft
        if ft is None:
            raise CommError(f"{what} on {self.name} needs the job's monitor: run the job with "
                            "`ringworld run` and RINGWORLD_LIVENESS_TIMEOUT > 0")
        return ft

    def free(self) -> None:
        """Release this communicator (scratch, shared windows); later collectives raise CommError.

        Local: call it on every rank once no operation on the communicator is pending.
        """
        self._freed = True
        self._scratch = None
        self._last_small = None  # the repeated small calls would reach the windows directly
        self._repeat.clear()
        if self._arena is not None:
            self._arena = None
            self.unmap_shared("arena")
        if self._hier is not None:
            for sub in self._hier:
                if sub is not None and sub is not self:
                    sub.free()
            self._hier = None
        self._engine.forget_contexts((self.context, self.coll_context))
