"""``MPI.Comm`` / ``MPI.Intracomm``: mpi4py's communicator API over a native communicator.

The native communicator is looked up on every call (``ringworld.world()``), so ``COMM_WORLD``
starts the runtime only when first used and follows the world of a forked rank. Native errors
(``ringworld.errors`` types, ``ValueError``, ``TypeError``) propagate unchanged.

Synchronous sends (``Ssend``/``ssend``/``Issend``/``issend``/``Ssend_init``) complete only once
the matching receive has started (the receiver acknowledges the match), as MPI's synchronous mode
requires; buffered and ready sends are standard-mode sends.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Self

import numpy as np

import ringworld
from ringworld import runtime as _runtime
from ringworld.collective.communicator import Communicator as _Communicator
from ringworld.comm import hooks
from ringworld.comm.point_to_point import may_overlap, send_view
from ringworld.mpi._buffer import PLAIN_DTYPES, plain_array, recv_message, send_message
from ringworld.mpi._collectives import Collectives, IntraCollectives
from ringworld.mpi._constants import (
    ANY_SOURCE,
    ANY_TAG,
    APPNUM,
    COMM_TYPE_SHARED,
    HOST,
    IO,
    LASTUSEDCODE,
    PROC_NULL,
    TAG_UB,
    UNDEFINED,
    UNIVERSE_SIZE,
    WTIME_IS_GLOBAL,
)
from ringworld.mpi._env import Get_processor_name
from ringworld.mpi._exception import (
    ERR_ARG,
    ERR_COMM,
    ERR_GROUP,
    ERR_KEYVAL,
    ERR_LASTCODE,
    Exception,
)
from ringworld.mpi._group import CONGRUENT, IDENT, SIMILAR, UNEQUAL, Group, group_of
from ringworld.mpi._info import ERRORS_RETURN, Errhandler, Info
from ringworld.mpi._persistent import Prequest, SendRecvRequest
from ringworld.mpi._request import EMPTY_DONE, PROC_NULL_DONE, Request, _Kind
from ringworld.mpi._status import Status

_new_object = object.__new__

Resolver = Callable[[], ringworld.Communicator]


def _fill(status: Status | None, native: ringworld.Status) -> None:
    if status is not None:
        status._set(native.source, native.tag, native.nbytes, native.cancelled)


def _world() -> ringworld.Communicator:
    world = _runtime._world  # the common case inline: the native world, already made
    if type(world) is _Communicator:
        return world
    if _runtime.finalized():
        raise RuntimeError("ringworld.MPI: MPI.Finalize() (or ringworld.finalize()) has run in "
                           "this process; no communication may follow it")
    world = ringworld.world()
    if not isinstance(world, _Communicator):
        raise RuntimeError(
            "ringworld.MPI runs on the native backend; this job uses backend='mpi' "
            "(RINGWORLD_BACKEND=mpi): use the communicator ringworld.init() returns, or mpi4py")
    return world


def _fill_proc_null(status: Status | None) -> None:
    PROC_NULL_DONE.fill(status)


class _SelfResolver:
    """Resolves COMM_SELF: the world's self communicator, made once per world."""

    __slots__ = ("_self", "_world")

    def __init__(self) -> None:
        self._world: ringworld.Communicator | None = None
        self._self: ringworld.Communicator | None = None

    def __call__(self) -> ringworld.Communicator:
        world = _world()
        if world is not self._world or self._self is None:
            self._self = world.self_comm()
            self._world = world
        return self._self


class _Fixed:
    """Resolves a communicator made by Dup, Split, Create...: always the same native one."""

    __slots__ = ("native",)

    def __init__(self, native: ringworld.Communicator) -> None:
        self.native = native

    def __call__(self) -> ringworld.Communicator:
        return self.native


