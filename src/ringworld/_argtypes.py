"""Argument types shared by the command-line parsers (launcher, bench, topology)."""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"\s*(\d+)\s*([a-zA-Z]*)\s*")


def positive_int(text: str) -> int:
    """``text`` as an int of at least 1; argparse's error naming the value otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``4KiB``, ``64MiB`` (binary units) -> bytes."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 4KiB, 64MiB)")
    return int(m.group(1)) * _UNITS[unit]


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes."""
    return [parse_size(s) for s in text.split(",") if s.strip()]
