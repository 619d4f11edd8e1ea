"""A view of another store with every key scoped under a prefix (``"<prefix>/<key>"``)."""

from __future__ import annotations

from collections.abc import Sequence

from ringworld.errors import StoreError
from ringworld.store.base import Store
from ringworld.store.memory import check_key


class PrefixStore(Store):
    """Scope the keys of ``store`` under ``prefix``, so that separate users cannot collide.

    The wrapped store is shared, not owned: :meth:`close` closes this view only. Errors (timeouts
    included) come from the wrapped store and name the full, prefixed keys.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        """Wrap ``store``. Raises ``TypeError``/``ValueError`` for a bad prefix or store."""
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.prefix = check_key(prefix)
        self.store = store
        self._closed = False

    def _key(self, key: str) -> str:
        if self._closed:
            raise StoreError(f"the prefix store {self.prefix!r} is closed")
        return f"{self.prefix}/{check_key(key)}"

    def set(self, key: str, value: bytes) -> None:
        """Set ``<prefix>/<key>`` in the wrapped store; raises what it raises."""
        self.store.set(self._key(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return ``<prefix>/<key>`` from the wrapped store, waiting up to ``timeout`` seconds.

        Raises:
            StoreTimeout: the key was not set in time.
            StoreError: this view is closed, or the wrapped store failed.
        """
        return self.store.get(self._key(key), timeout)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``<prefix>/<key>``; return the new value."""
        return self.store.add(self._key(key), amount)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Wait until every ``<prefix>/<key>`` is set.

        Raises:
            StoreTimeout: some key was not set within ``timeout`` seconds.
            StoreError: this view is closed, or the wrapped store failed.
        """
        self.store.wait([self._key(k) for k in keys], timeout)

    def close(self) -> None:
        """Close this view (later calls raise :class:`StoreError`); the wrapped store stays open."""
        self._closed = True
