"""Failures between the launcher and the ranks' monitors, through the job store.

Every failure is published as ``rw/mon/dead/<i>`` = ``{"rank", "detail", "by"}`` (``i`` = 1, 2, ...,
counted at ``rw/mon/dead/count``; :func:`ringworld.store.records.publish_failure` writes them). The
launcher publishes a rank that exited on its own (``by``: null), so collectives that need it fail
at once everywhere; a rank's monitor publishes a peer whose heartbeats stopped for the liveness
timeout (``by``: its rank, ``detail``: ``not responding: ...``): a rank that is stopped, hung or
cut off, which never exits on its own. The launcher reads those to name such a rank as the root
cause of the failures that follow (:class:`~ringworld.launch.procset.ProcessSet`).

The keys and record forms are :mod:`ringworld.store.records`' (light: no numpy).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from ringworld.errors import RingworldError
from ringworld.launch.procset import RankExit
from ringworld.store.records import DEAD_COUNT_KEY, DEAD_KEY, publish_failure

if TYPE_CHECKING:
    from ringworld.store.tcp import TCPStore

#: How a monitor's declaration of a rank without heartbeats starts.
NOT_RESPONDING = "not responding"
_ENTRY_WAIT = 0.5  # seconds: an entry is set just after the count is raised


class JobFailures:
    """The launcher's connection to the job store for failures: :meth:`tell` publishes a rank that
    failed, :meth:`unresponsive` reads the ranks the monitors declared not responding.

    Use as a context manager; the connection opens on first use. Both are best effort (what
    they find out is a report, not a condition of stopping the job) and never raise.
    """

    def __init__(self, address: str, secret: bytes) -> None:
        self._address = address
        self._secret = secret
        self._store: TCPStore | None = None
        self._seen = 0  # entries read
        self._declared: dict[int, str] = {}
        self._warned = False

    def __enter__(self) -> JobFailures:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _connect(self) -> TCPStore:
        if self._store is None:
            from ringworld.store.tcp import TCPStore

            host, _, port = self._address.rpartition(":")
            self._store = TCPStore(host, int(port), self._secret, timeout=2.0)
        return self._store

    def tell(self, failure: RankExit) -> None:
        """Publish ``failure``, a rank that failed on its own."""
        try:
            publish_failure(self._connect(), failure.rank, failure.describe(), None)
        except (OSError, RingworldError) as exc:
            print(f"ringworld: could not tell the ranks that rank {failure.rank} failed: {exc}",
                  file=sys.stderr)

    def unresponsive(self) -> dict[int, str]:
        """The ranks declared not responding so far, with why, first declared first.

        Cost: one store round trip, plus one per entry published since the last call.
        """
        try:
            store = self._connect()
            count = store.add(DEAD_COUNT_KEY, 0)
            while self._seen < count:
                raw = store.get(DEAD_KEY.format(self._seen + 1), timeout=_ENTRY_WAIT)
                self._seen += 1
                self._take(raw)
        except (OSError, RingworldError) as exc:  # the next call reads on from there
            if not self._warned:
                self._warned = True
                print(f"ringworld: could not read the failures the ranks found: {exc}",
                      file=sys.stderr)
        return dict(self._declared)

    def _take(self, raw: bytes) -> None:
        try:
            info: Any = json.loads(raw)
            rank, detail, by = info["rank"], info["detail"], info["by"]
        except (ValueError, TypeError, KeyError):
            return
        if (isinstance(rank, int) and isinstance(by, int) and isinstance(detail, str)
                and detail.startswith(NOT_RESPONDING) and rank not in self._declared):
            self._declared[rank] = f"{_why(detail)}, found by rank {by}"


def _why(detail: str) -> str:
    """``no heartbeat for 3.0 s (...)`` from ``not responding: no heartbeat for 3.0 s (...)``."""
    rest = detail[len(NOT_RESPONDING):].lstrip(": ")
    return rest or NOT_RESPONDING
