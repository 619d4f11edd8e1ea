"""The collective operations of ``MPI.Comm`` and ``MPI.Intracomm`` over the native collectives.

Buffer specs are parsed as mpi4py parses them (see :mod:`ringworld.mpi._buffer`): a receive
buffer of ``Gather``/``Allgather``/``Alltoall`` (and a send buffer of ``Scatter``/``Alltoall``)
holds one block per process; v-variants take ``[buf, (counts, displs), datatype]``. Arguments
that only matter at the root are ignored elsewhere (they may be None). Data moves as raw bytes,
so only byte sizes must agree between processes; reductions see arrays of the datatype's numpy
dtype. ``IN_PLACE`` works wherever MPI allows it, and a reduction whose send and receive
buffers are the same memory runs in place, as in mpi4py.

Nonblocking forms return an ``MPI.Request`` that completes with an empty status; buffers must
stay untouched until it completes. ``Ireduce_scatter`` without ``recvcounts`` first agrees on
the counts with a blocking allgather.

The object forms (``bcast``, ``reduce``, ...) return a copy of this process's own value where
mpi4py does (mpi4py unpickles every value it returns). ``reduce`` returns None except at the
root and ``exscan`` None at rank 0.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

import ringworld
from ringworld.collective import calls
from ringworld.collective.cache import AdapterKey
from ringworld.comm import hooks
from ringworld.mpi import _vmemo
from ringworld.mpi._buffer import (
    SIMPLE_DTYPES,
    Array,
    Message,
    block_message,
    plain_array,
    recv_message,
    send_message,
    vector_message,
    w_blocks,
)
from ringworld.mpi._constants import IN_PLACE
from ringworld.mpi._op import SUM, buffer_op, object_op, predefined_native
from ringworld.mpi._request import Request, _Kind

_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def _copy(obj: Any) -> Any:
    """A copy of ``obj`` as unpickling gives it (immutable atoms are returned as they are)."""
    if type(obj) in _ATOMS:
        return obj
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _started(native: ringworld.Request[Any]) -> Request:
    return Request._wrap(native, _Kind.COLL)


# -- the repeat path ----------------------------------------------------------------------
# A blocking collective on the user's own plain arrays (see plain_array) runs as the native
# collective would and is remembered by the native repeat path under a key of this layer's own
# (AdapterKey: kept apart from native calls on the same arrays): a loop repeating the call on the
# same arrays, or on arrays of the same dtypes and shapes, skips the parsing of its buffer specs
# and the native checks, which for small calls cost more than the data's copies (an 8-byte
# Allgather 8 us through the checks, 3 us repeated; the native call 2.7 us). A shape first
# ran through the checks here, so a repeat is one they accept. While a tool observes the native
# calls (the tracer) every call goes through the native methods instead, so it sees them all.

_MOVED = AdapterKey("MPI", True)  # Allgather, Alltoall: byte views, as the checked path passes
# Bcast's, per root (part of the shape); not raw: the shared windows' broadcast moves bytes
# whatever the array's dtype (its ranks agree on the size and root alone), so it needs no views
_ROOT_KEYS: dict[int, AdapterKey] = {}
_MOVED_ROOTS: dict[int, AdapterKey] = {}  # Gather's and Scatter's, per root: byte views
_OP_KEYS: dict[int, AdapterKey] = {}  # a reduction's, per predefined MPI.Op (by id: they live
#                                       as long as the module, and MPI.Op is unhashable)


def _root_key(root: Any, raw: bool = False) -> AdapterKey | None:
    """The key for ``root`` of Bcast, or with ``raw`` of Gather and Scatter (they run on byte
    views, as Allgather); None for a root that is not an int (the checks say why)."""
    if type(root) is not int:
        return None
    table = _MOVED_ROOTS if raw else _ROOT_KEYS
    key = table.get(root)
    if key is None and len(table) < 4096:  # (roots are ranks: a few)
        key = table[root] = AdapterKey(("root", root), raw)
    return key


def _op_key(op: Any) -> AdapterKey | None:
    """A reduction's key for a predefined ``op``, else None."""
    key = _OP_KEYS.get(id(op))
    if key is None and predefined_native(op) is not None:
        key = _OP_KEYS[id(op)] = AdapterKey(op._name, False)
    return key


