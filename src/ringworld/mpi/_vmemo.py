"""ringworld.MPI's repeat path for the v-variants (Allgatherv, Gatherv, Scatterv, Alltoallv,
and Reduce_scatter with its recvcounts).

Their specs (``[buf, (counts, displs), datatype]``) take 5-10 us a call to parse, where the
native call repeated on arrays of the same shapes takes 3-4. A loop repeating one call on the
same arrays, with equal counts, reuses what the last call's parsing gave: its byte counts and
displacements as they were, and its buffers as views of this call's arrays, and runs the native
call that kept call ran again without the native repeat's checks of shapes and counts, which
this match has made (``Communicator._again_kept_vector``). The kept call knows its arrays by
weak reference, and each argument that was a view of one of them by where that array sits in
the specs and the view's dtype: the view is made again each call (0.1-0.3 us), or where the
memory under the array is a small numpy array's (``collective.cache.may_hold``, as that module
holds the equal-block calls' byte views) kept, which holds that memory until the next call of
that method on the communicator, or ``Free``.

A spec matches the kept one when its arrays (C-contiguous numpy arrays) and predefined
datatypes are the same objects and its counts and displacements (lists or tuples of ints,
compared by value: a list changed in place since no longer matches) are equal, and its op is
the same predefined one; any other item keeps the call from being kept. The match is a
function written for the kept call's shape of specs (as dataclasses write their methods:
compiled once per shape, the kept items its arguments): a test per item, no loop (an
Allgatherv's two specs, four items: 1.1 us looped, 0.13 written out).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

import ringworld
from ringworld.collective.cache import may_hold
from ringworld.comm import hooks
from ringworld.mpi._buffer import SIMPLE_DTYPES
from ringworld.mpi._constants import IN_PLACE
from ringworld.mpi._op import predefined_native

# how an item of a kept spec is matched: an array by weak reference, a predefined datatype or
# op (or None, IN_PLACE) by identity, counts and displacements by value (a copy), a root as int
# (markers compared by identity: the matching tests them inline)
_WEAK, _SAME, _VALUE = object(), object(), object()
_NOTHING = object()


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


def _item(x: Any) -> Any:
    """How ``x`` is matched later: (_WEAK, a weak reference) for a C-contiguous numpy array,
    (_SAME, it) for None, IN_PLACE, a predefined datatype or op, (_VALUE, a copy) for counts,
    displacements or an int; else _NOTHING."""
    if type(x) is np.ndarray:
        return (_WEAK, weakref.ref(x)) if x.flags.c_contiguous else _NOTHING
    if (x is None or x is IN_PLACE or SIMPLE_DTYPES.get(id(x)) is not None
            or predefined_native(x) is not None):
        return (_SAME, x)
    copy = _ints(x)
    return _NOTHING if copy is _NOTHING else (_VALUE, copy)


def _snapshot(spec: Any) -> Any:
    """What a later call's spec must match (see the module's docstring): (None, how its one
    item is matched) or (its list or tuple type, how each item is), else _NOTHING."""
    if type(spec) is not list and type(spec) is not tuple:
        found = _item(spec)
        return _NOTHING if found is _NOTHING else (None, (found,))
    items = tuple(_item(x) for x in spec)
    return _NOTHING if _NOTHING in items else (type(spec), items)


def _arrays(parts: tuple[Any, ...]) -> list[tuple[int, int, np.ndarray[Any, Any]]]:
    """The numpy arrays in ``parts``: (part index, item index or -1, the array)."""
    found = []
    for i, spec in enumerate(parts):
        if type(spec) is np.ndarray:
            found.append((i, -1, spec))
        elif type(spec) is list or type(spec) is tuple:
            found.extend((i, j, x) for j, x in enumerate(spec) if type(x) is np.ndarray)
    return found


# per shape of kept specs (each part's list or tuple type, or None, and how each item is
# matched), the function that makes its matcher from the kept items; compiled once per shape
_MATCHERS: dict[tuple[Any, ...], Callable[..., Callable[[tuple[Any, ...]], bool]]] = {}
_MATCHERS_KEPT = 256


def _matcher(snaps: tuple[Any, ...]) -> Callable[[tuple[Any, ...]], bool]:
    """A function of a call's parts that tells whether they match ``snaps`` (what
    :func:`_snapshot` made of each kept part), raising nothing."""
    shape = tuple((kind, tuple(how for how, _ in held)) for kind, held in snaps)
    make = _MATCHERS.get(shape)
    if make is None:
        if len(_MATCHERS) >= _MATCHERS_KEPT:
            _MATCHERS.clear()
        make = _MATCHERS[shape] = _compile(shape)
    values: list[Any] = []
    for kind, held in snaps:
        if kind is not None:
            values.append(kind)
        for how, h in held:
            values.append(h)
            if how is _VALUE:
                values.append(type(h))
    return make(*values)


def _compile(shape: tuple[Any, ...]) -> Callable[..., Callable[[tuple[Any, ...]], bool]]:
    """The source of a matcher of parts of ``shape`` (only names and indices are written into
    it; every kept item is an argument of the maker), compiled."""
    args: list[str] = []
    body: list[str] = []
    names = [f"p{i}" for i in range(len(shape))]
    body.append(f"({', '.join(names)},) = parts")
    for i, (kind, hows) in enumerate(shape):
        items = [names[i]]
        if kind is not None:
            body.append(f"if type({names[i]}) is not k{i} or len({names[i]}) != {len(hows)}: "
                        "return False")
            args.append(f"k{i}")
            items = [f"x{i}_{j}" for j in range(len(hows))]
            if items:
                body.append(f"({', '.join(items)},) = {names[i]}")
        for j, (how, x) in enumerate(zip(hows, items, strict=True)):
            h = f"h{i}_{j}"
            args.append(h)
            if how is _WEAK:
                body.append(f"if {h}() is not {x}: return False")
            elif how is _SAME:
                body.append(f"if {x} is not {h}: return False")
            else:
                args.append(f"t{i}_{j}")
                body.append(f"if type({x}) is not t{i}_{j} or {x} != {h}: return False")
    lines = "\n".join(f"            {b}" for b in body)
    source = (f"def make({', '.join(args)}):\n"
              f"    def match(parts):\n"
              f"        try:\n{lines}\n"
              f"        except (TypeError, ValueError):  # (an array inside counts)\n"
              f"            return False\n"
              f"        return True\n"
              f"    return match\n")
    space: dict[str, Any] = {}
    exec(compile(source, "<ringworld.MPI kept v-call>", "exec"), space)  # (our text only)
    make: Callable[..., Callable[[tuple[Any, ...]], bool]] = space["make"]
    return make


def call(native: ringworld.Communicator, where: str, parts: tuple[Any, ...],
         run: Callable[..., None], parse: Callable[[], tuple[Any, ...]]) -> None:
    """``where``'s call: its kept native call again if ``parts`` (its specs, root or op, as
    passed) match the kept ones, else ``run(*parse())``, kept for the next call (its array
    spec to write into: ``parts[1]``)."""
    if not again(native, where, parts, run):
        args = parse()
        run(*args)
        keep(native, where, parts, args)


def again(native: ringworld.Communicator, where: str, parts: tuple[Any, ...],
          run: Callable[..., None]) -> bool:
    """Run ``where``'s kept native call again, its buffers views of this call's arrays, if
    ``parts`` (the call's specs, root or op) match the kept ones; False, having done nothing,
    if not (or the array written into is no longer writable). Cost: the match, about 0.04 us
    an item (see :func:`_matcher`), and 0.3 us a view made again."""
    memo = native._cache.adapter.get(where)
    if memo is None or hooks.observing:
        return False
    match, fixed, remade, written, coll, native_entry = memo
    if not match(parts):
        return False
    for i, j in written:
        if not (parts[i] if j < 0 else parts[i][j]).flags.writeable:
            return False
    args: Any = fixed
    if remade:
        args = list(fixed)
        for at, i, j, dt in remade:
            src = parts[i] if j < 0 else parts[i][j]
            if not src.flags.c_contiguous:  # (its strides set in place: reshape would copy)
                return False
            args[at] = (src if src.ndim == 1 else src.reshape(-1)).view(dt)
    if native_entry is None:
        run(*args)  # (not kept natively: another transport, or in place)
    elif not native._again_kept_vector(coll, native_entry, args[0], args[1]):
        run(*args)  # (through the native repeat's checks, which keep it again: so here too)
        native._cache.adapter[where] = (*memo[:5], _native_entry(native, coll, tuple(args)))
    return True


def keep(native: ringworld.Communicator, where: str, parts: tuple[Any, ...],
         args: tuple[Any, ...]) -> None:
    """Keep ``where``'s call, just run as the native call on ``args``, for :func:`again`, if
    its specs ``parts`` can be matched and each argument that is an array is a whole view of
    one of their arrays (else the kept call, if any, goes)."""
    memo = native._cache.adapter
    snaps = tuple(_snapshot(p) for p in parts)
    if any(s is _NOTHING for s in snaps):
        memo.pop(where, None)
        return
    sources = _arrays(parts)
    fixed: list[Any] = []
    remade: list[tuple[int, int, int, np.dtype[Any]]] = []
    written: set[tuple[int, int]] = set()
    for at, arg in enumerate(args):
        if type(arg) is np.ndarray:
            address = arg.__array_interface__["data"][0]
            whose = [(i, j, a) for i, j, a in sources
                     if a.__array_interface__["data"][0] == address and a.nbytes == arg.nbytes]
            if not whose or not arg.flags.c_contiguous:
                memo.pop(where, None)
                return
            i, j, a = whose[0]
            if i == 1:  # (the receive spec's array: written into)
                written.add((i, j))
            # a view of that array, as this dtype: kept where it may hold the memory under it
            # (small numpy memory, as collective.cache's byte views), else made again each call
            if may_hold(a):
                fixed.append(arg)
            else:
                fixed.append(None)
                remade.append((at, i, j, arg.dtype))
        else:  # counts, displacements, a root, an op, None or IN_PLACE: as they were
            fixed.append(arg)
    coll = where.lower()
    memo[where] = (_matcher(snaps), tuple(fixed), tuple(remade), tuple(written), coll,
                   _native_entry(native, coll, args))


def _native_entry(native: ringworld.Communicator, coll: str, args: tuple[Any, ...]) -> Any:
    """The native repeat path's entry for the call just run on ``args`` (see
    ``CallCache.keep_vector``), which a match of this layer's kept call may run again without
    the native checks: its arrays are the same (or views of the same memory, of the same
    size: numpy resizes no array a weak reference refers to), its counts equal. None if the
    native call kept no entry, or not this call's."""
    entry = native._cache.vector.get(coll)
    bufs = [a for a in args[:2] if a is not None]
    if entry is None or any(type(a) is not np.ndarray for a in bufs):
        return None  # (IN_PLACE: never kept natively)
    try:
        same = ((entry[0], entry[1]) == tuple(None if a is None else a.shape for a in args[:2])
                and all(a.dtype is entry[3] for a in bufs) and entry[2] == tuple(args[2:]))
    except (TypeError, ValueError):
        return None
    return entry if same else None
