"""The collective table: every buffer collective's arguments, checked once into a frozen call.

One function per collective (``allreduce``, ``gatherv``...) checks its arguments and returns a
:class:`Call`: the schedule's buffers, its :class:`~ringworld.algorithms.schedule.Spec` (counts,
root, order of combining), the op, the size the algorithm is chosen for, and what the ranks must
agree on in the shared windows. A runner then executes the call, blocking or not: the native
communicator's (:meth:`~ringworld.collective.core.CollectiveCore._run`, shared windows or a
schedule) or another plane's. The checks, their errors and the buffers' meaning live here once,
for every API that reaches the collectives (the native methods, ``ringworld.MPI``, the torch
backend).

Every prepare function raises ``TypeError``/``ValueError`` naming the argument, and
:class:`Refused` for an error in arguments that only the root checks (the runner tells the other
ranks, which are already in the call, before raising it). Cost: a few microseconds (the checks);
the runner's repeat path skips them for a call repeated on the same arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ringworld._lazy import LazyModule
from ringworld.algorithms.schedule import Spec
from ringworld.collective.markers import IN_PLACE
from ringworld.comm.ops import Op

if TYPE_CHECKING:
    import numpy as np

    from ringworld.algorithms import executor
    from ringworld.collective import buffers as bufs
    from ringworld.collective.buffers import Array
else:  # imported on the first collective call: init() and point-to-point never load numpy
    np = LazyModule("numpy", globals(), "np")
    executor = LazyModule("ringworld.algorithms.executor", globals(), "executor")
    bufs = LazyModule("ringworld.collective.buffers", globals(), "bufs")

Counts = Sequence[int] | None


class Call(NamedTuple):
    """One buffer collective, checked: everything a runner needs to execute it.

    ``arrays`` are the schedule's buffers (send, receive; alltoallw: three empty ones, then one
    per peer each way). ``nbytes`` is the size the algorithm is chosen for (the vector, or one
    block). ``shared`` is (bytes, what the ranks must agree on) for a call the shared windows can
    run, else None. ``finish`` runs once the data is in place (a copy out of a scratch buffer).
    ``in_place``: the caller passed ``IN_PLACE``, or one array as both buffers where that means
    the same (allreduce, scan, reduce: see :func:`~ringworld.collective.buffers.apart`); the
    arrays already stand for it, and a plane with an in-place form of its own, such as MPI,
    uses that instead (MPI refuses one buffer passed twice). ``copied``: the send buffer
    shared memory with the receive buffer and the arrays hold a copy of it (see
    :func:`~ringworld.collective.buffers.apart`): a repeat on the caller's arrays would need
    that copy again, so the call is not kept for one.
    """

    collective: str
    spec: Spec
    arrays: tuple[Array, ...]
    op: Op | None = None
    nbytes: int = 0
    equal_blocks: bool = True
    shared: tuple[int, tuple[Any, ...]] | None = None
    finish: Callable[[], None] | None = None
    in_place: bool = False
    copied: bool = False


class Refused(Exception):
    """The root's arguments are wrong (``error``); only it can see that. The runner tells the
    other ranks, which wait in the call, before raising ``error``. ``own`` (the root's own
    block as passed: a reduce's or gather's sendbuf, a scatter's recvbuf) and ``op`` (a
    reduce's) tell the runner which path the other ranks took."""

    def __init__(self, collective: str, error: TypeError | ValueError, own: Any = None,
                 op: Any = None) -> None:
        super().__init__(f"{collective}: {error}")
        self.collective, self.error, self.own, self.op = collective, error, own, op


class Frame(Protocol):
    """What the checks need of the communicator: its shape, root and op validation."""

    @property
    def size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def _root(self, root: int) -> int:
        """``root`` as an int. Raises: ValueError / TypeError (not a rank)."""

    def _op(self, op: Any, *arrays: Array) -> Op:
        """``op`` resolved and checked against the arrays' dtype. Raises: TypeError."""


def bcast(f: Frame, buf: Any, root: int) -> Call:
    root = f._root(root)
    a = bufs.as_array(buf, "buf", writable=f.rank != root)
    return Call("bcast", Spec(f.size, f.rank, a.size, root), (bufs.EMPTY_U8.view(a.dtype), a),
                nbytes=a.nbytes, shared=(a.nbytes, (a.dtype, root)))


def reduce(f: Frame, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> Call:
    root = f._root(root)
    if f.rank == root:
        try:
            rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
            sb = rb if sendbuf is IN_PLACE else bufs.as_array(sendbuf, "sendbuf")
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
        except (TypeError, ValueError) as exc:
            raise Refused("reduce", exc, sendbuf, op) from None
        sb, copied = (sb, False) if sendbuf is IN_PLACE else bufs.apart(sb, rb, same_ok=True)
    else:
        sb = bufs.as_array(sendbuf, "sendbuf")
        rb = bufs.EMPTY_U8.view(sb.dtype)
        copied = False
    o = f._op(op, sb)
    return Call("reduce", Spec(f.size, f.rank, sb.size, root, commutative=o.commutative),
                (sb, rb), o, sb.nbytes, shared=(sb.nbytes, (sb.dtype, o.name, root)),
                in_place=sb is rb, copied=copied)


def allreduce(f: Frame, sendbuf: Any, recvbuf: Any, op: Any) -> Call:
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    copied = False
    if sendbuf is IN_PLACE:
        sb = rb
    else:
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb, same_ok=True)
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
    o = f._op(op, rb)
    # positional: the keyword constructors of Spec and Call cost half a microsecond more
    return Call("allreduce", Spec(f.size, f.rank, rb.size, 0, None, None, None, None,
                                  o.commutative, 0),
                (sb, rb), o, rb.nbytes, True, (rb.nbytes, (rb.dtype, o.name)), None,
                sb is rb, copied)


def reduce_scatter(f: Frame, sendbuf: Any, recvbuf: Any, counts: Counts, op: Any) -> Call:
    """``counts`` None: reduce_scatter_block (equal blocks of ``len(recvbuf)``)."""
    p, r = f.size, f.rank
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    coll = "reduce_scatter" if counts is not None else "reduce_scatter_block"
    finish: Callable[[], None] | None = None
    copied = False
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
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb)
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        c = (bufs.int_list(counts, p, "counts") if counts is not None else (rb.size,) * p)
        bufs.check_len(sb, sum(c), "sendbuf", "the sum of all blocks")
        bufs.check_len(rb, c[r], "recvbuf", "this rank's block")
        out = rb
    o = f._op(op, sb)
    spec = Spec(p, r, c[0] if c else 0, counts=c if counts is not None else None,
                commutative=o.commutative)
    # (with counts, the shared windows check every rank's: the signature holds them)
    kind = (sb.dtype, o.name) if counts is None else (sb.dtype, o.name, c)
    return Call(coll, spec, (sb, out), o, sb.nbytes // max(1, p), counts is None,
                (sb.nbytes, kind), finish, sendbuf is IN_PLACE, copied)


