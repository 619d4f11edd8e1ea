"""The runners of repeated small rooted collectives. First scatter's
(``Arena.bcast_runner`` with a block per rank: up to EAGER_MAX bytes in all, through the small
entries of the root's eager ring up to EAGER_SMALL, its large ones above, which a scatter
shares with the broadcasts): every dtype, counts 0, 1, 7, the most that fits EAGER_SMALL and
one element more (a large entry), the most that fits EAGER_MAX and one element more (the plain
path), around SCATTER_APART, from root 0, the middle rank and the last, into a separate buffer
and in place, repeated on the same arrays and on new ones. Every call has new data (per
element, root and call) and the receivers' buffers first hold bytes the root never sends, so
a runner that read another call's entry, another rank's block or nothing is caught. Then
long runs mixed with broadcasts and other calls, small and large, the receivers behind at
times, so that the root's entries of both sizes wrap around and it waits for ring space.

Then gather's, alike: ``Arena.gather_runner`` (each sender's block in its own eager ring)
where ranks share cores or there are two, else (three or more ranks with cores of their own)
``shm_repeat._gather`` at the root and ``_put`` elsewhere (through the slots, one sync): every
dtype, counts up to the slots' size (or EAGER_MAX bytes, and EAGER_SMALL, the largest small
entry) and one element over it, both roots, in place, with a sync between repeats so that
they start at both slot parities."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest
from coll_support import AFFINE
from test_coll_shm_repeat import FILL, PLAIN, PLAN, _bcast_data

import ringworld
from ringworld import runtime
from ringworld.algorithms import shm_collectives
from ringworld.algorithms.shm_policy import EAGER_MAX, EAGER_RING, EAGER_SMALL, SCATTER_APART
from ringworld.testing import run_processes

Array = np.ndarray[Any, Any]


class Scatters:
    """Scatters with fresh data each, checked byte for byte on every rank."""

    def __init__(self, comm: ringworld.Communicator) -> None:
        self.comm = comm
        self.t = 0
        self.errors: list[str] = []

    def scatter(self, dt: np.dtype[Any], root: int, send: Array | None, recv: Array,
                in_place: bool, tag: str) -> None:
        comm, p, r = self.comm, self.comm.size, self.comm.rank
        n = recv.size
        self.t += 1
        data = _bcast_data(dt, p * n, root, self.t)
        if r == root:
            assert send is not None
            send[...] = data
        if not (in_place and r == root):
            recv.view(np.uint8)[...] = FILL
        comm.scatter(send if r == root else None,
                     ringworld.IN_PLACE if in_place and r == root else recv, root)
        got = (send[r * n : (r + 1) * n] if in_place and r == root else recv).view(np.uint8)
        want = data[r * n : (r + 1) * n].view(np.uint8)
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            self.errors.append(
                f"scatter {dt} n={n} root={root} {tag} (call {self.t}, rank {r}): {bad.size} "
                f"bytes wrong, first at byte {bad[0]}"
                f"{' (never sent: unwritten)' if got[bad[0]] == FILL else ''}")
        if r == root and not np.array_equal(send.view(np.uint8), data.view(np.uint8)):
            self.errors.append(f"scatter {dt} n={n} root={root} {tag}: the root's send changed")

    def kept(self, dt: np.dtype[Any], n: int, what: str) -> None:
        """After repeats: a scatter runner up to EAGER_MAX bytes in all, else RUN's entry."""
        comm = self.comm
        if comm.size == 1 or n == 0:
            return
        if comm.last_algorithm != "shm":
            self.errors.append(f"{what}: ran {comm.last_algorithm}, not shm")
            return
        last = comm._cache.last.get("scatter")
        if not isinstance(last, tuple) or not callable(last[5]):
            self.errors.append(f"{what}: no call kept ({last!r})")
            return
        plain = last[5] is shm_collectives.RUN["scatter"]
        if n * comm.size * dt.itemsize <= EAGER_MAX and plain:
            self.errors.append(f"{what}: repeats run shm_collectives.RUN's entry, no runner")
        if n * comm.size * dt.itemsize > EAGER_MAX and not plain:
            self.errors.append(f"{what}: over EAGER_MAX bytes, kept {last[5]}")


