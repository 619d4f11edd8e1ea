"""The Store contract (after Gloo's and torch's stores).

A store holds byte values under string keys for the lifetime of a job. Every blocking call takes a
timeout in seconds (``None`` waits forever) and raises :class:`~ringworld.errors.StoreTimeout`
when it runs out. Implementations: ``MemoryStore`` (threads of one process), ``TCPStore``
(authenticated, served by the launcher) and ``PrefixStore`` (scopes keys).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class Store(ABC):
    """A key-value store for rendezvous."""

    @abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""

    @abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until it is set.

        Raises:
            StoreTimeout: the key was not set within ``timeout`` seconds.
        """

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer counter at ``key`` (0 if unset); return it."""

    @abstractmethod
    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set.

        Raises:
            StoreTimeout: some key was not set within ``timeout`` seconds.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Release the store's resources (connections); idempotent."""


def store_barrier(store: Store, name: str, size: int, timeout: float | None = None) -> None:
    """Wait until ``size`` participants have called this with the same ``name``.

    Cost: one ``add`` and one ``wait`` round trip per participant.

    Raises:
        StoreTimeout: not everyone arrived within ``timeout`` seconds.
    """
    arrived = store.add(f"{name}/count", 1)
    if arrived == size:
        store.set(f"{name}/done", b"1")
    store.wait([f"{name}/done"], timeout)
