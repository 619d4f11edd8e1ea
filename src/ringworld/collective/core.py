"""The machinery every collective of the communicator runs on.

:class:`CollectiveCore` holds a communicator's collective state and the steps every call takes:
the choice of path (asked of the selector: see :meth:`CollectiveCore.plan`), the shared-memory
arena and its calls, running a schedule blocking or not, the call's signature, the repeat fast
paths, the op and root checks, a root's refusal of its arguments, and the barrier. The
collectives themselves are :class:`~ringworld.collective.communicator.Communicator`'s.
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from ringworld._lazy import LazyModule
from ringworld.algorithms import registry
from ringworld.algorithms.registry import SHM
from ringworld.algorithms.schedule import Spec
from ringworld.collective.cache import CallCache
from ringworld.collective.markers import IN_PLACE
from ringworld.collective.objects import ObjectCollectives
from ringworld.comm import ops
from ringworld.comm.engine import Engine
from ringworld.comm.hooks import observable, observed
from ringworld.comm.ops import Op
from ringworld.comm.point_to_point import arrays_overlap
from ringworld.comm.requests import (
    SEQ_MASK,
    SIG_SHIFT,
    CompletedRequest,
    Request,
    check_timeout,
    wait_all,
)
from ringworld.errors import Timeout
from ringworld.tuning import constants
from ringworld.tuning.select import BARRIERS_ON_MESSAGES, Plan, Selector

if TYPE_CHECKING:
    import numpy as np

    from ringworld.algorithms import executor
    from ringworld.algorithms import shm_collectives as shm
    from ringworld.collective import buffers as bufs
    from ringworld.collective.buffers import Array
    from ringworld.collective.calls import Call
    from ringworld.device.plane import Plane
else:  # imported on the first collective call: init() and point-to-point never load numpy
    np = LazyModule("numpy", globals(), "np")
    executor = LazyModule("ringworld.algorithms.executor", globals(), "executor")
    shm = LazyModule("ringworld.algorithms.shm_collectives", globals(), "shm")
    bufs = LazyModule("ringworld.collective.buffers", globals(), "bufs")


OpLike = Op | str


@observed
class CollectiveCore(ObjectCollectives):
    """A communicator's collective state and the steps every collective call takes."""

    def __init__(self, engine: Engine, ranks: Sequence[int], context: int, name: str = "",
                 selector: Selector | None = None, transport: str = "shm") -> None:
        super().__init__(engine, ranks, context, name)
        self._next_seq = self._chan.next_seq  # per call: one attribute load, not two
        self.selector = selector or Selector(constants.DEFAULTS)
        self.transport = transport if self.size > 1 else "self"
        self.last_algorithm = ""
        self._scratch: executor.Scratch | None = None  # made on first use (imports numpy)
        self._freed = False
        self._arena: shm.Arena | None = None
        self._barriers = 0  # barriers run on messages before the windows were mapped
        self._barrier_sig: tuple[int, int, str] | None = None  # a windows barrier's (repeats)
        self._cache = CallCache()  # what the calls remember (see collective.cache)
        self._last_calls = self._cache.last  # the repeat path's first lookup, one load away
        self._done: Request[None] = CompletedRequest(engine, None)  # a blocking call's result
        self._agree_round = 0  # agreements (agree, shrink) made on this communicator
        self._hier: tuple[Self, Self | None] | None = None  # (host comm, leaders comm)
        self._plane: Plane | None = None  # the NCCL plane, made by the first device call
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
        # a barrier alone maps the shared windows only after a few (start-up stays light:
        # see BARRIERS_ON_MESSAGES); any other collective does, once, on its first call
        return (blocking and self.transport == "shm"
                and (self._arena is not None or collective != "barrier" or algorithm == SHM
                     or self._barriers >= BARRIERS_ON_MESSAGES)
                and self.size <= shm.MAX_RANKS and self._chan.supports_shared_memory)

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
        # (Communicator._kept_begin skips this method where none of these flags is up: a
        # check added here must be added to its test too)
        if e.mismatched or e.remote_mismatches or e.strays or e.revoked or e.closed:
            self._check_open()  # revoked (the repeat path checks nothing before this)
            e.check_mismatched(self.coll_context)  # the sequence broke earlier
        if self._arena is None:
            # before the call's number is taken: the set-up's barriers come first, signed with
            # the call, so a rank in another call at the same number is caught as a mismatch
            setup = f"{what} (shm: setting up the shared windows)"
            try:
                self._arena = shm.Arena(self._chan, lambda: self._dissemination(timeout, setup),
                                         self.selector.shm_policy)
            except Timeout as exc:
                raise Timeout(f"{what} (shm) on {self.name}: setting up shared memory: "
                              f"{exc}") from exc
            self.last_algorithm = SHM  # not the barriers that set the windows up
        # shared-memory collectives send no messages but keep tags in step
        seq = self._next_seq()
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
                    self._chan, sched, arrays, op, what, scratch, finish, inline=True, sig=sig)
                req.run_inline(timeout)
            else:
                self._next_seq()
                if finish is not None:
                    finish()
            return CompletedRequest(self._engine, None)
        if not sched.steps:
            self._next_seq()
            if finish is not None:
                finish()
            return CompletedRequest(self._engine, None)
        nb: executor.CollectiveRequest[None] = executor.CollectiveRequest(
            self._chan, sched, arrays, op, what, None, finish, sig=sig)
        return nb

    def _signature(self, collective: str, algo: str, spec: Spec, arrays: Sequence[Array],
                   op: Op | None) -> int:
        """A 16-bit hash of what every rank must agree on in this call, carried in the tags of
        its messages so that a disagreement fails as MismatchError instead of hanging or
        corrupting (the engine compares it with the peer's). Cost: one dict lookup (of a key
        holding allgatherv's and reduce_scatter's p counts: O(p))."""
        # per-rank sizes of the v/w variants legitimately differ; everything else must agree,
        # and so must the counts that every rank states whole (allgatherv's, reduce_scatter's)
        varying = collective.endswith(("v", "w")) or spec.counts is not None
        dtype = None
        if arrays and collective != "alltoallw":
            dtype = (arrays[1] if collective.startswith("scatter") else arrays[0]).dtype
        count: int | tuple[int, ...] = spec.n
        if varying:
            count = spec.counts if collective in _WHOLE_COUNTS and spec.counts else -1
        key = (collective, algo, count, spec.root, dtype, "" if op is None else op.name)
        known = self._engine.signed_calls
        found = known.get(key)
        if found is None:
            text = (f"{collective}(algorithm={algo}, count={_count_text(count)},"
                    f" dtype={dtype}, op={key[5] or '-'}, root={spec.root})")
            found = self._engine.sign(text)
            if len(known) < 4096:
                known[key] = found
        return found

    def _op(self, op: OpLike, *bufs: Array) -> Op:
        """``op`` resolved, and checked against the dtype of the first non-empty buffer.

        Raises:
            TypeError / ValueError: an unknown op, or one undefined on that dtype.
        """
        return self._cache.op(op, *bufs)

    def _root(self, root: int) -> int:
        self._world(root, "root")  # validates
        return int(root)

    # ------------------------------------------------------------------ barrier
    @observable("collective")
    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Block until every rank has entered the barrier: one sync in the shared windows,
        else dissemination on messages (log2 p rounds).

        Raises:
            Timeout, PeerFailure: a rank did not arrive in time or failed.
        """
        a, sig, e = self._arena, self._barrier_sig, self._engine
        if (sig is not None and a is not None and algorithm is None and timeout is None
                and not (e.mismatched or e.remote_mismatches or e.strays or e.revoked or e.closed)):
            # a repeat in the windows: _barrier's steps without the choice (np=4 on 2 cores,
            # where every step costs twice its time after the ranks' turns on a core)
            a.begin_signed("barrier", None, sig, self._next_seq())
            self.last_algorithm = SHM
            try:
                a.sync()
            except BaseException as exc:
                a.abandon(exc)
                raise
            return
        self._barrier(algorithm, True, timeout)

    @observable("collective", start=True)
    def ibarrier(self, *, algorithm: str | None = None) -> Request[None]:
        """Start a barrier; the request completes once every rank has entered it."""
        return self._barrier(algorithm, False, None)

    def _barrier(self, algorithm: str | None, blocking: bool,
                 timeout: float | None) -> Request[None]:
        algo = self._choose("barrier", 0, algorithm, blocking=blocking)
        if algo == SHM:
            a = self._shm("barrier", timeout)
            self._in_windows(shm.barrier, a)
            if algorithm is None:
                self._barrier_sig = a.signature("barrier", 0, ())
            return CompletedRequest(self._engine, None)
        if blocking and self.size > 1:  # without the executor: start-up needs no numpy
            self._dissemination(timeout)
            self._barriers += 1
            return CompletedRequest(self._engine, None)
        return self._go("barrier", algo, Spec(self.size, self.rank), [], None, blocking, timeout)

    def _dissemination(self, timeout: float | None,
                       what: str = "barrier(algorithm=dissemination)") -> None:
        """The dissemination barrier's schedule, run directly on zero-byte messages, signed
        with ``what`` (a rank in another call is caught as a mismatch)."""
        if timeout is not None:
            check_timeout(timeout)
        e = self._engine
        tag = self._next_seq() | e.sign(what) << SIG_SHIFT
        e.note_call(self.coll_context, tag)
        if e.mismatched or e.remote_mismatches:  # the sequence broke earlier
            e.check_mismatched(self.coll_context, tag & SEQ_MASK)
        sink = memoryview(bytearray(0))
        chan = self._chan
        for step in registry.build("barrier", "dissemination", Spec(self.size, self.rank)).steps:
            reqs: list[Request[Any]] = []
            for x in step.sends:
                h = chan.coll_isend(sink, x.peer, tag)
                if h is not None:
                    reqs.append(h)
            # sent first, the step's one message is taken straight from the transport where it
            # has come (as a blocking call's steps take theirs: executor.TAKE_BYTES)
            for x in step.recvs:
                if reqs or len(step.recvs) != 1 or not chan.coll_take(sink, x.peer, tag):
                    reqs.append(chan.coll_irecv(sink, x.peer, tag))
            try:
                wait_all(reqs, timeout)
            except Timeout as exc:
                raise Timeout(f"barrier #{tag & SEQ_MASK} on {self.name}: {exc}") from exc

    def _refuse_rooted(self, collective: str, exc: TypeError | ValueError, own: Any,
                       op: OpLike | None, algorithm: str | None, blocking: bool) -> None:
        """The root's buffers are wrong: refuse the call on every rank (see :meth:`_refuse`),
        in the shared windows if that is where the others are. The root's own block (``own``:
        a reduce's or gather's sendbuf, a scatter's recvbuf; ``op``: a reduce's) tells which
        path they took; where it cannot (``IN_PLACE`` over a bad buffer), they are in the
        windows if those take every size. The refusal there is unsigned: its sync compares call
        numbers only, so a wrong size of the root's own is refused, not a mismatch. The caller
        raises ``exc``."""
        windows = False
        try:
            c = True if op is None else ops.resolve(op).commutative
            if collective in ("gatherv", "scatterv"):  # the windows take every size
                windows = self._choose(collective, 0, algorithm, equal_blocks=False,
                                       blocking=blocking) == SHM
            else:
                try:
                    b = bufs.as_array(own, "own")
                    if op is not None:
                        self._op(op, b)
                    sizes: tuple[int, ...] = (b.nbytes,)
                except (TypeError, ValueError):
                    if own is not IN_PLACE:
                        raise
                    sizes = (0, 1 << 30)  # the others' size is unknown here
                windows = all(self._choose(collective, n, algorithm, commutative=c,
                                           blocking=blocking) == SHM for n in sizes)
        except (TypeError, ValueError):
            pass  # an op, buffer or algorithm the others refuse themselves
        if not windows:
            self._refuse(collective, exc)
            return
        a = self._shm(collective, None)
        a.unsign()
        if collective in ("gather", "gatherv", "reduce"):  # the others: maybe an eager path
            a.refuse_gather(self._refusal(a.what, exc), type(exc))
        else:
            a.refuse(self._refusal(a.what, exc), type(exc))

    def _refusal(self, what: str, exc: BaseException) -> str:
        return (f"{what}: the root (world rank {self._ranks[self.rank]}) refused its "
                f"arguments: {type(exc).__name__}: {exc}")

    def _refuse(self, collective: str, exc: TypeError | ValueError) -> None:
        """Refuse the call for ``exc``, an error in arguments that only this rank, the root,
        checks (the caller raises it); the other ranks, which cannot see it, are in the call.
        The root takes the call's number as they do and tells them (those waiting for the root
        raise the same error type, naming it), and drops the messages they send it in that
        call: the communicator stays usable on every rank. Cost: two store round trips, on
        this error path only."""
        seq = self._next_seq()
        e = self._engine
        e.refuse_call(self.coll_context, seq,
                      self._refusal(f"{collective} #{seq} on {self.name}", exc),
                      type(exc).__name__)

    # ------------------------------------------------------------------ hierarchy
    def _hosts(self) -> tuple[list[str], list[str]]:
        """Each rank's host label, and the hosts in order of their first rank."""
        hosts = [self._engine.hosts[w] for w in self._ranks]
        return hosts, list(dict.fromkeys(hosts))

    def _host_sizes(self) -> list[int]:
        """Ranks of this communicator per host, hosts in order of their first rank."""
        hosts, order = self._hosts()
        return [hosts.count(h) for h in order]


