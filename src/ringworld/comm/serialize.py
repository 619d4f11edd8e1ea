"""The object path: Python values as pickle protocol 5 with out-of-band buffers.

A value without large buffers travels as its pickle alone (flag ``OBJ``). A value holding buffers
that pickle 5 can export (numpy arrays, ``PickleBuffer``) travels as a gather list, so the
arrays' memory goes to the transport directly instead of being copied into one big bytes object
(flag ``OBJ | OOB``)::

    [ u32 nbuf | u32 0 | u64 pickle_len | u64 len_0 .. len_{n-1} ] pad64
    [ pickle bytes ] pad64 [ buffer 0 ] pad64 [ buffer 1 ] ...

On receipt the buffers are views into the one received block, so arrays are not copied again.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import Any

from ringworld.errors import CommError

FLAG_OBJ = 1
FLAG_OOB = 2
_HEAD = struct.Struct("<IIQ")
_ZEROS = bytes(64)
MAX_OOB_BUFFERS = 1 << 20


def _pad(n: int) -> int:
    return (-n) % 64


_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})
_NO_BUFFERS: list[pickle.PickleBuffer] = []  # shared, never appended to


def encode(obj: Any) -> tuple[Sequence[memoryview], int, int, list[pickle.PickleBuffer]]:
    """Serialise ``obj``; return (segments, total bytes, flags, buffers to keep alive).

    Cost: one pickle; arrays inside travel as their own segments, uncopied.

    Raises:
        TypeError / pickle.PicklingError: ``obj`` cannot be pickled.
    """
    if type(obj) in _PLAIN:  # no buffers possible: skip the out-of-band machinery
        data = pickle.dumps(obj, 5)
        return (memoryview(data),), len(data), FLAG_OBJ, _NO_BUFFERS
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return (memoryview(data),), len(data), FLAG_OBJ, _NO_BUFFERS
    raws = [b.raw() for b in buffers]  # contiguous byte views; raises if not contiguous
    head = bytearray(_HEAD.pack(len(raws), 0, len(data)))
    head += struct.pack(f"<{len(raws)}Q", *(len(r) for r in raws))
    head += _ZEROS[: _pad(len(head))]
    segments = [memoryview(head), memoryview(data)]
    total = len(head) + len(data)
    for r in raws:
        pad = _pad(total)
        if pad:
            segments.append(memoryview(_ZEROS)[:pad])
            total += pad
        segments.append(r)
        total += len(r)
    return segments, total, FLAG_OBJ | FLAG_OOB, buffers


def decode(block: memoryview, flags: int) -> Any:
    """Rebuild the value sent by :func:`encode` from the received ``block``.

    Raises:
        CommError: the block is malformed (not an object message).
        Whatever unpickling raises for the value itself.
    """
    if not flags & FLAG_OBJ:
        raise CommError("the matched message was sent as a buffer, not an object: use the "
                        "buffer receive (recv/irecv) for it")
    if not flags & FLAG_OOB:
        return pickle.loads(block)
    if len(block) < _HEAD.size:
        raise CommError("malformed object message: too short")
    nbuf, _, plen = _HEAD.unpack_from(block, 0)
    if nbuf > MAX_OOB_BUFFERS:
        raise CommError(f"malformed object message: {nbuf} buffers")
    lens = struct.unpack_from(f"<{nbuf}Q", block, _HEAD.size)
    at = _HEAD.size + 8 * nbuf
    at += _pad(at)
    if at + plen > len(block):
        raise CommError("malformed object message: pickle runs past the end")
    pickled = block[at : at + plen]
    at += plen
    views = []
    for n in lens:
        at += _pad(at)
        if at + n > len(block):
            raise CommError("malformed object message: buffer runs past the end")
        views.append(block[at : at + n])
        at += n
    return pickle.loads(pickled, buffers=views)
