"""Small socket helpers shared by the TCP store and the TCP transport."""

from __future__ import annotations

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
