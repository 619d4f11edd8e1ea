"""The job's records in its store: the keys and JSON forms that the ranks' monitors and the
launcher share (heartbeats, states, failures, mismatches, calls left, revocations,
agreements), and the readers of them that need no monitor (the launcher's SIGUSR1 dump).

Every key starts with :data:`PREFIX`. A failure is ``rw/mon/dead/<i>`` = ``{"rank", "detail",
"by"}`` counted at ``rw/mon/dead/count``; a rank's heartbeat counter is ``rw/mon/beat/<rank>``
and its state (what it is doing) ``rw/mon/state/<rank>``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ringworld.errors import RingworldError
from ringworld.store.base import Store

PREFIX = "rw/mon/"
HISTORY = 8  # long waits each rank remembers (its flight recorder)
DEAD_COUNT_KEY = f"{PREFIX}dead/count"
DEAD_KEY = PREFIX + "dead/{}"


def beat_key(rank: int) -> str:
    """The key of ``rank``'s heartbeat counter."""
    return f"{PREFIX}beat/{rank}"


def state_key(rank: int) -> str:
    """The key of ``rank``'s published state."""
    return f"{PREFIX}state/{rank}"


def publish_failure(store: Store, rank: int, detail: str, by: int | None) -> None:
    """Tell every rank's monitor that ``rank`` failed (``by``: the rank that found it, None for
    the launcher). Cost: two store round trips.

    Raises:
        StoreError: the store is unreachable.
    """
    i = store.add(DEAD_COUNT_KEY, 1)
    store.set(DEAD_KEY.format(i), json.dumps({"rank": rank, "detail": detail,
                                                "by": by}).encode())


MismatchRecord = tuple[int, int, int, str, int, str | None]


def mismatch_record(store: Store, i: int) -> MismatchRecord | None:
    """Published mismatch number ``i`` as (context, seq, by, by_call, sender, sender_call)."""
    return parse_mismatch(get_json(store, f"{PREFIX}mismatch/{i}"))


def left_record(info: dict[str, Any]) -> tuple[int, int, int, str, str] | None:
    """A published call left with an error (see Monitor.publish_left) as (context, seq, by,
    text, kind), or None if ``info`` is not one."""
    if "left" not in info:
        return None
    try:
        return (int(info["context"]), int(info["seq"]), int(info["by"]), str(info["left"]),
                str(info.get("kind", "")))
    except (KeyError, TypeError, ValueError):
        return None


def parse_mismatch(info: dict[str, Any]) -> MismatchRecord | None:
    if "left" in info:
        return None
    try:
        sender_call = info.get("sender_call")
        return (int(info["context"]), int(info["seq"]), int(info["by"]), str(info["by_call"]),
                int(info["sender"]), None if sender_call is None else str(sender_call))
    except (KeyError, TypeError, ValueError):
        return None


def get_json(store: Store, key: str, timeout: float = 2.0) -> dict[str, Any]:
    """The JSON object stored at ``key``; {} if absent within ``timeout`` or not an object."""
    try:
        got = json.loads(store.get(key, timeout=timeout))
    except (RingworldError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def try_get(store: Store, key: str, timeout: float) -> bytes | None:
    try:
        return store.get(key, timeout=timeout)
    except RingworldError:
        return None


def fetch_states(store: Store, size: int) -> dict[int, dict[str, Any] | None]:
    # a published state is never empty: {} means none (absent, unreadable)
    return {r: get_json(store, state_key(r), 0.5) or None for r in range(size)}


def format_states(states: dict[int, dict[str, Any] | None], history: bool = True) -> list[str]:
    """One line per rank saying what it is doing; with ``history``, its recent long waits."""
    now = time.time()
    lines = []
    for r, st in sorted(states.items()):
        if st is None:
            lines.append(f"  rank {r}: no state published (not started, or heartbeats off)")
            continue
        if st.get("exited"):
            lines.append(f"  rank {r}: exited")
            continue
        age = now - st["t"] if isinstance(st.get("t"), float) else None
        stale = f" [last heartbeat {age:.0f} s ago]" if age is not None and age > 5 else ""
        if "waiting" in st:
            since = st.get("since")
            for_s = f" for {now - since:.1f} s" if isinstance(since, float) else ""
            lines.append(f"  rank {r}: waiting{for_s} on {st['waiting']}{stale}")
        else:
            lines.append(f"  rank {r}: not in a communication call (computing?){stale}")
        entered = st.get("entered")
        if history and isinstance(entered, dict) and entered:
            lines.append("    last collective entered: " + ", ".join(
                f"#{seq} on {name}" for name, seq in entered.items()))
        recent = st.get("recent")
        if history and isinstance(recent, list):
            for item in recent[-HISTORY:]:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[0], float):
                    lines.append(f"    {now - item[0]:7.1f} s ago: waited on {item[1]}")
    return lines


def read_states(host: str, port: int, secret: bytes, size: int) -> list[str]:
    """What every rank of a job is doing, read from its store (the launcher's SIGUSR1 dump).

    Raises:
        StoreError: the store cannot be reached or authenticated with.
    """
    from ringworld.store.tcp import TCPStore

    with TCPStore(host, port, secret, timeout=2.0) as store:
        return format_states(fetch_states(store, size))