def _matrix(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    c = Scatters(comm)
    for dt in (*PLAIN, AFFINE):
        small, most = EAGER_SMALL // (p * dt.itemsize), EAGER_MAX // (p * dt.itemsize)
        # (from SCATTER_APART bytes a block the root's entry leaves its own out: a root in the
        # middle puts the blocks before and after it)
        apart = -(-SCATTER_APART // dt.itemsize)
        for n in (0, 1, 7, small, small + 1, apart - 1, apart, most, most + 1):
            for root in sorted({0, p // 2, p - 1}):
                for in_place in (False, True):
                    send, recv = np.empty(p * n, dt), np.empty(n, dt)
                    for k, fresh in enumerate(PLAN):
                        if fresh:
                            send, recv = np.empty(p * n, dt), np.empty(n, dt)
                        c.scatter(dt, root, send if r == root else None, recv, in_place,
                                  f"repeat {k}{' (new arrays)' * fresh}"
                                  f"{' in place' * in_place}")
                    c.kept(dt, n, f"scatter {dt} n={n} root={root}")
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_scatter_repeats_every_dtype_and_count(size: int) -> None:
    results = run_processes(size, _matrix, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []


def _ring(comm: ringworld.Communicator) -> list[str]:
    """Scatters of a few shapes from both roots, small entries and large, more than twice
    EAGER_RING of them, with broadcasts (which take entries of the same ring, small and large),
    barriers and allreduces between them and receivers that fall behind at times, in an order
    the same on every rank."""
    p, r = comm.size, comm.rank
    c = Scatters(comm)
    i64, f32 = np.dtype(np.int64), np.dtype(np.float32)
    shapes = [(i64, 3, 0), (i64, 3, p - 1), (f32, EAGER_SMALL // (4 * p), p - 1),
              (f32, EAGER_MAX // (4 * p), 0), (i64, EAGER_SMALL // (8 * p) + 1, p - 1)]
    arrays = [(np.empty(p * n, dt), np.empty(n, dt)) for dt, n, _ in shapes]
    bcast_buf = np.empty(5, i64)
    big = np.empty(EAGER_SMALL // 8 + 3, i64)  # (a large entry)
    rng = random.Random(11 * p)  # the same draws on every rank
    for k in range(3 * EAGER_RING):
        j = rng.randrange(len(shapes))
        dt, n, root = shapes[j]
        between, pause = rng.random(), rng.random() < 0.05
        if between < 0.1:
            comm.barrier()
        elif between < 0.3:
            bcast_buf[:] = np.arange(5) + k if r == root else -1
            comm.bcast(bcast_buf, root)
            if bcast_buf.tolist() != list(range(k, k + 5)):
                c.errors.append(f"bcast between {k}: {bcast_buf.tolist()}")
        elif between < 0.4:
            big[:] = np.arange(big.size) * k if r == root else -1
            comm.bcast(big, root)
            bad = np.flatnonzero(big != np.arange(big.size) * k)
            if bad.size:
                c.errors.append(f"large bcast between {k}: {bad.size} wrong, first at {bad[0]}")
        elif between < 0.45:
            out = np.empty(2, i64)
            comm.allreduce(np.full(2, k, i64), out)
            if out.tolist() != [k * p] * 2:
                c.errors.append(f"allreduce between {k}: {out.tolist()}")
        if pause and r != root:
            time.sleep(0.02)
        send, recv = arrays[j]
        c.scatter(dt, root, send if r == root else None, recv, False, f"mixed {k}")
    for dt, n, root in shapes:
        c.kept(dt, n, f"scatter {dt} n={n} root={root} last")
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_scatter_repeats_wrap_the_ring_beside_broadcasts(size: int) -> None:
    results = run_processes(size, _ring, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []


def _gathers(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    t = 0
    out = np.empty(2, np.int64)
    for dt in (*PLAIN, AFFINE):
        comm.allreduce(np.ones(2, np.int64), out)  # (the arena exists: its slots' size)
        arena = comm._arena  # (None on one rank: no windows)
        # blocks up to the slots' size, or EAGER_MAX in the eager rings (ranks share cores, or
        # two ranks), have a runner, below the direct path's size where ranks may take it: up
        # to that and one element over it (and EAGER_SMALL, the largest of the small entries,
        # and one element over it: a large one)
        limit = (64 if arena is None else EAGER_MAX if arena.crowded or p == 2
                 else arena.small)
        if arena is not None and arena.direct:
            limit = min(limit, arena.direct_min["gather"] - 1)
        most, small = limit // dt.itemsize, EAGER_SMALL // dt.itemsize
        for n in (0, 1, 7, small, small + 1, most, most + 1):
            for root in sorted({0, p - 1}):
                for in_place in (False, True):
                    send, recv = np.empty(n, dt), np.empty(p * n, dt)
                    for k, fresh in enumerate(PLAN):
                        if fresh:
                            send, recv = np.empty(n, dt), np.empty(p * n, dt)
                        if k == 4:  # a sync between repeats: the next starts at the other parity
                            comm.barrier()  # (a sync in the windows)
                        t += 1
                        mine = _bcast_data(dt, n, r, t)  # (unique per element, rank, call)
                        if r == root:
                            recv.view(np.uint8)[...] = FILL
                        if in_place and r == root:
                            recv[r * n : (r + 1) * n] = mine
                        else:
                            send[...] = mine
                        comm.gather(ringworld.IN_PLACE if in_place and r == root else send,
                                    recv if r == root else None, root)
                        if r != root:
                            continue
                        want = np.concatenate([_bcast_data(dt, n, i, t) for i in range(p)])
                        if not np.array_equal(recv.view(np.uint8), want.view(np.uint8)):
                            bad = np.flatnonzero(recv.view(np.uint8) != want.view(np.uint8))
                            errors.append(f"gather {dt} n={n} root={root} repeat {k}"
                                          f"{' in place' * in_place} (call {t}): {bad.size} "
                                          f"bytes wrong, first at byte {bad[0]}")
                if arena is not None and n and comm.last_algorithm == "shm":
                    last = comm._cache.last.get("gather")
                    plain = isinstance(last, tuple) and last[5] is shm_collectives.RUN["gather"]
                    if n * dt.itemsize <= limit and plain:
                        errors.append(f"gather {dt} n={n} root={root}: no runner kept")
    return errors


@pytest.mark.parametrize(("size", "own_cores"),
                         [(1, False), (2, False), (3, False), (5, False), (3, True)])
def test_gather_repeats_every_dtype_and_count(size: int, own_cores: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``own_cores``: ranks that count a core each (inherited by the forked ranks), so that
    three of them take the slots' runners on a machine of any size."""
    if own_cores:
        monkeypatch.setattr(runtime, "usable_cpus", lambda: 64)
    results = run_processes(size, _gathers, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []


def _mixed_paths(comm: ringworld.Communicator) -> list[str]:
    """Broadcasts, scatters and gathers, small entries and large, repeated past both rings'
    lengths, where one side runs its runner and the other the plain path each call (it names
    the algorithm, so no repeat of its is run straight: see ``Communicator._again``): the
    root's runner and the plain receivers (or the other way round) must agree on which entry
    holds the data."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    dt = np.dtype(np.int64)
    t = 0
    # elements per block: in a small entry, in a large one (a gather's block; a scatter's
    # blocks and a broadcast's p blocks in all), the most a large entry holds
    for n in (3, EAGER_SMALL // 8 + 1, EAGER_MAX // (8 * p)):
        for plain_root in (False, True):
            root = p - 1
            kw: dict[str, Any] = {"algorithm": "shm"} if (r == root) == plain_root else {}
            for k in range(EAGER_RING + 3):
                t += 1
                data = _bcast_data(dt, p * n, root, t)
                if p * n * 8 <= EAGER_MAX:
                    buf = data.copy() if r == root else np.full(p * n, -1, dt)
                    comm.bcast(buf, root, **kw)
                    if not np.array_equal(buf, data):
                        errors.append(f"bcast n={p * n} plain_root={plain_root} repeat {k}")
                    recv = np.full(n, -1, dt)
                    comm.scatter(data if r == root else None, recv, root, **kw)
                    if not np.array_equal(recv, data[r * n : (r + 1) * n]):
                        errors.append(f"scatter n={n} plain_root={plain_root} repeat {k}")
                out = np.full(p * n, -1, dt) if r == root else None
                comm.gather(_bcast_data(dt, n, r, t), out, root, **kw)
                want = np.concatenate([_bcast_data(dt, n, i, t) for i in range(p)])
                if out is not None and not np.array_equal(out, want):
                    errors.append(f"gather n={n} plain_root={plain_root} repeat {k}")
    return errors


@pytest.mark.parametrize(("size", "crowded"), [(2, False), (2, True), (3, True)])
def test_runners_and_plain_calls_agree_on_entries(size: int, crowded: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank on its runner beside ranks on the plain path (a runner's stamps say which entry
    holds its data, as the plain path's do); crowded: gathers through the eager rings."""
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    results = run_processes(size, _mixed_paths, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []
