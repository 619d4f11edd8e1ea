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
from ringworld.collective import calls
from ringworld.collective.cache import LIMIT, REPEATED, VECTORS, AdapterKey
from ringworld.collective.calls import Call
from ringworld.collective.core import OnMessages, OpLike
from ringworld.collective.management import CommManagement
from ringworld.collective.markers import IN_PLACE, UNDEFINED
from ringworld.comm import ops
from ringworld.comm.foreign import DeviceBuffer
from ringworld.comm.hooks import observable, observed
from ringworld.comm.ops import Op
from ringworld.comm.point_to_point import arrays_overlap
from ringworld.comm.requests import (
    CompletedRequest,
    Request,
    Status,
)
from ringworld.errors import PeerFailure, reaches_every_member

if TYPE_CHECKING:
    from ringworld.algorithms import shm_collectives as shm
    from ringworld.algorithms import shm_repeat, shm_vector
    from ringworld.algorithms.schedule import Spec
    from ringworld.collective.buffers import Array
    from ringworld.device.plane import Plane
else:  # imported on the first collective call: init() and point-to-point never load numpy
    shm = LazyModule("ringworld.algorithms.shm_collectives", globals(), "shm")
    shm_vector = LazyModule("ringworld.algorithms.shm_vector", globals(), "shm_vector")
    shm_repeat = LazyModule("ringworld.algorithms.shm_repeat", globals(), "shm_repeat")


__all__ = ["IN_PLACE", "UNDEFINED", "Communicator"]


