"""The store's wire format: constants and pure, bound-checking decoders (see :mod:`.tcp`).

The decoders never allocate in proportion to a length they have not checked, and raise
:class:`ProtocolError` (server side) or ``ConnectionError`` (client side) for anything else.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import NamedTuple

VERSION = 1
REQUEST_MAGIC = 0x51535752  # b"RWSQ"
RESPONSE_MAGIC = 0x50535752  # b"RWSP"
REQUEST = struct.Struct("<IHHIQdq")
RESPONSE = struct.Struct("<IHHQq")

OP_SET, OP_GET, OP_ADD, OP_WAIT = 1, 2, 3, 4
STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR = 0, 1, 2
OP_NAMES = {OP_SET: "set", OP_GET: "get", OP_ADD: "add", OP_WAIT: "wait"}

MAX_KEY_BYTES = 4096
MAX_WAIT_KEYS = 65536
MAX_KEYS_BYTES = 4 << 20
MAX_VALUE_BYTES = 64 << 20


class ProtocolError(ValueError):
    """Bytes from the wire break the store protocol (raised by the decoders below)."""


class VersionMismatch(ProtocolError):
    """A request of another wire version (the server answers it with an ``ERROR`` reply)."""


class RequestHeader(NamedTuple):
    """A validated request header; ``timeout`` is -1.0 for "forever"."""

    op: int
    nkeys: int
    value_len: int
    timeout: float
    amount: int


def parse_request_header(raw: bytes | bytearray | memoryview) -> RequestHeader:
    """Decode and bound-check a :data:`REQUEST` header.

    Raises:
        ProtocolError: wrong size or magic, unknown op, a key count or value length out of
            bounds, or a NaN timeout (:class:`VersionMismatch` for another version).
    Cost: O(1); allocates nothing proportional to the claimed lengths.
    """
    if len(raw) != REQUEST.size:
        raise ProtocolError(f"request header has {len(raw)} bytes, expected {REQUEST.size}")
    magic, version, op, nkeys, value_len, timeout, amount = REQUEST.unpack(raw)
    if magic != REQUEST_MAGIC:
        raise ProtocolError(f"bad request magic {magic:#x}")
    if version != VERSION:
        raise VersionMismatch(
            f"store server speaks wire version {VERSION}, client sent {version}")
    if op not in OP_NAMES:
        raise ProtocolError(f"unknown op {op}")
    max_keys = MAX_WAIT_KEYS if op == OP_WAIT else 1
    if not 1 <= nkeys <= max_keys:
        raise ProtocolError(f"key count {nkeys} is outside 1..{max_keys} for {OP_NAMES[op]}")
    max_value = MAX_VALUE_BYTES if op == OP_SET else 0
    if value_len > max_value:
        raise ProtocolError(
            f"value length {value_len} exceeds {max_value} for {OP_NAMES[op]}")
    if math.isnan(timeout):
        raise ProtocolError("timeout is NaN")
    forever = timeout < 0 or math.isinf(timeout)
    return RequestHeader(op, nkeys, value_len, -1.0 if forever else timeout, amount)


def parse_key_lengths(raw: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """Decode the ``u32`` key lengths that follow a header and bound-check them.

    Raises:
        ProtocolError: ``raw`` is empty or not whole ``u32``s, or a key is longer than
            :data:`MAX_KEY_BYTES`, or all together longer than :data:`MAX_KEYS_BYTES`.
    """
    if not raw or len(raw) % 4:
        raise ProtocolError(f"key lengths take {len(raw)} bytes, not a positive multiple of 4")
    lens = struct.unpack(f"<{len(raw) // 4}I", raw)
    if max(lens) > MAX_KEY_BYTES or sum(lens) > MAX_KEYS_BYTES:
        raise ProtocolError(
            f"key lengths (longest {max(lens)}, total {sum(lens)}) exceed "
            f"{MAX_KEY_BYTES} per key or {MAX_KEYS_BYTES} in all")
    return lens


def decode_keys(raw: bytes | bytearray | memoryview, lens: Sequence[int]) -> list[str]:
    """Split ``raw`` into keys of ``lens`` bytes and decode them as UTF-8.

    Raises:
        ProtocolError: the lengths do not add up to ``len(raw)``, or a key is not UTF-8.
    """
    data = bytes(raw)
    if sum(lens) != len(data):
        raise ProtocolError(f"keys take {len(data)} bytes, their lengths say {sum(lens)}")
    keys, pos = [], 0
    try:
        for n in lens:
            keys.append(data[pos:pos + n].decode("utf-8"))
            pos += n
    except UnicodeDecodeError:
        raise ProtocolError("key is not UTF-8") from None
    return keys


def parse_response_header(raw: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """Decode a :data:`RESPONSE` header into ``(status, value_len, amount)``, bound-checked.

    Raises:
        ConnectionError: wrong size, magic, version or status, or an oversized value.
    """
    if len(raw) != RESPONSE.size:
        raise ConnectionError(f"the store sent a {len(raw)}-byte reply header")
    magic, version, status, value_len, total = RESPONSE.unpack(raw)
    if magic != RESPONSE_MAGIC:
        raise ConnectionError("the store sent a reply with a bad magic")
    if version != VERSION:
        raise ConnectionError(f"the store speaks wire version {version}, this client {VERSION}")
    if status not in (STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR):
        raise ConnectionError(f"the store sent an unknown status {status}")
    if value_len > MAX_VALUE_BYTES + MAX_KEYS_BYTES:
        raise ConnectionError(f"the store sent an oversized reply ({value_len} bytes)")
    return status, value_len, total
