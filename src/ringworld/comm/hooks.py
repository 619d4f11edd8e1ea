"""Explicit hook points: the calls a tool (the tracer) may observe, marked where they are defined.

A class whose methods may be observed is decorated with :func:`observed`; each such method with
:func:`observable` and its category (``"p2p"``, ``"collective"``, ``"management"`` or
``"wait"``; ``start=True`` for a nonblocking form, which returns a request). :func:`observe`
hands every marked method to a tool's wrapper factory and installs what it returns;
:func:`unobserve` puts the originals back. So the list of what can be observed lives with the
methods (a new collective is traced by marking it), and no tool patches classes by name.

Cost: nothing while nobody observes (the marks are attributes of the functions). A call does not
check for a hook each time because a wrapper costs 150-300 ns a call (measured: ``*args``
forwarding), 4-8% of an 8-byte allreduce.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)
MARK = "__ringworld_observable__"


class Mark(NamedTuple):
    """What :func:`observable` records on a method."""

    category: str
    start: bool  # a nonblocking form: it returns a request


#: ``wrap(mark, name, fn) -> replacement``: a tool's wrapper factory
Wrapper = Callable[[Mark, str, Callable[..., Any]], Callable[..., Any]]

_classes: list[type] = []
#: True while a tool observes: callers that take a shortcut past the observable methods (the
#: repeat path of ``ringworld.MPI``) go through them instead, so the tool sees every call
observing = False
_originals: dict[tuple[type, str], Callable[..., Any]] = {}
_lock = threading.Lock()


def observable(category: str, *, start: bool = False) -> Callable[[F], F]:
    """Mark a method as observable in ``category`` (it is returned unchanged)."""

    def mark(fn: F) -> F:
        setattr(fn, MARK, Mark(category, start))
        return fn

    return mark


def observed(cls: C) -> C:
    """Register a class whose :func:`observable` methods :func:`observe` may wrap."""
    if cls not in _classes:
        _classes.append(cls)
    return cls


def marked() -> list[tuple[type, str, Mark]]:
    """Every observable method: (its class, its name, its mark)."""
    found = []
    for cls in _classes:
        for name, fn in vars(cls).items():
            mark = getattr(_originals.get((cls, name), fn), MARK, None)
            if isinstance(mark, Mark):
                found.append((cls, name, mark))
    return found


def observe(wrap: Wrapper) -> None:
    """Install ``wrap(mark, name, fn)`` in place of every observable method (once: a second
    call while observed replaces the first tool's wrappers)."""
    global observing
    with _lock:
        for cls, name, mark in marked():
            fn = _originals.setdefault((cls, name), vars(cls)[name])
            setattr(cls, name, wrap(mark, name, fn))
        observing = True


def unobserve() -> None:
    """Put every original method back."""
    global observing
    with _lock:
        for (cls, name), fn in _originals.items():
            setattr(cls, name, fn)
        _originals.clear()
        observing = False