@observed
class Communicator(CommManagement):
    """A group of ranks with point-to-point messaging and the full collective set."""

    # ------------------------------------------------------------------ the runner
    def _run(self, prepare: Callable[..., Call], args: tuple[Any, ...], algorithm: str | None,
             blocking: bool, timeout: float | None,
             keep: tuple[Any, Any, Any] | None = None) -> Request[None]:
        """Check a collective's arguments (``prepare(self, *args)``, a function of
        :mod:`ringworld.collective.calls`) and run the call: the one way every buffer collective
        takes. ``keep`` (the user's sendbuf, recvbuf and op or root, blocking calls only) lets a
        call run in the shared windows be repeated without its checks (:meth:`_again`).

        Raises:
            What ``prepare`` raises; a root's refusal (:class:`calls.Refused`) reaches the other
            ranks first. Then what the run raises (Timeout, PeerFailure, MismatchError, ...).
        """
        try:
            call = prepare(self, *args)
        except calls.Refused as exc:
            if isinstance(exc.error, DeviceBuffer):
                return self._on_device(prepare, args, blocking, timeout)
            refused = exc  # raised below, outside this handler: the user sees the error alone
        except DeviceBuffer:  # a buffer in GPU memory: the device plane's call
            return self._on_device(prepare, args, blocking, timeout)
        else:
            return self._start(call, algorithm, blocking, timeout, keep)
        if refused.collective in ("reduce", "gather", "scatter", "gatherv", "scatterv"):
            self._refuse_rooted(refused.collective, refused.error, refused.own, refused.op,
                                algorithm, blocking)
        else:
            self._refuse(refused.collective, refused.error)
        raise refused.error

    def _on_device(self, prepare: Callable[..., Call], args: tuple[Any, ...], blocking: bool,
                   timeout: float | None) -> Request[None]:
        """Run a call on device buffers on the NCCL plane (see :mod:`ringworld.device.plane`).

        Raises:
            TypeError: a host buffer beside a device one, a device of another kind, a type or
                op NCCL lacks; DeviceUnavailable: no CUDA driver or NCCL here. Then what the
                run raises (MismatchError, Timeout, PeerFailure, DeviceError).
        """
        from ringworld.collective import device_calls

        device_prepare = device_calls.TABLE[prepare]
        self.last_algorithm = "nccl"
        return self.device_plane().run(lambda: device_prepare(self, *args), blocking, timeout)

    def device_plane(self) -> Plane:
        """This communicator's NCCL plane (made on first use; its NCCL communicator is made by
        the first device call). Raises: CommError (freed or revoked)."""
        self._check_open()
        if self._plane is None:
            from ringworld.device.plane import Plane

            engine = self._engine
            self._plane = Plane(self, engine, lambda: engine.timeout)
        return self._plane

    def _device_send(self, exc: DeviceBuffer, buf: Any, dest: int,
                     tag: int) -> Request[None]:
        """Start sending a device buffer on the NCCL plane (see :mod:`ringworld.device.p2p`).

        Raises:
            TypeError / ValueError: bad buffer, rank or tag; DeviceUnavailable: no driver or
                NCCL here.
        """
        self.last_algorithm = "nccl"
        req: Request[None] = self.device_plane().links.send(buf, dest, self._send_tag(tag))
        return req

    def _device_recv(self, exc: DeviceBuffer, buf: Any, source: int,
                     tag: int) -> Request[Status]:
        """Start receiving into a device buffer on the NCCL plane (a named source)."""
        self.last_algorithm = "nccl"
        req: Request[Status] = self.device_plane().links.recv(buf, source,
                                                              self._recv_tag(tag))
        return req

    def _start(self, call: Call, algorithm: str | None, blocking: bool, timeout: float | None,
               keep: tuple[Any, Any, Any] | None = None) -> Request[None]:
        """Run a checked call on the path the selector chooses (kept per call shape)."""
        coll, o = call.collective, call.op
        commutative = o is None or o.commutative
        key = (coll, call.nbytes, algorithm, commutative, call.equal_blocks, blocking)
        plan = self._cache.plans.get(key)
        if plan is None:
            plan = self._plan_call(call, algorithm, blocking, commutative)
            if len(self._cache.plans) < LIMIT:
                self._cache.plans[key] = plan
        else:
            self._check_open()
        algo, hierarchical = plan
        self.last_algorithm = algo
        if hierarchical:
            assert o is not None
            self._hierarchical_allreduce(call.arrays[0], call.arrays[1], o, timeout)
            return CompletedRequest(self._engine, None)
        if algo == SHM:
            return self._in_shared(call, timeout, keep)
        spec = call.spec
        if coll == "bcast":
            itemsize = call.arrays[1].itemsize
            spec = spec._replace(segment=max(1, self.selector.segment_bytes // max(1, itemsize)))
        req = self._go(coll, algo, spec, call.arrays, o, blocking, timeout, call.finish)
        if keep is not None and algorithm is None and call.finish is None and not call.copied:
            # (a call that chose its algorithm is not kept: a repeat would run the selector's)
            if coll in REPEATED:
                raw = type(keep[2]) is AdapterKey and keep[2].raw
                run = OnMessages.make(self, call, algo, spec, keep[0], keep[1], raw)
                if run is not None:
                    self._cache.keep(call, keep[0], keep[1], call.arrays[0], call.arrays[1],
                                     keep[2], None, run)
            elif coll in VECTORS:
                run = OnMessages.make(self, call, algo, spec, keep[0], keep[1], False)
                if run is not None:
                    self._cache.keep_vector(call, keep[0], keep[1], keep[2], None, run)
        return req

    def _in_shared(self, call: Call, timeout: float | None,
                   keep: tuple[Any, Any, Any] | None) -> Request[None]:
        """Run ``call`` in the shared windows (a blocking call: the request is done)."""
        coll, o = call.collective, call.op
        assert call.shared is not None
        sb, rb = call.arrays[0], call.arrays[1]
        if coll == "bcast":
            sb = rb
        nbytes, kind = call.shared
        a = self._arena
        if a is None:  # the first call maps the windows
            a = self._shm(coll, timeout, nbytes, kind)
            sig = a.signature(coll, nbytes, kind)
        else:
            sig = a.signature(coll, nbytes, kind)
            a = self._shm(coll, timeout, sig=sig)
        if coll in shm_vector.RUN:
            if keep is not None:
                self._cache.keep_vector(call, keep[0], keep[1], keep[2], sig)
            return self._vector_in_shared(coll, call.spec, sb, rb, o, call.nbytes, call.finish,
                                          a, timeout)
        run = shm.RUN[coll]
        self._in_windows(run, a, sb, rb, o, call.spec.root)
        if call.finish is not None:
            call.finish()
        if keep is not None:
            root = call.spec.root
            self._cache.keep(call, keep[0], keep[1], sb, rb, keep[2], sig, run,
                             lambda s, r: shm_repeat.quick(a, coll, s, r, o, root))
        return self._done

    def _vector_in_shared(self, coll: str, spec: Spec, sb: Array, rb: Array, op: Op | None,
                          nbytes: int, finish: Callable[[], None] | None, a: shm.Arena,
                          timeout: float | None) -> Request[None]:
        """Run a v-variant, begun in the shared windows: there where its blocks fit them, else
        (every rank decides alike, see :mod:`ringworld.algorithms.shm_vector`) on the message
        path after."""
        try:
            done = shm_vector.RUN[coll](a, spec, sb, rb, op)
        except BaseException as exc:
            a.abandon(exc)
            raise
        if done:
            if finish is not None:
                finish()
            return self._done
        return self._vector_on_messages(coll, spec, sb, rb, op, nbytes, finish, timeout)

    def _vector_on_messages(self, coll: str, spec: Spec, sb: Array, rb: Array, op: Op | None,
                            nbytes: int, finish: Callable[[], None] | None,
                            timeout: float | None) -> Request[None]:
        """The rest of a v-variant begun in the shared windows, whose blocks did not fit them:
        on the message path."""
        algo = self.selector.choose(coll, self.size, nbytes, self.transport,
                                    commutative=op is None or op.commutative,
                                    equal_blocks=False, layout=self._layout)
        self.last_algorithm = f"{SHM}+{algo}"
        return self._go(coll, algo, spec, (sb, rb), op, True, timeout, finish)

    def _again_vector(self, coll: str, sendbuf: Any, recvbuf: Any, key: tuple[Any, ...],
                      timeout: float | None) -> bool:
        """A v-variant repeated on arrays of the same dtype and shapes with equal counts (see
        :meth:`CallCache.keep_vector`): straight into the shared windows, without the checks;
        False, having done nothing, if it is no such repeat. (Written out, not looped over the
        two buffers, and the run inlined in :meth:`_rerun_vector`: a repeat's cost is Python's;
        same job, old and new code swapped each round, 4-byte blocks, np=4 on 2 cores:
        scatterv 18.5 -> 15.5 us, allgatherv 25.9 -> 23.1, alltoallv 34.1 -> 32.0; np=2 3-5%.)"""
        last = self._cache.vector.get(coll)
        if last is None:
            return False
        try:
            if last[2] != key:
                return False
        except (TypeError, ValueError):  # counts of another type (a numpy array): not kept
            return False
        dt, nd = last[3], self._cache.ndarray
        if sendbuf is None:
            if last[0] is not None:
                return False
        elif (type(sendbuf) is not nd or sendbuf.dtype is not dt or sendbuf.shape != last[0]
              or not sendbuf.flags.c_contiguous):
            return False
        if recvbuf is None:
            if last[1] is not None:
                return False
        elif type(recvbuf) is not nd or recvbuf.dtype is not dt or recvbuf.shape != last[1]:
            return False
        else:
            flags = recvbuf.flags
            if not (flags.c_contiguous and flags.writeable):
                return False
            if sendbuf is not None and arrays_overlap(sendbuf, recvbuf):
                return False  # (the checks copy the send buffer aside: see Call.copied)
        self._rerun_vector(coll, last, sendbuf, recvbuf, timeout)
        return True

    def _kept_begin(self, coll: str, timeout: float | None, sig: tuple[int, int, str]
                    ) -> shm.Arena:
        """Begin a kept call (signed ``sig``) in the windows: as :meth:`_shm`, with its checks
        skipped where none can fail (no timeout given, the windows mapped, no engine flag up:
        a repeat's case). Raises: as _shm (revoked, mismatched; free() empties the cache)."""
        a = self._arena
        e = self._engine
        if (timeout is None and a is not None and not (
                e.mismatched or e.remote_mismatches or e.strays or e.revoked or e.closed)):
            a.begin_signed(coll, None, sig, self._next_seq())
            return a
        return self._shm(coll, timeout, sig=sig)

    def _again_kept_vector(self, coll: str, last: tuple[Any, ...], sendbuf: Any, recvbuf: Any
                           ) -> bool:
        """The v-variant kept as ``last`` (``CallCache.vector``'s entry, as an adapter found it
        after its own call) again, without the checks: the caller vouches that ``sendbuf`` and
        ``recvbuf`` are arrays of the kept dtype and shapes (the recvbuf writable) and the
        counts the same. False, having done nothing, if ``last`` is no longer the kept call
        (a later call of another shape replaced it, or the first repeat stored its runner in a
        new entry: the adapter then runs the call through the native method once more)."""
        if self._cache.vector.get(coll) is not last:
            return False
        self._rerun_vector(coll, last, sendbuf, recvbuf, None)
        return True

    def _rerun_vector(self, coll: str, last: tuple[Any, ...], sendbuf: Any, recvbuf: Any,
                      timeout: float | None) -> None:
        sb = last[7] if sendbuf is None else sendbuf
        rb = last[8] if recvbuf is None else recvbuf
        if rb.ndim != 1:
            rb = rb.reshape(-1)
        if sb.ndim != 1:
            sb = sb.reshape(-1)
        if last[4] is None:  # kept on messages (core.OnMessages): it runs the call itself
            last[10](timeout, sb, rb, last[9], 0)
            return
        a = self._kept_begin(coll, timeout, last[4])
        self.last_algorithm = SHM
        run = last[10]
        try:  # (_vector_in_shared's, written out: one Python call fewer a repeat)
            if run is None:  # the first repeat: a runner made for the shape (see shm_repeat)
                run = shm_repeat.quick_vector(a, coll, last[5], sb, rb) or shm_vector.RUN[coll]
                if self._cache.vector.get(coll) is last:
                    self._cache.vector[coll] = (*last[:10], run)
            done = run(a, last[5], sb, rb, last[9])
        except BaseException as exc:
            a.abandon(exc)
            raise
        if not done:
            self._vector_on_messages(coll, last[5], sb, rb, last[9], last[6], None, timeout)

    def _plan_call(self, call: Call, algorithm: str | None, blocking: bool,
                   commutative: bool) -> tuple[str, bool]:
        """(the algorithm for this call's shape, whether it runs hierarchically)."""
        if (call.collective == "allreduce" and blocking and commutative
                and self.selector.use_hierarchy(self._host_sizes(), float(call.nbytes),
                                                algorithm, self._interhost_bandwidth)):
            self._check_open()
            return HIERARCHICAL, True
        return self._choose(call.collective, call.nbytes, algorithm, commutative=commutative,
                            equal_blocks=call.equal_blocks, blocking=blocking), False

    def _again(self, coll: str, sendbuf: Any, recvbuf: Any, extra: Any,
               timeout: float | None) -> bool:
        """Run this call without its checks if one of its shape ran before, straight in the
        shared windows or on messages as that one did (see :meth:`CallCache.again`; the last
        call's own arrays are checked here, inline: that is a training loop's case); False,
        having done nothing, if not."""
        last = self._last_calls.get(coll)
        if (last is not None and last[1]() is recvbuf and last[0]() is sendbuf
                and (last[2] is extra or (last[2] == extra and type(last[2]) is type(extra)))
                and recvbuf.dtype is last[3]
                and (sendbuf is IN_PLACE or sendbuf.dtype is last[3])):
            flags = recvbuf.flags
            if not (flags.writeable and flags.c_contiguous):
                return False
            sig, run, op, root = last[4], last[5], last[6], last[7]
        else:
            kept = self._cache.again(coll, sendbuf, recvbuf, extra)
            if kept is None:
                return False
            sig, run, op, root = kept
        rb = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)  # views: both contiguous
        sb = rb if sendbuf is IN_PLACE else sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
        if sig is None:  # kept on messages (core.OnMessages): it runs the call itself
            run(timeout, sb, rb, op, root)
            return True
        self.last_algorithm = SHM
        a = self._kept_begin(coll, timeout, sig)
        try:
            run(a, sb, rb, op, root)
        except BaseException as exc:
            a.abandon(exc)
            raise
        return True

    # ------------------------------------------------------------------ bcast
    @observable("collective")
    def bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None,
              timeout: float | None = None) -> None:
        """Copy ``buf`` of ``root`` into ``buf`` of every rank.

        Cost: binomial tree for small messages, pipelined ring or scatter+allgather for large.

        Raises:
            TypeError / ValueError: bad ``buf``, ``root`` or ``algorithm``.
            Timeout, PeerFailure, TruncationError (ranks disagree on the size).
        """
        if algorithm is None and self._again("bcast", buf, buf, root, timeout):
            return
        self._run(calls.bcast, (buf, root), algorithm, True, timeout, (buf, buf, root))

    @observable("collective", start=True)
    def ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request[None]:
        """Start a broadcast; ``buf`` must not be touched until the request completes."""
        return self._run(calls.bcast, (buf, root), algorithm, False, None)

    # ------------------------------------------------------------------ reductions
    @observable("collective")
    def reduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Combine every rank's ``sendbuf`` with ``op`` into ``recvbuf`` of ``root``.

        ``recvbuf`` matters only at the root (None elsewhere); ``IN_PLACE`` at the root takes
        its input from ``recvbuf``.

        Raises:
            TypeError / ValueError: bad buffers, op, root or algorithm.
            Timeout, PeerFailure, TruncationError.
        """
        # a repeat runs straight in the shared windows (see _again), kept under the op and the
        # root; a rank other than the root that passes no recvbuf is kept under its sendbuf
        # alone (never the root: a missing recvbuf there is the checks' error to report)
        held = sendbuf if recvbuf is None and root != self.rank else recvbuf
        if algorithm is None and self._again("reduce", sendbuf, held, (op, root), timeout):
            return
        self._run(calls.reduce, (sendbuf, recvbuf, op, root), algorithm, True, timeout,
                  (sendbuf, held, (op, root)))

    @observable("collective", start=True)
    def ireduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a reduce; buffers must not be touched until the request completes."""
        return self._run(calls.reduce, (sendbuf, recvbuf, op, root), algorithm, False, None)

    @observable("collective")
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
        if algorithm is None and self._again("allreduce", sendbuf, recvbuf, op, timeout):
            return
        self._run(calls.allreduce, (sendbuf, recvbuf, op), algorithm, True, timeout,
                  (sendbuf, recvbuf, op))

    @observable("collective", start=True)
    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allreduce; buffers must not be touched until the request completes."""
        return self._run(calls.allreduce, (sendbuf, recvbuf, op), algorithm, False, None)

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
        if reaches_every_member(exc):
            return
        kind = f"PeerFailure:{exc.rank}" if isinstance(exc, PeerFailure) else ""
        self._engine.report_left(self.coll_context, self._chan.seq,
                                 f"a composite collective with {type(exc).__name__}: {exc}",
                                 kind)

    @observable("collective")
    def reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                             algorithm: str | None = None,
                             timeout: float | None = None) -> None:
        """Reduce ``sendbuf`` (p blocks of ``len(recvbuf)``) and give rank i block i.

        With ``IN_PLACE`` the input is ``recvbuf`` (p blocks) and the result its first block.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._again("reduce_scatter_block", sendbuf, recvbuf, op,
                                             timeout):
            return
        self._run(calls.reduce_scatter, (sendbuf, recvbuf, None, op), algorithm, True, timeout,
                  (sendbuf, recvbuf, op))

    @observable("collective", start=True)
    def ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                              algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter_block."""
        return self._run(calls.reduce_scatter, (sendbuf, recvbuf, None, op), algorithm, False,
                         None)

    @observable("collective")
    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                       op: OpLike = ops.SUM, *, algorithm: str | None = None,
                       timeout: float | None = None) -> None:
        """Reduce ``sendbuf`` (blocks of ``counts[i]``) and give rank i block i.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        key = (counts, op)
        if algorithm is None and self._again_vector("reduce_scatter", sendbuf, recvbuf, key,
                                                    timeout):
            return
        self._run(calls.reduce_scatter, (sendbuf, recvbuf, *key), algorithm, True, timeout,
                  (sendbuf, recvbuf, key))

    @observable("collective", start=True)
    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                        op: OpLike = ops.SUM, *, algorithm: str | None = None) -> Request[None]:
        """Start a reduce_scatter."""
        return self._run(calls.reduce_scatter, (sendbuf, recvbuf, counts, op), algorithm, False,
                         None)

    @observable("collective")
    def scan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
             algorithm: str | None = None, timeout: float | None = None) -> None:
        """Inclusive prefix reduction: rank i gets ``op`` over ranks 0..i, in rank order.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._again("scan", sendbuf, recvbuf, op, timeout):
            return
        self._run(calls.scan, ("scan", sendbuf, recvbuf, op), algorithm, True, timeout,
                  (sendbuf, recvbuf, op))

    @observable("collective", start=True)
    def iscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
              algorithm: str | None = None) -> Request[None]:
        """Start a scan."""
        return self._run(calls.scan, ("scan", sendbuf, recvbuf, op), algorithm, False, None)

    @observable("collective")
    def exscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Exclusive prefix reduction: rank i gets ``op`` over ranks 0..i-1 (rank 0: untouched).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._again("exscan", sendbuf, recvbuf, op, timeout):
            return
        self._run(calls.scan, ("exscan", sendbuf, recvbuf, op), algorithm, True, timeout,
                  (sendbuf, recvbuf, op))

    @observable("collective", start=True)
    def iexscan(self, sendbuf: Any, recvbuf: Any, op: OpLike = ops.SUM, *,
                algorithm: str | None = None) -> Request[None]:
        """Start an exscan."""
        return self._run(calls.scan, ("exscan", sendbuf, recvbuf, op), algorithm, False, None)

    # ------------------------------------------------------------------ gather / scatter
    @observable("collective")
    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               algorithm: str | None = None, timeout: float | None = None) -> None:
        """Collect every rank's ``sendbuf`` into ``recvbuf`` of ``root`` (block i from rank i).

        ``recvbuf`` matters only at the root; ``IN_PLACE`` at the root means its block is
        already in place.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        # a repeat runs straight in the shared windows (see _again), kept under the root; a
        # rank other than the root that passes no recvbuf is kept under its sendbuf alone
        held = sendbuf if recvbuf is None and root != self.rank else recvbuf
        if algorithm is None and self._again("gather", sendbuf, held, root, timeout):
            return
        self._run(calls.gather, (sendbuf, recvbuf, root), algorithm, True, timeout,
                  (sendbuf, held, root))

    @observable("collective", start=True)
    def igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None) -> Request[None]:
        """Start a gather."""
        return self._run(calls.gather, (sendbuf, recvbuf, root), algorithm, False, None)

    @observable("collective")
    def gatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                displs: Sequence[int] | None = None, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Gather blocks of different sizes: rank i's ``sendbuf`` lands at ``displs[i]``.

        ``counts``/``displs`` (elements; displs default packed) matter only at the root.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        key = (counts, displs, root)
        if algorithm is None and self._again_vector("gatherv", sendbuf, recvbuf, key, timeout):
            return
        self._run(calls.gatherv, (sendbuf, recvbuf, *key), algorithm, True, timeout,
                  (sendbuf, recvbuf, key))

    @observable("collective", start=True)
    def igatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                 displs: Sequence[int] | None = None, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a gatherv."""
        return self._run(calls.gatherv, (sendbuf, recvbuf, counts, displs, root), algorithm,
                         False, None)

    @observable("collective")
    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                algorithm: str | None = None, timeout: float | None = None) -> None:
        """Send block i of ``root``'s ``sendbuf`` to rank i's ``recvbuf``.

        ``sendbuf`` matters only at the root; ``IN_PLACE`` as ``recvbuf`` at the root leaves
        its own block where it is.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        # as gather's: a rank other than the root that passes no sendbuf is kept under its
        # recvbuf alone
        held = recvbuf if sendbuf is None and root != self.rank else sendbuf
        if algorithm is None and self._again("scatter", held, recvbuf, root, timeout):
            return
        self._run(calls.scatter, (sendbuf, recvbuf, root), algorithm, True, timeout,
                  (held, recvbuf, root))

    @observable("collective", start=True)
    def iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 algorithm: str | None = None) -> Request[None]:
        """Start a scatter."""
        return self._run(calls.scatter, (sendbuf, recvbuf, root), algorithm, False, None)

    @observable("collective")
    def scatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                 displs: Sequence[int] | None = None, root: int = 0, *,
                 algorithm: str | None = None, timeout: float | None = None) -> None:
        """Scatter blocks of different sizes: rank i receives ``counts[i]`` from ``displs[i]``.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        key = (counts, displs, root)
        if algorithm is None and self._again_vector("scatterv", sendbuf, recvbuf, key, timeout):
            return
        self._run(calls.scatterv, (sendbuf, recvbuf, *key), algorithm, True, timeout,
                  (sendbuf, recvbuf, key))

    @observable("collective", start=True)
    def iscatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int] | None = None,
                  displs: Sequence[int] | None = None, root: int = 0, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start a scatterv."""
        return self._run(calls.scatterv, (sendbuf, recvbuf, counts, displs, root), algorithm,
                         False, None)

    # ------------------------------------------------------------------ allgather
    @observable("collective")
    def allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Every rank gets every rank's ``sendbuf``: block i of ``recvbuf`` from rank i.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._again("allgather", sendbuf, recvbuf, None, timeout):
            return
        self._run(calls.allgather, (sendbuf, recvbuf, None, None), algorithm, True, timeout,
                  (sendbuf, recvbuf, None))

    @observable("collective", start=True)
    def iallgather(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an allgather."""
        return self._run(calls.allgather, (sendbuf, recvbuf, None, None), algorithm, False,
                         None)

    @observable("collective")
    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                   displs: Sequence[int] | None = None, *, algorithm: str | None = None,
                   timeout: float | None = None) -> None:
        """Allgather of blocks of different sizes (``counts[i]`` at ``displs[i]``).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        key = (counts, displs)
        if algorithm is None and self._again_vector("allgatherv", sendbuf, recvbuf, key,
                                                    timeout):
            return
        self._run(calls.allgather, (sendbuf, recvbuf, *key), algorithm, True, timeout,
                  (sendbuf, recvbuf, key))

    @observable("collective", start=True)
    def iallgatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                    displs: Sequence[int] | None = None, *,
                    algorithm: str | None = None) -> Request[None]:
        """Start an allgatherv."""
        return self._run(calls.allgather, (sendbuf, recvbuf, counts, displs), algorithm, False,
                         None)

    # ------------------------------------------------------------------ alltoall
    @observable("collective")
    def alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None,
                 timeout: float | None = None) -> None:
        """Block j of rank i's ``sendbuf`` goes to block i of rank j's ``recvbuf``.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        if algorithm is None and self._again("alltoall", sendbuf, recvbuf, None, timeout):
            return
        self._run(calls.alltoall, (sendbuf, recvbuf), algorithm, True, timeout,
                  (sendbuf, recvbuf, None))

    @observable("collective", start=True)
    def ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  algorithm: str | None = None) -> Request[None]:
        """Start an alltoall."""
        return self._run(calls.alltoall, (sendbuf, recvbuf), algorithm, False, None)

    @observable("collective")
    def alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                  recvcounts: Sequence[int], sdispls: Sequence[int] | None = None,
                  rdispls: Sequence[int] | None = None, *, algorithm: str | None = None,
                  timeout: float | None = None) -> None:
        """Alltoall with per-peer counts and displacements (elements; default packed).

        With ``IN_PLACE`` the send side uses ``recvcounts``/``rdispls`` (as MPI).

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        key = (sendcounts, recvcounts, sdispls, rdispls)
        if algorithm is None and self._again_vector("alltoallv", sendbuf, recvbuf, key, timeout):
            return
        self._run(calls.alltoallv, (sendbuf, recvbuf, *key), algorithm, True, timeout,
                  (sendbuf, recvbuf, key))

    @observable("collective", start=True)
    def ialltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                   recvcounts: Sequence[int], sdispls: Sequence[int] | None = None,
                   rdispls: Sequence[int] | None = None, *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallv."""
        return self._run(calls.alltoallv, (sendbuf, recvbuf, sendcounts, recvcounts, sdispls,
                                          rdispls), algorithm, False, None)

    @observable("collective")
    def alltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                  algorithm: str | None = None, timeout: float | None = None) -> None:
        """The most general alltoall: one buffer per peer each way, of any dtype and size.

        ``sendbufs[j]`` goes to rank j, ``recvbufs[i]`` receives from rank i; the byte sizes
        of matching buffers must agree.

        Raises:
            TypeError / ValueError, Timeout, PeerFailure, TruncationError.
        """
        self._run(calls.alltoallw, (sendbufs, recvbufs), algorithm, True, timeout)

    @observable("collective", start=True)
    def ialltoallw(self, sendbufs: Sequence[Any], recvbufs: Sequence[Any], *,
                   algorithm: str | None = None) -> Request[None]:
        """Start an alltoallw."""
        return self._run(calls.alltoallw, (sendbufs, recvbufs), algorithm, False, None)
