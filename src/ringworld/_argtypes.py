"""Argument types shared by the command-line parsers (launcher, bench, topology)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """``text`` as an int of at least 1; argparse's error naming the value otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value
