"""The MPI backend's communicator: point to point, object forms and communicator management.

Semantics follow the native :class:`ringworld.Communicator` (same names, arguments, results,
errors), with MPI's own where MPI decides: a large ``send`` may wait until the receiver posts
(MPI's rendezvous protocol; the native backend buffers at the receiver), and object collectives
are mpi4py's pickle-based blocking calls (``timeout=`` is accepted but not enforced there).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ringworld.backends.mpi._base import translating
from ringworld.backends.mpi._coll import Collectives, OpLike
from ringworld.backends.mpi._requests import LazyRecv, MpiRequest, Poller, make_status
from ringworld.collective.markers import UNDEFINED
from ringworld.comm import ops
from ringworld.comm.requests import ANY_SOURCE, ANY_TAG, Request, Status
from ringworld.errors import TruncationError


def _status(_: Any, st: Status) -> Status:
    return st


def _unpickle(data: Any, _: Status) -> Any:
    return pickle.loads(data)


@translating
class MpiComm(Collectives):
    """A Ringworld communicator whose every call is an mpi4py call (see the package doc): it
    provides the native :class:`~ringworld.Communicator`'s interface, which
    :func:`ringworld.backends.start_world` declares it returns."""

    def __init__(self, comm: Any, poller: Poller, name: str, predefined: bool = False) -> None:
        super().__init__(comm, poller, name, predefined)

    # ------------------------------------------------------------------ point to point
    def isend(self, buf: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start sending ``buf`` (any buffer) to ``dest``; ``wait()`` -> None."""
        spec = self._bytes(self._arr(buf, "buf"))
        req = self._c.Isend(spec, self._rank_arg(dest, "dest"), self._send_tag(tag))
        return MpiRequest(self._poller, req, f"send to {dest} on {self.name!r}", keep=spec)

    def send(self, buf: Any, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` to ``dest``. Raises: Timeout (only with a timeout)."""
        if timeout is None and self._poller.timeout is None and not self._poller.busy():
            spec = self._bytes(self._arr(buf, "buf"))
            self._c.Send(spec, self._rank_arg(dest, "dest"), self._send_tag(tag))
        else:
            self.isend(buf, dest, tag).wait(timeout)

    def irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request[Status]:
        """Start receiving into ``buf``; ``wait()`` -> Status (TruncationError if too big)."""
        view = self._arr(buf, "buf", writable=True).view(np.uint8)
        return LazyRecv(self._poller, self._matcher, self._source(source), self._recv_tag(tag),
                        view, _status, f"recv from {source} on {self.name!r}")

    def recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
             timeout: float | None = None) -> Status:
        """Receive into ``buf`` and return the Status.

        Raises:
            TruncationError: the message is larger than ``buf`` (left untouched).
            Timeout: nothing arrived within ``timeout`` s (the receive is withdrawn).
        """
        if timeout is None and self._poller.timeout is None and self._matcher.idle() \
                and not self._poller.busy():
            view = self._arr(buf, "buf", writable=True).view(np.uint8)
            st = MPI.Status()
            msg = self._c.Mprobe(self._source(source), self._recv_tag(tag), st)
            status = make_status(st)
            if status.nbytes > view.size:
                msg.Recv([bytearray(status.nbytes), MPI.BYTE])
                raise TruncationError(status.nbytes, view.size, f"recv on {self.name!r}")
            msg.Recv([view, status.nbytes, MPI.BYTE])
            return status
        return self.irecv(buf, source, tag).wait(timeout)

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int = ANY_SOURCE,
                 sendtag: int = 0, recvtag: int = ANY_TAG, *,
                 timeout: float | None = None) -> Status:
        """Send to ``dest`` and receive from ``source`` at once (no deadlock in a ring)."""
        req = self.isend(sendbuf, dest, sendtag)
        status = self.irecv(recvbuf, source, recvtag).wait(timeout)
        req.wait(timeout)
        return status

    def isend_obj(self, obj: Any, dest: int, tag: int = 0) -> Request[None]:
        """Start sending a picklable ``obj`` (pickle protocol 5)."""
        return self.isend(pickle.dumps(obj, protocol=5), dest, tag)

    def send_obj(self, obj: Any, dest: int, tag: int = 0, *,
                 timeout: float | None = None) -> None:
        """Send a picklable ``obj`` to ``dest``."""
        self.send(pickle.dumps(obj, protocol=5), dest, tag, timeout=timeout)

    def irecv_obj(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request[Any]:
        """Start receiving an object; ``wait()`` -> the object, ``.status`` after."""
        return LazyRecv(self._poller, self._matcher, self._source(source), self._recv_tag(tag),
                        None, _unpickle, f"recv_obj from {source} on {self.name!r}")

    def recv_obj(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                 timeout: float | None = None) -> Any:
        """Receive an object. Raises: Timeout (the receive is withdrawn)."""
        return self.irecv_obj(source, tag).wait(timeout)

    def sendrecv_obj(self, obj: Any, dest: int, source: int = ANY_SOURCE, sendtag: int = 0,
                     recvtag: int = ANY_TAG, *, timeout: float | None = None) -> Any:
        """Send ``obj`` to ``dest`` and receive one from ``source``."""
        req = self.isend_obj(obj, dest, sendtag)
        got = self.irecv_obj(source, recvtag).wait(timeout)
        req.wait(timeout)
        return got

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """The Status of a matching message not yet received, or None."""
        _ = self._c  # raises after free()
        return self._matcher.find(self._source(source), self._recv_tag(tag))

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
              timeout: float | None = None) -> Status:
        """Wait for a matching message and return its Status (it stays to be received).

        Raises:
            Timeout: none arrived within ``timeout`` s.
        """
        found: list[Status] = []

        def look() -> bool:
            st = self.iprobe(source, tag)
            if st is not None:
                found.append(st)
            return st is not None

        self._poller.wait_for(look, timeout, lambda: f"probe on {self.name!r}")
        return found[0]

    # ------------------------------------------------------------------ objects
    def bcast_obj(self, obj: Any, root: int = 0, *, timeout: float | None = None) -> Any:
        """``root``'s ``obj`` on every rank."""
        return self._c.bcast(obj, self._root(root))

    def gather_obj(self, obj: Any, root: int = 0, *,
                   timeout: float | None = None) -> list[Any] | None:
        """A list of every rank's ``obj`` at ``root``; None elsewhere."""
        out: list[Any] | None = self._c.gather(obj, self._root(root))
        return out

    def scatter_obj(self, objs: Sequence[Any] | None, root: int = 0, *,
                    timeout: float | None = None) -> Any:
        """Item i of ``root``'s ``objs`` on rank i.

        Raises:
            ValueError: (root) ``objs`` does not have one item per rank.
        """
        root = self._root(root)
        items = None
        if self.rank == root:
            items = list(objs) if objs is not None else []
            if len(items) != self.size:
                raise ValueError(f"objs has {len(items)} items; the communicator has "
                                 f"{self.size} ranks")
        return self._c.scatter(items, root)

    def allgather_obj(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """A list of every rank's ``obj``, on every rank."""
        out: list[Any] = self._c.allgather(obj)
        return out

    def alltoall_obj(self, objs: Sequence[Any], *, timeout: float | None = None) -> list[Any]:
        """Item j of rank i's ``objs`` becomes item i of rank j's result.

        Raises:
            ValueError: ``objs`` does not have one item per rank.
        """
        items = list(objs)
        if len(items) != self.size:
            raise ValueError(f"objs has {len(items)} items; the communicator has {self.size} "
                             "ranks")
        out: list[Any] = self._c.alltoall(items)
        return out

    @staticmethod
    def _fold(values: Sequence[Any], op: OpLike) -> Any:
        o = ops.resolve(op)
        acc = values[0]
        for v in values[1:]:
            acc = o.combine_obj(acc, v)
        return acc

    def reduce_obj(self, obj: Any, op: OpLike = ops.SUM, root: int = 0, *,
                   timeout: float | None = None) -> Any:
        """``op`` over every rank's ``obj`` in rank order at ``root``; None elsewhere.
        Cost: a gather of every value to the root."""
        ops.resolve(op)
        values = self.gather_obj(obj, root)
        return None if values is None else self._fold(values, op)

    def allreduce_obj(self, obj: Any, op: OpLike = ops.SUM, *,
                      timeout: float | None = None) -> Any:
        """``op`` over every rank's ``obj`` in rank order, on every rank (an allgather)."""
        ops.resolve(op)
        return self._fold(self.allgather_obj(obj), op)

    def scan_obj(self, obj: Any, op: OpLike = ops.SUM, *,
                 timeout: float | None = None) -> Any:
        """``op`` over the values of ranks 0..rank, in rank order (an allgather)."""
        ops.resolve(op)
        return self._fold(self.allgather_obj(obj)[: self.rank + 1], op)

    def exscan_obj(self, obj: Any, op: OpLike = ops.SUM, *,
                   timeout: float | None = None) -> Any:
        """``op`` over the values of ranks 0..rank-1 (None on rank 0), in rank order."""
        ops.resolve(op)
        values = self.allgather_obj(obj)[: self.rank]
        return self._fold(values, op) if values else None

    # ------------------------------------------------------------------ communicators
    @property
    def world_ranks(self) -> tuple[int, ...]:
        """This communicator's ranks as ranks of the world."""
        if self._world_ranks is None:
            group = self._c.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            self._world_ranks = tuple(int(r) for r in
                                      group.Translate_ranks(list(range(self.size)), world))
            group.Free()
            world.Free()
        return self._world_ranks

    def self_comm(self) -> MpiComm:
        """A communicator holding only this rank (MPI's COMM_SELF)."""
        return MpiComm(MPI.COMM_SELF, self._poller, "self", predefined=True)

    def dup(self, name: str | None = None) -> MpiComm:
        """Same ranks, separate traffic (``MPI_Comm_dup``). Collective."""
        return MpiComm(self._c.Dup(), self._poller, name or f"{self.name}.dup")

    def split(self, color: int | None, key: int = 0, name: str | None = None) -> MpiComm | None:
        """One communicator per ``color``, ranked by (``key``, old rank); None for color None
        or UNDEFINED. Collective.

        Raises:
            TypeError / ValueError: color or key not an int, or a negative color.
        """
        if color is not None and type(color) is not int:
            raise TypeError(f"color must be an int or None, got {type(color).__name__}")
        if type(key) is not int:
            raise TypeError(f"key must be an int, got {type(key).__name__}")
        col = UNDEFINED if color is None else color
        if col < 0 and col != UNDEFINED:
            raise ValueError(f"color={color} must be >= 0, None or UNDEFINED")
        new = self._c.Split(MPI.UNDEFINED if col == UNDEFINED else col, key)
        if new == MPI.COMM_NULL:
            return None
        return MpiComm(new, self._poller, name or f"{self.name}.split{col}")

    def create(self, ranks: Sequence[int], name: str | None = None) -> MpiComm | None:
        """A communicator of ``ranks`` (in that order); None on other ranks. Collective.

        Raises:
            ValueError: a rank is out of range or repeated.
        """
        members = [self._rank_arg(r, "ranks[]") for r in ranks]
        if len(set(members)) != len(members):
            raise ValueError(f"ranks={list(ranks)} has a repeated rank")
        group = self._c.Get_group()
        sub = group.Incl(members)
        try:
            new = self._c.Create(sub)
        finally:
            sub.Free()
            group.Free()
        if new == MPI.COMM_NULL:
            return None
        return MpiComm(new, self._poller, name or f"{self.name}.create")

    def free(self) -> None:
        """Release the communicator; later calls raise CommError. Idempotent."""
        if self._freed:
            return
        self._freed = True
        if not self._predefined:
            self._comm.Free()
