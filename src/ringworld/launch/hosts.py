"""Where ranks run: ``--hosts``/``--hostfile`` parsing, rank placement, interface addresses.

Light on purpose (no numpy): part of the launcher's start-up.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import NamedTuple

from ringworld._sockutil import iface_address, route_address

__all__ = ["Host", "iface_address", "is_local", "parse_hostfile", "parse_hosts", "place",
           "route_address"]

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class Host(NamedTuple):
    """A host and how many ranks it takes (``slots``)."""

    name: str
    slots: int


def parse_hosts(text: str) -> list[Host]:
    """``h1:4,h2:4`` (or ``h1,h2``: one slot each) -> hosts in order.

    Raises:
        ValueError: an empty name, a slot count that is not a positive integer, or a repeat.
    """
    hosts: list[Host] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, slots = item.rpartition(":")
        if not sep or not slots.isdigit():  # no count (an IPv6 address keeps its colons)
            name, slots = item, "1"
        hosts.append(_host(name, slots, f"--hosts entry {item!r}"))
    return _checked(hosts, "--hosts")


def parse_hostfile(path: str) -> list[Host]:
    """A hostfile: one host per line, ``name [slots=N]`` or ``name:N``; ``#`` comments.

    Raises:
        OSError: the file cannot be read.
        ValueError: a malformed line (named with its number) or a repeated host.
    """
    hosts: list[Host] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{path}:{number}"
            name, slots = words[0], "1"
            if ":" in name and name.rsplit(":", 1)[1].isdigit():
                name, slots = name.rsplit(":", 1)
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key in ("slots", "max_slots", "max-slots"):
                    slots = value
                else:
                    raise ValueError(f"{where}: unknown field {word!r} (expected slots=N)")
            hosts.append(_host(name, slots, where))
    return _checked(hosts, path)


def _host(name: str, slots: str, where: str) -> Host:
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"{where}: a host name is required")
    if not slots.isdigit() or int(slots) < 1:
        raise ValueError(f"{where}: slots {slots!r} must be a positive integer")
    return Host(name, int(slots))


def _checked(hosts: list[Host], what: str) -> list[Host]:
    if not hosts:
        raise ValueError(f"{what} names no host")
    names = [h.name for h in hosts]
    for n in names:
        if names.count(n) > 1:
            raise ValueError(f"{what} names host {n!r} twice")
    return hosts


def place(hosts: Sequence[Host], size: int) -> list[str]:
    """The host of each rank: hosts filled in order (rank blocks per host).

    Raises:
        ValueError: ``size`` exceeds the total slots.
    """
    total = sum(h.slots for h in hosts)
    if size > total:
        raise ValueError(f"-n {size} exceeds the {total} slots of the hosts given")
    where: list[str] = []
    for h in hosts:
        where.extend([h.name] * min(h.slots, size - len(where)))
    return where


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine (started directly, without the remote shell)."""
    return name in LOCAL_NAMES or name == socket.gethostname()
