"""Small socket helpers shared by the TCP store, the TCP transport and the launcher."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
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


SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def iface_address(iface: str) -> str:
    """The IPv4 address of network interface ``iface`` on this host.

    Raises:
        ValueError: no such interface, or it has no IPv4 address.
    """
    raw = iface.encode()
    if not raw or len(raw) > 15:
        raise ValueError(f"interface name {iface!r} is not valid")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            out = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", raw))
        except OSError as exc:
            known = ", ".join(sorted(os.listdir("/sys/class/net"))) if os.path.isdir(
                "/sys/class/net") else "?"
            raise ValueError(f"interface {iface!r} has no IPv4 address ({exc.strerror}); "
                             f"interfaces here: {known}") from None
    return socket.inet_ntoa(out[20:24])


def route_address(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (what a peer there would connect back to).

    Cost: one UDP socket, no packet sent.

    Raises:
        OSError: ``host`` is unreachable from here.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])
