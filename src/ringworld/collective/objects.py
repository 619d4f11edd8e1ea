"""Collectives on Python values (mpi4py's lowercase methods): pickled once, moved as bytes.

A value is serialised once where it originates (pickle protocol 5, numpy arrays out-of-band)
and forwarded as raw bytes, so a broadcast tree does not re-pickle at every hop. Reductions
combine values with :meth:`Op.combine_obj` (``+`` for ``SUM``, ...) along a binomial tree over
rank order, so non-commutative user ops are applied in rank order and every rank gets the value
computed once, by rank 0. Algorithms: binomial trees for bcast and reduce, linear exchanges for
gather, scatter, allgather and alltoall (values are usually small), a chain for scans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from ringworld.comm import ops
from ringworld.comm import serialize as objects
from ringworld.comm.hooks import observable, observed
from ringworld.comm.point_to_point import PointToPoint
from ringworld.comm.requests import SEQ_MASK, SIG_SHIFT, Request, wait_all
from ringworld.errors import CommBroken, CommError, PeerFailure, Timeout


class _Encoded:
    """A value's wire form: segments, byte count, flags (and buffers to keep alive)."""

    __slots__ = ("flags", "keep", "nbytes", "segments")

    def __init__(self, segments: Sequence[memoryview], nbytes: int, flags: int,
                 keep: object = None) -> None:
        self.segments = segments
        self.nbytes = nbytes
        self.flags = flags
        self.keep = keep

    @classmethod
    def of(cls, obj: Any) -> _Encoded:
        segments, nbytes, flags, keep = objects.encode(obj)
        return cls(segments, nbytes, flags, keep)

    def value(self) -> Any:
        view = self.segments[0] if len(self.segments) == 1 else memoryview(
            b"".join(bytes(s) for s in self.segments))
        return objects.decode(view, self.flags)


def _in_rank_order(p: int, r: int, own: Any, got: Iterator[tuple[int, memoryview]]) -> list[Any]:
    """The values of ranks 0..p-1: ``own`` at ``r``, the others decoded from ``got`` in order."""
    out = []
    for i in range(p):
        if i == r:
            out.append(own)
        else:
            flags, view = next(got)
            out.append(objects.decode(view, flags))
    return out


