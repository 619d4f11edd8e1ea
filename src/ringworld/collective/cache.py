"""What a communicator remembers of its collective calls, in one place, keyed on the call.

:class:`CallCache` holds these tables, each bounded and each cleared by ``free``:

* ``shapes`` (and ``last``): the blocking calls that ran in the shared windows or on messages
  (their schedule, ``core.OnMessages``), by collective, op or root, and the dtypes and shapes
  of their arrays (``last``: the last one's arrays, held weakly, so no user buffer is kept
  alive, but for ``ringworld.MPI``'s arrays on small numpy memory (:func:`may_hold`): their
  byte views hold it until the next call of that collective). A call of a shape seen before
  skips the checks and the choice of algorithm, which for small calls cost more than the
  data's copies.
* ``plans``: the algorithm chosen for a call's shape (collective, size, op order, blocking,
  algorithm asked for) and whether a blocking allreduce runs hierarchically.
* ``ops``: each (op, dtype) pair found valid.
* ``vector``: per v-variant, its last call in the shared windows (the dtype and shapes of its
  arrays, a copy of its counts, the runner its first repeat made), so that a repeat on
  arrays of that dtype and those shapes skips the checks (no buffer held).
* ``adapter``: what an adapter (``ringworld.MPI``) keeps of its own calls (its v-calls'
  parsed arguments: byte views of arrays on small numpy memory, see :func:`may_hold`).

The algorithms keep their own memos of pure functions (the selector's costs, the signatures'
hashes); those depend on nothing a call can change.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ringworld.collective.markers import IN_PLACE
from ringworld.comm import ops
from ringworld.comm.ops import Op
from ringworld.comm.point_to_point import arrays_overlap

if TYPE_CHECKING:
    import numpy as np

    from ringworld.collective.buffers import Array
    from ringworld.collective.calls import Call

LIMIT = 4096  # entries per table: a program with endlessly new shapes stops adding, not grows


def _in_place() -> Any:
    """Stands for the weak reference to an ``IN_PLACE`` sendbuf."""
    return IN_PLACE


#: the collectives whose one array passed as both buffers needs no copy (see
#: ``buffers.apart``): bcast's one buffer, and off the root the one buffer a reduce, gather or
#: scatter uses, are kept as both (a root's two differ in size but on one rank, where the
#: copy is the call); allreduce, scan and exscan run on it as on IN_PLACE's
SAME_ARRAY = frozenset({"bcast", "allreduce", "scan", "exscan", "reduce", "gather", "scatter"})


#: the collectives whose calls :meth:`CallCache.again` finds (``Communicator._again``); the
#: v-variants have their own table, ``vector``
REPEATED = frozenset({"allreduce", "bcast", "reduce", "allgather", "alltoall",
                      "reduce_scatter_block", "scan", "exscan", "gather", "scatter"})
#: the v-variants, whose calls :meth:`CallCache.keep_vector` keeps
VECTORS = frozenset({"allgatherv", "gatherv", "scatterv", "alltoallv", "reduce_scatter"})


def _shape_key(coll: str, extra: Any, sendbuf: Any, recvbuf: Any) -> tuple[Any, ...]:
    """A call's key in ``shapes``: collective, op or root and its type (a root of True or 1.0
    equals 1 but is the checks' TypeError), and the arrays' dtypes and shapes; one array
    passed as both has a key of its own (a runner on messages kept from such a call cannot
    tell which of two arrays it read: ``core.OnMessages``)."""
    kind = type(extra)
    if sendbuf is IN_PLACE:
        return (coll, extra, kind, recvbuf.dtype, recvbuf.shape)
    if sendbuf is recvbuf:
        return (coll, extra, kind, recvbuf.dtype, recvbuf.shape, True)
    return (coll, extra, kind, recvbuf.dtype, recvbuf.shape, sendbuf.dtype, sendbuf.shape)


class AdapterKey(NamedTuple):
    """What an adapter that checks its own arguments (``ringworld.MPI``) passes as a call's op or
    root to :meth:`CallCache.keep` and :meth:`CallCache.again`: its calls are kept apart from
    native calls on the same arrays. ``name`` tells the adapter's calls apart (its op's name, or
    its root); ``raw``: the adapter ran the call on byte views of the arrays (MPI moves bytes,
    so ranks may see them through different datatypes), and a repeat runs on byte views too."""

    name: Any
    raw: bool


HELD_BYTES = 64 << 10  # arrays up to this size may be held by their byte views (see _OnBytes)


def may_hold(a: Array) -> bool:
    """Whether views of ``a`` may be kept between calls: the memory under it is a numpy
    array's own (not an mmap's, a shared memory segment's or a bytearray's, which a held view
    would keep from closing or resizing) of at most :data:`HELD_BYTES`, so a view holds at
    most that much alive. A view of a small numpy array qualifies (the bench's aligned
    buffers, a slice of a preallocated one): remaking its byte view cost 0.3 us a call."""
    owner = a
    while type(owner.base) is type(a):
        owner = owner.base
    return owner.base is None and owner.nbytes <= HELD_BYTES


class _OnBytes:
    """``run`` on byte views of its (contiguous, flat) arrays. Cost: 0.12 us a view and a
    call, 0.3 us in all for two arrays: more than a third of what ringworld.MPI adds to an
    8-byte Allgather, so a loop on the same small arrays reuses its views (:meth:`bound`)."""

    __slots__ = ("run", "u8")

    def __init__(self, run: Callable[..., None]) -> None:
        import numpy as np  # loaded already: a call that ran on numpy arrays is being kept

        self.run = run
        self.u8 = np.dtype(np.uint8)

    def __call__(self, arena: Any, sendbuf: Array, recvbuf: Array, op: Op | None,
                 root: int) -> None:
        u8 = self.u8
        rb = recvbuf.view(u8)
        self.run(arena, rb if sendbuf is recvbuf else sendbuf.view(u8), rb, op, root)

    def bound(self, sendbuf: Any, recvbuf: Array) -> Callable[..., None]:
        """This runner on the byte views of these very arrays, made once here, where they are
        small numpy memory (see :func:`may_hold`): the views keep it alive until the next
        call of the collective or ``free``, and so never pin another object's buffer (a
        shared memory segment's, an mmap's). Else this runner itself."""
        arrays = (recvbuf,) if sendbuf is IN_PLACE or sendbuf is recvbuf else (sendbuf, recvbuf)
        for a in arrays:
            if not (a.flags.c_contiguous and may_hold(a)):
                return self
        u8 = self.u8
        rb = recvbuf.reshape(-1).view(u8)
        sb = rb if len(arrays) == 1 else sendbuf.reshape(-1).view(u8)

        def on_held(arena: Any, _sendbuf: Array, _recvbuf: Array, op: Op | None,
                    root: int) -> None:
            self.run(arena, sb, rb, op, root)  # (read each call: see _FirstRepeat)

        return on_held


class _FirstRepeat:
    """A kept call's ``run`` until the shape repeats: the first repeat asks ``make(s, r)``
    for a runner made for the arrays it passes (``shm_repeat.quick``: views made once), runs
    that (or ``run``) from then on, and points the cache's entries for the shape at it, so
    that later repeats call it directly. A shape that never repeats (a new size every call)
    never makes one: a bcast's runner makes 32 views (np=2, a new size every call: 9.9 us a
    call without runners, 45.6 with one made on every first call)."""

    __slots__ = ("cache", "coll", "key", "make", "run")

    def __init__(self, cache: CallCache, coll: str, key: tuple[Any, ...],
                 make: Callable[[Array, Array], Callable[..., None] | None],
                 run: Callable[..., None]) -> None:
        self.cache, self.coll, self.key, self.run = cache, coll, key, run
        self.make: Callable[[Array, Array], Callable[..., None] | None] | None = make

    def __call__(self, arena: Any, sendbuf: Array, recvbuf: Array, op: Op | None,
                 root: int) -> None:
        make = self.make
        if make is not None:
            self.make = None
            self.run = make(sendbuf, recvbuf) or self.run
            self.cache.adopt(self.coll, self.key, self, self.run)
        self.run(arena, sendbuf, recvbuf, op, root)


class Kept(NamedTuple):
    """A call shape that ran in the shared windows: its windows' signature, the runner
    ``run(arena, sendbuf, recvbuf, op, root)``, and its resolved op and root. Or one that
    ran on messages: no signature (None), and ``run(timeout, sendbuf, recvbuf, op, root)``
    runs the call whole (``core.OnMessages``)."""

    sig: tuple[int, int, str] | None
    run: Callable[..., None]
    op: Op | None
    root: int


class CallCache:
    """A communicator's memory of its calls (see the module's docstring)."""

    __slots__ = ("adapter", "last", "ndarray", "ops", "plans", "shapes", "vector")

    def __init__(self) -> None:
        # per collective: (weak refs to the last call's sendbuf and recvbuf, its op or root as
        # passed, its dtype, then its Kept's fields: sig, run, op, root): a loop on the same
        # arrays is found by identity (Communicator._again reads these entries by position, on
        # its latency-critical path: a flat tuple is read faster than a Kept inside one)
        self.last: dict[str, tuple[Any, ...]] = {}
        # (collective, op or root as passed, dtypes and shapes of recvbuf and sendbuf) -> Kept
        self.shapes: dict[tuple[Any, ...], Kept] = {}
        self.plans: dict[tuple[Any, ...], tuple[str, bool]] = {}
        self.ops: dict[tuple[Any, np.dtype[Any]], Op] = {}
        self.ndarray: Any = None  # numpy's ndarray type, once a call has loaded numpy
        # per v-variant, its last call in the shared windows (see keep_vector)
        self.vector: dict[str, tuple[Any, ...]] = {}
        # what an adapter (ringworld.MPI) remembers of its own calls, by its own key
        self.adapter: dict[Any, Any] = {}

    def clear(self) -> None:
        """Forget everything (the communicator was freed)."""
        self.last.clear()
        self.vector.clear()
        self.adapter.clear()
        self.shapes.clear()
        self.plans.clear()
        self.ops.clear()

    def again(self, coll: str, sendbuf: Any, recvbuf: Any, extra: Any) -> Kept | None:
        """How to run this call of ``coll`` again without its checks, if one of the same
        shape ran in the shared windows or on messages (see :class:`Kept`): contiguous numpy
        arrays of the same dtypes and shapes (``recvbuf`` writable) and the same ``extra``
        (op or root); the arrays then become the ``last`` call's. Cost: a dict lookup. (The
        caller first checks ``last``'s arrays by identity: :meth:`Communicator._again`.)
        """
        nd = self.ndarray
        if nd is None or type(recvbuf) is not nd:
            return None
        flags = recvbuf.flags
        if not (flags.writeable and flags.c_contiguous):
            return None
        if sendbuf is IN_PLACE:
            send: Callable[[], Any] = _in_place
        elif type(sendbuf) is nd and sendbuf.flags.c_contiguous:
            if sendbuf is recvbuf:
                if coll not in SAME_ARRAY:
                    return None  # (the checks copy it aside: see Call.copied)
            elif arrays_overlap(sendbuf, recvbuf):
                return None
            send = weakref.ref(sendbuf)
        else:
            return None
        key = _shape_key(coll, extra, sendbuf, recvbuf)
        try:
            kept = self.shapes.get(key)
        except TypeError:  # an unhashable op or root: the checked path says what is wrong
            return None
        if kept is not None:
            self._remember(coll, sendbuf, send, recvbuf, extra, kept)
        return kept

    def keep(self, call: Call, sendbuf: Any, recvbuf: Any, sb: Array, rb: Array, extra: Any,
             sig: tuple[int, int, str] | None, run: Callable[..., None],
             quick: Callable[[Array, Array], Callable[..., None] | None] | None = None) -> None:
        """Remember ``call``'s shape, just run in the shared windows as ``run(arena, sb, rb,
        ...)`` (or on messages: ``sig`` None, see :class:`Kept`), for :meth:`again`, if
        ``sendbuf`` and ``recvbuf`` (the user's) are numpy arrays (or IN_PLACE) and the call
        needs no finishing; a repeat runs ``run`` on them, flat (or on their byte views, for
        an adapter's raw key). ``quick(s, r)``, if given,
        may return a runner made for such arrays ``s`` and ``r``, made by the shape's first
        repeat and run in place of ``run`` from then on (a shape kept already keeps its
        entry: a caller that passes ``algorithm`` comes here every call)."""
        nd = self.ndarray = type(rb)
        if call.finish is not None or call.copied or type(recvbuf) is not nd:
            return
        if sendbuf is IN_PLACE:
            if sb is not rb:
                return  # the input was moved aside: a repeat would need that again
            send: Callable[[], Any] = _in_place
        elif type(sendbuf) is nd:
            send = weakref.ref(sendbuf)
        else:
            return
        key = _shape_key(call.collective, extra, sendbuf, recvbuf)
        try:
            kept = self.shapes.get(key)
        except TypeError:  # an unhashable op or root (accepted by the checks): not kept
            return
        if kept is None or kept.sig != sig:
            if quick is not None:  # made by the first repeat, from the arrays it passes
                run = _FirstRepeat(self, call.collective, key, quick, run)
            if type(extra) is AdapterKey and extra.raw:
                run = _OnBytes(run)
            kept = Kept(sig, run, call.op, call.spec.root)
            if len(self.shapes) < LIMIT:
                self.shapes[key] = kept
        self._remember(call.collective, sendbuf, send, recvbuf, extra, kept)

    def adopt(self, coll: str, key: tuple[Any, ...], first: _FirstRepeat,
              run: Callable[..., None]) -> None:
        """Run ``run`` in place of ``first`` for the shape ``key`` of ``coll`` (see
        :class:`_FirstRepeat`), in its kept entry and in ``coll``'s last call."""
        kept = self.shapes.get(key)
        if kept is not None:
            if kept.run is first:
                self.shapes[key] = kept._replace(run=run)
            elif type(kept.run) is _OnBytes and kept.run.run is first:
                kept.run.run = run  # (its bound views read it each call)
        last = self.last.get(coll)
        if last is not None and last[5] is first:
            self.last[coll] = (*last[:5], run, *last[6:])

    def _remember(self, coll: str, sendbuf: Any, send: Callable[[], Any], recvbuf: Any,
                  extra: Any, kept: Kept) -> None:
        """Make these arrays ``coll``'s last call's (see ``last``); a runner on byte views
        is bound to these arrays' own where it may be (see :meth:`_OnBytes.bound`)."""
        run = kept.run
        if type(run) is _OnBytes:
            run = run.bound(sendbuf, recvbuf)
        self.last[coll] = (send, weakref.ref(recvbuf), extra, recvbuf.dtype, kept.sig, run,
                           kept.op, kept.root)

    def keep_vector(self, call: Call, sendbuf: Any, recvbuf: Any, key: tuple[Any, ...],
                    sig: tuple[int, int, str] | None,
                    run: Callable[..., Any] | None = None) -> None:
        """Remember a v-variant's call, begun in the shared windows (or run on messages:
        ``sig`` None, ``run`` its ``core.OnMessages``), as its collective's last
        (read by ``Communicator._again_vector``): if its buffers are contiguous numpy arrays
        (or None, a side this rank does not pass), ``key`` (its counts, displs and root or op,
        as passed) holds lists, tuples, ints, None, op names or ops, and it needs no
        finishing. Entry: the buffers' shapes (None for a None), a copy of ``key``, the dtype,
        ``sig``, the call's spec and size, the empty stand-ins of a side passed as None, the
        resolved op, and its runner (None until the first repeat makes one: see
        ``Communicator._rerun_vector``). No buffer is held: a later call on any arrays of
        these dtypes and shapes passes the checks alike (a fresh view of the same memory each
        call, as ``ringworld.MPI`` passes)."""
        nd = self.ndarray = type(call.arrays[1])
        if call.finish is not None or call.in_place or call.copied:
            return
        shapes: list[tuple[int, ...] | None] = []
        for buf in (sendbuf, recvbuf):
            if buf is None:
                shapes.append(None)
            elif type(buf) is nd and buf.flags.c_contiguous:
                shapes.append(buf.shape)
            else:
                return
        copy: list[Any] = []
        for k in key:
            if type(k) is list or type(k) is tuple:
                copy.append(k[:])  # (a list the user changes later must not match)
            elif k is None or type(k) is int or type(k) is str or isinstance(k, Op):
                copy.append(k)  # (an op: immutable, as a reduction's repeat keeps it)
            else:
                return
        self.vector[call.collective] = (
            shapes[0], shapes[1], tuple(copy), call.arrays[1].dtype, sig, call.spec, call.nbytes,
            call.arrays[0] if sendbuf is None else None,
            call.arrays[1] if recvbuf is None else None, call.op, run)

    def op(self, op: Any, *arrays: Array) -> Op:
        """``op`` resolved, and checked against the dtype of the first non-empty array (every
        collective's op check, on any plane).

        Raises:
            TypeError / ValueError: an unknown op, or one undefined on that dtype.
        """
        for a in arrays:
            if a.size:
                key = (op, a.dtype)
                found = self.ops.get(key)
                if found is None:
                    found = ops.resolve(op)
                    found.check_dtype(a.dtype, "the buffers")
                    if len(self.ops) < LIMIT:
                        self.ops[key] = found
                return found
        return ops.resolve(op)