class Comm(Collectives):
    """A communicator. ``Comm()`` is a null communicator like ``MPI.COMM_NULL``."""

    __slots__ = ("_errhandler", "_name", "_native", "_predefined", "_resolver")

    def __init__(self) -> None:
        self._resolver: Resolver | None = None
        self._name = "MPI_COMM_NULL"
        self._predefined = False
        self._errhandler = ERRORS_RETURN

    @classmethod
    def _create(cls, resolver: Resolver, name: str, *, predefined: bool = False) -> Self:
        comm = cls()
        comm._resolver = resolver
        comm._name = name
        comm._predefined = predefined
        return comm

    if not TYPE_CHECKING:  # (hidden from mypy, which would take every name as Any)

        def __getattr__(self, name: str) -> Any:
            """``_native``, the native communicator, resolved on first use and kept in its slot
            (reading it is then one load: as a property it cost 80 ns, a tenth of the layer's
            cost on an 8-byte Bcast). The world's cannot change while the job runs (one job a
            process) and raises CommBroken after ``finalize()``; Free empties the slot.

            Raises:
                MPI.Exception (ERR_COMM): the communicator is null. AttributeError: another name.
            """
            if name != "_native":
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            if self._resolver is None:
                raise Exception(ERR_COMM, "the communicator is null (COMM_NULL or freed)")
            native = self._native = self._resolver()
            return native

    def __bool__(self) -> bool:
        return self._resolver is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self is other or (not self and not other)  # all null communicators are equal

    __hash__ = None  # type: ignore[assignment]  # a mutable handle, unhashable as in mpi4py

    def __repr__(self) -> str:
        return f"<MPI.{type(self).__name__} {self._name}>"

    # -- properties and bookkeeping ---------------------------------------------------------

    def Get_rank(self) -> int:
        """Return the rank of this process in the communicator."""
        return self._native.rank

    def Get_size(self) -> int:
        """Return the number of processes in the communicator."""
        return self._native.size

    @property
    def rank(self) -> int:
        """The rank of this process."""
        return self._native.rank

    @property
    def size(self) -> int:
        """The number of processes."""
        return self._native.size

    def Get_name(self) -> str:
        """Return the communicator's name."""
        return self._name

    def Set_name(self, name: str) -> None:
        """Set the communicator's name."""
        self._name = str(name)

    @property
    def name(self) -> str:
        """The communicator's name."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self.Set_name(value)

    def Is_inter(self) -> bool:
        """Return False: only intracommunicators exist."""
        return False

    def Is_intra(self) -> bool:
        """Return True: only intracommunicators exist."""
        return True

    @property
    def is_inter(self) -> bool:
        """False: only intracommunicators exist."""
        return False

    @property
    def is_intra(self) -> bool:
        """True: only intracommunicators exist."""
        return True

    def Get_attr(self, keyval: int) -> int | bool:
        """Return a predefined attribute.

        ``TAG_UB``; ``UNIVERSE_SIZE`` (the world size); ``APPNUM`` (0); ``WTIME_IS_GLOBAL``
        (False: each process has its own clock); ``HOST`` (``PROC_NULL``); ``IO``
        (``ANY_SOURCE``: every process can do I/O); ``LASTUSEDCODE``.

        Raises:
            MPI.Exception: any other key (user attributes are not supported).
        """
        fixed: dict[int, int | bool] = {TAG_UB: TAG_UB, APPNUM: 0, WTIME_IS_GLOBAL: False,
                                        HOST: PROC_NULL, IO: ANY_SOURCE,
                                        LASTUSEDCODE: ERR_LASTCODE}
        if keyval in fixed:
            return fixed[keyval]
        if keyval == UNIVERSE_SIZE:
            return ringworld.world().size
        raise Exception(ERR_KEYVAL, f"unsupported attribute key {keyval!r}; the predefined keys "
                        "are TAG_UB, UNIVERSE_SIZE, APPNUM, WTIME_IS_GLOBAL, HOST, IO and "
                        "LASTUSEDCODE")

    def Get_errhandler(self) -> Errhandler:
        """Return the error handler set on the communicator (``ERRORS_RETURN`` at first)."""
        return self._errhandler

    def Set_errhandler(self, errhandler: Errhandler) -> None:
        """Record an error handler; errors are raised as Python exceptions whatever it is."""
        self._errhandler = errhandler

    def Get_info(self) -> Info:
        """Return the hints in use: always an empty info object."""
        return Info.Create()

    def Set_info(self, info: Info) -> None:
        """Accept and ignore hints."""
        del info

    @classmethod
    def Get_parent(cls) -> Comm:
        """Return the parent communicator: ``COMM_NULL``, as processes are never spawned."""
        return COMM_NULL

    def Free(self) -> None:
        """Free the communicator, which becomes null; predefined ones cannot be freed."""
        if self._predefined:
            raise Exception(ERR_COMM, f"cannot free the predefined communicator {self._name}")
        self._native.free()
        self._resolver = None
        del self._native

    def free(self) -> None:
        """Free the communicator unless it is null or predefined."""
        if self and not self._predefined:
            self.Free()

    # -- groups and communicator management -------------------------------------------------

    def _wrap(self, native: ringworld.Communicator | None) -> Self:
        """A new communicator of this class over ``native``; a null one for None."""
        comm = type(self)()
        if native is not None:
            comm._resolver = _Fixed(native)
            comm._name = ""
        return comm

    def Get_group(self) -> Group:
        """Return the group of this communicator's processes, in rank order."""
        native = self._native
        return group_of(native.world_ranks, native.world_ranks[native.rank])

    @property
    def group(self) -> Group:
        """The group of this communicator."""
        return self.Get_group()

    def Compare(self, comm: Comm) -> int:
        """Return ``IDENT``, ``CONGRUENT`` (same ranks and order), ``SIMILAR`` or ``UNEQUAL``."""
        mine, theirs = self._native, comm._native
        if mine is theirs:
            return IDENT
        if mine.world_ranks == theirs.world_ranks:
            return CONGRUENT
        return SIMILAR if sorted(mine.world_ranks) == sorted(theirs.world_ranks) else UNEQUAL

    def Dup(self, info: Any = None) -> Self:
        """A new communicator with the same processes and its own message contexts.

        Collective. ``info`` is accepted and ignored.
        """
        del info
        return self._wrap(self._native.dup())

    def Dup_with_info(self, info: Any) -> Self:
        """Same as ``Dup()``; ``info`` is ignored."""
        return self.Dup(info)

    def Clone(self) -> Self:
        """Same as ``Dup()``."""
        return self.Dup()

    def Idup(self, info: Any = None) -> tuple[Self, Request]:
        """``Dup()`` (it blocks here), with a request that is already complete."""
        return self.Dup(info), Request._completed(EMPTY_DONE)

    Idup_with_info = Idup

    def Split(self, color: int = 0, key: int = 0) -> Self:
        """One communicator per ``color``, ranked by ``(key, rank)``; null for ``UNDEFINED``.

        Collective.
        """
        return self._wrap(self._native.split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Self:
        """Split into the processes that share memory (``COMM_TYPE_SHARED``: one per host).

        ``UNDEFINED`` gives a null communicator; other split types are not supported.
        Collective.
        """
        del info
        native = self._native
        if split_type not in (COMM_TYPE_SHARED, UNDEFINED):
            raise Exception(ERR_ARG, f"Split_type: split type {split_type!r} is not "
                            "supported; use COMM_TYPE_SHARED")
        hosts = native.allgather_obj(Get_processor_name())
        color = UNDEFINED if split_type == UNDEFINED else hosts.index(hosts[native.rank])
        return self._wrap(native.split(color, key))

    def _ranks_of(self, group: Group, where: str) -> list[int]:
        native = self._native
        mine = {w: i for i, w in enumerate(native.world_ranks)}
        try:
            return [mine[w] for w in group._list]
        except KeyError:
            raise Exception(ERR_GROUP, f"{where}: the group has processes outside the "
                            "communicator") from None

    def Create(self, group: Group) -> Self:
        """The communicator of ``group`` (a subset of this one); null outside the group.

        Collective over this communicator: every process passes the same group.
        """
        return self._wrap(self._native.create(self._ranks_of(group, "Create")))

    def Abort(self, errorcode: int = 0) -> NoReturn:
        """Print a message and end this process at once with exit status ``errorcode``.

        The launcher sees the rank die and tears the rest of the job down.
        """
        where = f"rank {self._native.rank} " if ringworld.initialized() and self else ""
        sys.stdout.flush()
        sys.stderr.write(f"ringworld.MPI: {where}called Abort({errorcode}) on {self._name}\n")
        sys.stderr.flush()
        os._exit(errorcode)

    # -- Python objects (lowercase) ---------------------------------------------------------

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a picklable object (blocking, standard mode)."""
        if dest != PROC_NULL:
            self._native.send_obj(obj, dest, tag)

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a picklable object in synchronous mode: returns once the receive matched it."""
        if dest != PROC_NULL:
            self._native.ssend_obj(obj, dest, tag)

    bsend = send

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start sending a picklable object; ``wait()`` returns None."""
        if dest == PROC_NULL:
            return Request._completed(EMPTY_DONE)
        return Request._wrap(self._native.isend_obj(obj, dest, tag), _Kind.SEND)

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send of a picklable object: done once the receive matched it."""
        if dest == PROC_NULL:
            return Request._completed(EMPTY_DONE)
        return Request._wrap(self._native.issend_obj(obj, dest, tag), _Kind.SEND)

    ibsend = isend

    def recv(
        self,
        buf: Any = None,
        source: int = ANY_SOURCE,
        tag: int = ANY_TAG,
        status: Status | None = None,
    ) -> Any:
        """Receive and return a Python object; ``buf`` is accepted and ignored."""
        del buf
        if source == PROC_NULL:
            _fill_proc_null(status)
            return None
        if status is None:
            return self._native.recv_obj(source, tag)
        request = self._native.irecv_obj(source, tag)
        obj = request.wait()
        if request.status is not None:
            _fill(status, request.status)
        return obj

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving an object; ``wait()`` returns it. ``buf`` is accepted and ignored."""
        del buf
        if source == PROC_NULL:
            return Request._completed(PROC_NULL_DONE)
        return Request._wrap(self._native.irecv_obj(source, tag), _Kind.RECV_OBJ)

    def sendrecv(
        self,
        sendobj: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
        status: Status | None = None,
    ) -> Any:
        """Send ``sendobj`` to ``dest`` and return the object received from ``source``."""
        del recvbuf
        if source == PROC_NULL:
            self.send(sendobj, dest, sendtag)
            _fill_proc_null(status)
            return None
        if dest == PROC_NULL:
            return self.recv(None, source, recvtag, status)
        if status is None:
            return self._native.sendrecv_obj(
                sendobj, dest, source=source, sendtag=sendtag, recvtag=recvtag
            )
        receiving = self._native.irecv_obj(source, recvtag)
        sending = self._native.isend_obj(sendobj, dest, sendtag)
        obj = ringworld.wait_all([receiving, sending])[0]
        if receiving.status is not None:
            _fill(status, receiving.status)
        return obj

    def probe(
        self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None
    ) -> Literal[True]:
        """Block until a matching message is pending; fill ``status`` with its envelope."""
        if source == PROC_NULL:
            _fill_proc_null(status)
        else:
            _fill(status, self._native.probe(source, tag))
        return True

    def iprobe(
        self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None
    ) -> bool:
        """Return whether a matching message is pending; if so fill ``status``."""
        if source == PROC_NULL:
            _fill_proc_null(status)
            return True
        found = self._native.iprobe(source, tag)
        if found is None:
            return False
        _fill(status, found)
        return True

    # -- buffers (uppercase) ----------------------------------------------------------------

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send a buffer spec (blocking, standard mode)."""
        # (the common call inline: a contiguous array of plain dtype)
        if (type(buf) is np.ndarray and buf.dtype in PLAIN_DTYPES and buf.flags.c_contiguous
                and dest != PROC_NULL):
            self._native.send(buf, dest, tag)  # its bytes, as validating would give them
            return
        arr = plain_array(buf, False)
        if arr is not None and dest != PROC_NULL:  # sends the same bytes, unvalidated
            self._native.send(arr, dest, tag)
            return
        if dest == PROC_NULL and buf is None:
            return
        message = send_message(buf, "Send(buf)")
        if dest != PROC_NULL:
            self._native.send(message.view, dest, tag)

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send a buffer spec in synchronous mode: returns once the receive matched it."""
        if dest == PROC_NULL and buf is None:
            return
        message = send_message(buf, "Ssend(buf)")
        if dest != PROC_NULL:
            self._native.ssend(message.view, dest, tag)

    Bsend = Send  # every send is buffered at the receiver: no attached buffer needed
    Rsend = Send

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Start sending a buffer spec; keep the buffer unchanged until the request completes."""
        # (the common call inline, as Send's: 3 calls fewer; and straight to the transport,
        # as the native isend goes, so a small message sent at once makes one request, not
        # a native one and its wrapper)
        arr: Any
        if type(buf) is np.ndarray and buf.dtype in PLAIN_DTYPES and buf.flags.c_contiguous:
            arr = buf
        else:
            arr = plain_array(buf, False)  # ([array, datatype]: the same bytes)
        if arr is None or dest == PROC_NULL or hooks.observing:  # (a tool: the native call)
            return self._start_send(buf, dest, tag, "Isend", self._native.isend)
        view = send_view(arr)
        req = _new_object(Request)  # (_completed or _wrap inline)
        req._native = self._native._post_send(dest, tag, 0, (view,), len(view), view)
        req._kind = _Kind.SEND
        req._done = EMPTY_DONE if req._native is None else None
        return req

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send of a buffer spec: done once the receive matched it."""
        return self._start_send(buf, dest, tag, "Issend", self._native.issend)

    def _start_send(self, buf: Any, dest: int, tag: int, name: str,
                    start: Callable[[Any, int, int], Any]) -> Request:
        arr = plain_array(buf, False)
        if arr is not None and dest != PROC_NULL:  # the same bytes as validating gives
            return Request._wrap(start(arr, dest, tag), _Kind.SEND)
        if dest == PROC_NULL and buf is None:
            return Request._completed(EMPTY_DONE)
        message = send_message(buf, f"{name}(buf)")
        if dest == PROC_NULL:
            return Request._completed(EMPTY_DONE)
        return Request._wrap(start(message.view, dest, tag), _Kind.SEND)

    Ibsend = Isend
    Irsend = Isend

    def Recv(
        self,
        buf: Any,
        source: int = ANY_SOURCE,
        tag: int = ANY_TAG,
        status: Status | None = None,
    ) -> None:
        """Receive into a buffer spec; a longer message raises ``TruncationError``."""
        if type(buf) is np.ndarray and buf.dtype in PLAIN_DTYPES:  # (inline, as Send's)
            flags = buf.flags
            arr = buf if flags.c_contiguous and flags.writeable else None
        else:
            arr = plain_array(buf, True)
        if arr is not None and source != PROC_NULL:  # receives into the same bytes
            got = self._native.recv(arr, source, tag)  # (a null communicator's raises)
            if status is not None:
                status._set(got.source, got.tag, got.nbytes, got.cancelled)
            return
        if source == PROC_NULL and buf is None:
            _fill_proc_null(status)
            return
        message = recv_message(buf, "Recv(buf)")
        if source == PROC_NULL:
            _fill_proc_null(status)
            return
        _fill(status, self._native.recv(message.view, source, tag))

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving into a buffer spec."""
        # (the common call inline, as Recv's: 3 calls fewer)
        if type(buf) is np.ndarray and buf.dtype in PLAIN_DTYPES:
            flags = buf.flags
            arr = buf if flags.c_contiguous and flags.writeable else None
        else:
            arr = plain_array(buf, True)  # ([array, datatype]: into the same bytes)
        if arr is not None and source != PROC_NULL:
            req = _new_object(Request)  # (_wrap inline: 50 ns less)
            req._native = self._native.irecv(arr, source, tag)
            req._kind = _Kind.RECV_BUF
            req._done = None
            return req
        if source == PROC_NULL and buf is None:
            return Request._completed(PROC_NULL_DONE)
        message = recv_message(buf, "Irecv(buf)")
        if source == PROC_NULL:
            return Request._completed(PROC_NULL_DONE)
        return Request._wrap(self._native.irecv(message.view, source, tag), _Kind.RECV_BUF)

    def Sendrecv(
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
        status: Status | None = None,
    ) -> None:
        """Send ``sendbuf`` to ``dest`` and receive into ``recvbuf`` from ``source``."""
        out, into = plain_array(sendbuf, False), plain_array(recvbuf, True)
        if out is not None and into is not None and dest != PROC_NULL and source != PROC_NULL:
            _fill(status, self._native.sendrecv(out, dest, into, source, sendtag, recvtag))
            return  # (plain arrays, as Send's and Recv's: the bytes validating would give)
        outgoing = None
        if not (dest == PROC_NULL and sendbuf is None):
            outgoing = send_message(sendbuf, "Sendrecv(sendbuf)")
        incoming = None
        if not (source == PROC_NULL and recvbuf is None):
            incoming = recv_message(recvbuf, "Sendrecv(recvbuf)")
        if incoming is None or source == PROC_NULL:
            if outgoing is not None and dest != PROC_NULL:
                self._native.send(outgoing.view, dest, sendtag)
            _fill_proc_null(status)
        elif outgoing is None or dest == PROC_NULL:
            _fill(status, self._native.recv(incoming.view, source, recvtag))
        else:
            native = self._native.sendrecv(
                outgoing.view, dest, incoming.view, source=source, sendtag=sendtag, recvtag=recvtag
            )
            _fill(status, native)

    def Sendrecv_replace(
        self,
        buf: Any,
        dest: int,
        sendtag: int = 0,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
        status: Status | None = None,
    ) -> None:
        """Send the contents of ``buf`` to ``dest``, then receive into ``buf`` from ``source``.

        Cost: one copy of the buffer (the data sent).
        """
        message = recv_message(buf, "Sendrecv_replace(buf)")
        self.Sendrecv(message.bytes().copy(), dest, sendtag, message.view, source, recvtag,
                      status)

    def Isendrecv(
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
    ) -> Request:
        """Start ``Sendrecv``: the request completes when both halves have, with the status of
        the receive."""
        outgoing = incoming = None
        if sendbuf is not None:
            outgoing = send_message(sendbuf, "Isendrecv(sendbuf)").view
        if recvbuf is not None:
            incoming = recv_message(recvbuf, "Isendrecv(recvbuf)").view
        keep = None
        if outgoing is not None and incoming is not None and may_overlap(outgoing, incoming):
            keep = bytes(outgoing)  # (the receive may land first: send what was there)
            outgoing = memoryview(keep)
        return self._isendrecv(outgoing, dest, sendtag, incoming, source, recvtag, keep)

    def Isendrecv_replace(
        self,
        buf: Any,
        dest: int,
        sendtag: int = 0,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
    ) -> Request:
        """Start ``Sendrecv_replace``; the data sent is copied now. Cost: one buffer copy."""
        view = recv_message(buf, "Isendrecv_replace(buf)").view
        copy = bytes(view)
        return self._isendrecv(memoryview(copy), dest, sendtag, view, source, recvtag, copy)

    def _isendrecv(self, outgoing: memoryview | None, dest: int, sendtag: int,
                   incoming: memoryview | None, source: int, recvtag: int,
                   keep: object) -> Request:
        native = self._native
        sends = outgoing is not None and dest != PROC_NULL
        if incoming is None or source == PROC_NULL:
            if outgoing is not None and sends:
                native.send(outgoing, dest, sendtag)  # buffered: completes without the peer
            return Request._completed(PROC_NULL_DONE)
        receiving = native.irecv(incoming, source, recvtag)
        if outgoing is None or not sends:
            return Request._wrap(receiving, _Kind.RECV_BUF)
        both = SendRecvRequest(native.isend(outgoing, dest, sendtag), receiving, keep)
        return Request._wrap(both, _Kind.RECV_BUF)

    # -- persistent requests ------------------------------------------------------------------

    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each ``Start()`` sends the buffer's contents at that moment."""
        if not (dest == PROC_NULL and buf is None):
            send_message(buf, "Send_init(buf)")
        return Prequest._persistent(lambda: self.Isend(buf, dest, tag))

    def Ssend_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """A persistent synchronous send (see :meth:`Send_init` and :meth:`Issend`)."""
        if not (dest == PROC_NULL and buf is None):
            send_message(buf, "Ssend_init(buf)")
        return Prequest._persistent(lambda: self.Issend(buf, dest, tag))

    Bsend_init = Send_init
    Rsend_init = Send_init

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """A persistent receive into ``buf``: each ``Start()`` posts the receive again."""
        if not (source == PROC_NULL and buf is None):
            recv_message(buf, "Recv_init(buf)")
        return Prequest._persistent(lambda: self.Irecv(buf, source, tag))

    def Probe(
        self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None
    ) -> Literal[True]:
        """Block until a matching message is pending; fill ``status`` with its envelope."""
        return self.probe(source, tag, status)

    def Iprobe(
        self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None
    ) -> bool:
        """Return whether a matching message is pending; if so fill ``status``."""
        return self.iprobe(source, tag, status)


class Intracomm(Comm, IntraCollectives):
    """An intracommunicator; collective operations are methods of this class."""

    __slots__ = ()

    def Create_group(self, group: Group, tag: int = 0) -> Intracomm:
        """The communicator of ``group``; collective over the group's processes only.

        The processes agree on a context with point-to-point messages tagged ``tag`` on this
        communicator. A process outside the group gets a null communicator at once.
        """
        native = self._native
        ranks = self._ranks_of(group, "Create_group")
        if native.rank not in ranks:
            return type(self)()
        engine = native._engine  # the context agreement needs the engine and _derive
        leader = ranks[0]
        if native.rank == leader:
            ctx = max([engine.next_context,
                       *(native.recv_obj(source, tag) for source in ranks[1:])])
            for dest in ranks[1:]:
                native.send_obj(ctx, dest, tag)
        else:
            native.send_obj(engine.next_context, leader, tag)
            ctx = native.recv_obj(leader, tag)
        engine.reserve_contexts(ctx)
        world = native.world_ranks
        sub = native._derive([world[r] for r in ranks], ctx, f"{native.name}.group")
        return self._wrap(sub)


COMM_NULL = Comm()
COMM_WORLD = Intracomm._create(_world, "MPI_COMM_WORLD", predefined=True)
COMM_SELF = Intracomm._create(_SelfResolver(), "MPI_COMM_SELF", predefined=True)