@observed
class ObjectCollectives(PointToPoint):
    """The object forms of the collectives (blocking; values of any picklable type)."""

    _freed = False

    def _check_open(self) -> None:
        if self._freed:
            raise CommError(f"{self.name} was freed; it cannot be used any more")
        if self._engine.closed:  # (the reason: ringworld.finalize() ran)
            raise CommBroken(str(self._engine.broken))
        revoked = self._engine.revoked
        if revoked and self.coll_context in revoked:
            raise revoked[self.coll_context]

    @contextlib.contextmanager
    def _named(self, what: str, tag: int) -> Iterator[None]:
        """Name the collective in a Timeout or PeerFailure raised by its messages; a call that
        raises is given up here, so its peers' messages that still come are no strays."""
        try:
            yield
        except BaseException as exc:
            if self._chan.seq != tag & SEQ_MASK:  # it took its number
                self._engine.open_calls[self.coll_context].add(tag & SEQ_MASK)
            if isinstance(exc, Timeout):
                raise Timeout(f"{what} #{tag & SEQ_MASK} on {self.name}: {exc}") from exc
            if isinstance(exc, PeerFailure):
                raise PeerFailure(exc.rank, f"{exc.detail} (in {what} #{tag & SEQ_MASK} on "
                                            f"{self.name})") from exc
            raise

    def _obj_seq(self, what: str, root: int = 0, op: str = "") -> int:
        """The next sequence number with this call's signature in its high bits, so that a
        rank calling another collective fails with MismatchError (see the engine)."""
        key = ("obj", what, root, op)
        known = self._engine.signed_calls
        sig = known.get(key)
        if sig is None:
            sig = self._engine.sign(f"{what}(root={root}, op={op or '-'})")
            if len(known) < 4096:
                known[key] = sig
        tag = self._chan.next_seq() | (sig << SIG_SHIFT)
        self._engine.note_call(self.coll_context, tag)
        return tag

    def _send(self, enc: _Encoded, dest: int, tag: int) -> Request[None] | None:
        return self._chan.coll_isend_raw(enc.segments, enc.nbytes, enc.flags, dest, tag, enc.keep)

    def _recv(self, source: int, tag: int, timeout: float | None) -> _Encoded:
        flags, view = self._chan.coll_irecv_raw(source, tag).wait_or_cancel(timeout)
        return _Encoded([view], len(view), flags)

    def _root_of(self, root: int) -> int:
        self._world(root, "root")
        return int(root)

    @observable("collective")
    def bcast_obj(self, obj: Any, root: int = 0, *, timeout: float | None = None) -> Any:
        """Return ``root``'s ``obj`` on every rank (the root gets its own object back).

        Cost: log2 p rounds; the value is pickled once, at the root.

        Raises:
            Timeout, PeerFailure; pickling errors at the root.
        """
        self._check_open()
        with self._named("bcast_obj", self._chan.seq):
            root = self._root_of(root)
            tag = self._obj_seq("bcast_obj", root)
            return self._bcast_obj(obj, root, tag, timeout)

    def _bcast_obj(self, obj: Any, root: int, tag: int, timeout: float | None) -> Any:
        p, r = self.size, self.rank
        if p == 1:
            return obj
        v = (r - root) % p
        span = 1
        while span < p and not v & span:
            span <<= 1
        enc = _Encoded.of(obj) if v == 0 else self._recv((v - span + root) % p, tag, timeout)
        sends = []
        m = span >> 1
        while m:
            if v + m < p:
                h = self._send(enc, (v + m + root) % p, tag)
                if h is not None:
                    sends.append(h)
            m >>= 1
        wait_all(sends, timeout)
        return obj if v == 0 else enc.value()

    @observable("collective")
    def gather_obj(self, obj: Any, root: int = 0, *,
                   timeout: float | None = None) -> list[Any] | None:
        """A list of every rank's ``obj`` (index i from rank i) at ``root``; None elsewhere.

        Raises:
            Timeout, PeerFailure.
        """
        self._check_open()
        with self._named("gather_obj", self._chan.seq):
            root = self._root_of(root)
            tag = self._obj_seq("gather_obj", root)
            p, r = self.size, self.rank
            if r != root:
                h = self._send(_Encoded.of(obj), root, tag)
                if h is not None:
                    h.wait(timeout)
                return None
            reqs = [self._chan.coll_irecv_raw(i, tag) for i in range(p) if i != r]
            got = iter(wait_all(reqs, timeout))
            return _in_rank_order(p, r, obj, got)

    @observable("collective")
    def scatter_obj(self, objs: Sequence[Any] | None, root: int = 0, *,
                    timeout: float | None = None) -> Any:
        """Rank i gets ``objs[i]`` of ``root`` (``objs`` matters only at the root).

        Raises:
            ValueError: ``objs`` at the root does not have one item per rank.
            Timeout, PeerFailure.
        """
        self._check_open()
        with self._named("scatter_obj", self._chan.seq):
            root = self._root_of(root)
            p, r = self.size, self.rank
            if r == root:
                if objs is None or len(objs) != p:
                    self._obj_seq("scatter_obj", root)
                    raise ValueError(f"objs must have {p} items at the root, got "
                                     f"{None if objs is None else len(objs)}")
                tag = self._obj_seq("scatter_obj", root)
                sends = [h for i in range(p) if i != r
                         for h in [self._send(_Encoded.of(objs[i]), i, tag)] if h is not None]
                wait_all(sends, timeout)
                return objs[r]
            tag = self._obj_seq("scatter_obj", root)
            return self._recv(root, tag, timeout).value()

    @observable("collective")
    def allgather_obj(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """A list of every rank's ``obj`` on every rank; pickled once per rank.

        Raises:
            Timeout, PeerFailure.
        """
        self._check_open()
        with self._named("allgather_obj", self._chan.seq):
            tag = self._obj_seq("allgather_obj")
            p, r = self.size, self.rank
            enc = _Encoded.of(obj)
            reqs: list[Request[Any]] = [self._chan.coll_irecv_raw(i, tag) for i in range(p)
                                        if i != r]
            sends = [h for i in range(p) if i != r for h in [self._send(enc, i, tag)]
                     if h is not None]
            got = iter(wait_all(reqs + sends, timeout)[: len(reqs)])
            return _in_rank_order(p, r, obj, got)

    @observable("collective")
    def alltoall_obj(self, objs: Sequence[Any], *, timeout: float | None = None) -> list[Any]:
        """Item j of rank i's ``objs`` becomes item i of rank j's result.

        Raises:
            ValueError: ``objs`` does not have one item per rank.  Timeout, PeerFailure.
        """
        self._check_open()
        with self._named("alltoall_obj", self._chan.seq):
            p, r = self.size, self.rank
            tag = self._obj_seq("alltoall_obj")
            if len(objs) != p:
                raise ValueError(f"objs must have {p} items (one per rank), got {len(objs)}")
            reqs: list[Request[Any]] = [self._chan.coll_irecv_raw(i, tag) for i in range(p)
                                        if i != r]
            sends = [h for i in range(p) if i != r
                     for h in [self._send(_Encoded.of(objs[i]), i, tag)] if h is not None]
            got = iter(wait_all(reqs + sends, timeout)[: len(reqs)])
            return _in_rank_order(p, r, objs[r], got)

    @observable("collective")
    def reduce_obj(self, obj: Any, op: ops.Op | str = ops.SUM, root: int = 0, *,
                   timeout: float | None = None) -> Any:
        """``op`` over every rank's ``obj`` in rank order, at ``root``; None elsewhere.

        Raises:
            Timeout, PeerFailure; whatever ``op`` raises on these values.
        """
        self._check_open()
        with self._named("reduce_obj", self._chan.seq):
            root = self._root_of(root)
            o = ops.resolve(op)
            tag = self._obj_seq("reduce_obj", root, o.name)
            return self._reduce_obj(obj, o, root, tag, timeout)

    def _reduce_obj(self, obj: Any, o: ops.Op, root: int, tag: int,
                    timeout: float | None) -> Any:
        p, r = self.size, self.rank
        acc = obj
        m = 1
        while m < p:  # binomial tree over rank order, rooted at 0
            if r & m:
                h = self._send(_Encoded.of(acc), r - m, tag)
                if h is not None:
                    h.wait(timeout)
                acc = None
                break
            if r + m < p:
                acc = o.combine_obj(acc, self._recv(r + m, tag, timeout).value())
            m <<= 1
        if root == 0:
            return acc if r == 0 else None
        if r == 0:
            h = self._send(_Encoded.of(acc), root, tag)
            if h is not None:
                h.wait(timeout)
            return None
        return self._recv(0, tag, timeout).value() if r == root else None

    @observable("collective")
    def allreduce_obj(self, obj: Any, op: ops.Op | str = ops.SUM, *,
                      timeout: float | None = None) -> Any:
        """``op`` over every rank's ``obj`` in rank order, on every rank (computed once).

        Raises:
            Timeout, PeerFailure; whatever ``op`` raises on these values.
        """
        self._check_open()
        with self._named("allreduce_obj", self._chan.seq):
            o = ops.resolve(op)
            tag = self._obj_seq("allreduce_obj", 0, o.name)
            acc = self._reduce_obj(obj, o, 0, tag, timeout)
            return self._bcast_obj(acc, 0, self._obj_seq("allreduce_obj", 0, o.name), timeout)

    @observable("collective")
    def scan_obj(self, obj: Any, op: ops.Op | str = ops.SUM, *,
                 timeout: float | None = None) -> Any:
        """``op`` over the values of ranks 0..rank, in rank order (a chain).

        Raises:
            Timeout, PeerFailure; whatever ``op`` raises on these values.
        """
        return self._chain("scan_obj", obj, op, timeout, inclusive=True)

    @observable("collective")
    def exscan_obj(self, obj: Any, op: ops.Op | str = ops.SUM, *,
                   timeout: float | None = None) -> Any:
        """``op`` over the values of ranks 0..rank-1 (None on rank 0), in rank order.

        Raises:
            Timeout, PeerFailure; whatever ``op`` raises on these values.
        """
        return self._chain("exscan_obj", obj, op, timeout, inclusive=False)

    def _chain(self, what: str, obj: Any, op: ops.Op | str, timeout: float | None,
               inclusive: bool) -> Any:
        """A prefix reduction along the chain 0 -> 1 -> ... (rank order for any op)."""
        self._check_open()
        with self._named(what, self._chan.seq):
            o = ops.resolve(op)
            tag = self._obj_seq(what, 0, o.name)
            prefix = self._recv(self.rank - 1, tag, timeout).value() if self.rank else None
            last = self.rank == self.size - 1
            if last and not inclusive:
                return prefix
            acc = obj if self.rank == 0 else o.combine_obj(prefix, obj)
            if not last:
                h = self._send(_Encoded.of(acc), self.rank + 1, tag)
                if h is not None:
                    h.wait(timeout)
            return acc if inclusive else prefix
