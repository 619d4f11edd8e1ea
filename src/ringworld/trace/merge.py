"""Join the ranks' trace parts (``<path>.rank<N>``, JSON lines) into one Chrome trace file.

Light on purpose (json and os only): the launcher calls it after every traced job. From the
command line: ``ringworld trace merge PATH`` (:mod:`ringworld.trace.cli`); ``python -m
ringworld.trace.merge PATH`` runs the same command.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

_PART = re.compile(r"\.rank(\d+)$")


def parts(path: str) -> list[str]:
    """The part files of trace ``path`` that exist, in rank order."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    prefix = os.path.basename(path) + ".rank"
    found: list[tuple[int, str]] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(prefix):
            m = _PART.search(name)
            if m and name == prefix + m.group(1):
                found.append((int(m.group(1)), os.path.join(directory, name)))
    return [p for _, p in sorted(found)]


def _read_part(part: str) -> tuple[list[dict[str, Any]], int]:
    """Events of one part and the number of unreadable lines (a rank killed mid-write)."""
    events: list[dict[str, Any]] = []
    bad = 0
    with open(part, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(event, dict):
                events.append(event)
            else:
                bad += 1
    return events, bad


def merge(path: str, *, remove_parts: bool = True) -> tuple[int, int]:
    """Write trace ``path`` from its parts; return (ranks merged, events written).

    Cost: reads every part once and holds all events in memory. A torn last line of a part (a
    rank killed while writing) is skipped and counted in the file's ``otherData``.

    Raises:
        FileNotFoundError: no part of ``path`` exists.
        OSError: ``path`` cannot be written.
    """
    found = parts(path)
    if not found:
        raise FileNotFoundError(f"no trace parts {path}.rank<N> to merge")
    events: list[dict[str, Any]] = []
    bad = 0
    for part in found:
        got, torn = _read_part(part)
        events.extend(got)
        bad += torn
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0.0)))
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "ringworld", "ranks": len(found),
                         "unreadable_lines": bad}}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
    if remove_parts:
        for part in found:
            os.unlink(part)
    return len(found), len(events)


if __name__ == "__main__":
    import sys

    from ringworld.trace.cli import main

    sys.exit(main(["merge", *sys.argv[1:]]))
