"""Runners for the repeats of small shared-memory collectives.

A small allreduce, allgather, alltoall or reduce_scatter_block is one sync through the slots
(see :mod:`ringworld.algorithms.shm_collectives`): each rank copies its input into its slot,
syncs, and reads every rank's. At 8 bytes that is a few microseconds, and the lookups around
it (the slots' views for this dtype and count, which block is this rank's, how to combine) are
a good part of them. A program repeats the same call, so :func:`quick` does them once, for a
call's shape, and returns a runner that only copies, syncs and reads (and copies the blocks out
with one ``np.concatenate`` rather than a slice assignment per rank). Same job, np=2, 8-byte
blocks, with and without it: allreduce 3.53 -> 2.80 us, allgather 3.73 -> 2.89, alltoall 4.02
-> 3.02, reduce_scatter_block 4.28 -> 3.04; np=4 on two cores within the noise (+2% to -12%).
A small bcast is one entry of the root's eager ring: its runner is the arena's
(:meth:`~ringworld.algorithms.shm_arena.Arena.bcast_runner`; 3.25 -> 2.25 us).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ringworld.algorithms.shm_arena import EAGER_SMALL
from ringworld.algorithms.shm_collectives import _combine_in_rank_order

if TYPE_CHECKING:
    from ringworld.algorithms.shm_arena import Arena
    from ringworld.comm.ops import Op

Array = np.ndarray[Any, Any]
Runner = Callable[["Arena", Array, Array, "Op | None", int], None]


def quick(a: Arena, coll: str, send: Array, recv: Array, op: Op | None,
          root: int) -> Runner | None:
    """A runner of ``coll`` on ``a`` with ``shm_collectives.RUN[coll]``'s arguments (its
    ``a``, op and root are those given here), for flat arrays of ``send``'s and ``recv``'s
    dtype and size, that takes the same steps; None where such a call does not go through
    the slots or a small eager entry (larger ones, other collectives). Cost: the slots' or
    entries' views, once."""
    p, r = a.chan.size, a.chan.rank
    dt = recv.dtype
    if coll == "bcast":
        return a.bcast_runner(root, recv) if recv.nbytes <= EAGER_SMALL else None
    if coll == "allreduce" and op is not None and recv.nbytes <= a.small_reduce:
        return _allreduce(a, op, _by_epoch(a, dt, recv.size))
    if send.nbytes > a.small or coll not in ("allgather", "alltoall", "reduce_scatter_block"):
        return None
    views = _by_epoch(a, dt, send.size)
    if coll == "allgather":
        return _gather(a, views)
    n = send.size // p  # alltoall and reduce_scatter_block: this rank's block of every slot
    own = tuple(tuple(s[r * n : (r + 1) * n] for s in v) for v in views)
    if coll == "alltoall":
        return _gather(a, views, own)
    return None if op is None else _allreduce(a, op, views, own)


def _by_epoch(a: Arena, dt: np.dtype[Any], count: int) -> tuple[list[Array], list[Array]]:
    """Every rank's slots as ``count`` of ``dt``, indexed by the arena's epoch's parity (the
    next sync's slots are the other parity's)."""
    return a.slots(1, dt, count), a.slots(0, dt, count)


def _allreduce(a: Arena, op: Op, views: tuple[list[Array], list[Array]],
               blocks: tuple[tuple[Array, ...], ...] | None = None) -> Runner:
    """Copy in, sync, combine every rank's slot (or ``blocks``: a block of each) in rank
    order, as the slot paths of allreduce and reduce_scatter_block."""
    r = a.chan.rank
    ins = views if blocks is None else blocks
    uf = op.ufunc if a.chan.size == 2 else None

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        e = a.epoch & 1
        views[e][r][...] = send
        a.sync()
        x = ins[e]
        if uf is not None:
            uf(x[0], x[1], out=recv)
        else:
            _combine_in_rank_order(op, recv, x)

    return run


def _gather(a: Arena, views: tuple[list[Array], list[Array]],
            blocks: tuple[tuple[Array, ...], ...] | None = None) -> Runner:
    """Copy in, sync, copy every rank's slot (or ``blocks``: a block of each) into ``recv``
    in rank order, as the slot paths of allgather and alltoall."""
    r = a.chan.rank
    ins = views if blocks is None else blocks
    concatenate = np.concatenate

    def run(_: Arena, send: Array, recv: Array, _op: Op | None, _root: int) -> None:
        e = a.epoch & 1
        views[e][r][...] = send
        a.sync()
        concatenate(ins[e], out=recv)

    return run
