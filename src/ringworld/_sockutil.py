"""Small socket helpers shared by the TCP store and the TCP transport."""

from __future__ import annotations

import socket
from collections import deque


def consume_sent(pending: deque[memoryview], sent: int) -> None:
    """Drop the first ``sent`` bytes from the views queued in ``pending`` (after a sendmsg)."""
    while sent:
        head = pending[0]
        if sent >= len(head):
            sent -= len(head)
            pending.popleft()
        else:
            pending[0] = head[sent:]
            return


def recv_exact(sock: socket.socket, n: int, closed: str) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket.

    Raises:
        ConnectionResetError: the peer closed first; the message is ``closed``.
        OSError: the socket failed (including a socket timeout).
    """
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError(closed)
        got += k
    return bytes(buf)
