"""ringworld.MPI's repeat path for the v-variants (Allgatherv, Gatherv, Scatterv, Alltoallv,
and Reduce_scatter with its recvcounts).

Their specs (``[buf, (counts, displs), datatype]``) take 5-10 us a call to parse, where the
native call repeated on the same arrays takes 3-4. A loop repeating one call on the same small
arrays, with equal counts, reuses the last call's parsed native arguments: the byte views and
byte counts it passed, which the native repeat path then finds again (see
``Communicator._again_vector``). The views hold the arrays, so only arrays that own their
memory and are small (``HELD_BYTES``, as ``collective.cache`` holds the equal-block calls'
views) are kept: until the next call of that method on the communicator, or ``Free``.

A spec matches the kept one when its arrays and predefined datatypes are the same objects and
its counts and displacements (lists or tuples of ints, compared by value: a list changed in
place since no longer matches) are equal, and its op is the same predefined one; any other
item keeps the call from being kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import ringworld
from ringworld.collective.cache import HELD_BYTES
from ringworld.comm import hooks
from ringworld.mpi._buffer import SIMPLE_DTYPES
from ringworld.mpi._constants import IN_PLACE
from ringworld.mpi._op import predefined_native

_SAME = "is"  # a snapshot kind: the spec itself, by identity


def _ints(x: Any) -> Any:
    """A copy of counts or displacements (a list or tuple of ints, a pair of those, an int or
    None), else a marker that matches nothing."""
    if x is None or type(x) is int:
        return x
    if type(x) is list or type(x) is tuple:
        if all(type(i) is int for i in x):
            return x[:]
        if type(x) is tuple and len(x) == 2:
            pair = (_ints(x[0]), _ints(x[1]))
            if _NOTHING not in pair:
                return pair
    return _NOTHING


_NOTHING = object()


def _snapshot(spec: Any) -> Any:
    """What a later call's spec must match (see the module's docstring), or _NOTHING."""
    if (spec is None or spec is IN_PLACE or type(spec) is np.ndarray
            or predefined_native(spec) is not None):  # (a predefined MPI.Op: by identity)
        return (_SAME, spec)
    if type(spec) is int:
        return (int, spec)
    if type(spec) is not list and type(spec) is not tuple:
        return _NOTHING
    items = []
    for x in spec:
        if type(x) is np.ndarray or SIMPLE_DTYPES.get(id(x)) is not None:
            items.append(x)
        else:
            copy = _ints(x)
            if copy is _NOTHING:
                return _NOTHING
            items.append(copy)
    return (type(spec), tuple(items))


def _matches(spec: Any, snap: Any) -> bool:
    kind, held = snap
    if kind is _SAME:
        return spec is held
    if type(spec) is not kind:
        return False
    if kind is int:
        return bool(spec == held)
    if len(spec) != len(held):
        return False
    for x, h in zip(spec, held, strict=True):
        if type(h) is np.ndarray or (type(h) is not list and type(h) is not tuple
                                     and h is not None and type(h) is not int):
            if x is not h:  # an array or a datatype
                return False
        elif type(x) is not type(h):
            return False
        else:
            try:
                if x != h:
                    return False
            except (TypeError, ValueError):  # (an array inside counts: never kept)
                return False
    return True


def call(native: ringworld.Communicator, where: str, parts: tuple[Any, ...],
         run: Callable[..., None], parse: Callable[[], tuple[Any, ...]]) -> None:
    """``where``'s call: its kept native call again if ``parts`` (its specs, root or op, as
    passed) match the kept ones, else ``run(*parse())``, kept for the next call (its array
    spec to write into: ``parts[1]``)."""
    if not again(native, where, parts, run):
        args = parse()
        run(*args)
        keep(native, where, parts, 1, args)


def again(native: ringworld.Communicator, where: str, parts: tuple[Any, ...],
          run: Callable[..., None]) -> bool:
    """Run ``where``'s kept native call again (``run(*its arguments)``) if ``parts`` (the
    call's specs and root) match the kept ones; False, having done nothing, if not."""
    memo = native._cache.adapter.get(where)
    if memo is None or hooks.observing:
        return False
    snaps, written, args = memo
    for spec, snap in zip(parts, snaps, strict=True):
        if not _matches(spec, snap):
            return False
    for arr in written:
        if not arr.flags.writeable:
            return False
    run(*args)
    return True


def keep(native: ringworld.Communicator, where: str, parts: tuple[Any, ...], written: int,
         args: tuple[Any, ...]) -> None:
    """Keep ``where``'s call, just run as the native call on ``args``, for :func:`again`, if
    its specs ``parts`` can be matched and its arrays are small and own their memory
    (``parts[written]`` holds the arrays it writes into)."""
    snaps = tuple(_snapshot(p) for p in parts)
    if any(s is _NOTHING for s in snaps):
        native._cache.adapter.pop(where, None)
        return
    arrays: list[list[np.ndarray[Any, Any]]] = [[], []]
    for i, (kind, held) in enumerate(snaps):
        for x in (held,) if kind is _SAME else held if kind is not int else ():
            if type(x) is np.ndarray:
                if x.base is not None or x.nbytes > HELD_BYTES or not x.flags.c_contiguous:
                    native._cache.adapter.pop(where, None)
                    return
                arrays[i == written].append(x)
    native._cache.adapter[where] = (snaps, tuple(arrays[1]), args)
