"""torch's store as a Ringworld store: how a torch job's ranks meet without ``ringworld run``.

``init_process_group`` hands the backend a ``torch.distributed.Store`` (a FileStore for
``file://``, a TCPStore for ``tcp://`` and ``env://``, a PrefixStore around either); the
Ringworld world of the default group is built over it (:func:`ringworld.runtime.world_over`),
under keys of its own (``ringworld/<meeting>/...``, see :meth:`TorchStore.for_group`), as
Gloo builds its context over the same store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ringworld.errors import StoreError, StoreTimeout
from ringworld.store.base import Store

PREFIX = "ringworld/"
_FOREVER = timedelta(days=365)


class TorchStore(Store):
    """Ringworld's :class:`~ringworld.store.base.Store` over a ``torch.distributed.Store``.

    Cost: one torch store round trip per call (two for a ``get`` with a timeout: a ``wait``
    first, as torch's ``get`` only knows the store's own timeout).
    """

    def __init__(self, store: Any, prefix: str = PREFIX) -> None:
        self._store = store
        self._prefix = prefix

    @classmethod
    def for_group(cls, store: Any, size: int) -> TorchStore:
        """The keys of one meeting of ``size`` ranks in ``store``, apart from every earlier
        meeting's: a store can outlive a job (torchrun's elastic restarts keep the agents'
        store; ``store=`` may be passed again), and an earlier meeting's keys (a barrier's
        count, a job id) would be taken for this one's. Collective: each rank takes a ticket;
        ``size`` consecutive tickets make one meeting. Cost: one store round trip."""
        attempt = ".".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID",
                                                           "TORCHELASTIC_RESTART_COUNT"))
        ticket = cls(store).add(f"meetings/{attempt}", 1)
        return cls(store, f"{PREFIX}{attempt}/{(ticket - 1) // size}/")

    def clone(self) -> TorchStore:
        """A second connection to the same store (for the liveness monitor's thread).

        Raises:
            StoreError: this kind of torch store cannot be cloned.
        """
        try:
            return TorchStore(self._store.clone(), self._prefix)
        except (RuntimeError, AttributeError) as exc:
            raise StoreError(f"torch's {type(self._store).__name__} cannot be cloned: {exc}") \
                from None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, lambda: self._store.set(self._prefix + key, value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self.wait([key], timeout)
        value: bytes = self._call("get", key, lambda: self._store.get(self._prefix + key))
        return value

    def add(self, key: str, amount: int) -> int:
        total: int = self._call("add", key, lambda: self._store.add(self._prefix + key, amount))
        return total

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        span = _FOREVER if timeout is None else timedelta(seconds=max(timeout, 0.001))
        self._call("wait", ", ".join(keys),
                   lambda: self._store.wait([self._prefix + k for k in keys], span), timeout)

    @staticmethod
    def _call(what: str, key: str, fn: Any, timeout: float | None = None) -> Any:
        try:
            return fn()
        except dist.DistStoreError as exc:
            if "timeout" in str(exc).lower():
                raise StoreTimeout(f"torch store: {what} {key!r}: not set within {timeout} s "
                                   f"({exc})") from None
            raise StoreError(f"torch store: {what} {key!r}: {exc}") from None
        except RuntimeError as exc:  # the store's server is gone, a file was removed, ...
            raise StoreError(f"torch store: {what} {key!r}: {exc}") from None


def store_address(store: Any) -> str | None:
    """``host:port`` of the TCPStore under ``store`` (PrefixStores unwrapped), else None: the
    route to it tells which interface a rank's TCP listener should bind (ranks on several
    hosts reach each other where they reach torch's store)."""
    for _ in range(16):  # PrefixStores nest a few deep
        if isinstance(store, dist.TCPStore):
            return f"{store.host}:{store.port}"
        inner = getattr(store, "underlying_store", None)
        if inner is None:
            return None
        store = inner
    return None