def scan(f: Frame, coll: str, sendbuf: Any, recvbuf: Any, op: Any) -> Call:
    """``coll``: "scan" or "exscan"."""
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    copied = False
    if sendbuf is IN_PLACE:
        sb = rb
    else:
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb, same_ok=True)
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(rb, sb.size, "recvbuf", "the size of sendbuf")
    o = f._op(op, rb)
    return Call(coll, Spec(f.size, f.rank, rb.size, commutative=o.commutative), (sb, rb), o,
                rb.nbytes, shared=(rb.nbytes, (rb.dtype, o.name)), in_place=sb is rb,
                copied=copied)


def gather(f: Frame, sendbuf: Any, recvbuf: Any, root: int) -> Call:
    p, r = f.size, f.rank
    root = f._root(root)
    if r == root:
        try:
            rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
            n = bufs.blocks_of(rb, p, "recvbuf")
            sb = (rb[r * n : (r + 1) * n] if sendbuf is IN_PLACE
                  else bufs.as_array(sendbuf, "sendbuf"))
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
        except (TypeError, ValueError) as exc:
            raise Refused("gather", exc, sendbuf) from None
        sb, copied = (sb, False) if sendbuf is IN_PLACE else bufs.apart(sb, rb)
    else:
        sb = bufs.as_array(sendbuf, "sendbuf")
        rb = bufs.EMPTY_U8.view(sb.dtype)
        n, copied = sb.size, False
    return Call("gather", Spec(p, r, n, root), (sb, rb), nbytes=sb.nbytes,
                shared=(sb.nbytes, (sb.dtype, root)), in_place=r == root and sendbuf is IN_PLACE,
                copied=copied)