def _again_specs(native: ringworld.Communicator, coll: str, sendbuf: Any, recvbuf: Any,
                 key: Any, _nd: Any = np.ndarray, _dtype_of: Any = SIMPLE_DTYPES.get) -> bool:
    """The repeat path for specs that are not arrays, as ``[array, datatype]`` (mpi4py's
    common form, a new list each call): the call again on their arrays, an array's datatype
    being its own dtype's. False, having done nothing, if they are no such specs or not kept.
    (The tests inline, on locals: as calls they were most of the 0.6 us this form added to
    an 8-byte Allgather.)"""
    if type(recvbuf) is not list and type(recvbuf) is not tuple:
        return False
    try:
        r, rtype = recvbuf
        if sendbuf is IN_PLACE or type(sendbuf) is _nd:
            s = sendbuf
        elif sendbuf is recvbuf:  # (Bcast's one buffer: tested once, below)
            s = r
        else:
            s, stype = sendbuf
            if type(s) is not _nd or _dtype_of(id(stype)) is not s.dtype:
                return False
    except (TypeError, ValueError):  # another form: the checks say what it is
        return False
    return (type(r) is _nd and _dtype_of(id(rtype)) is r.dtype
            and native._again(coll, s, r, key, None))


def _keep(native: ringworld.Communicator, prepare: Any, args: tuple[Any, ...], sendbuf: Any,
          recvbuf: Any, key: Any) -> bool:
    """Run a checked blocking call (``prepare(native, *args)`` of the collective table) so that
    the native repeat path keeps it under ``key`` (an :class:`AdapterKey`; Reduce's: one with
    its root) for ``sendbuf`` and ``recvbuf``, the user's plain arrays (or the native
    ``IN_PLACE``); False, having done nothing, when they are not (None) or a tool observes:
    then the caller runs the native method."""
    if key is None or recvbuf is None or sendbuf is None or hooks.observing:
        return False
    native._run(prepare, args, None, True, None, (sendbuf, recvbuf, key))
    return True


def _address(a: Array) -> int:
    address: int = a.__array_interface__["data"][0]
    return address


