"""The shared-memory transport's rings: their layout, frame format and per-peer state.

Holds what :mod:`ringworld.transport.shm` builds its transport from: the frame header structs,
frame kinds and control-page layout (see that module's docstring for the protocol), the sizing
rules for inboxes and rings, the placement rule that keeps staging copies clear of 4 KiB
aliasing, one rank's view of a peer's rings (:class:`_Peer`), the frames and streams queued
while a ring is full, and the :class:`~ringworld.transport.base.Incoming` messages the drain
hands to the engine.
"""

from __future__ import annotations

import ctypes
import mmap
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ringworld.transport.base import BufferedIncoming, Incoming, OnDone, SendHandle

if TYPE_CHECKING:
    from ringworld.transport.shm import ShmTransport

# A frame: word 0 is its sequence word, ``(absolute ring offset + 1) XOR ring key``, written
# last; the receiver polls it, so a small message costs one cache line, not a separate counter.
# Then FRAME (ftype u8, flags u8, pad u16, context u32, frame_len u32, payload_off u32, tag i64,
# nbytes u64) and, for rendezvous frames, EXTRA (msg_id u64, aux u64).
FRAME = struct.Struct("<BBHIIIqQ")
EXTRA = struct.Struct("<QQ")
EAGER_OFF = 8 + FRAME.size          # 40: up to 24 payload bytes share the header's cache line
HDR = EAGER_OFF + EXTRA.size        # 56: header of rendezvous frames
EAGER, RTS, CTS, DATA, WRAP, FIN = 1, 2, 3, 4, 5, 6
PAGE = 4096
_EMPTY = memoryview(b"")
CTL_MAGIC = 0x52574C4453484D31  # "RWLDSHM1"
# Control page layout, in 8-byte words: [0] magic, [1] pid, [8] sleeping flag,
# then per sender s, on a cache line of its own: tail at word 16 + 8*s, ring key at 17 + 8*s.
_W_MAGIC, _W_PID, _W_SLEEP = 0, 1, 8
MIN_RING = 64 * 1024
MAX_RING = 2 * 1024 * 1024        # 256 KiB chunks: measured fastest for 16 MiB messages
INBOX_BUDGET = 16 * 1024 * 1024
DEFAULT_EAGER = 128 * 1024  # measured: 64 KiB ping-pong 69 us with rendezvous, 16 us eager


def _tail_word(sender: int) -> int:
    return 16 + 8 * sender


def ctl_bytes(size: int) -> int:
    """Bytes of the control area of an inbox for ``size`` ranks (page multiple)."""
    need = (_tail_word(size) + 8) * 8
    return (need + PAGE - 1) // PAGE * PAGE


def default_ring_bytes(size: int) -> int:
    """Ring size for a world of ``size`` ranks: an inbox budget split among the senders."""
    per = INBOX_BUDGET // max(1, size - 1)
    per = max(MIN_RING, min(MAX_RING, per))
    return per // PAGE * PAGE


def _addr(view: memoryview) -> int:
    """Virtual address of the first byte of a contiguous buffer.

    Cost: about 0.4 us for a writable buffer (through ctypes), 3 us for a read-only one
    (through numpy, which ctypes cannot take).
    """
    if len(view) == 0:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    import numpy as np  # only large (rendezvous) messages need addresses

    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


def _bad_distance(d: int) -> bool:
    """Whether copying to ``dst = src + d (mod 4096)`` hits 4 KiB aliasing (slow memcpy)."""
    return 1 <= d % PAGE <= 63


def _placement(src_off: int, dst_off: int) -> int:
    """Page offset for a staging copy between ``src_off`` and ``dst_off`` that avoids aliasing."""
    x = (dst_off - src_off) % PAGE
    k = x + 64 if _bad_distance(x) else 0
    return (src_off + k) % PAGE


class _Peer:
    """This rank's view of one peer: its inbox (we write into our ring there) and ours."""

    __slots__ = (
        "ctl", "data", "dead", "mm", "out", "pid", "pidfd", "rank", "rx_data", "rx_expect",
        "rx_idx", "rx_key", "rx_q", "rx_tail", "rx_tail_w", "streams", "tx_free_to", "tx_head",
        "tx_key", "tx_q", "tx_tail_w",
    )

    ctl: memoryview        # the peer's control words (uint64)
    data: memoryview       # our ring in the peer's inbox (we write)
    mm: mmap.mmap
    tx_q: memoryview       # the same ring as uint64 words (sequence words)
    tx_head: int           # absolute offset of our next frame
    tx_free_to: int        # we may write below this absolute offset (cached peer tail + ring)
    tx_key: int
    tx_tail_w: int
    rx_data: memoryview    # the peer's ring in our inbox (we read)
    rx_q: memoryview
    rx_key: int
    rx_idx: int            # word index of the next frame's sequence word
    rx_expect: int         # the sequence word that marks it as written
    rx_tail_w: int

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.dead = False
        self.pid = 0
        self.pidfd = -1
        self.out: deque[_OutOp] = deque()          # frames waiting for ring space, in order
        self.streams: dict[int, _RxStream] = {}    # msg_id -> destination of DATA frames
        self.rx_tail = 0


class _RxStream:
    __slots__ = ("dest", "on_done", "received", "total")

    def __init__(self, dest: memoryview, total: int, on_done: OnDone) -> None:
        self.dest = dest
        self.total = total
        self.received = 0
        self.on_done = on_done


class _OutOp:
    """A queued outgoing frame or stream; ``write`` returns True once fully written."""

    __slots__ = ()

    def write(self, t: ShmTransport, p: _Peer) -> bool:
        raise NotImplementedError


