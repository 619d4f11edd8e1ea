"""The transport contract: move framed messages between this rank and its peers.

A transport knows nothing about matching, requests or collectives. It carries *messages*: an
envelope ``(context, tag, flags)`` chosen by the communicator layer plus a payload of ``nbytes``
bytes, in FIFO order per (sender, receiver) pair. The communicator drives it:

* :meth:`Transport.isend` queues a message given as a list of byte segments (gathered, not joined);
  the returned :class:`SendHandle` becomes ``done`` once the segments may be reused.
* :meth:`Transport.poll` moves bytes without blocking and hands each arriving message to a
  ``deliver`` callback as an :class:`Incoming`. Inside the callback the communicator either calls
  :meth:`Incoming.read_into` (a receive matched: bytes land straight in the user's buffer) or
  :meth:`Incoming.detach` (no receive yet: the message is kept, buffered or as a handshake only).
* :meth:`Transport.wait_event` blocks until something may have happened (a doorbell, a readable
  socket, a peer exiting) or the timeout passes; spurious returns are allowed.

Failures: ``poll`` raises :class:`~ringworld.errors.PeerFailure` naming the rank when a peer process
dies or its connection breaks; :meth:`Transport.check_peers` does the same check on demand.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from ringworld.errors import TransportError

OnDone = Callable[[], None]
Deliver = Callable[["Incoming"], None]


class SendHandle:
    """Completion flag of one queued send; ``done`` turns true when the buffer may be reused."""

    __slots__ = ("done",)

    def __init__(self, done: bool = False) -> None:
        self.done = done


#: A shared, already-completed handle, returned by sends that finished synchronously.
DONE = SendHandle(True)


class Incoming(ABC):
    """A message that has arrived (at least its envelope); the payload may still be in flight."""

    __slots__ = ("context", "flags", "nbytes", "source", "tag")

    #: True for an announcement that stays valid after the deliver callback returns and holds
    #: nothing up but its own sender (a rendezvous): the engine may queue it as it is, so that
    #: a receive posted soon after takes the payload straight into the caller's buffer, and
    #: detaches it only if no receive comes within a millisecond.
    lazy = False

    def __init__(self, source: int, context: int, tag: int, flags: int, nbytes: int) -> None:
        self.source = source
        self.context = context
        self.tag = tag
        self.flags = flags
        self.nbytes = nbytes

    @abstractmethod
    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        """Deliver the payload into ``dest`` (writable bytes view, ``len(dest) >= nbytes``).

        ``on_done`` is called exactly once when all ``nbytes`` are in ``dest``, possibly before this
        returns. Bytes of ``dest`` beyond ``nbytes`` are never written.
        """

    @abstractmethod
    def detach(self) -> Incoming:
        """Keep this message for a later :meth:`read_into` after the deliver callback returns.

        Cost: the payload is received into an owned buffer (one extra copy on ``read_into``), so
        unmatched messages never hold up their sender or later messages.
        """


class BufferedIncoming(Incoming):
    """A detached message whose payload is (being) copied into an owned buffer."""

    __slots__ = ("_complete", "_pending", "data")

    def __init__(self, source: int, context: int, tag: int, flags: int, nbytes: int) -> None:
        super().__init__(source, context, tag, flags, nbytes)
        self.data = bytearray(nbytes)
        self._complete = False
        self._pending: tuple[memoryview, OnDone] | None = None

    def mark_complete(self) -> None:
        """Called by the transport once ``data`` holds the whole payload."""
        self._complete = True
        if self._pending is not None:
            dest, on_done = self._pending
            self._pending = None
            self._finish(dest, on_done)

    def _finish(self, dest: memoryview, on_done: OnDone) -> None:
        if self.nbytes:
            dest[: self.nbytes] = self.data
        self.data = bytearray()
        on_done()

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        if self._complete:
            self._finish(dest, on_done)
        else:
            self._pending = (dest, on_done)

    def detach(self) -> Incoming:
        return self


def _never() -> bool:
    return False


class Transport(ABC):
    """Moves messages between this rank and a set of peers (world ranks)."""

    #: short stable name used in logs and the CLI ("shm", "tcp").
    name: str = ""

    def __init__(self, rank: int, peers: Sequence[int]) -> None:
        self.rank = rank
        self.peers = tuple(peers)
        #: whether :meth:`take_eager` may sleep in the kernel until its message arrives (where
        #: the transport can: TCP's) rather than poll: set by the engine (the waiting policy)
        self.sleepy: Callable[[], bool] = _never

    @abstractmethod
    def isend(
        self, dest: int, context: int, tag: int, flags: int, segments: Sequence[memoryview],
        nbytes: int,
    ) -> SendHandle:
        """Queue a message to ``dest``; ``segments`` are byte views totalling ``nbytes``.

        Returns :data:`DONE` when the message was copied out synchronously. The segments must stay
        unchanged until the handle is done.

        Raises:
            PeerFailure: ``dest`` is known to have failed.
        """

    def send_eager(self, dest: int, context: int, tag: int, flags: int,
                   segments: Sequence[memoryview], nbytes: int) -> bool:
        """Write a small message to ``dest`` at once, if it can go without waiting or queueing.

        The fast path of a blocking send: returns True when the message is written (the send
        is complete), False when the caller must use :meth:`isend` (too large, sends queued
        before it, no room, peer gone, or not supported). Never raises; never writes part of
        a message.
        """
        return False

    #: whether :meth:`take_eager` is implemented (a fast path for blocking receives).
    supports_take_eager: bool = False

    def take_eager(self, source: int, context: int, tag: int, dest: memoryview | None,
                   polls: int = 1, exact: bool = False
                   ) -> tuple[int, int, int, bytes | None] | int | None:
        """Take the next message from ``source`` directly, if it is small and complete.

        A fast path for a blocking receive when nothing else could match first: it checks up
        to ``polls`` times whether the next message from ``source`` has arrived. Returns
        ``(tag, flags, nbytes, payload)`` after consuming the message: its bytes are copied into
        ``dest``, or returned as ``payload`` when ``dest`` is None. Returns 0 when nothing from
        ``source`` has arrived yet, and None when the next message is not one it can take (other
        context or tag, larger than ``dest``, a rendezvous it cannot complete at once) or the
        transport has sends to push: the caller then uses the general :meth:`poll` path. Never
        consumes a message it does not return. ``exact``: take only a message of exactly
        ``len(dest)`` bytes (a collective's block; any other length is the general path's to
        report).
        """
        return None

    #: whether :meth:`window_create` and friends work (every peer maps the same memory).
    supports_shared_windows: bool = False

    def window_create(self, key: str, nbytes: int) -> memoryview:
        """Create this rank's shared window ``key`` of ``nbytes`` (zeroed) and map it.

        Only where :attr:`supports_shared_windows`; the caller then synchronises, has every
        peer :meth:`window_attach`, synchronises again and calls :meth:`window_unlink`.

        Raises:
            TransportError: no shared memory here, or not enough of it.
        """
        raise TransportError(f"{type(self).__name__} has no shared windows")

    def window_attach(self, rank: int, key: str, nbytes: int) -> memoryview:
        """Map peer ``rank``'s window ``key`` (created with :meth:`window_create`).

        Raises:
            TransportError: it does not exist or has another size.
        """
        raise TransportError(f"{type(self).__name__} has no shared windows")

    #: whether :meth:`read_peer` may work (single-copy reads from a peer's memory).
    supports_peer_reads: bool = False

    def read_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``remote_addr`` in peer ``rank``'s memory to ``local_addr``.

        Raises:
            TransportError: not supported here, not permitted, or the peer is gone.
        """
        raise TransportError(f"{type(self).__name__} cannot read peer memory")

    def peer_copier(self, rank: int, write: bool) -> Callable[[int, int, int], None]:
        """:meth:`write_peer` (``write``) or :meth:`read_peer` with peer ``rank``, as a
        function of (remote_addr, local_addr, nbytes): what it looks up once per call is
        looked up here, once (a transport may override it with a shorter path)."""
        copy = self.write_peer if write else self.read_peer

        def copier(remote_addr: int, local_addr: int, nbytes: int) -> None:
            copy(rank, remote_addr, local_addr, nbytes)

        return copier

    def write_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``local_addr`` here to ``remote_addr`` in peer ``rank``'s memory
        (possible where :meth:`read_peer` is).

        Raises:
            TransportError: not supported here, not permitted, or the peer is gone.
        """
        raise TransportError(f"{type(self).__name__} cannot write peer memory")

    def window_close(self, key: str) -> None:
        """Unmap every mapping of window ``key`` (once nothing views them any more)."""
        return

    def window_unlink(self, key: str) -> None:
        """Remove the name of this rank's window ``key`` (mappings stay valid until close)."""
        return

    @abstractmethod
    def poll(self, deliver: Deliver) -> bool:
        """Make progress without blocking; return whether anything happened.

        Raises:
            PeerFailure: a peer died or its connection broke.
        """

    @abstractmethod
    def wait_event(self, timeout: float, waiting: Callable[[], bool] | None = None) -> None:
        """Block for at most ``timeout`` seconds until progress may be possible.

        ``waiting``, if given, is asked once more after this rank is marked asleep (so a peer
        that changes what it tests calls :meth:`wake_all` and ends the sleep): False returns at
        once.
        """

    #: whether :meth:`shares_cpu` can tell (peers on this host whose processes it can see)
    knows_cpus = False
    #: whether :meth:`wait_event` sleeps in the kernel until a peer's data arrives (a socket's
    #: wait), so that a waiter that sleeps at once loses only the wake-up, not the message
    wakes_on_arrival = False

    def runnable_peers(self) -> int | None:
        """How many peers on this host run or wait to run now; None where the transport
        cannot tell (the default)."""
        return None

    def shares_cpu(self, ranks: Iterable[int]) -> bool:
        """Whether any of ``ranks`` (peers this transport reaches) last ran, or waits to run,
        on the calling thread's CPU: then a wait for them should give the CPU up, else keep
        it (see :mod:`ringworld.transport.cpus`). True when that cannot be told, as here."""
        return True

    def wake_all(self, ranks: Sequence[int]) -> None:
        """Wake each peer of ``ranks`` that sleeps in :meth:`wait_event` (cheap for those that
        do not; one call, as a shared-memory sync wakes every peer)."""
        return

    def waker(self, ranks: Sequence[int]) -> Callable[[], None]:
        """``wake_all(ranks)`` as a function of no arguments, made once for a fixed set of
        ranks, for the per-call paths (a transport may make it cheaper than the call)."""
        return partial(self.wake_all, tuple(ranks))

    @abstractmethod
    def check_peers(self) -> None:
        """Raise :class:`~ringworld.errors.PeerFailure` if any peer is known to be gone."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource (sockets, mappings, descriptors); idempotent."""
