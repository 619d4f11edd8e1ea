"""The TCP transport's wire format: frame header, checksum trailer, hello, padding rules.

Shared by the frame path (:mod:`ringworld.transport.tcp`, whose docstring explains the framing
and why frames are padded) and the bootstrap (:mod:`ringworld.transport.tcp_bootstrap`, which
exchanges the :data:`HELLO`). Pure constants and two helpers; no sockets.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

MAGIC = 0x5752  # b"RW"
VERSION = 3  # 2: frames padded to FRAME_ALIGN (see :mod:`.tcp`); 3: options in HELLO
HEADER = struct.Struct("<HHIIqQ")
#: follows the header when checksums are on: CRC-32 of the payload, CRC-32 of header + that.
CHECK = struct.Struct("<II")
HELLO_MAGIC = 0x4857  # b"WH"
HELLO = struct.Struct("<HHIII")  # magic, version, rank, world size, options
#: HELLO option bit: per-frame checksums.
OPT_CHECKSUM = 1
#: sanity bound on one message; a header claiming more is a protocol error.
MAX_MESSAGE_BYTES = 1 << 40
#: every frame's length is a multiple of this; large payloads start at this offset in their frame.
FRAME_ALIGN = 64
#: payloads at least this big are preceded by lead padding (they are copied by the kernel).
LEAD_MIN_BYTES = 4096

_LEAD = FRAME_ALIGN - HEADER.size
_LEAD_BYTES = bytes(_LEAD)
_CHECKED_HEADER = HEADER.size + CHECK.size
_LEAD_CK = FRAME_ALIGN - _CHECKED_HEADER
_LEAD_CK_BYTES = bytes(_LEAD_CK)
_ALIGN_MASK = FRAME_ALIGN - 1
_TRAILS = [memoryview(bytes(FRAME_ALIGN))[:k] for k in range(FRAME_ALIGN)]


def frame_padding(nbytes: int, checksum: bool = False) -> tuple[int, int]:
    """``(lead, trail)`` zero bytes around a payload of ``nbytes`` in its frame (see :mod:`.tcp`).

    The hot paths (:meth:`TcpTransport.isend`, ``_start_message``, ``take_eager``) compute the
    same inline.
    """
    head = _CHECKED_HEADER if checksum else HEADER.size
    lead = FRAME_ALIGN - head if nbytes >= LEAD_MIN_BYTES else 0
    return lead, -(head + lead + nbytes) & _ALIGN_MASK


def checked_header(header: bytes, segments: Sequence[memoryview], nbytes: int) -> tuple[bytes, int]:
    """``header`` followed by its :data:`CHECK` and lead padding, and the trail padding.

    Cost: one CRC-32 pass over the payload.
    """
    crc = 0
    for seg in segments:
        crc = zlib.crc32(seg, crc)
    head = header + crc.to_bytes(4, "little")
    head += zlib.crc32(head).to_bytes(4, "little")
    if nbytes >= LEAD_MIN_BYTES:
        return head + _LEAD_CK_BYTES, -nbytes & _ALIGN_MASK
    return head, -(_CHECKED_HEADER + nbytes) & _ALIGN_MASK