# OnMessages.slots: a repeat's send or receive array, as passed or seen as bytes
_SEND, _RECV, _SEND_BYTES, _RECV_BYTES = object(), object(), object(), object()


class OnMessages:
    """A blocking call kept for the repeat path (see :meth:`CallCache.keep`) that ran on
    messages: its schedule run again on a repeat's arrays, without the checks, the choice of
    path or the signature's lookup (:meth:`Communicator._again` calls it with the repeat's
    timeout in the place of a windows call's arena). Made by :meth:`make`."""

    __slots__ = ("algo", "core", "sched", "sig", "slots", "what")

    def __init__(self, core: CollectiveCore, algo: str, sched: Any, sig: int,
                 slots: tuple[Any, ...], what: tuple[str, str]) -> None:
        # (weakly: the communicator's cache holds this runner, which would otherwise hold the
        # communicator in a cycle, freed only by the cyclic collector)
        self.core = weakref.ref(core)
        self.algo, self.sched, self.sig = algo, sched, sig
        self.slots, self.what = slots, what

    @classmethod
    def make(cls, core: CollectiveCore, call: Call, algo: str, spec: Spec, sendbuf: Any,
             recvbuf: Array | None, raw: bool) -> OnMessages | None:
        """The runner of ``call``, just run with ``algo`` on ``spec``, for repeats on arrays
        of the shape of ``sendbuf`` and ``recvbuf`` (the user's, or None: a v-variant's side
        this rank does not pass; the repeat passes them flat, as byte views where ``raw``);
        None where the call's arrays are not those (a part of one, a copy) or two arrays share
        memory: the checked path runs those each call. (One array passed as both is kept under
        a key of its own, which only such calls repeat: ``cache._shape_key``.) Cost: a few
        microseconds."""
        if recvbuf is not None and type(recvbuf) is not np.ndarray:
            return None
        if sendbuf is not IN_PLACE and sendbuf is not None and sendbuf is not recvbuf and (
                type(sendbuf) is not np.ndarray
                or (recvbuf is not None and arrays_overlap(sendbuf, recvbuf))):
            return None
        sched = registry.build(call.collective, algo, spec)
        if not sched.steps:
            return None
        slots: list[Any] = []
        for a in call.arrays:
            if not a.size:  # an empty stand-in, the same for every repeat (a fresh one: the
                slots.append(np.empty(0, a.dtype))  # call's may be a view of the user's memory)
            elif recvbuf is not None and (form := _seen_as(a, recvbuf, raw)) is not None:
                slots.append(_RECV_BYTES if form else _RECV)
            elif (sendbuf is not IN_PLACE and sendbuf is not None
                  and (form := _seen_as(a, sendbuf, raw)) is not None):
                slots.append(_SEND_BYTES if form else _SEND)
            else:
                return None
        sig = core._signature(call.collective, algo, spec, call.arrays, call.op)
        return cls(core, algo, sched, sig, tuple(slots), (call.collective, algo))

    def __call__(self, timeout: float | None, sendbuf: Array, recvbuf: Array, op: Op | None,
                 root: int) -> None:
        core = self.core()
        assert core is not None  # (called by the communicator itself)
        core._check_open()
        if timeout is not None:
            check_timeout(timeout)  # before the call's number is taken: a local error
        core.last_algorithm = self.algo
        arrays = [sendbuf if x is _SEND else recvbuf if x is _RECV
                  else sendbuf.view(np.uint8) if x is _SEND_BYTES
                  else recvbuf.view(np.uint8) if x is _RECV_BYTES else x for x in self.slots]
        scratch = core._scratch
        if scratch is None:
            scratch = core._scratch = executor.Scratch()
        executor.CollectiveRequest(core._chan, self.sched, arrays, op, self.what, scratch,
                                   None, inline=True, sig=self.sig).run_inline(timeout)


def _seen_as(a: Array, user: Any, raw: bool) -> bool | None:
    """How ``a`` shows the user's array ``user``: flat as the repeat passes it (False; as bytes
    where ``raw``), as its bytes (True: an adapter that ran the call on bytes, ``ringworld.MPI``'s
    Bcast, under a key that passes typed arrays), or not at all (None)."""
    if (a.nbytes != user.nbytes
            or a.__array_interface__["data"][0] != user.__array_interface__["data"][0]):
        return None
    u8 = np.dtype(np.uint8)
    if a.dtype == (u8 if raw else user.dtype):
        return False
    return True if a.dtype == u8 else None


#: the varying-count collectives whose counts every rank passes whole, and must agree on
_WHOLE_COUNTS = ("allgatherv", "reduce_scatter")


def _count_text(count: int | tuple[int, ...]) -> str:
    """A call's count as its signature shows it: a number, "per rank", or the counts (the
    first eight, and a checksum of all, when there are more)."""
    if isinstance(count, int):
        return "per rank" if count < 0 else str(count)
    if len(count) <= 8:
        return str(list(count))
    crc = zlib.crc32(repr(count).encode())
    return f"[{', '.join(map(str, count[:8]))}, ... ({len(count)} counts, crc {crc:08x})]"
