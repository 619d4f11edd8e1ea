"""Shared-memory transport: lock-free single-producer rings between the ranks of one host.

Every rank owns one segment, its *inbox*: a control page, then one ring per sender::

    /dev/shm/ringworld-<job>-<rank>
    +-----------+---------------------+--------------------+-----+
    | ctl page  | ring from rank 0    | ring from rank 1   | ... |
    | pid, bell | (ring_bytes, paged) |                    |     |
    | head/tail |                     |                    |     |
    +-----------+---------------------+--------------------+-----+

A ring is a byte FIFO written only by its sender (``head``) and read only by the owner (``tail``);
both are monotonically increasing 64-bit counters on their own cache lines. Frames are 64-byte
aligned: a 48-byte header, padding, payload. Kinds of frame:

* ``EAGER``: a whole message (small: at most ``eager_bytes``), copied in and out once each.
* ``RTS`` -> ``FIN``: large messages from one contiguous buffer announce its address; once a
  receive matches, the receiver copies the bytes straight out of the sender's memory
  (``process_vm_readv``: one copy, made by the receiver alone) and answers ``FIN``, which
  completes the send. Where the kernel refuses (ptrace rules), or for messages of several
  segments, or with ``single_copy`` off, the receiver answers ``CTS`` instead:
* ``RTS`` -> ``CTS`` -> ``DATA``*: the receiver answers a request-to-send only when a receive
  matches, telling the sender where the bytes will land; the sender then streams chunks that the
  receiver copies straight into the user's buffer. Sender and receiver copy in parallel
  (pipelined), chunk size a fraction of the ring. Each chunk is placed at a ring offset whose
  distance to both the source and the destination address avoids the 4 KiB-aliasing window that
  makes ``memcpy`` up to 10x slower.
* ``WRAP``: the rest of the ring is unused; continue at offset 0.

Segments are unlinked as soon as every rank has attached (after a store barrier), so a killed job
leaves nothing behind in /dev/shm. Waiting: the engine spins, yields, then calls
:meth:`ShmTransport.wait_event`, which raises a *sleeping* flag in the inbox and blocks on a
datagram "doorbell" socket (abstract namespace) plus a pidfd per peer; senders ring the bell only
when the flag is up. Peers that exit are seen through their pidfds within milliseconds.

Assumes a total-store-order machine (x86-64) for the head/tail protocol; aarch64 would need fences.
The ring layout, frame format and per-peer ring state live in :mod:`.shm_ring`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import select
import socket
import sys
from collections.abc import Callable, Iterable, Sequence

from ringworld.errors import BootstrapError, PeerFailure, RingworldError, TransportError
from ringworld.store.base import Store, store_barrier
from ringworld.transport.base import DONE, Deliver, OnDone, SendHandle, Transport
from ringworld.transport.cpus import CpuWatch
from ringworld.transport.shm_ring import (
    _EMPTY,
    _W_MAGIC,
    _W_PID,
    _W_SLEEP,
    CTL_MAGIC,
    CTS,
    DATA,
    DEFAULT_EAGER,
    EAGER,
    EAGER_OFF,
    EXTRA,
    FIN,
    FRAME,
    HDR,
    INBOX_BUDGET,
    MAX_RING,
    MIN_RING,
    PAGE,
    RTS,
    WRAP,
    _addr,
    _EagerIncoming,
    _OutFrame,
    _OutStream,
    _Peer,
    _RendezvousIncoming,
    _RxStream,
    _tail_word,
    ctl_bytes,
    default_ring_bytes,
    drain,
    flag_waker,
)

__all__ = [
    "CTL_MAGIC", "CTS", "DATA", "DEFAULT_EAGER", "EAGER", "EAGER_OFF", "EXTRA", "FIN", "FRAME",
    "HDR", "INBOX_BUDGET", "MAX_RING", "MIN_RING", "PAGE", "RTS", "WRAP", "ShmTransport",
    "ctl_bytes", "default_ring_bytes",
]


class ShmTransport(Transport):
    """Moves messages through shared-memory rings between ranks of one host."""

    name = "shm"

    def __init__(self, rank: int, size: int, peers: Sequence[int], inbox_path: str,
                 ring_bytes: int, eager_bytes: int, single_copy: bool = True) -> None:
        super().__init__(rank, peers)
        if ring_bytes % PAGE or ring_bytes < MIN_RING:
            raise ValueError(f"ring_bytes={ring_bytes} must be a multiple of {PAGE} and at least "
                             f"{MIN_RING}")
        self.size = size
        self.ring_bytes = ring_bytes
        self.eager_bytes = min(eager_bytes, ring_bytes // 4 - 2 * HDR)
        self.chunk = max(PAGE, min(256 * 1024, ring_bytes // 8))
        self.inbox_path = inbox_path
        self._ctl_bytes = ctl_bytes(size)
        self._closed = False
        self._next_msg = 1
        self._pending_rts: dict[int, tuple[_Peer, Sequence[memoryview], int, SendHandle]] = {}
        self._peers: list[_Peer | None] = [None] * size
        self._active: list[_Peer] = []
        self._mms: list[mmap.mmap] = []
        self._windows: dict[str, list[mmap.mmap]] = {}
        self._bell: socket.socket | None = None
        self._bell_names: dict[int, bytes] = {}
        self._my_ctl: memoryview | None = None
        self._my_mm: mmap.mmap | None = None
        self._fd_to_peer: dict[int, _Peer] = {}
        self._cpus = CpuWatch()  # where peers run, for waits (see shares_cpu)
        self._eager = _EagerIncoming(0, 0, 0, 0, _EMPTY)
        # large messages read straight from the sender's memory (until the kernel refuses once)
        self.single_copy = single_copy and sys.platform == "linux"
        self.single_copy_reads = 0  # messages received that way (for tests and diagnosis)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, rank: int, size: int, store: Store, job_id: str,
               ring_bytes: int | None = None, eager_bytes: int = DEFAULT_EAGER,
               timeout: float | None = 60.0, shm_dir: str = "/dev/shm",
               peers: Sequence[int] | None = None, single_copy: bool = True) -> ShmTransport:
        """Create this rank's inbox, attach to every peer's, and unlink the segments.

        ``peers`` (default: every other rank) are the ranks this transport reaches, those on
        this host when others are reached by TCP. ``single_copy``: large messages are read
        straight from the sender's memory where the kernel allows it (else streamed through the
        rings). Collective over this rank and its ``peers``
        (each must call it with the same arguments and the same group).
        Cost: one segment of ``ctl + size * ring_bytes`` bytes (sparse) and a few store round
        trips.

        Raises:
            BootstrapError: shared memory is unavailable or too small, or a peer is on another
                host or did not appear within ``timeout``.
        """
        rb = ring_bytes if ring_bytes is not None else default_ring_bytes(size)
        path = os.path.join(shm_dir, f"ringworld-{job_id}-{rank}")
        group = sorted({rank, *(range(size) if peers is None else peers)})
        t = cls(rank, size, [r for r in group if r != rank], path, rb, eager_bytes, single_copy)
        try:
            t._create_inbox()
            store.set(f"shm/{rank}", f"{os.getpid()} {_boot_id()}".encode())
            for r in t.peers:
                pid_s, boot = store.get(f"shm/{r}", timeout).decode().split()
                if boot != _boot_id():
                    raise BootstrapError(f"rank {r} runs on another host; shared memory cannot "
                                         "reach it (use --transport tcp)")
                t._attach(r, int(pid_s), os.path.join(shm_dir, f"ringworld-{job_id}-{r}"))
            store_barrier(store, f"shm/attached/{group[0]}", len(group), timeout)
        except BaseException:
            t.close()
            raise
        finally:
            t._unlink()
        return t

    def _create_inbox(self) -> None:
        total = self._ctl_bytes + self.size * self.ring_bytes
        shm_dir = os.path.dirname(self.inbox_path)
        try:
            st = os.statvfs(shm_dir)
        except OSError as exc:
            raise BootstrapError(f"shared memory directory {shm_dir} is unavailable") from exc
        expected = self._ctl_bytes + (self.size - 1) * self.ring_bytes
        if st.f_bavail * st.f_frsize < expected:
            raise BootstrapError(
                f"{shm_dir} has {st.f_bavail * st.f_frsize} bytes free but the shared-memory "
                f"transport needs up to {expected} per rank; enlarge it, lower "
                "RINGWORLD_SHM_RING_BYTES, or use --transport tcp")
        try:
            fd = os.open(self.inbox_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as exc:
            raise BootstrapError(f"cannot create shared-memory segment {self.inbox_path}") from exc
        try:
            os.ftruncate(fd, total)
            # reserve the pages now: a full /dev/shm must fail here, not SIGBUS on a later write
            os.posix_fallocate(fd, 0, self._ctl_bytes)
            for s in self.peers:
                os.posix_fallocate(fd, self._ctl_bytes + s * self.ring_bytes, self.ring_bytes)
            mm = mmap.mmap(fd, total)
        except OSError as exc:
            os.close(fd)
            self._unlink()
            raise BootstrapError(
                f"cannot reserve {self._ctl_bytes + len(self.peers) * self.ring_bytes} bytes of "
                f"shared memory in {shm_dir} ({exc.strerror}); enlarge it, lower "
                "RINGWORLD_SHM_RING_BYTES, or use --transport tcp") from exc
        else:
            os.close(fd)
        self._my_mm = mm
        self._mms.append(mm)
        ctl = memoryview(mm)[: self._ctl_bytes].cast("Q")
        ctl[_W_PID] = os.getpid()
        for s in range(self.size):
            ctl[_tail_word(s) + 1] = int.from_bytes(os.urandom(8), "little") | 1
        ctl[_W_MAGIC] = CTL_MAGIC
        self._my_ctl = ctl
        bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bell.bind(self._bell_name(self.rank))
        bell.setblocking(False)
        self._bell = bell

    def _bell_name(self, rank: int) -> bytes:
        job = os.path.basename(self.inbox_path).rsplit("-", 1)[0]
        return f"\0{job}-{rank}-bell".encode()

    def _attach(self, r: int, pid: int, path: str) -> None:
        total = self._ctl_bytes + self.size * self.ring_bytes
        mm = self._map_peer_file(path, total, f"rank {r}'s shared-memory segment",
                                 BootstrapError)
        assert self._my_mm is not None
        p = _Peer(r)
        p.pid = pid
        p.mm = mm
        whole = memoryview(mm)
        p.ctl = whole[: self._ctl_bytes].cast("Q")
        if p.ctl[_W_MAGIC] != CTL_MAGIC or p.ctl[_W_PID] != pid:
            raise BootstrapError(f"rank {r}'s segment {path} is not initialised")
        # our ring inside the peer's inbox
        base = self._ctl_bytes + self.rank * self.ring_bytes
        p.data = whole[base : base + self.ring_bytes]
        p.tx_q = p.data.cast("Q")
        p.tx_tail_w = _tail_word(self.rank)
        p.tx_key = p.ctl[p.tx_tail_w + 1]
        p.tx_head = 0
        p.tx_free_to = self.ring_bytes
        # the peer's ring inside our inbox
        mine = memoryview(self._my_mm)
        rbase = self._ctl_bytes + r * self.ring_bytes
        p.rx_data = mine[rbase : rbase + self.ring_bytes]
        p.rx_q = p.rx_data.cast("Q")
        p.rx_tail_w = _tail_word(r)
        assert self._my_ctl is not None
        p.rx_key = self._my_ctl[p.rx_tail_w + 1]
        p.rx_idx = 0
        p.rx_expect = 1 ^ p.rx_key
        try:
            p.pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            p.pidfd = -1
        else:
            self._fd_to_peer[p.pidfd] = p
        self._bell_names[r] = self._bell_name(r)
        self._peers[r] = p
        self._active.append(p)

    def _map_peer_file(self, path: str, nbytes: int, what: str,
                       error: type[RingworldError]) -> mmap.mmap:
        """Map a peer's file of exactly ``nbytes`` (kept until close); ``error`` if not."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise error(f"cannot open {what} {path}") from exc
        try:
            if os.fstat(fd).st_size != nbytes:
                raise error(f"{what} {path} has the wrong size")
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self._mms.append(mm)
        return mm

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.inbox_path)

    # ------------------------------------------------------------------ shared windows
    supports_shared_windows = True

    def _window_path(self, rank: int, key: str) -> str:
        if not key.isalnum():
            raise ValueError(f"window key {key!r} must be alphanumeric")
        return f"{self.inbox_path.rsplit('-', 1)[0]}-{rank}w{key}"

    def window_create(self, key: str, nbytes: int) -> memoryview:
        path = self._window_path(self.rank, key)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as exc:
            raise TransportError(f"cannot create shared window {path}: {exc.strerror}") from exc
        try:
            os.ftruncate(fd, nbytes)
            os.posix_fallocate(fd, 0, nbytes)  # a full /dev/shm fails here, not with SIGBUS
            mm = mmap.mmap(fd, nbytes)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise TransportError(f"cannot reserve a {nbytes}-byte shared window in "
                                 f"{os.path.dirname(path)} ({exc.strerror})") from exc
        finally:
            os.close(fd)
        self._mms.append(mm)
        self._windows.setdefault(key, []).append(mm)
        return memoryview(mm)

    def window_attach(self, rank: int, key: str, nbytes: int) -> memoryview:
        path = self._window_path(rank, key)
        mm = self._map_peer_file(path, nbytes, f"rank {rank}'s shared window", TransportError)
        self._windows.setdefault(key, []).append(mm)
        return memoryview(mm)

    supports_peer_reads = sys.platform == "linux"

    def read_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        self.peer_copier(rank, False)(remote_addr, local_addr, nbytes)

    def write_peer(self, rank: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
        self.peer_copier(rank, True)(remote_addr, local_addr, nbytes)

    def peer_copier(self, rank: int, write: bool) -> Callable[[int, int, int], None]:
        p = self._peers[rank] if 0 <= rank < self.size else None
        if p is None:
            raise TransportError(f"rank {rank} is not a peer of this transport")
        from ringworld.transport import cma

        return cma.copier(p.pid, write, f"rank {rank}'s memory")

    def window_close(self, key: str) -> None:
        mms = self._windows.pop(key, [])
        for mm in mms:
            with contextlib.suppress(ValueError):
                self._mms.remove(mm)
            with contextlib.suppress(BufferError):  # still viewed: unmapped when collected
                mm.close()

    def window_unlink(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            os.unlink(self._window_path(self.rank, key))

    # ------------------------------------------------------------------ sending
    def _peer(self, dest: int) -> _Peer:
        p = self._peers[dest] if 0 <= dest < self.size else None
        if p is not None and not p.dead:
            return p
        if self._closed:
            raise TransportError("the shared-memory transport is closed")
        if p is None:
            raise ValueError(f"dest={dest} is not a peer of this shared-memory transport")
        if p.dead:
            raise PeerFailure(dest, "process exited")
        return p

    def _ring_bell(self, p: _Peer) -> None:
        if p.ctl[_W_SLEEP] and self._bell is not None:
            try:  # noqa: SIM105 - hot path: try/except is cheaper than contextlib.suppress
                self._bell.sendto(b"!", self._bell_names[p.rank])
            except OSError:
                pass  # full or gone: the sleeper wakes on its timeout or pidfd anyway

    def _reserve(self, p: _Peer, frame_len: int, len_at_zero: int) -> int:
        """Reserve contiguous ring space for a frame; return its position, or -1 if full.

        ``frame_len`` is the frame's length at the current head, ``len_at_zero`` its length if it
        has to wrap to offset 0 (they differ only for padded DATA frames).
        """
        rb = self.ring_bytes
        head = p.tx_head
        pos = head % rb
        tail_room = rb - pos
        need = frame_len if frame_len <= tail_room else tail_room + len_at_zero
        if head + need > p.tx_free_to:
            p.tx_free_to = p.ctl[p.tx_tail_w] + rb  # re-read the receiver's progress
            if head + need > p.tx_free_to:
                return -1
        if frame_len <= tail_room:
            return pos
        FRAME.pack_into(p.data, pos + 8, WRAP, 0, 0, 0, tail_room, 0, 0, 0)
        p.tx_q[pos >> 3] = (head + 1) ^ p.tx_key
        p.tx_head = head + tail_room
        return 0

    def _publish(self, p: _Peer, pos: int, frame_len: int) -> None:
        """Make the frame at ring position ``pos`` visible (its sequence word last)."""
        head = p.tx_head
        p.tx_q[pos >> 3] = (head + 1) ^ p.tx_key
        p.tx_head = head + frame_len
        if p.ctl[_W_SLEEP]:
            self._ring_bell(p)

    def _write_frame(self, p: _Peer, ftype: int, flags: int, context: int, tag: int,
                     nbytes: int, msg_id: int, aux: int, segments: Sequence[memoryview]) -> bool:
        frame_len = (EAGER_OFF + nbytes + 63) & ~63 if ftype == EAGER else (HDR + 63) & ~63
        pos = self._reserve(p, frame_len, frame_len)
        if pos < 0:
            return False
        data = p.data
        if ftype == EAGER:
            FRAME.pack_into(data, pos + 8, EAGER, flags, 0, context, frame_len, EAGER_OFF, tag,
                            nbytes)
            at = pos + EAGER_OFF
            for seg in segments:
                n = len(seg)
                data[at : at + n] = seg
                at += n
        else:
            FRAME.pack_into(data, pos + 8, ftype, flags, 0, context, frame_len, HDR, tag, nbytes)
            EXTRA.pack_into(data, pos + EAGER_OFF, msg_id, aux)
        self._publish(p, pos, frame_len)
        return True

    def _write_chunk(self, p: _Peer, msg_id: int, offset: int, chunk: memoryview,
                     want_off: int) -> bool:
        """Write one DATA frame whose payload starts at ring page offset ``want_off``."""
        n = len(chunk)
        here = p.tx_head % self.ring_bytes
        pad_here = (want_off - (here + HDR)) % PAGE
        pad_zero = (want_off - HDR) % PAGE
        pos = self._reserve(p, (HDR + pad_here + n + 63) & ~63, (HDR + pad_zero + n + 63) & ~63)
        if pos < 0:
            return False
        pad = pad_here if pos == here else pad_zero
        frame_len = (HDR + pad + n + 63) & ~63
        FRAME.pack_into(p.data, pos + 8, DATA, 0, 0, 0, frame_len, HDR + pad, 0, n)
        EXTRA.pack_into(p.data, pos + EAGER_OFF, msg_id, offset)
        at = pos + HDR + pad
        p.data[at : at + n] = chunk
        self._publish(p, pos, frame_len)
        return True

    def isend(self, dest: int, context: int, tag: int, flags: int,
              segments: Sequence[memoryview], nbytes: int) -> SendHandle:
        p = self._peers[dest] if 0 <= dest < self.size else None
        if p is None or p.dead:
            p = self._peer(dest)  # raises the right error
        if nbytes <= self.eager_bytes:
            if not p.out:
                if self.send_eager(dest, context, tag, flags, segments, nbytes):
                    return DONE
                if self._write_frame(p, EAGER, flags, context, tag, nbytes, 0, 0, segments):
                    return DONE
            h = SendHandle()
            p.out.append(_OutFrame(EAGER, flags, context, tag, nbytes, 0, 0, segments, h))
            return h
        h = SendHandle()
        msg_id = self._next_msg
        self._next_msg += 1
        self._pending_rts[msg_id] = (p, segments, nbytes, h)
        addr = 0  # offered for a single-copy read when the message is one contiguous buffer
        if self.single_copy:
            whole = [s for s in segments if len(s)]
            if len(whole) == 1:
                addr = _addr(whole[0])
        if p.out or not self._write_frame(p, RTS, flags, context, tag, nbytes, msg_id, addr, ()):
            p.out.append(_OutFrame(RTS, flags, context, tag, nbytes, msg_id, addr, (), None))
        return h

    def send_eager(self, dest: int, context: int, tag: int, flags: int,
                   segments: Sequence[memoryview], nbytes: int) -> bool:
        # the fast path of _write_frame: a small message, nothing queued before it, room before
        # the end of the ring and below the cached free bound
        p = self._peers[dest]
        if p is None or p.dead or p.out or nbytes > self.eager_bytes:
            return False
        frame_len = (EAGER_OFF + nbytes + 63) & ~63
        head = p.tx_head
        pos = head % self.ring_bytes
        if pos + frame_len > self.ring_bytes or head + frame_len > p.tx_free_to:
            return False
        data = p.data
        FRAME.pack_into(data, pos + 8, EAGER, flags, 0, context, frame_len, EAGER_OFF, tag,
                        nbytes)
        at = pos + EAGER_OFF
        if len(segments) == 1:  # the common case, without the loop
            data[at : at + nbytes] = segments[0]
        else:
            for seg in segments:
                n = len(seg)
                data[at : at + n] = seg
                at += n
        p.tx_q[pos >> 3] = (head + 1) ^ p.tx_key
        p.tx_head = head + frame_len
        if p.ctl[_W_SLEEP]:
            self._ring_bell(p)
        return True

    def _flush(self, p: _Peer) -> bool:
        out = p.out
        did = False
        while out:
            if not out[0].write(self, p):
                return did
            out.popleft()
            did = True
        return did

    # ------------------------------------------------------------------ receiving
    def _accept_rendezvous(self, inc: _RendezvousIncoming, dest: memoryview,
                           on_done: OnDone) -> None:
        p = self._peer(inc.source)
        # A single-copy read halves the copying of an exchange (a 2 MiB sendrecv on two ranks:
        # 0.5-1.2 ms streamed, 0.37-0.47 ms read), saves the clear-to-send round trip of every
        # piece of a pipelined broadcast (np=2 binomial, 4 MiB: 0.79-0.87 ms streamed, 0.53-0.69
        # read), and leaves the sender free; a lone one-way message runs about as fast either
        # way (np=2 ping-pong, 1-16 MiB: 4.1-6.0 GB/s streamed, 4.1-5.5 read, same runs).
        if (inc.addr and self.single_copy and len(dest) >= inc.nbytes
                and self._read_from_sender(p, inc.addr, inc.nbytes, dest)):
            self._send_fin(p, inc.msg_id)
            on_done()
            return
        p.streams[inc.msg_id] = _RxStream(dest, inc.nbytes, on_done)
        cts = _OutFrame(CTS, 0, 0, 0, 0, inc.msg_id, _addr(dest) % PAGE, (), None)
        if p.out or not cts.write(self, p):
            p.out.append(cts)

    def _send_fin(self, p: _Peer, msg_id: int) -> None:
        """Tell ``p`` that message ``msg_id`` has been read from its memory (its send is done)."""
        fin = _OutFrame(FIN, 0, 0, 0, 0, msg_id, 0, (), None)
        if p.out or not fin.write(self, p):
            p.out.append(fin)

    def _read_from_sender(self, p: _Peer, addr: int, nbytes: int, dest: memoryview) -> bool:
        """Copy ``nbytes`` at ``addr`` in ``p``'s memory into ``dest``; False if refused.

        A refusal (ptrace rules, no such call) turns single-copy reads off for this rank: the
        sender then streams, this message and every later one.
        """
        from ringworld.transport import cma

        try:
            cma.read(p.pid, addr, _addr(dest), nbytes)
        except OSError as exc:
            # stream this one instead; a refusal by the kernel will not change, so stop asking
            # (a sender that is gone, ESRCH, is reported through its pidfd as usual)
            if exc.errno != errno.ESRCH:
                self.single_copy = False
            return False
        self.single_copy_reads += 1
        return True

    def _finish_send(self, p: _Peer, msg_id: int) -> None:
        """The receiver has read message ``msg_id`` straight from our buffer: the send is done."""
        entry = self._pending_rts.pop(msg_id, None)
        if entry is None:
            raise TransportError(f"rank {p.rank} finished unknown message {msg_id}")
        entry[3].done = True

    def _start_stream(self, p: _Peer, msg_id: int, dst_off: int) -> None:
        entry = self._pending_rts.pop(msg_id, None)
        if entry is None:
            raise TransportError(f"rank {p.rank} sent a clear-to-send for unknown message "
                                 f"{msg_id}")
        _, segments, nbytes, handle = entry
        st = _OutStream(msg_id, segments, nbytes, handle)
        st.dst_off = dst_off
        if p.out or not st.write(self, p):
            p.out.append(st)

    def _drain(self, p: _Peer, deliver: Deliver) -> bool:
        """Consume every complete frame from ``p``'s ring; return whether there was one."""
        q = p.rx_q
        if q[p.rx_idx] != p.rx_expect:
            return False
        my_ctl = self._my_ctl
        assert my_ctl is not None
        rb = self.ring_bytes
        data = p.rx_data
        key = p.rx_key
        unpack = FRAME.unpack_from
        tail = p.rx_tail
        pos = tail % rb
        while q[pos >> 3] == (tail + 1) ^ key:
            ftype, flags, _, context, frame_len, poff, tag, nbytes = unpack(data, pos + 8)
            if ftype == EAGER:
                at = pos + poff
                inc = self._eager  # reused: an eager Incoming is valid only inside deliver()
                inc.source = p.rank
                inc.context = context
                inc.tag = tag
                inc.flags = flags
                inc.nbytes = nbytes
                inc.view = data[at : at + nbytes]
                deliver(inc)
                inc.view = _EMPTY
            elif ftype != WRAP:
                msg_id, aux = EXTRA.unpack_from(data, pos + EAGER_OFF)
                if ftype == DATA:
                    st = p.streams[msg_id]
                    at = pos + poff
                    st.dest[aux : aux + nbytes] = data[at : at + nbytes]
                    st.received += nbytes
                    if st.received >= st.total:
                        del p.streams[msg_id]
                        st.on_done()
                elif ftype == RTS:
                    deliver(_RendezvousIncoming(self, p.rank, context, tag, flags, nbytes,
                                                msg_id, aux))
                elif ftype == CTS:
                    self._start_stream(p, msg_id, aux)
                elif ftype == FIN:
                    self._finish_send(p, msg_id)
                else:
                    raise TransportError(f"corrupt frame type {ftype} from rank {p.rank}")
            if frame_len <= 0 or frame_len & 63:
                raise TransportError(f"corrupt frame length {frame_len} from rank {p.rank}")
            tail += frame_len
            pos = tail % rb
            p.rx_tail = tail
            my_ctl[p.rx_tail_w] = tail
        p.rx_idx = pos >> 3
        p.rx_expect = (tail + 1) ^ key
        if p.ctl[_W_SLEEP]:
            self._ring_bell(p)  # the sender may be sleeping on a full ring
        return True

    supports_take_eager = True

    def take_eager(self, source: int, context: int, tag: int, dest: memoryview | None,
                   polls: int = 1, exact: bool = False
                   ) -> tuple[int, int, int, bytes | None] | int | None:
        p = self._peers[source]
        ctl = self._my_ctl
        # checked before the wait, off the path from arrival to return: nothing can become
        # queued while this rank only spins here
        if p is None or p.dead or ctl is None:
            return None
        for other in self._active:  # (frames queued for ring space: the general path flushes)
            if other.out:
                return None
        idx = p.rx_idx
        q = p.rx_q
        expect = p.rx_expect
        if q[idx] != expect:
            # spin on the one sequence word: a few bytecodes per check, so the message is seen
            # soon after it lands (a method call per check cost ~0.3 us on each receive)
            for _ in range(polls - 1):
                if q[idx] == expect:
                    break
            else:
                return 0
        data = p.rx_data
        pos = idx << 3
        ftype, flags, _, ctx, frame_len, poff, mtag, nbytes = FRAME.unpack_from(data, pos + 8)
        if (ctx != context or (mtag != tag and tag != -1) or frame_len & 63 or not frame_len
                or (dest is not None and (nbytes != len(dest) if exact
                                          else nbytes > len(dest)))):
            return None
        payload: bytes | None = None
        fin = 0  # a large message read from the sender: its id, for the FIN
        if ftype == EAGER:
            at = pos + poff
            if dest is None:
                payload = bytes(data[at : at + nbytes])
            elif nbytes:
                dest[:nbytes] = data[at : at + nbytes]
        else:
            # a large message into a named buffer: read it from the sender right here (no
            # receive posted, no matching: about 20 us less per message than the general path)
            if ftype != RTS or dest is None or not self.single_copy:
                return None
            fin, addr = EXTRA.unpack_from(data, pos + EAGER_OFF)
            if not addr or not self._read_from_sender(p, addr, nbytes, dest):
                return None
        tail = p.rx_tail + frame_len
        p.rx_tail = tail
        ctl[p.rx_tail_w] = tail
        p.rx_idx = (tail % self.ring_bytes) >> 3
        p.rx_expect = (tail + 1) ^ p.rx_key
        if p.ctl[_W_SLEEP]:
            self._ring_bell(p)
        if fin:
            self._send_fin(p, fin)
        return mtag, flags, nbytes, payload

    def poll(self, deliver: Deliver) -> bool:
        did = False
        for p in self._active:
            if p.out and self._flush(p):
                did = True
            if p.rx_q[p.rx_idx] == p.rx_expect and self._drain(p, deliver):
                did = True
        return did

    def wait_event(self, timeout: float, waiting: Callable[[], bool] | None = None) -> None:
        ctl = self._my_ctl
        if ctl is None or self._bell is None:
            return
        ctl[_W_SLEEP] = 1
        try:
            if waiting is not None and not waiting():
                return
            for p in self._active:
                if p.rx_q[p.rx_idx] == p.rx_expect:
                    return
            fds: list[int] = [self._bell.fileno(), *self._fd_to_peer]
            select.select(fds, [], [], timeout)
        finally:
            ctl[_W_SLEEP] = 0
            drain(self._bell)

    def wake_all(self, ranks: Sequence[int]) -> None:
        peers = self._peers
        for rank in ranks:
            p = peers[rank] if 0 <= rank < self.size else None
            if p is not None and p.ctl[_W_SLEEP] and not p.dead:
                self._ring_bell(p)

    def waker(self, ranks: Sequence[int]) -> Callable[[], None]:
        """:meth:`wake_all`; for a lone peer, one that reads its sleep flag first (np=2)."""
        if len(ranks) == 1 and 0 <= ranks[0] < self.size:
            return flag_waker(self, ranks[0])
        return super().waker(ranks)

    knows_cpus = True

    def shares_cpu(self, ranks: Iterable[int]) -> bool:
        peers = self._peers
        pids = [p.pid for r in ranks if 0 <= r < self.size and (p := peers[r]) is not None]
        return self._cpus.shares_cpu(pids)

    def check_peers(self) -> None:
        if not self._fd_to_peer:
            self._check_by_proc()
            return
        ready, _, _ = select.select(list(self._fd_to_peer), [], [], 0)
        for fd in ready:
            p = self._fd_to_peer.pop(fd)
            os.close(fd)
            p.pidfd = -1
            self._mark_dead(p)

    def _check_by_proc(self) -> None:
        for p in self._active:
            if not os.path.exists(f"/proc/{p.pid}") or _is_zombie(p.pid):
                self._mark_dead(p)

    def _mark_dead(self, p: _Peer) -> None:
        if p.dead:
            return
        p.dead = True
        raise PeerFailure(p.rank, f"process {p.pid} exited")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in list(self._fd_to_peer):
            os.close(fd)
        self._fd_to_peer.clear()
        self._active.clear()
        self._cpus.close()
        self._peers = [None] * self.size
        self._my_ctl = None
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        for mm in self._mms:
            # a view may still be exported (e.g. by a pending message): then the GC unmaps it
            with contextlib.suppress(BufferError):
                mm.close()
        self._mms.clear()
        self._my_mm = None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


_BOOT_ID: str | None = None


def _boot_id() -> str:
    """An identifier of this host's running kernel, to tell whether two ranks share memory."""
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT_ID = f.read().strip() + "-" + socket.gethostname()
        except OSError:
            _BOOT_ID = socket.gethostname()
    return _BOOT_ID