class _OutFrame(_OutOp):
    __slots__ = ("aux", "context", "flags", "ftype", "handle", "msg_id", "nbytes", "segments",
                 "tag")

    def __init__(self, ftype: int, flags: int, context: int, tag: int, nbytes: int,
                 msg_id: int, aux: int, segments: Sequence[memoryview],
                 handle: SendHandle | None) -> None:
        self.ftype = ftype
        self.flags = flags
        self.context = context
        self.tag = tag
        self.nbytes = nbytes
        self.msg_id = msg_id
        self.aux = aux
        self.segments = segments
        self.handle = handle

    def write(self, t: ShmTransport, p: _Peer) -> bool:
        ok = t._write_frame(p, self.ftype, self.flags, self.context, self.tag, self.nbytes,
                            self.msg_id, self.aux, self.segments)
        if ok and self.handle is not None:
            self.handle.done = True
        return ok


class _OutStream(_OutOp):
    """The DATA chunks of one rendezvous message, written as ring space allows."""

    __slots__ = ("dst_off", "handle", "msg_id", "nbytes", "offset", "seg_addr", "seg_index",
                 "seg_pos", "segments")

    def __init__(self, msg_id: int, segments: Sequence[memoryview], nbytes: int,
                 handle: SendHandle) -> None:
        self.msg_id = msg_id
        self.segments = [s for s in segments if len(s)]
        self.nbytes = nbytes
        self.handle = handle
        self.offset = 0        # bytes of the message sent
        self.seg_index = 0
        self.seg_pos = 0
        self.seg_addr = [_addr(s) for s in self.segments]
        self.dst_off = 0       # page offset of the receiver's buffer start (from CTS)

    def write(self, t: ShmTransport, p: _Peer) -> bool:
        while self.seg_index < len(self.segments):
            seg = self.segments[self.seg_index]
            n = min(len(seg) - self.seg_pos, t.chunk)
            src_off = (self.seg_addr[self.seg_index] + self.seg_pos) % PAGE
            dst_off = (self.dst_off + self.offset) % PAGE
            want = _placement(src_off, dst_off)
            if not t._write_chunk(p, self.msg_id, self.offset, seg[self.seg_pos:self.seg_pos + n],
                                  want):
                return False
            self.offset += n
            self.seg_pos += n
            if self.seg_pos == len(seg):
                self.seg_index += 1
                self.seg_pos = 0
        self.handle.done = True
        self.segments = []
        return True


class _EagerIncoming(Incoming):
    """An eager message still in the ring; valid only inside the deliver callback."""

    __slots__ = ("view",)

    def __init__(self, source: int, context: int, tag: int, flags: int,
                 view: memoryview) -> None:  # no super() call: this is the hot path
        self.source = source
        self.context = context
        self.tag = tag
        self.flags = flags
        self.nbytes = len(view)
        self.view = view

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        n = self.nbytes
        if n:
            dest[:n] = self.view
        on_done()

    def detach(self) -> Incoming:
        b = BufferedIncoming(self.source, self.context, self.tag, self.flags, self.nbytes)
        if self.nbytes:
            b.data[:] = self.view
        b.mark_complete()
        return b


def flag_waker(t: ShmTransport, rank: int) -> Callable[[], None]:
    """``t.wake_all([rank])``, for a rank of ``t``, that reads the peer's sleep flag itself and
    calls nothing while the peer is awake, as it nearly always is at a sync (np=2, same job:
    2-3% off an 8-byte allreduce, about 0.08 us). It reads ``t``'s peers afresh: close empties
    them, and a closed peer's views are not kept here."""
    ranks = (rank,)
    wake_all = t.wake_all

    def wake_one() -> None:
        p = t._peers[rank]
        if p is not None and p.ctl[_W_SLEEP]:
            wake_all(ranks)

    return wake_one


def drain(bell: socket.socket | None) -> None:
    """Read every datagram waiting on a doorbell socket (none: nothing to do)."""
    try:
        while bell is not None:
            bell.recv(64)
    except (BlockingIOError, InterruptedError):
        pass


class _RendezvousIncoming(Incoming):
    """A large message announced by RTS; data moves once a receive names a buffer.

    An unmatched one waits in the engine's unexpected queue as it is for up to a millisecond
    (``lazy``), so a receive posted right after it (the next segment of a pipelined collective, a
    loop of blocking receives) still gets the data straight into its buffer; after that it is
    pulled into an owned buffer (``detach``), so a sender never waits long on a receiver that
    has not posted yet: sends behave as buffered, as over TCP, and the classic "both ranks send
    first" exchange cannot deadlock.
    """

    __slots__ = ("addr", "msg_id", "transport")
    lazy = True  # the sender waits for a clear-to-send; nothing else is held up

    def __init__(self, transport: ShmTransport, source: int, context: int, tag: int, flags: int,
                 nbytes: int, msg_id: int, addr: int) -> None:
        super().__init__(source, context, tag, flags, nbytes)
        self.transport = transport
        self.msg_id = msg_id
        self.addr = addr  # the sender's buffer, for a single-copy read; 0: stream it

    def read_into(self, dest: memoryview, on_done: OnDone) -> None:
        self.transport._accept_rendezvous(self, dest, on_done)

    def detach(self) -> Incoming:
        b = BufferedIncoming(self.source, self.context, self.tag, self.flags, self.nbytes)
        self.transport._accept_rendezvous(self, memoryview(b.data), b.mark_complete)
        return b