def gatherv(f: Frame, sendbuf: Any, recvbuf: Any, counts: Counts, displs: Counts,
            root: int) -> Call:
    p, r = f.size, f.rank
    root = f._root(root)
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
            raise Refused("gatherv", exc) from None
        sb, copied = (sb, False) if sendbuf is IN_PLACE else bufs.apart(sb, rb)
        spec = Spec(p, r, c[r], root, counts=c, displs=d)
    else:
        sb = bufs.as_array(sendbuf, "sendbuf")
        rb = bufs.EMPTY_U8.view(sb.dtype)
        spec, copied = Spec(p, r, sb.size, root), False
    return Call("gatherv", spec, (sb, rb), nbytes=sb.nbytes, equal_blocks=False,
                shared=(0, (sb.dtype, root)), in_place=r == root and sendbuf is IN_PLACE,
                copied=copied)


def scatter(f: Frame, sendbuf: Any, recvbuf: Any, root: int) -> Call:
    p, r = f.size, f.rank
    root = f._root(root)
    if r == root:
        try:
            sb = bufs.as_array(sendbuf, "sendbuf")
            n = bufs.blocks_of(sb, p, "sendbuf")
            rb = (sb[r * n : (r + 1) * n] if recvbuf is IN_PLACE
                  else bufs.as_array(recvbuf, "recvbuf", writable=True))
            bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
            bufs.check_len(rb, n, "recvbuf", "sendbuf holds size blocks of this length")
        except (TypeError, ValueError) as exc:
            raise Refused("scatter", exc, recvbuf) from None
        sb, copied = (sb, False) if recvbuf is IN_PLACE else bufs.apart(sb, rb)
    else:
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        sb = bufs.EMPTY_U8.view(rb.dtype)
        n, copied = rb.size, False
    return Call("scatter", Spec(p, r, n, root), (sb, rb), nbytes=rb.nbytes,
                shared=(rb.nbytes, (rb.dtype, root)), in_place=r == root and recvbuf is IN_PLACE,
                copied=copied)


def scatterv(f: Frame, sendbuf: Any, recvbuf: Any, counts: Counts, displs: Counts,
             root: int) -> Call:
    p, r = f.size, f.rank
    root = f._root(root)
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
            raise Refused("scatterv", exc) from None
        sb, copied = (sb, False) if recvbuf is IN_PLACE else bufs.apart(sb, rb)
        spec = Spec(p, r, c[r], root, counts=c, displs=d)
    else:
        rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
        sb = bufs.EMPTY_U8.view(rb.dtype)
        spec, copied = Spec(p, r, rb.size, root), False
    return Call("scatterv", spec, (sb, rb), nbytes=rb.nbytes, equal_blocks=False,
                shared=(0, (rb.dtype, root)), in_place=r == root and recvbuf is IN_PLACE,
                copied=copied)


