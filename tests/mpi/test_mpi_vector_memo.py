"""ringworld.MPI's kept v-call matcher (``mpi._vmemo``): the function written for a kept call's
shape of specs matches the same objects and equal counts only, raises nothing, and is compiled
once per shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from ringworld import MPI
from ringworld.mpi import _vmemo


def _kept(*parts: Any) -> Any:
    snaps = tuple(_vmemo._snapshot(p) for p in parts)
    assert all(s is not _vmemo._NOTHING for s in snaps)
    return _vmemo._matcher(snaps)


def test_the_matcher_takes_the_same_objects_and_equal_counts_only() -> None:
    send, recv = np.ones(3), np.zeros(6)
    counts, displs = [1, 2, 3], [0, 1, 3]
    match = _kept(send, [recv, (counts, displs), MPI.DOUBLE], 2)
    assert match((send, [recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE], 2))
    counts[0] = 9  # the kept counts are a copy: the list changed in place matches no more
    assert match((send, [recv, (counts, displs), MPI.DOUBLE], 2)) is False
    unlike = [
        (send.copy(), [recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE], 2),  # another array
        (send, [recv.copy(), ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE], 2),
        (send, [recv, ([1, 2, 4], [0, 1, 3]), MPI.DOUBLE], 2),  # other counts
        (send, [recv, ([1, 2, 3], (0, 1, 3)), MPI.DOUBLE], 2),  # a tuple where a list was
        (send, [recv, ([1, 2, 3], [0, 1, 3]), MPI.FLOAT], 2),  # another datatype
        (send, (recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE), 2),  # a tuple spec, not a list
        (send, [recv, ([1, 2, 3], [0, 1, 3])], 2),  # fewer items
        (send, [recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE], 1),  # another root
        (send, [recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE], 2.0),  # a root of another type
        (send, [recv, (np.array([1, 2, 3]), [0, 1, 3]), MPI.DOUBLE], 2),  # an array as counts
        (send, [recv, ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE]),  # fewer parts
        (send, [recv, 5, MPI.DOUBLE], 2),
    ]
    for parts in unlike:
        assert match(parts) is False, parts


def test_a_dead_array_matches_nothing_and_shapes_compile_once() -> None:
    recv = np.zeros(2)
    match = _kept(np.ones(1), [recv, MPI.DOUBLE])  # (its sendbuf gone at once)
    assert match((np.ones(1), [recv, MPI.DOUBLE])) is False
    before = len(_vmemo._MATCHERS)
    a, b = np.ones(2), np.zeros(2)
    again = _kept(a, [b, MPI.DOUBLE])  # the same shape of specs: the same compiled maker
    assert len(_vmemo._MATCHERS) == before
    assert again((a, [b, MPI.DOUBLE])) and not again((a, [b, MPI.INT]))
    empty = _kept(a, [])  # (an empty spec: the call raises, but its shape compiles)
    assert empty((a, [])) and not empty((a, [b]))
