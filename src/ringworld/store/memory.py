"""An in-process store for the threads of one process (tests, threaded worlds).

Also home of the argument checks every store shares (:func:`check_key`, :func:`check_timeout`,
:func:`check_amount`) and of the counter encoding ``add`` uses (decimal ASCII, as in torch).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from ringworld.errors import StoreError, StoreTimeout
from ringworld.store.base import Store


def check_key(key: object) -> str:
    """Return ``key`` if it is a non-empty ``str``.

    Raises:
        TypeError: ``key`` is not a ``str``.
        ValueError: ``key`` is empty.
    """
    if not isinstance(key, str):
        raise TypeError(f"store key must be a str, got {type(key).__name__}: {key!r}")
    if not key:
        raise ValueError("store key must not be empty")
    return key


#: the longest single sleep of a store's wait (a waiting loop then looks at the clock again): a
#: timeout of a few billion seconds or more is valid, but a sleep that long overflows the
#: platform's time_t (OverflowError from the lock or the selector)
SLEEP_SLICE = 3600.0


def check_timeout(timeout: float | None) -> float | None:
    """Return ``timeout`` as seconds (``None`` = forever; ``inf`` is turned into ``None``).

    Raises:
        TypeError: ``timeout`` is not a number.
        ValueError: ``timeout`` is negative or NaN.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    value = float(timeout)
    if math.isnan(value) or value < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return None if math.isinf(value) else value


def check_amount(amount: object) -> int:
    """Return ``amount`` if it is an ``int`` (not a ``bool``).

    Raises:
        TypeError: ``amount`` is not an integer.
    """
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"add amount must be an int, got {amount!r}")
    return amount


def check_value(value: object) -> bytes:
    """Return ``value`` as ``bytes`` (one copy unless it already is ``bytes``).

    Raises:
        TypeError: ``value`` does not support the buffer protocol.
    """
    if isinstance(value, bytes):
        return value
    try:
        return bytes(memoryview(value))  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"store value must be bytes-like, got {type(value).__name__}") from None


def parse_counter(key: str, raw: bytes | bytearray | None) -> int:
    """Decode the counter stored at ``key`` (``None`` counts as 0).

    Raises:
        StoreError: the value is not a decimal integer.
    """
    if raw is None:
        return 0
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise StoreError(
            f"store key {key!r} holds {bytes(raw[:32])!r}, not an integer counter"
        ) from None


def timeout_message(keys: Sequence[str], timeout: float) -> str:
    """The text of a :class:`StoreTimeout` for ``keys`` missing after ``timeout`` seconds."""
    what = f"key {keys[0]!r}" if len(keys) == 1 else f"keys {list(keys)!r}"
    return f"store {what} not set within {timeout:g} s"


class MemoryStore(Store):
    """A thread-safe dictionary store; blocking calls wait on a :class:`threading.Condition`.

    ``close()`` wakes every blocked caller with :class:`StoreError` and makes later calls raise
    it, which a threaded test harness can use to abort a world stuck in a rendezvous.
    """

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the memory store is closed")

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` and wake waiters. Cost: O(1) plus a copy of non-bytes.

        Raises:
            StoreError: the store is closed.
        """
        key = check_key(key)
        data = check_value(value)
        with self._cond:
            self._check_open()
            self._data[key] = data
            self._cond.notify_all()

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until it is set.

        Raises:
            StoreTimeout: ``key`` was not set within ``timeout`` seconds.
            StoreError: the store is (or gets) closed.
        """
        key = check_key(key)
        self._wait_for([key], check_timeout(timeout))
        with self._cond:
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key`` (0 if unset); return the new value.

        Raises:
            StoreError: the store is closed or ``key`` holds a non-integer value.
        """
        key = check_key(key)
        amount = check_amount(amount)
        with self._cond:
            self._check_open()
            value = parse_counter(key, self._data.get(key)) + amount
            self._data[key] = str(value).encode("ascii")
            self._cond.notify_all()
            return value

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set.

        Raises:
            StoreTimeout: some key was not set within ``timeout`` seconds (names the missing ones).
            StoreError: the store is (or gets) closed.
        """
        self._wait_for([check_key(k) for k in keys], check_timeout(timeout))

    def _wait_for(self, keys: list[str], timeout: float | None) -> None:
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with self._cond:
            while True:
                self._check_open()
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeout(timeout_message(missing, deadline - start))
                self._cond.wait(min(left, SLEEP_SLICE))

    def close(self) -> None:
        """Close the store: blocked and later calls raise :class:`StoreError`; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