def allgather(f: Frame, sendbuf: Any, recvbuf: Any, counts: Counts, displs: Counts) -> Call:
    """``counts`` None: allgather (equal blocks), else allgatherv."""
    p, r = f.size, f.rank
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    if counts is None:
        n = bufs.blocks_of(rb, p, "recvbuf")
        copied = False
        if sendbuf is IN_PLACE:
            sb = rb[r * n : (r + 1) * n]
        else:
            sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb)
        bufs.check_len(sb, n, "sendbuf", "recvbuf holds size blocks of this length")
        bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
        return Call("allgather", Spec(p, r, n), (sb, rb), nbytes=sb.nbytes,
                    shared=(rb.nbytes, (rb.dtype,)), in_place=sendbuf is IN_PLACE,
                    copied=copied)
    c, d = bufs.layout(counts, displs, p, rb, "counts", "displs", "recvbuf")
    copied = False
    if sendbuf is IN_PLACE:
        sb = rb[d[r] : d[r] + c[r]]
    else:
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb)
    bufs.check_len(sb, c[r], "sendbuf", "counts[rank]")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    # in the shared windows every rank checks every rank's counts (the signature holds them)
    return Call("allgatherv", Spec(p, r, c[r], counts=c, displs=d), (sb, rb), nbytes=sb.nbytes,
                equal_blocks=False, shared=(sum(c) * rb.itemsize, (rb.dtype, c)),
                in_place=sendbuf is IN_PLACE, copied=copied)


def alltoall(f: Frame, sendbuf: Any, recvbuf: Any) -> Call:
    p, r = f.size, f.rank
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    n = bufs.blocks_of(rb, p, "recvbuf")
    copied = False
    if sendbuf is IN_PLACE:
        sb = rb.copy()
    else:
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb)
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_len(sb, rb.size, "sendbuf", "the size of recvbuf")
    return Call("alltoall", Spec(p, r, n), (sb, rb), nbytes=sb.nbytes // p,
                shared=(rb.nbytes, (rb.dtype,)), in_place=sendbuf is IN_PLACE, copied=copied)


def alltoallv(f: Frame, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
              recvcounts: Sequence[int], sdispls: Counts, rdispls: Counts) -> Call:
    p, r = f.size, f.rank
    rb = bufs.as_array(recvbuf, "recvbuf", writable=True)
    rc, rd = bufs.layout(recvcounts, rdispls, p, rb, "recvcounts", "rdispls", "recvbuf")
    copied = False
    if sendbuf is IN_PLACE:
        sb, sc, sd = rb.copy(), rc, rd
    else:
        sb, copied = bufs.apart(bufs.as_array(sendbuf, "sendbuf"), rb)
        sc, sd = bufs.layout(sendcounts, sdispls, p, sb, "sendcounts", "sdispls", "sendbuf")
    bufs.same_dtype(sb, rb, "sendbuf", "recvbuf")
    bufs.check_own_block(sc, rc, r)
    spec = Spec(p, r, 0, counts=sc, displs=sd, rcounts=rc, rdispls=rd)
    return Call("alltoallv", spec, (sb, rb), nbytes=sb.nbytes // p, equal_blocks=False,
                shared=(0, (rb.dtype,)), in_place=sendbuf is IN_PLACE, copied=copied)


def alltoallw(f: Frame, sendbufs: Sequence[Any], recvbufs: Sequence[Any]) -> Call:
    p, r = f.size, f.rank
    sends = [bufs.as_array(b, f"sendbufs[{i}]")
             for i, b in enumerate(bufs.seq(sendbufs, p, "sendbufs"))]
    recvs = [bufs.as_array(b, f"recvbufs[{i}]", writable=True)
             for i, b in enumerate(bufs.seq(recvbufs, p, "recvbufs"))]
    sends = [a.view(np.uint8)  # (each read from a copy where it overlaps a receive buffer)
             for a in bufs.apart_all(sends, recvs)]
    recvs = [b.view(np.uint8) for b in recvs]
    bufs.check_len(recvs[r], sends[r].size, f"recvbufs[{r}]", f"the bytes of sendbufs[{r}]")
    spec = Spec(p, r, 0, counts=tuple(s.size for s in sends),
                rcounts=tuple(b.size for b in recvs))
    none = bufs.EMPTY_U8
    return Call("alltoallw", spec, (none, none, none, *sends, *recvs),
                nbytes=sum(s.nbytes for s in sends) // p)