def _plain_reduction(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[Any, Array, Any] | None:
    """The native arguments of a reduction, without validating, when validating would give
    the same: plain arrays (see :func:`plain_array`) of one dtype and size that do not overlap
    (or ``IN_PLACE``), and a predefined op; else None. Cost: well under a microsecond."""
    native_op = predefined_native(op)
    if native_op is None:
        return None
    rb = plain_array(recvbuf, True)
    if rb is None:
        return None
    if sendbuf is IN_PLACE:
        return ringworld.IN_PLACE, rb, native_op
    sb = plain_array(sendbuf, False)
    if (sb is None or sb.dtype is not rb.dtype or sb.size != rb.size or sb is rb
            or np.may_share_memory(sb, rb)):
        return None  # the general path says why, or finds the same memory (in place)
    return sb, rb, native_op


def _reduce_input(sendbuf: Any, recv: Message, where: str) -> Any:
    """The native send argument of a reduction: ``IN_PLACE`` or a typed array."""
    if sendbuf is IN_PLACE:
        return IN_PLACE
    rb = recv.array()
    sb = send_message(sendbuf, f"{where}(sendbuf)").array()
    if sb.dtype != rb.dtype:
        raise ValueError(f"{where}: mismatch in send and receive MPI datatypes ({sb.dtype} "
                         f"and {rb.dtype})")
    if sb.size != rb.size:
        raise ValueError(f"{where}: mismatch in send count {sb.size} and receive count "
                         f"{rb.size}")
    if sb.size and _address(sb) == _address(rb):
        return IN_PLACE  # the same memory: in place, as mpi4py does
    return sb


def _send_bytes(sendbuf: Any, where: str, block: Message | None = None) -> Any:
    """``IN_PLACE`` or the bytes of ``sendbuf``, checked against one block of ``block``."""
    if sendbuf is IN_PLACE:
        return IN_PLACE
    sb = send_message(sendbuf, where).bytes()
    if block is not None:
        _check_block(sb.size, block, where)
    return sb


def _check_block(nbytes: int, block: Message, where: str) -> None:
    want = block.count * block.datatype.extent
    if nbytes != want:
        raise ValueError(f"{where} has {nbytes} bytes but each block of the other buffer has "
                         f"{want} ({block.count} x {block.datatype.name})")


class Collectives:
    """Collective operations of every communicator (mixed into ``MPI.Comm``)."""

    __slots__ = ()
    _native: ringworld.Communicator  # the native communicator (MPI.Comm's slot)

    # -- barrier and broadcast ------------------------------------------------------------

    def Barrier(self) -> None:
        """Block until every process of the communicator has called it."""
        self._native.barrier()

    def barrier(self) -> None:
        """Block until every process of the communicator has called it."""
        self._native.barrier()

    def Ibarrier(self) -> Request:
        """Start a barrier; the request completes once every process has entered it."""
        return _started(self._native.ibarrier())

    def _bcast(self, buf: Any, root: int, where: str) -> tuple[Any, ...]:
        n = self._native
        m = (send_message if n.rank == root else recv_message)(buf, f"{where}(buf)")
        return m.bytes(), root

    def Bcast(self, buf: Any, root: int = 0) -> None:
        """Copy ``buf`` of ``root`` into ``buf`` of every process."""
        n = self._native
        key = _ROOT_KEYS.get(root) if type(root) is int else None
        if key is not None and not hooks.observing and (  # the repeat path (see above), inline
                n._again("bcast", buf, buf, key, None) if type(buf) is np.ndarray
                else _again_specs(n, "bcast", buf, buf, key)):
            return
        arr = plain_array(buf, True)  # (a root's read-only buffer takes the checked path)
        args = self._bcast(buf, root, "Bcast")
        if not _keep(n, calls.bcast, args, arr, arr, _root_key(root)):
            n.bcast(*args)

    def Ibcast(self, buf: Any, root: int = 0) -> Request:
        """Start a broadcast."""
        return _started(self._native.ibcast(*self._bcast(buf, root, "Ibcast")))

    # -- gather and scatter ---------------------------------------------------------------

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, where: str) -> tuple[Any, ...]:
        n = self._native
        if n.rank != root:
            return send_message(sendbuf, f"{where}(sendbuf)").bytes(), None, root
        rb = block_message(recvbuf, f"{where}(recvbuf)", writable=True, blocks=n.size)
        return _send_bytes(sendbuf, f"{where}(sendbuf)", rb), rb.bytes(), root

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Collect every process's ``sendbuf`` into block i (from rank i) of ``recvbuf`` at root."""
        key = _MOVED_ROOTS.get(root) if type(root) is int else None
        if (key is not None and type(recvbuf) is np.ndarray and not hooks.observing
                and self._native._again("gather", sendbuf, recvbuf, key, None)):
            return  # (the repeat path of the common form, inline: see _rooted)
        self._rooted("gather", sendbuf, recvbuf, root, "Gather")

    def _rooted(self, coll: str, sendbuf: Any, recvbuf: Any, root: Any, where: str) -> None:
        """Gather or Scatter (``coll``), repeated as the native call is: kept under its root on
        byte views (as Allgather); off the root, the buffer it does not use, as None, is kept
        under the other one."""
        n = self._native
        gather = coll == "gather"
        off = root != n.rank
        s = recvbuf if not gather and sendbuf is None and off else sendbuf
        r = sendbuf if gather and recvbuf is None and off else recvbuf
        key = _MOVED_ROOTS.get(root) if type(root) is int else None  # (_root_key's, inline)
        if key is not None and not hooks.observing and (
                n._again(coll, s, r, key, None) if type(r) is np.ndarray
                else _again_specs(n, coll, s, r, key)):
            return
        parse, prepare, run = ((self._gather, calls.gather, n.gather) if gather
                               else (self._scatter, calls.scatter, n.scatter))
        key = key or _root_key(root, True)
        if key is None or hooks.observing:
            run(*parse(sendbuf, recvbuf, root, where))
            return
        args = parse(sendbuf, recvbuf, root, where)
        if not _keep(n, prepare, args, plain_array(s, False), plain_array(r, True), key):
            run(*args)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Start a gather."""
        return _started(self._native.igather(*self._gather(sendbuf, recvbuf, root, "Igather")))

    def _gatherv(self, sendbuf: Any, recvbuf: Any, root: int, where: str) -> tuple[Any, ...]:
        n = self._native
        if n.rank != root:
            return send_message(sendbuf, f"{where}(sendbuf)").bytes(), None, None, None, root
        rb = vector_message(recvbuf, f"{where}(recvbuf)", writable=True, blocks=n.size)
        return (_send_bytes(sendbuf, f"{where}(sendbuf)"), rb.bytes(), rb.byte_counts(),
                rb.byte_displs(), root)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Gather blocks of different sizes: ``recvbuf`` is ``[buf, (counts, displs), type]``."""
        n = self._native
        _vmemo.call(n, "Gatherv", (sendbuf, recvbuf, root), n.gatherv,
                    lambda: self._gatherv(sendbuf, recvbuf, root, "Gatherv"))

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Start a gatherv."""
        return _started(self._native.igatherv(*self._gatherv(sendbuf, recvbuf, root,
                                                             "Igatherv")))

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, where: str) -> tuple[Any, ...]:
        n = self._native
        if n.rank != root:
            return None, recv_message(recvbuf, f"{where}(recvbuf)").bytes(), root
        sb = block_message(sendbuf, f"{where}(sendbuf)", writable=False, blocks=n.size)
        rb = (IN_PLACE if recvbuf is IN_PLACE
              else recv_message(recvbuf, f"{where}(recvbuf)").bytes())
        if rb is not IN_PLACE:
            _check_block(rb.size, sb, f"{where}(recvbuf)")
        return sb.bytes(), rb, root

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Send block i of ``sendbuf`` at root to ``recvbuf`` of rank i."""
        key = _MOVED_ROOTS.get(root) if type(root) is int else None
        if (key is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray
                and not hooks.observing
                and self._native._again("scatter", sendbuf, recvbuf, key, None)):
            return  # (the repeat path of the common form, inline: see _rooted)
        self._rooted("scatter", sendbuf, recvbuf, root, "Scatter")

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Start a scatter."""
        return _started(self._native.iscatter(*self._scatter(sendbuf, recvbuf, root,
                                                             "Iscatter")))

    def _scatterv(self, sendbuf: Any, recvbuf: Any, root: int, where: str) -> tuple[Any, ...]:
        n = self._native
        if n.rank != root:
            rb = recv_message(recvbuf, f"{where}(recvbuf)").bytes()
            return None, rb, None, None, root
        sb = vector_message(sendbuf, f"{where}(sendbuf)", writable=False, blocks=n.size)
        rb = (IN_PLACE if recvbuf is IN_PLACE
              else recv_message(recvbuf, f"{where}(recvbuf)").bytes())
        return sb.bytes(), rb, sb.byte_counts(), sb.byte_displs(), root

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Scatter blocks of different sizes: ``sendbuf`` is ``[buf, (counts, displs), type]``."""
        n = self._native
        _vmemo.call(n, "Scatterv", (sendbuf, recvbuf, root), n.scatterv,
                    lambda: self._scatterv(sendbuf, recvbuf, root, "Scatterv"))

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Start a scatterv."""
        return _started(self._native.iscatterv(*self._scatterv(sendbuf, recvbuf, root,
                                                               "Iscatterv")))

    # -- allgather and alltoall -----------------------------------------------------------

    def _allgather(self, sendbuf: Any, recvbuf: Any, where: str) -> tuple[Any, ...]:
        rb = block_message(recvbuf, f"{where}(recvbuf)", writable=True,
                           blocks=self._native.size)
        return _send_bytes(sendbuf, f"{where}(sendbuf)", rb), rb.bytes()

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        """Every process gets every process's ``sendbuf``, block i from rank i."""
        n = self._native
        if not hooks.observing and (
                n._again("allgather", sendbuf, recvbuf, _MOVED, None) if type(recvbuf) is np.ndarray
                else _again_specs(n, "allgather", sendbuf, recvbuf, _MOVED)):
            return
        s, r = plain_array(sendbuf, False), plain_array(recvbuf, True)
        args = self._allgather(sendbuf, recvbuf, "Allgather")
        if not _keep(n, calls.allgather, (*args, None, None), s, r, _MOVED):
            n.allgather(*args)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Start an allgather."""
        return _started(self._native.iallgather(*self._allgather(sendbuf, recvbuf,
                                                                 "Iallgather")))

    def _allgatherv(self, sendbuf: Any, recvbuf: Any, where: str) -> tuple[Any, ...]:
        rb = vector_message(recvbuf, f"{where}(recvbuf)", writable=True,
                            blocks=self._native.size)
        return (_send_bytes(sendbuf, f"{where}(sendbuf)"), rb.bytes(), rb.byte_counts(),
                rb.byte_displs())

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Allgather of blocks of different sizes (``recvbuf`` a vector spec)."""
        n = self._native
        _vmemo.call(n, "Allgatherv", (sendbuf, recvbuf), n.allgatherv,
                    lambda: self._allgatherv(sendbuf, recvbuf, "Allgatherv"))

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Start an allgatherv."""
        return _started(self._native.iallgatherv(*self._allgatherv(sendbuf, recvbuf,
                                                                   "Iallgatherv")))

    def _alltoall(self, sendbuf: Any, recvbuf: Any, where: str) -> tuple[Any, ...]:
        p = self._native.size
        rb = block_message(recvbuf, f"{where}(recvbuf)", writable=True, blocks=p)
        if sendbuf is IN_PLACE:
            return IN_PLACE, rb.bytes()
        sb = block_message(sendbuf, f"{where}(sendbuf)", writable=False, blocks=p)
        _check_block(sb.count * sb.datatype.extent, rb, f"{where}(sendbuf)")
        return sb.bytes(), rb.bytes()

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block j of rank i's ``sendbuf`` goes to block i of rank j's ``recvbuf``."""
        n = self._native
        if not hooks.observing and (
                n._again("alltoall", sendbuf, recvbuf, _MOVED, None) if type(recvbuf) is np.ndarray
                else _again_specs(n, "alltoall", sendbuf, recvbuf, _MOVED)):
            return
        s, r = plain_array(sendbuf, False), plain_array(recvbuf, True)
        args = self._alltoall(sendbuf, recvbuf, "Alltoall")
        if not _keep(n, calls.alltoall, args, s, r, _MOVED):
            n.alltoall(*args)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Start an alltoall."""
        return _started(self._native.ialltoall(*self._alltoall(sendbuf, recvbuf, "Ialltoall")))

    def _alltoallv(self, sendbuf: Any, recvbuf: Any, where: str) -> tuple[Any, ...]:
        p = self._native.size
        rb = vector_message(recvbuf, f"{where}(recvbuf)", writable=True, blocks=p)
        rc, rd = rb.byte_counts(), rb.byte_displs()
        if sendbuf is IN_PLACE:
            return IN_PLACE, rb.bytes(), rc, rc, rd, rd
        sb = vector_message(sendbuf, f"{where}(sendbuf)", writable=False, blocks=p)
        return sb.bytes(), rb.bytes(), sb.byte_counts(), rc, sb.byte_displs(), rd

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Alltoall with per-process counts and displacements (vector specs)."""
        n = self._native
        _vmemo.call(n, "Alltoallv", (sendbuf, recvbuf), n.alltoallv,
                    lambda: self._alltoallv(sendbuf, recvbuf, "Alltoallv"))

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Start an alltoallv."""
        return _started(self._native.ialltoallv(*self._alltoallv(sendbuf, recvbuf,
                                                                 "Ialltoallv")))

    def _alltoallw(self, sendbuf: Any, recvbuf: Any, where: str) -> tuple[Any, ...]:
        p = self._native.size
        recvs = w_blocks(recvbuf, f"{where}(recvbuf)", writable=True, blocks=p)
        if sendbuf is IN_PLACE:
            return [b.copy() for b in recvs], recvs
        return w_blocks(sendbuf, f"{where}(sendbuf)", writable=False, blocks=p), recvs

    def Alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:
        """The general alltoall: ``[buf, (counts, byte displs), datatypes]`` each way."""
        self._native.alltoallw(*self._alltoallw(sendbuf, recvbuf, "Alltoallw"))

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Start an alltoallw."""
        return _started(self._native.ialltoallw(*self._alltoallw(sendbuf, recvbuf,
                                                                 "Ialltoallw")))

    # -- reductions -----------------------------------------------------------------------

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int,
                where: str) -> tuple[Any, ...]:
        n = self._native
        if n.rank != root:
            s = send_message(sendbuf, f"{where}(sendbuf)")
            return s.array(), None, buffer_op(op, s.datatype), root
        r = recv_message(recvbuf, f"{where}(recvbuf)")
        sb = _reduce_input(sendbuf, r, where)
        return sb, r.array(), buffer_op(op, r.datatype), root

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0) -> None:
        """Combine every process's ``sendbuf`` with ``op`` into ``recvbuf`` of ``root``."""
        n = self._native
        key = _OP_KEYS.get(id(op)) or _op_key(op)
        if key is not None and type(root) is int and not hooks.observing:
            # kept under the op and the root, as the native reduce: off the root, a missing
            # recvbuf is kept under the sendbuf (at the root it is the checks' error)
            held = sendbuf if recvbuf is None and root != n.rank else recvbuf
            extra = (key, root)
            if (n._again("reduce", sendbuf, held, extra, None) if type(held) is np.ndarray
                    else _again_specs(n, "reduce", sendbuf, held, extra)):
                return
            if held is sendbuf:  # (sendbuf, None, op), kept under sendbuf twice
                sb = plain_array(sendbuf, False)
                fast: tuple[Any, ...] | None = (
                    None if sb is None else (sb, None, predefined_native(op)))
                kept = sb
            else:
                fast = _plain_reduction(sendbuf, recvbuf, op)
                kept = None if fast is None else fast[1]
            if fast is not None and _keep(n, calls.reduce, (*fast, root), fast[0], kept,
                                          extra):
                return
        n.reduce(*self._reduce(sendbuf, recvbuf, op, root, "Reduce"))

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0) -> Request:
        """Start a reduce."""
        return _started(self._native.ireduce(*self._reduce(sendbuf, recvbuf, op, root,
                                                           "Ireduce")))

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: Any, where: str) -> tuple[Any, ...]:
        r = recv_message(recvbuf, f"{where}(recvbuf)")
        return _reduce_input(sendbuf, r, where), r.array(), buffer_op(op, r.datatype)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        """Combine every process's ``sendbuf`` with ``op``; every process gets the result."""
        n = self._native
        key = _OP_KEYS.get(id(op))
        if key is not None and not hooks.observing and (
                n._again("allreduce", sendbuf, recvbuf, key, None) if type(recvbuf) is np.ndarray
                else _again_specs(n, "allreduce", sendbuf, recvbuf, key)):
            return
        self._reduction("allreduce", sendbuf, recvbuf, op, "Allreduce")

    def _reduction(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, where: str) -> None:
        """Allreduce, Scan or Exscan (``coll``) through the checks, kept for the repeat path
        where the buffers are the user's plain arrays and the op a predefined one."""
        n = self._native
        run = getattr(n, coll)
        fast = _plain_reduction(sendbuf, recvbuf, op)
        if fast is None:
            run(*self._allreduce(sendbuf, recvbuf, op, where))
            return
        prepare, args = ((calls.allreduce, fast) if coll == "allreduce"
                         else (calls.scan, (coll, *fast)))
        if not _keep(n, prepare, args, fast[0], fast[1], _op_key(op)):
            run(*fast)  # the user's own arrays: the native repeat path can see them

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:
        """Start an allreduce."""
        return _started(self._native.iallreduce(*self._allreduce(sendbuf, recvbuf, op,
                                                                 "Iallreduce")))

    def _reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any,
                              where: str) -> tuple[Any, ...]:
        p = self._native.size
        if sendbuf is IN_PLACE:
            r = block_message(recvbuf, f"{where}(recvbuf)", writable=True, blocks=p)
            return IN_PLACE, r.array(), buffer_op(op, r.datatype)
        r = recv_message(recvbuf, f"{where}(recvbuf)")
        s = block_message(sendbuf, f"{where}(sendbuf)", writable=False, blocks=p)
        sb, rb = s.array(), r.array()
        if sb.dtype != rb.dtype:
            raise ValueError(f"{where}: mismatch in send and receive MPI datatypes")
        if s.count != r.count:
            raise ValueError(f"{where}: mismatch in send count {s.count} (per process) and "
                             f"receive count {r.count}")
        return sb, rb, buffer_op(op, r.datatype)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        """Reduce ``sendbuf`` (one block per process) and give rank i block i."""
        n = self._native
        key = _OP_KEYS.get(id(op))
        if key is not None and not hooks.observing and (
                n._again("reduce_scatter_block", sendbuf, recvbuf, key, None)
                if type(recvbuf) is np.ndarray
                else _again_specs(n, "reduce_scatter_block", sendbuf, recvbuf, key)):
            return
        s, r = plain_array(sendbuf, False), plain_array(recvbuf, True)
        sb, rb, o = self._reduce_scatter_block(sendbuf, recvbuf, op, "Reduce_scatter_block")
        if sb is IN_PLACE or not _keep(n, calls.reduce_scatter, (sb, rb, None, o), s, r,
                                       _op_key(op)):
            n.reduce_scatter_block(sb, rb, o)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:
        """Start a reduce_scatter_block."""
        return _started(self._native.ireduce_scatter_block(*self._reduce_scatter_block(
            sendbuf, recvbuf, op, "Ireduce_scatter_block")))

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any,
                        where: str) -> tuple[Any, ...]:
        n = self._native
        r = recv_message(recvbuf, f"{where}(recvbuf)")
        rb = r.array()
        if sendbuf is IN_PLACE:
            if recvcounts is None:
                raise TypeError(f"{where}: recvcounts are required with IN_PLACE")
            sb: Any = IN_PLACE
        else:
            sb = send_message(sendbuf, f"{where}(sendbuf)").array()
            if sb.dtype != rb.dtype:
                raise ValueError(f"{where}: mismatch in send and receive MPI datatypes")
            if recvcounts is None:  # every process's receive count, as mpi4py does
                table = np.empty(n.size, dtype=np.int64)
                n.allgather(np.array([rb.size], dtype=np.int64), table)
                recvcounts = table.tolist()
        return sb, rb, recvcounts, buffer_op(op, r.datatype)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                       op: Any = SUM) -> None:
        """Reduce ``sendbuf`` and give rank i its ``recvcounts[i]`` elements."""
        n = self._native
        args = (sendbuf, recvbuf, recvcounts, op, "Reduce_scatter")
        if recvcounts is None:  # (every call agrees on them, a collective: never kept)
            n.reduce_scatter(*self._reduce_scatter(*args))
        else:
            _vmemo.call(n, "Reduce_scatter", args[:4], n.reduce_scatter,
                        lambda: self._reduce_scatter(*args))

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                        op: Any = SUM) -> Request:
        """Start a reduce_scatter."""
        return _started(self._native.ireduce_scatter(*self._reduce_scatter(
            sendbuf, recvbuf, recvcounts, op, "Ireduce_scatter")))

    # -- Python objects -------------------------------------------------------------------

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return ``root``'s ``obj`` on every process."""
        n = self._native
        got = n.bcast_obj(obj, root)
        return _copy(got) if n.rank == root else got

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        """A list of every process's ``sendobj`` (index i from rank i) at root; None elsewhere."""
        n = self._native
        got = n.gather_obj(sendobj, root)
        if got is not None:
            got[n.rank] = _copy(got[n.rank])
        return got

    def scatter(self, sendobj: Any, root: int = 0) -> Any:
        """Rank i gets item i of ``sendobj`` at root (``sendobj`` is ignored elsewhere)."""
        n = self._native
        got = n.scatter_obj(sendobj if n.rank == root else None, root)
        return _copy(got) if n.rank == root else got

    def allgather(self, sendobj: Any) -> list[Any]:
        """A list of every process's ``sendobj`` on every process."""
        n = self._native
        got = n.allgather_obj(sendobj)
        got[n.rank] = _copy(got[n.rank])
        return got

    def alltoall(self, sendobj: Any) -> list[Any]:
        """Item j of rank i's ``sendobj`` becomes item i of rank j's result."""
        n = self._native
        got = n.alltoall_obj(list(sendobj))
        got[n.rank] = _copy(got[n.rank])
        return got

    def reduce(self, sendobj: Any, op: Any = SUM, root: int = 0) -> Any:
        """``op`` over every process's ``sendobj`` in rank order at root; None elsewhere."""
        n = self._native
        value = _copy(sendobj) if n.rank == 0 else sendobj  # rank 0 starts the combination
        return n.reduce_obj(value, object_op(op), root)

    def allreduce(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over every process's ``sendobj`` in rank order, on every process."""
        n = self._native
        return n.allreduce_obj(_copy(sendobj) if n.rank == 0 else sendobj, object_op(op))


class IntraCollectives(Collectives):
    """The prefix reductions, which only intracommunicators have."""

    __slots__ = ()

    def _prefix(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, where: str) -> None:
        """Scan or Exscan (``coll``), repeated as Allreduce is."""
        n = self._native
        key = _OP_KEYS.get(id(op))
        if key is not None and not hooks.observing and (
                n._again(coll, sendbuf, recvbuf, key, None) if type(recvbuf) is np.ndarray
                else _again_specs(n, coll, sendbuf, recvbuf, key)):
            return
        self._reduction(coll, sendbuf, recvbuf, op, where)

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        """Inclusive prefix reduction: rank i gets ``op`` over ranks 0..i."""
        self._prefix("scan", sendbuf, recvbuf, op, "Scan")

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:
        """Start a scan."""
        return _started(self._native.iscan(*self._allreduce(sendbuf, recvbuf, op, "Iscan")))

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        """Exclusive prefix reduction: rank i gets ``op`` over ranks 0..i-1 (rank 0: untouched)."""
        self._prefix("exscan", sendbuf, recvbuf, op, "Exscan")

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:
        """Start an exscan."""
        return _started(self._native.iexscan(*self._allreduce(sendbuf, recvbuf, op, "Iexscan")))

    def scan(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over the values of ranks 0..rank, in rank order."""
        return self._native.scan_obj(_copy(sendobj), object_op(op))

    def exscan(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over the values of ranks 0..rank-1, in rank order (None on rank 0)."""
        return self._native.exscan_obj(sendobj, object_op(op))
