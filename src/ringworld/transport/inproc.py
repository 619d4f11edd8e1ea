"""An in-process transport: every rank of a world is a thread of one process.

A :class:`Hub` is the medium of one world: a message queue and a wake-up condition per rank, and
the shared windows by name. Each rank's :class:`InprocTransport` is an endpoint on it. Sends
copy the payload once into the destination's queue (FIFO per sender and receiver, as the
contract asks) and complete at once; windows are ordinary process memory that every endpoint
maps, and peer reads are plain memory copies, so the shared-memory algorithms run unchanged.

It exists for tests (:func:`ringworld.testing.run_threads`): communicator and collective
semantics without forking, at the price of the GIL (ranks take turns; no timing means
anything here).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ringworld.errors import PeerFailure, TransportError
from ringworld.transport.base import DONE, Deliver, Incoming, OnDone, SendHandle, Transport

_ALIGN = 64  # windows start on a cache line, as mapped pages do
EAGER_BYTES = 1 << 16  # send_eager's limit: larger messages take isend, as on the other wires


class _Message(Incoming):
    """A queued message; its whole payload is here from the start."""

    __slots__ = ("data",)

    def __init__(self, source: int, context: int, tag: int, flags: int, data: bytes) -> None:
        super().__init__(source, context, tag, flags, len(data))
        self.data = data

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        if self.nbytes:
            dest[: self.nbytes] = self.data
        self.data = b""
        on_done()

    def detach(self) -> Incoming:
        return self


class Hub:
    """The shared medium of one in-process world of ``size`` ranks."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size={size} must be at least 1")
        self.size = size
        self.queues: list[deque[_Message]] = [deque() for _ in range(size)]
        self.wakes = [threading.Condition(threading.Lock()) for _ in range(size)]
        self.gone: dict[int, str] = {}  # rank -> why its endpoint is closed
        self.windows: dict[tuple[int, str], np.ndarray] = {}  # (creator, key) -> its memory
        self.lock = threading.Lock()

    def endpoints(self) -> list[InprocTransport]:
        """One transport per rank, in rank order."""
        return [InprocTransport(self, r) for r in range(self.size)]

    def fail(self, rank: int, why: str) -> None:
        """Mark ``rank`` gone (its thread ended or raised): peers waiting for it then get a
        PeerFailure naming it, after the messages it sent before."""
        self.gone.setdefault(rank, why)
        for r in range(self.size):
            self.wake(r)

    def wake(self, rank: int) -> None:
        cond = self.wakes[rank]
        with cond:
            cond.notify_all()


class InprocTransport(Transport):
    """Rank ``rank``'s endpoint on a :class:`Hub` (every other rank is a peer)."""

    name = "inproc"
    supports_shared_windows = True
    supports_peer_reads = True

    def __init__(self, hub: Hub, rank: int) -> None:
        super().__init__(rank, [r for r in range(hub.size) if r != rank])
        self.hub = hub
        self._inbox = hub.queues[rank]
        self._closed = False
        self._reported: set[int] = set()  # peers whose failure poll has raised already

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"rank {self.rank}: the in-process transport is closed")

    def isend(self, dest: int, context: int, tag: int, flags: int,
              segments: Sequence[memoryview], nbytes: int) -> SendHandle:
        """Copy the message into ``dest``'s queue; complete at once. Cost: one copy.

        Raises:
            TransportError: this endpoint is closed.  PeerFailure: ``dest`` is gone.
        """
        self._check_open()
        why = self.hub.gone.get(dest)
        if why is not None:
            raise PeerFailure(dest, why)
        data = b"".join(segments) if len(segments) != 1 else bytes(segments[0])
        self.hub.queues[dest].append(_Message(self.rank, context, tag, flags, data))
        self.hub.wake(dest)
        return DONE

    def send_eager(self, dest: int, context: int, tag: int, flags: int,
                   segments: Sequence[memoryview], nbytes: int) -> bool:
        if nbytes > EAGER_BYTES or self._closed or dest in self.hub.gone:
            return False
        self.isend(dest, context, tag, flags, segments, nbytes)
        return True

    def poll(self, deliver: Deliver) -> bool:
        """Hand every queued message to ``deliver`` in arrival order.

        Raises:
            TransportError: closed.  PeerFailure: a peer is gone (once per peer, after every
                message it sent has been delivered).
        """
        self._check_open()
        inbox = self._inbox
        did = False
        while inbox:
            deliver(inbox.popleft())
            did = True
        if self.hub.gone:
            self._raise_gone()
        return did

    def _raise_gone(self) -> None:
        for rank, why in tuple(self.hub.gone.items()):
            if rank != self.rank and rank not in self._reported:
                self._reported.add(rank)
                raise PeerFailure(rank, why)

    def check_peers(self) -> None:
        self._check_open()
        for rank, why in tuple(self.hub.gone.items()):
            if rank != self.rank:
                raise PeerFailure(rank, why)

    def wait_event(self, timeout: float, waiting: Callable[[], bool] | None = None) -> None:
        """Sleep until a message for this rank arrives, a peer wakes it, or ``timeout``."""
        cond = self.hub.wakes[self.rank]
        with cond:
            if self._inbox or (waiting is not None and not waiting()):
                return
            cond.wait(timeout)

    def wake_all(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            self.hub.wake(r)

    # ------------------------------------------------------------ windows and peer memory
    def window_create(self, key: str, nbytes: int) -> memoryview:
        """A zeroed window of ``nbytes`` that peers attach by ``key``."""
        self._check_open()
        raw = np.zeros(nbytes + _ALIGN, dtype=np.uint8)
        skip = -raw.ctypes.data % _ALIGN
        mem = raw[skip: skip + nbytes]
        with self.hub.lock:
            if (self.rank, key) in self.hub.windows:
                raise TransportError(f"rank {self.rank}: window {key!r} exists already")
            self.hub.windows[(self.rank, key)] = mem
        return mem.data.cast("B")

    def window_attach(self, rank: int, key: str, nbytes: int) -> memoryview:
        self._check_open()
        with self.hub.lock:
            mem = self.hub.windows.get((rank, key))
        if mem is None:
            raise TransportError(f"rank {rank} has no window {key!r}")
        if mem.nbytes != nbytes:
            raise TransportError(f"rank {rank}'s window {key!r} has {mem.nbytes} bytes, "
                                 f"not {nbytes}")
        return mem.data.cast("B")

    def window_unlink(self, key: str) -> None:
        with self.hub.lock:
            self.hub.windows.pop((self.rank, key), None)

    def read_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        self._peer_copy(rank, local_addr, remote_addr, nbytes)

    def write_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        self._peer_copy(rank, remote_addr, local_addr, nbytes)

    def _peer_copy(self, rank: int, dest: int, src: int, nbytes: int) -> None:
        self._check_open()
        why = self.hub.gone.get(rank)
        if why is not None:
            raise PeerFailure(rank, why)
        if nbytes:
            ctypes.memmove(dest, src, nbytes)

    def close(self) -> None:
        """Leave the world: peers that wait for this rank get a PeerFailure; idempotent."""
        if not self._closed:
            self._closed = True
            self.hub.fail(self.rank, "its in-process endpoint closed")
