"""The runners of repeated v-collectives in the shared windows
(:func:`ringworld.algorithms.shm_repeat.quick_vector`, made by ``Communicator._rerun_vector``
on a kept call's first repeat and kept at index 10 of its ``CallCache.vector`` entry).

allgatherv, gatherv and scatterv (from root 0 and from the last rank) and alltoallv, on 1, 2,
3 and 5 ranks whose windows are not crowded (the ranks' core count patched), with counts that
differ by rank (0, 1, 2, 3), in int8, int32, float64 and complex128, packed, with a gap at the
end and with gaps in reverse rank order; each shape repeated on the same arrays and on new
ones, with new data every call (per element, block and call), checked against numpy, the gaps
left alone. After every small call each rank's slot of
that sync's parity must hold what shm_vector's own step writes there (its header words, its
blocks): a runner that went through the other parity is caught even where no rank overtook
another. The repeats must run a runner (not ``shm_vector.RUN``'s entry); blocks too large for
the slots run ``RUN``'s entry. Crowded windows run runners too: of the slots for allgatherv and
alltoallv, of the eager rings for scatterv and gatherv (``shm_vector.eager_scatterv_runner``
and ``eager_gatherv_runner``), up to the most an entry holds (one element more: ``RUN``'s entry
on the ranks that know, the others' runners handing over to shm_vector's steps).

Then: repeats with other calls between them (both slot parities); disagreements on a repeat
(a rank that passes a new shape beside ranks that run their runners) raise MismatchError on
the ranks that see them, with the messages of the checked path, and the communicator stays
usable (in crowded windows too, through the eager rings); a root's large blocks beside a
runner (its header hands the rest of the call to shm_vector's steps: blocks read or written
straight, or the message path); and
``ringworld.MPI``'s Gatherv, Scatterv, Allgatherv and Alltoallv repeated on the same arrays.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld import runtime
from ringworld.algorithms import shm_vector
from ringworld.algorithms.shm_policy import EAGER_MAX
from ringworld.errors import MismatchError
from ringworld.testing import run_processes

Array = np.ndarray[Any, Any]
RUN = shm_vector.RUN
I8, I32, F64, C128 = (np.dtype(t) for t in (np.int8, np.int32, np.float64, np.complex128))
DTYPES = (I8, I32, F64, C128)
#: elements a block, by (rank + shift) % 5: none, one, uneven
PATTERN = (2, 0, 1, 3, 1)
#: displacements: packed (passed as None), packed with three spare elements at the end
#: (passed), and in reverse rank order with gaps of two (passed)
LAYOUTS = ("packed", "padded", "gapped")
#: each shape's calls: True on new arrays (the first call: the checked path, kept; the second,
#: on the same arrays, makes the runner)
PLAN = (True, False, False, True, False, True)
WAIT = 60  # seconds a run of ranks may take at most


@pytest.fixture
def roomy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks with cores of their own (the windows not crowded), on any machine (the ranks are
    forked: they see the patched count)."""
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 64)


@pytest.fixture
def crowded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that share cores (the windows crowded)."""
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)


def _values(dt: np.dtype[Any], n: int, who: int, t: int) -> Array:
    """Block ``who``'s ``n`` elements in call ``t``: they differ from element to element and
    block to block within a call (int8: for blocks up to 8 elements and ``who`` up to 30), and
    every element changes from one call to the next; never :func:`_sentinel`'s value."""
    i = np.arange(n, dtype=np.int64)
    if dt.itemsize == 1:
        return ((who * 8 + i + t * 67) % 251 - 125).astype(dt)
    base = ((t * 53 + who) * 65_537 + i) % (2**31 - 2) + 1
    if dt.kind == "c":
        return (base + 1j * (3 * base + 1)).astype(dt)
    return base.astype(dt)


def _sentinel(dt: np.dtype[Any]) -> Any:
    """What no rank sends: a result element left unwritten shows."""
    return -128 if dt.itemsize == 1 else -1


def _place(counts: list[int], layout: str) -> tuple[list[int], list[int] | None, int]:
    """(displacements, as passed (None: packed), the buffer's length) of ``layout``."""
    p = len(counts)
    packed = [sum(counts[:i]) for i in range(p)]
    if layout == "packed":
        return packed, None, sum(counts)
    if layout == "padded":
        return packed, packed[:], sum(counts) + 3
    displs, at = [0] * p, 1
    for i in reversed(range(p)):
        displs[i] = at
        at += counts[i] + 2
    return displs, displs[:], at


def _where(counts: list[int], me: int) -> list[int]:
    """Where each block lies in the slot of the rank ``me`` that packs them (its own block
    is not there: the offset it would have)."""
    where, at = [], 0
    for i, n in enumerate(counts):
        where.append(at)
        if i != me:
            at += n
    return where


class Shape:
    """One v-call's shape on ``p`` ranks: every rank's counts and displacements (so each rank
    knows every block), and how a rank fills, calls and checks it. Block ids (``who`` of
    :func:`_values`): rank i's block (allgatherv, gatherv, scatterv) is i + 1; alltoallv's
    from rank i to rank j is 1 + i p + j."""

    def __init__(self, coll: str, p: int, dt: np.dtype[Any], shift: int = 0,
                 layout: str = "packed", root: int = 0, counts: list[int] | None = None,
                 sc: list[list[int]] | None = None) -> None:
        self.coll, self.p, self.dt, self.root, self.layout = coll, p, dt, root, layout
        self.c: list[int] = []
        self.sc: list[list[int]] = []
        if coll == "alltoallv":  # sc[i][j]: what rank i sends rank j
            self.sc = sc or [[PATTERN[(i + 2 * j + shift) % 5] for j in range(p)]
                             for i in range(p)]
            rlayout = LAYOUTS[(LAYOUTS.index(layout) + 1) % len(LAYOUTS)]
            self.sd = [_place(self.sc[i], layout) for i in range(p)]
            self.rc = [[self.sc[i][j] for i in range(p)] for j in range(p)]  # rc[j][i]
            self.rd = [_place(self.rc[j], rlayout) for j in range(p)]
        else:
            self.c = counts or [PATTERN[(i + shift) % 5] for i in range(p)]
            self.d, self.darg, self.length = _place(self.c, layout)

    def __repr__(self) -> str:
        what = f"root={self.root} " if self.coll in ("gatherv", "scatterv") else ""
        counts = self.sc if self.coll == "alltoallv" else self.c
        return f"{self.coll} {self.dt} {what}counts={counts} {self.layout}"

    def large(self, cap: int) -> bool:
        """Whether any rank's blocks do not fit its slot (``cap`` elements)."""
        r0 = self.root
        if self.coll == "allgatherv":
            return max(self.c) > cap
        if self.coll == "gatherv":
            return any(n > cap for i, n in enumerate(self.c) if i != r0)
        if self.coll == "scatterv":
            return sum(self.c) - self.c[r0] > cap
        return any(sum(s) - s[i] > cap for i, s in enumerate(self.sc))

    def arrays(self, r: int) -> tuple[Array | None, Array | None]:
        """New (send, recv) arrays of rank ``r`` (None: a side it passes as None)."""
        dt, root = self.dt, self.root
        if self.coll == "alltoallv":
            return np.empty(self.sd[r][2], dt), np.empty(self.rd[r][2], dt)
        mine = np.empty(self.c[r], dt)
        full = np.empty(self.length, dt)
        if self.coll == "allgatherv":
            return mine, full
        if self.coll == "gatherv":
            return mine, full if r == root else None
        return full if r == root else None, mine

    def fill(self, r: int, t: int, send: Array | None, recv: Array | None) -> None:
        """Rank ``r``'s input of call ``t`` into ``send``; ``recv`` all sentinels."""
        dt, p = self.dt, self.p
        if recv is not None:
            recv[...] = _sentinel(dt)
        if send is None:
            return
        if self.coll in ("allgatherv", "gatherv"):
            send[...] = _values(dt, self.c[r], r + 1, t)
        elif self.coll == "scatterv":
            send[...] = _sentinel(dt)
            for i, n in enumerate(self.c):
                send[self.d[i] : self.d[i] + n] = _values(dt, n, i + 1, t)
        else:
            send[...] = _sentinel(dt)
            sd = self.sd[r][0]
            for j, n in enumerate(self.sc[r]):
                send[sd[j] : sd[j] + n] = _values(dt, n, 1 + r * p + j, t)

    def call(self, comm: ringworld.Communicator, send: Array | None, recv: Array | None
             ) -> None:
        """Rank ``comm.rank``'s call (counts and displs passed where they matter only)."""
        r, root = comm.rank, self.root
        if self.coll == "allgatherv":
            comm.allgatherv(send, recv, self.c, self.darg)
        elif self.coll == "gatherv":
            if r == root:
                comm.gatherv(send, recv, self.c, self.darg, root=root)
            else:
                comm.gatherv(send, None, root=root)
        elif self.coll == "scatterv":
            if r == root:
                comm.scatterv(send, recv, self.c, self.darg, root=root)
            else:
                comm.scatterv(None, recv, root=root)
        else:
            comm.alltoallv(send, recv, self.sc[r], self.rc[r], self.sd[r][1], self.rd[r][1])

    def want(self, r: int, t: int) -> Array | None:
        """Rank ``r``'s recv after call ``t`` (None: it passes none)."""
        dt, p, root = self.dt, self.p, self.root
        if self.coll == "alltoallv":
            rd, _, length = self.rd[r]
            out = np.full(length, _sentinel(dt), dt)
            for i, n in enumerate(self.rc[r]):
                out[rd[i] : rd[i] + n] = _values(dt, n, 1 + i * p + r, t)
            return out
        if self.coll == "scatterv":
            return _values(dt, self.c[r], r + 1, t)
        if self.coll == "gatherv" and r != root:
            return None
        out = np.full(self.length, _sentinel(dt), dt)
        for i, n in enumerate(self.c):
            out[self.d[i] : self.d[i] + n] = _values(dt, n, i + 1, t)
        return out

    def slot_errors(self, comm: ringworld.Communicator, t: int, what: str) -> list[str]:
        """After small call ``t`` through the slots: every rank's slot of the parity of the
        sync just made holds what shm_vector writes there before it (no rank can write that
        slot again before this rank reaches its next sync)."""
        a = comm._arena
        assert a is not None
        heads, datas, _cap = shm_vector.slot_views(a, a.epoch & 1, self.dt)
        dt, p, root = self.dt, self.p, self.root
        errors: list[str] = []

        def head_is(i: int, words: list[int]) -> None:
            got = list(heads[i][: len(words)])
            if got != words:
                errors.append(f"{what}: rank {i}'s slot header (parity {a.epoch & 1}) holds "
                              f"{got}, not {words}")

        def data_is(i: int, at: int, want: Array) -> None:
            got = datas[i][at : at + want.size]
            if not np.array_equal(got, want):
                errors.append(f"{what}: rank {i}'s slot (parity {a.epoch & 1}) holds {got} at "
                              f"{at}, not {want}")

        if self.coll == "allgatherv":
            for i, n in enumerate(self.c):
                data_is(i, 0, _values(dt, n, i + 1, t))
        elif self.coll == "gatherv":
            head_is(root, [0, *self.c, *self.d])
            for i, n in enumerate(self.c):
                if i != root:
                    head_is(i, [n])
                    data_is(i, 0, _values(dt, n, i + 1, t))
        elif self.coll == "scatterv":
            where = _where(self.c, root)
            head_is(root, [0, *self.c, *where])
            for i, n in enumerate(self.c):
                if i != root:
                    data_is(root, where[i], _values(dt, n, i + 1, t))
        else:
            for i, s in enumerate(self.sc):
                where = _where(s, i)
                head_is(i, [0, *s, *where])
                for j, n in enumerate(s):
                    if j != i:
                        data_is(i, where[j], _values(dt, n, 1 + i * p + j, t))
        return errors


class Checker:
    """One rank's v-calls with new data, each checked against numpy (and its slots, where
    ``slots``: windows not crowded); ``t`` numbers the calls alike on every rank."""

    def __init__(self, comm: ringworld.Communicator, slots: bool = True) -> None:
        self.comm = comm
        self.slots = slots
        self.t = 0
        self.errors: list[str] = []

    def cap(self, dt: np.dtype[Any]) -> int:
        """Elements of ``dt`` a slot holds after the v-variants' header."""
        a = self.comm._arena
        return 0 if a is None else shm_vector.slot_views(a, 0, dt)[2]

    def call(self, shape: Shape, send: Array | None, recv: Array | None, tag: str = "",
             want_algorithm: str | None = "shm", slots: bool = True) -> None:
        """``shape``'s call on ``send`` and ``recv`` with new data, checked: the result, the
        sendbuf unchanged, the path (``want_algorithm``: "shm", or where the blocks are too
        large for the slots and ranks may not read each other's memory, "shm+" and the message
        path's algorithm; None: not checked) and, where ``slots`` and the call is small, the
        slots."""
        comm, r = self.comm, self.comm.rank
        self.t += 1
        t = self.t
        shape.fill(r, t, send, recv)
        keep = None if send is None else send.copy()
        shape.call(comm, send, recv)
        what = f"{shape!r} {tag} (call {t}, rank {r})"
        want = shape.want(r, t)
        if want is not None:
            assert recv is not None
            if recv.shape != want.shape or not np.array_equal(recv, want):
                self.errors.append(f"{what}: got {recv}, want {want}")
        if send is not None and not np.array_equal(send, keep):
            self.errors.append(f"{what}: the sendbuf changed: {send}, was {keep}")
        if comm.size == 1:
            return
        large = shape.large(self.cap(shape.dt))
        a = comm._arena
        if want_algorithm == "shm" and large and a is not None and not a.direct:
            want_algorithm = "shm+"
        got = comm.last_algorithm
        if want_algorithm is not None and not (
                got.startswith("shm+") if want_algorithm == "shm+" else got == want_algorithm):
            self.errors.append(f"{what}: ran {got}, not {want_algorithm}")
        if self.slots and slots and not large:
            self.errors += shape.slot_errors(comm, t, what)

    def repeats(self, shape: Shape, plan: tuple[bool, ...] = PLAN) -> None:
        """``shape`` called as ``plan`` says: on new arrays or on those of the call before."""
        send, recv = shape.arrays(self.comm.rank)
        for k, fresh in enumerate(plan):
            if fresh and k:
                send, recv = shape.arrays(self.comm.rank)
            self.call(shape, send, recv, f"repeat {k}{' (new arrays)' * fresh}")

    def kept(self, coll: str, runner: bool, what: str) -> None:
        """After repeats of ``coll`` on more than one rank: its kept entry holds a runner of
        its own (``runner``) or ``shm_vector.RUN``'s entry."""
        if self.comm.size == 1:
            return
        entry = self.comm._cache.vector.get(coll)
        r = self.comm.rank
        if entry is None:
            self.errors.append(f"{what} (rank {r}): no call kept")
            return
        run = entry[10]
        if run is None:
            self.errors.append(f"{what} (rank {r}): repeated, yet no runner made")
        elif runner and run is RUN[coll]:
            self.errors.append(f"{what} (rank {r}): repeats run shm_vector.RUN's entry, not "
                               "a runner")
        elif not runner and run is not RUN[coll]:
            self.errors.append(f"{what} (rank {r}): repeats run {run}, not shm_vector.RUN's "
                               "entry")


def _variants(p: int) -> list[tuple[str, int]]:
    """(collective, root): gatherv and scatterv from root 0 and from the last rank."""
    out = [("allgatherv", 0)]
    for coll in ("gatherv", "scatterv"):
        out += [(coll, root) for root in sorted({0, p - 1})]
    return [*out, ("alltoallv", 0)]


# ------------------------------------------------------------------------ the matrix
def _matrix(comm: ringworld.Communicator, crowded: bool) -> list[str]:
    """Every variant, dtype and layout (the layouts cycled over the dtypes), repeated."""
    p = comm.size
    ch = Checker(comm, slots=not crowded)
    for k, dt in enumerate(DTYPES):
        for j, (coll, root) in enumerate(_variants(p)):
            shape = Shape(coll, p, dt, shift=j + k, layout=LAYOUTS[(j + k) % 3], root=root)
            # (ranks that share cores: allgatherv and alltoallv still take the slots, and so
            # does gatherv where ranks may not write each other's memory; scatterv and that
            # gatherv the eager rings, with runners of their own)
            ch.slots = _in_slots(comm, coll, crowded)
            ch.repeats(shape)
            ch.kept(coll, True, repr(shape))
    if p > 1 and comm._arena is not None and comm._arena.crowded != crowded:
        ch.errors.append(f"the windows' crowded is {comm._arena.crowded}, not {crowded}")
    return ch.errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeats_run_a_runner_and_give_numpys_result(size: int) -> None:
    results = run_processes(size, _matrix, False, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


@pytest.mark.usefixtures("crowded")
@pytest.mark.parametrize("size", [2, 3, 5])
def test_crowded_windows_make_runners_for_the_slots_and_the_eager_rings(size: int) -> None:
    results = run_processes(size, _matrix, True, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


def _in_slots(comm: ringworld.Communicator, coll: str, crowded: bool) -> bool:
    """Whether ``coll`` goes through the slots (else the eager rings: see shm_vector)."""
    a = comm._arena
    return (not crowded or coll in ("allgatherv", "alltoallv")
            or (coll == "gatherv" and a is not None and not a.direct))


# ----------------------------------------------------------------------- large blocks
def _rooted_edge(ch: Checker, big: int, fits: bool, large_root: bool = False) -> None:
    """A gatherv to root 0 where rank 1's block is ``big`` (the root and rank 1 know it), and
    a scatterv from the last rank whose blocks for the others sum to ``big``, repeated: a
    runner everywhere where they ``fits``, else ``RUN``'s entry on the ranks that know it
    (but a runner at the scatterv's root where ``large_root``: the eager ring's large steps)."""
    p, r = ch.comm.size, ch.comm.rank
    counts = [2] * p
    counts[1] = big
    shape = Shape("gatherv", p, F64, layout="gapped", counts=counts)
    ch.repeats(shape, PLAN[:4])
    ch.kept("gatherv", fits or r not in (0, 1), f"{shape!r} big={big}")
    counts = [1] * p
    counts[0] = big - (p - 2)
    shape = Shape("scatterv", p, F64, layout="padded", counts=counts, root=p - 1)
    ch.repeats(shape, PLAN[:4])
    ch.kept("scatterv", fits or r != p - 1 or large_root, f"{shape!r} big={big}")


def _large(comm: ringworld.Communicator) -> list[str]:
    """Blocks that just fit the slots (``cap`` elements: a runner) and one element more
    (``RUN``'s entry, on the ranks whose blocks no longer fit: the others still run theirs),
    repeated, right."""
    p, r = comm.size, comm.rank
    ch = Checker(comm)
    comm.allreduce(np.ones(1), np.zeros(1))  # (maps the windows)
    cap = ch.cap(F64)
    for extra in (0, 1):
        big = cap + extra
        fits = extra == 0
        # allgatherv: one rank's block of big (every rank knows the counts)
        counts = [1] * p
        counts[-1] = big
        shape = Shape("allgatherv", p, F64, layout="gapped", counts=counts)
        ch.repeats(shape, PLAN[:4])
        ch.kept("allgatherv", fits, f"{shape!r} big={big}")
        _rooted_edge(ch, big, fits)
        # alltoallv: rank 0's blocks for the others sum to big
        sc = [[1] * p for _ in range(p)]
        sc[0][1] = big - (p - 2)
        shape = Shape("alltoallv", p, F64, layout="gapped", sc=sc)
        ch.repeats(shape, PLAN[:4])
        ch.kept("alltoallv", fits or r != 0, f"{shape!r} big={big}")
    return ch.errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("size", [2, 3])
def test_blocks_too_large_for_the_slots_make_no_runner(size: int) -> None:
    results = run_processes(size, _large, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


# ------------------------------------------------------------------------ interleaved
def _interleaved(comm: ringworld.Communicator) -> list[str]:
    """Kept calls of every v-variant repeated with other calls between them, in an order that
    changes every round (the same on every rank): barriers, an allreduce, a broadcast, a
    reduce_scatter (a v-call without a runner), a v-call on a duplicate (its own arena and
    runner); each kept call made to start at both slot parities, on new arrays at times."""
    p, r = comm.size, comm.rank
    ch = Checker(comm)
    dup = comm.dup()
    dch = Checker(dup)
    kept = {
        "allgatherv": Shape("allgatherv", p, I32, shift=1, layout="gapped"),
        "gatherv": Shape("gatherv", p, F64, shift=2, layout="padded", root=p - 1),
        "scatterv": Shape("scatterv", p, C128, shift=3, layout="gapped", root=p // 2),
        "alltoallv": Shape("alltoallv", p, I8, shift=4, layout="packed"),
    }
    arrays = {name: shape.arrays(r) for name, shape in kept.items()}
    on_dup = Shape("allgatherv", p, F64, shift=0, layout="packed")
    dup_arrays = on_dup.arrays(r)
    state = {"round": 0}

    def allreduce() -> None:
        k = state["round"]
        got = np.zeros(3, np.int64)
        comm.allreduce(np.arange(3) + 10 * r + k, got)
        if not np.array_equal(got, sum(np.arange(3) + 10 * i + k for i in range(p))):
            ch.errors.append(f"allreduce round {k}: {got}")

    def bcast() -> None:
        k = state["round"]
        root = k % p
        buf = np.arange(5.0) + 100 * root + k if r == root else np.full(5, -1.0)
        comm.bcast(buf, root)
        if not np.array_equal(buf, np.arange(5.0) + 100 * root + k):
            ch.errors.append(f"bcast round {k}: {buf}")

    def reduce_scatter() -> None:
        k = state["round"]
        counts = [1 + i % 2 for i in range(p)]
        out = np.zeros(counts[r])
        comm.reduce_scatter(np.arange(float(sum(counts))) + r + k, out, counts)
        lo = sum(counts[:r])
        want = sum(np.arange(float(sum(counts)))[lo : lo + counts[r]] + i + k for i in range(p))
        if not np.array_equal(out, want):
            ch.errors.append(f"reduce_scatter round {k}: {out} != {want}")

    def duplicate() -> None:
        dch.call(on_dup, *dup_arrays, "on the duplicate")

    fillers: dict[str, Callable[[], None]] = {
        "barrier": comm.barrier, "allreduce": allreduce, "bcast": bcast,
        "reduce_scatter": reduce_scatter, "duplicate": duplicate,
    }
    for name, shape in kept.items():  # first calls: every shape kept before the rounds
        ch.call(shape, *arrays[name], "first")
    names = list(kept)
    parities: dict[str, set[int]] = {name: set() for name in names}
    for k in range(8):
        state["round"] = k
        rng = random.Random(1000 * p + k)  # the same order on every rank
        plan = [*names, *rng.sample(sorted(fillers), rng.randint(1, len(fillers)))]
        rng.shuffle(plan)
        for j, name in enumerate(plan):
            if name in fillers:
                fillers[name]()
                continue
            a = comm._arena
            if a is not None and p > 1:
                want = (k + j + names.index(name)) & 1
                for _ in range(2):  # a barrier is one sync (the same count on every rank)
                    if a.epoch & 1 != want:
                        comm.barrier()
                parities[name].add(a.epoch & 1)
            if k % 3 == 2:
                arrays[name] = kept[name].arrays(r)
            ch.call(kept[name], *arrays[name], f"round {k}")
    if p > 1:
        for name, seen in parities.items():
            if seen != {0, 1}:
                ch.errors.append(f"{name}: repeats started at slot parities {seen} only")
    for name in names:
        ch.kept(name, True, f"{kept[name]!r} between other calls")
    dch.kept("allgatherv", True, "allgatherv on the duplicate")
    dup.free()
    return ch.errors + dch.errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeats_between_other_calls(size: int) -> None:
    results = run_processes(size, _interleaved, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


# ------------------------------------------------------------------------- mismatches
class Attempts:
    """Calls that may raise MismatchError on some ranks: each checked for whether it raised,
    and the words it raised with."""

    def __init__(self, ch: Checker) -> None:
        self.ch = ch

    def call(self, what: str, shape: Shape, send: Array | None, recv: Array | None,
             words: str | None) -> int:
        """``shape``'s call with new data (its number returned); it must raise MismatchError
        with ``words`` in its text, or (None) not raise."""
        ch, r = self.ch, self.ch.comm.rank
        ch.t += 1
        shape.fill(r, ch.t, send, recv)
        try:
            shape.call(ch.comm, send, recv)
        except MismatchError as exc:
            if words is None or words not in str(exc):
                ch.errors.append(f"{what}: rank {r} raised {exc!r}, want "
                                 f"{'nothing' if words is None else repr(words)}")
            return ch.t
        if words is not None:
            ch.errors.append(f"{what}: rank {r} passed, want MismatchError with {words!r}")
        return ch.t

    def check(self, what: str, got: Array | None, want: Array | None) -> None:
        if got is None or want is None:
            return
        if got.shape != want.shape or not np.array_equal(got, want):
            self.ch.errors.append(f"{what} (rank {self.ch.comm.rank}): got {got}, want {want}")


def _usable(ch: Checker, shape: Shape, what: str) -> None:
    """After a mismatch: the kept shape on every rank, right (again a runner after two
    calls), and an allreduce."""
    comm = ch.comm
    send, recv = shape.arrays(comm.rank)
    for k in range(3):
        ch.call(shape, send, recv, f"after {what} ({k})")
    ch.kept(shape.coll, True, f"{shape!r} after {what}")
    got = np.zeros(1)
    comm.allreduce(np.ones(1), got)
    if got[0] != comm.size:
        ch.errors.append(f"after {what}: allreduce gave {got}")


def _mismatches(comm: ringworld.Communicator, crowded: bool = False) -> list[str]:
    """On 3 ranks, each shape kept with runners on every rank, then one rank (or the root)
    passes a new shape (the checked path) beside ranks that repeat theirs (their runners);
    ``crowded``: gatherv and scatterv through the eager rings."""
    r = comm.rank
    ch = Checker(comm)
    at = Attempts(ch)
    comm.allreduce(np.ones(1), np.zeros(1))  # (maps the windows)
    ch.slots = _in_slots(comm, "gatherv", crowded)

    # gatherv to root 0, counts [2, 1, 3]: runners everywhere
    kept = Shape("gatherv", 3, F64, layout="gapped", counts=[2, 1, 3])
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("gatherv", True, repr(kept))
    # rank 2 sends 2 elements (a new shape): the root (its runner) raises naming it, rank 2
    # raises (the root's header says 3); rank 1's block and the root's own still land
    other = Shape("gatherv", 3, F64, layout="gapped", counts=[2, 1, 2])
    words = {0: "rank 2 sent 2 elements, this rank (the root, rank 0) expects 3 (counts[2])",
             2: "the root (rank 0) expects 3 elements from this rank (rank 2), which sent 2"}
    eager = not ch.slots  # (a sender through its eager ring reads no root's header: no error)
    if eager:
        del words[2]
    mine = other.arrays(r)[0] if r == 2 else send
    t = at.call("gatherv, rank 2 sends 2", other if r == 2 else kept, mine, recv, words.get(r))
    if r == 0:
        want = np.full(kept.length, _sentinel(F64), F64)
        for i in (0, 1):
            want[kept.d[i] : kept.d[i] + kept.c[i]] = _values(F64, kept.c[i], i + 1, t)
        at.check("gatherv, rank 2 sends 2: the root's recv", recv, want)
    _usable(ch, kept, "gatherv, rank 2 sends 2")
    # the root expects 2 from rank 1 (new counts: the checked path), which repeats its 1 (its
    # runner, whose root header says 2): both raise; rank 2's block lands at its new place
    other = Shape("gatherv", 3, F64, layout="gapped", counts=[2, 2, 3])
    words = {0: "rank 1 sent 1 element, this rank (the root, rank 0) expects 2 (counts[1])",
             1: "the root (rank 0) expects 2 elements from this rank (rank 1), which sent 1"}
    if eager:
        del words[1]
    root_recv = other.arrays(0)[1] if r == 0 else None
    t = at.call("gatherv, the root expects 2 from rank 1", other if r == 0 else kept, send,
                root_recv, words.get(r))
    if r == 0:
        want = np.full(other.length, _sentinel(F64), F64)
        for i in (0, 2):
            want[other.d[i] : other.d[i] + other.c[i]] = _values(F64, other.c[i], i + 1, t)
        at.check("gatherv, the root expects 2 from rank 1: the root's recv", root_recv, want)
    _usable(ch, kept, "gatherv, the root expects 2 from rank 1")

    # scatterv from root 1, counts [2, 1, 3]: the root sends [1, 1, 3] (new counts, packed):
    # rank 0 (its runner) raises; rank 2's block, at another place in the root's slot, right
    ch.slots = _in_slots(comm, "scatterv", crowded)
    kept = Shape("scatterv", 3, I32, layout="gapped", counts=[2, 1, 3], root=1)
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("scatterv", True, repr(kept))
    other = Shape("scatterv", 3, I32, layout="packed", counts=[1, 1, 3], root=1)
    words = {0: "the root (rank 1) sends 1 element to this rank (rank 0), which expects 2"}
    mine = other.arrays(1)[0] if r == 1 else send
    t = at.call("scatterv, the root sends 1 to rank 0", other if r == 1 else kept, mine, recv,
                words.get(r))
    if r != 0:
        at.check("scatterv, the root sends 1 to rank 0: recv", recv, kept.want(r, t))
    _usable(ch, kept, "scatterv, the root sends 1 to rank 0")

    # alltoallv: rank 1 sends 2 elements to rank 0 (new counts), which expects 1 (its runner):
    # rank 0 raises; rank 2's block from rank 1 (at another place in its slot) right
    ch.slots = True
    sc = [[1, 2, 0], [1, 1, 2], [3, 0, 1]]
    kept = Shape("alltoallv", 3, C128, layout="gapped", sc=sc)
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("alltoallv", True, repr(kept))
    other = Shape("alltoallv", 3, C128, layout="gapped",
                  sc=[[1, 2, 0], [2, 1, 2], [3, 0, 1]])
    words = {0: "rank 1 sends 2 elements to this rank (rank 0), which expects 1 "
                "(recvcounts[1])"}
    mine = other.arrays(1)[0] if r == 1 else send
    t = at.call("alltoallv, rank 1 sends 2 to rank 0", other if r == 1 else kept, mine, recv,
                words.get(r))
    if r != 0:
        at.check("alltoallv, rank 1 sends 2 to rank 0: recv", recv, kept.want(r, t))
    _usable(ch, kept, "alltoallv, rank 1 sends 2 to rank 0")
    # rank 0 expects 2 from rank 2 (new counts), which repeats its 3 (its runner): rank 0
    # raises, having taken the other blocks
    other = Shape("alltoallv", 3, C128, layout="gapped",
                  sc=[[1, 2, 0], [1, 1, 2], [2, 0, 1]])
    words = {0: "rank 2 sends 3 elements to this rank (rank 0), which expects 2 "
                "(recvcounts[2])"}
    mine_recv = other.arrays(0)[1] if r == 0 else recv
    t = at.call("alltoallv, rank 0 expects 2 from rank 2", other if r == 0 else kept, send,
                mine_recv, words.get(r))
    if r != 0:
        at.check("alltoallv, rank 0 expects 2 from rank 2: recv", mine_recv, kept.want(r, t))
    else:
        assert mine_recv is not None
        want = other.want(0, t)
        assert want is not None
        lo = other.rd[0][0][2]
        want[lo : lo + 2] = _sentinel(C128)  # (rank 2's block: not taken)
        at.check("alltoallv, rank 0 expects 2 from rank 2: recv", mine_recv, want)
    _usable(ch, kept, "alltoallv, rank 0 expects 2 from rank 2")
    return ch.errors


@pytest.mark.usefixtures("roomy")
def test_mismatches_on_repeats_raise_where_seen_and_leave_the_communicator_usable() -> None:
    assert run_processes(3, _mismatches, timeout=WAIT) == [[]] * 3


@pytest.mark.usefixtures("crowded")
def test_mismatches_on_eager_repeats_raise_where_seen_and_leave_it_usable() -> None:
    assert run_processes(3, _mismatches, True, timeout=WAIT) == [[]] * 3


def _entry_edges(comm: ringworld.Communicator, direct: bool) -> list[str]:
    """Crowded windows: a gatherv block and a scatterv root's blocks for the others that just
    fit an eager entry (runners everywhere) and one element more (``RUN``'s entry on the ranks
    that know it, but the scatterv's root where ranks may read each other's memory: its
    runner of the large steps; the others' runners take the rest of the call as shm_vector's
    steps do: the root's large header, blocks read straight or the message path), repeated,
    right."""
    p = comm.size
    ch = Checker(comm, slots=False)
    comm.allreduce(np.ones(1), np.zeros(1))  # (maps the windows)
    a = comm._arena
    assert a is not None and a.crowded
    if direct and not a.direct:
        return []  # (ranks may not read each other's memory here: nothing to check)
    a.direct = direct  # (on every rank alike)
    room = (EAGER_MAX - shm_vector._head_bytes(p)) // F64.itemsize  # (elements an entry holds)
    for extra in (0, 1):
        # (gatherv through the slots where ranks may not write each other's memory: the same
        # room there)
        _rooted_edge(ch, room + extra, extra == 0, a.direct)
    return ch.errors


@pytest.mark.usefixtures("crowded")
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("size", [2, 3])
def test_blocks_too_large_for_an_eager_entry_leave_runners_where_the_steps_allow(
        size: int, direct: bool) -> None:
    results = run_processes(size, _entry_edges, direct, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


# ---------------------------------------------------------------------- large fallbacks
def _fallbacks(comm: ringworld.Communicator, direct: bool) -> list[str]:
    """On 3 ranks, runners on every rank, then a root (or a rank) whose blocks become too
    large for the slots (a new shape) beside ranks that repeat their small kept shapes: their
    runners find the large header and hand over to shm_vector's steps (read or write the
    blocks straight, or, where ranks may not, the message path): right data, or MismatchError
    where a count disagrees."""
    r = comm.rank
    ch = Checker(comm)
    at = Attempts(ch)
    comm.allreduce(np.ones(1), np.zeros(1))  # (maps the windows)
    arena = comm._arena
    assert arena is not None
    if direct and not arena.direct:
        return []  # (ranks may not read each other's memory here: nothing to check)
    arena.direct = direct  # (on every rank alike)
    big = ch.cap(F64) + 1
    large = "shm" if direct else "shm+"  # (the message path: "shm+" and its algorithm)

    # gatherv to root 0, counts [1, 2, 3]
    kept = Shape("gatherv", 3, F64, layout="gapped", counts=[1, 2, 3])
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("gatherv", True, repr(kept))
    # the root expects big from rank 1, which sends big too (a new shape); rank 2 repeats
    # (its runner: the root's header says large)
    other = Shape("gatherv", 3, F64, layout="gapped", counts=[1, big, 3])
    if r == 2:
        ch.call(kept, send, None, "beside a large block", want_algorithm=large, slots=False)
    else:
        ch.call(other, *other.arrays(r), "a large block", want_algorithm=large)
    _usable(ch, kept, "gatherv with a large block")
    if direct:
        # the root expects big from rank 1, which repeats its 2 (its runner): both raise;
        # rank 2 (its runner) writes its block straight into the root's recv. (Rank 1's text
        # names the root's count read before the call's second sync: after it, the root's
        # next call may have rewritten its header.)
        words = {0: f"rank 1 sent 2 elements, this rank (the root, rank 0) expects {big} "
                    "(counts[1])",
                 1: f"the root (rank 0) expects {big} elements from this rank (rank 1), "
                    "which sent 2"}
        root_recv = other.arrays(0)[1] if r == 0 else None
        t = at.call("gatherv, the root expects big from rank 1", other if r == 0 else kept,
                    send, root_recv, words.get(r))
        if r == 0:
            assert root_recv is not None
            want = np.full(other.length, _sentinel(F64), F64)
            for i in (0, 2):
                want[other.d[i] : other.d[i] + other.c[i]] = _values(F64, other.c[i], i + 1, t)
            at.check("gatherv, the root expects big from rank 1: the root's recv", root_recv,
                     want)
        _usable(ch, kept, "gatherv, the root expects big from rank 1")
    # rank 1 sends big (a new shape: no block in its slot) where the root (its runner)
    # expects 2: both raise, whether or not ranks may write each other's memory
    words = {0: f"rank 1 sent {big} elements, this rank (the root, rank 0) expects 2 "
                "(counts[1])",
             1: f"the root (rank 0) expects 2 elements from this rank (rank 1), which sent "
                f"{big}"}
    mine = np.empty(big, F64) if r == 1 else send
    at.call("gatherv, rank 1 sends big", other if r == 1 else kept, mine, recv, words.get(r))
    _usable(ch, kept, "gatherv, rank 1 sends big")

    # scatterv from root 0, counts [1, 2, 3]: rank 2's block becomes big (the root and rank 2
    # pass new shapes), rank 1 repeats (its runner: the root's header says large)
    kept = Shape("scatterv", 3, F64, layout="gapped", counts=[1, 2, 3])
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("scatterv", True, repr(kept))
    other = Shape("scatterv", 3, F64, layout="gapped", counts=[1, 2, big])
    if r == 1:
        ch.call(kept, None, recv, "beside a large block", want_algorithm=large, slots=False)
    else:
        ch.call(other, *other.arrays(r), "a large block", want_algorithm=large)
    _usable(ch, kept, "scatterv with a large block")
    if direct:
        # the root sends big to rank 2, which repeats its 3 (its runner): rank 2 raises
        words = {2: f"the root (rank 0) sends {big} elements to this rank (rank 2), which "
                    "expects 3"}
        mine = other.arrays(0)[0] if r == 0 else None
        t = at.call("scatterv, the root sends big to rank 2", other if r == 0 else kept, mine,
                    recv, words.get(r))
        if r == 1:
            at.check("scatterv, the root sends big to rank 2: recv", recv, kept.want(r, t))
        _usable(ch, kept, "scatterv, the root sends big to rank 2")

    # alltoallv: rank 1's block for rank 2 becomes big (both pass new shapes), rank 0 repeats
    # (its runner: rank 1's header says large)
    sc = [[1, 2, 0], [1, 1, 2], [3, 0, 1]]
    kept = Shape("alltoallv", 3, F64, layout="gapped", sc=sc)
    send, recv = kept.arrays(r)
    for k in range(2):
        ch.call(kept, send, recv, f"kept {k}")
    ch.kept("alltoallv", True, repr(kept))
    other = Shape("alltoallv", 3, F64, layout="gapped", sc=[[1, 2, 0], [1, 1, big], [3, 0, 1]])
    if r == 0:
        ch.call(kept, send, recv, "beside a large block", want_algorithm=large, slots=False)
    else:
        ch.call(other, *other.arrays(r), "a large block", want_algorithm=large)
    _usable(ch, kept, "alltoallv with a large block")
    return ch.errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("direct", [True, False])
def test_a_large_header_hands_a_runners_call_over(direct: bool) -> None:
    assert run_processes(3, _fallbacks, direct, timeout=WAIT) == [[]] * 3


# ------------------------------------------------------------------------- ringworld.MPI
def _mpi(_: object) -> list[str]:
    """``ringworld.MPI``'s Allgatherv, Gatherv (from root 0 and the last rank), Scatterv
    (likewise) and Alltoallv with ``[array, counts, displs, type]`` specs, repeated on the
    same arrays with new data, in float64 and int32: right every call; on more than one rank
    the native repeats run a runner."""
    from ringworld import MPI

    comm = MPI.COMM_WORLD
    native = ringworld.world()
    ch = Checker(native, slots=False)
    p, r = comm.Get_size(), comm.Get_rank()
    errors = ch.errors

    def right(what: str, got: Array, want: Array) -> None:
        if not np.array_equal(got, want):
            errors.append(f"{what} (call {ch.t}, rank {r}): got {got}, want {want}")

    for k, (dt, mt) in enumerate(((F64, MPI.DOUBLE), (I32, MPI.INT))):
        shape = Shape("allgatherv", p, dt, shift=k, layout="gapped")
        send, recv = shape.arrays(r)
        assert send is not None and recv is not None
        for _ in range(6):
            ch.t += 1
            shape.fill(r, ch.t, send, recv)
            comm.Allgatherv([send, mt], [recv, shape.c, shape.d, mt])
            want = shape.want(r, ch.t)
            assert want is not None
            right(f"Allgatherv {dt}", recv, want)
        ch.kept("allgatherv", True, f"Allgatherv {dt}")
        for root in sorted({0, p - 1}):
            shape = Shape("gatherv", p, dt, shift=k + 1, layout="gapped", root=root)
            send, recv = shape.arrays(r)
            assert send is not None
            for _ in range(6):
                ch.t += 1
                shape.fill(r, ch.t, send, recv)
                comm.Gatherv([send, mt], None if recv is None else
                             [recv, shape.c, shape.d, mt], root=root)
                want = shape.want(r, ch.t)
                if recv is not None and want is not None:
                    right(f"Gatherv {dt} root={root}", recv, want)
            ch.kept("gatherv", True, f"Gatherv {dt} root={root}")
            shape = Shape("scatterv", p, dt, shift=k + 2, layout="padded", root=root)
            send, recv = shape.arrays(r)
            assert recv is not None
            for _ in range(6):
                ch.t += 1
                shape.fill(r, ch.t, send, recv)
                comm.Scatterv(None if send is None else [send, shape.c, shape.d, mt],
                              [recv, mt], root=root)
                want = shape.want(r, ch.t)
                assert want is not None
                right(f"Scatterv {dt} root={root}", recv, want)
            ch.kept("scatterv", True, f"Scatterv {dt} root={root}")
        shape = Shape("alltoallv", p, dt, shift=k + 3, layout="gapped")
        send, recv = shape.arrays(r)
        assert send is not None and recv is not None
        for _ in range(6):
            ch.t += 1
            shape.fill(r, ch.t, send, recv)
            comm.Alltoallv([send, shape.sc[r], shape.sd[r][0], mt],
                           [recv, shape.rc[r], shape.rd[r][0], mt])
            want = shape.want(r, ch.t)
            assert want is not None
            right(f"Alltoallv {dt}", recv, want)
        ch.kept("alltoallv", True, f"Alltoallv {dt}")
    comm.Barrier()
    return errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("size", [1, 2, 3])
def test_mpi_vector_repeats_on_the_same_arrays(size: int) -> None:
    results = run_processes(size, _mpi, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


# ------------------------------------------------------------------ overlapping blocks
def _overlapping(comm: ringworld.Communicator) -> list[str]:
    """Send blocks that overlap (legal on the send side: scatterv's root, alltoallv's
    senders), repeated on the same arrays with new data: each block is packed on its own. And
    a gatherv root's receive blocks that overlap (erroneous in MPI, accepted by the checks):
    the repeats write them in rank order, the root's own among them, as the checked call."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    counts = [PATTERN[i % 5] + 1 for i in range(p)]
    displs = [i % 2 for i in range(p)]  # (every block starts at 0 or 1)
    length = max(counts) + 1
    root = p - 1
    src = np.empty(length, C128) if r == root else None
    out = np.empty(counts[r], C128)
    for t in range(5):
        if src is not None:
            src[...] = _values(C128, length, 7, t)
        out[...] = -1
        comm.scatterv(src, out, counts if r == root else None,
                      displs if r == root else None, root=root)
        whole = _values(C128, length, 7, t)
        want = whole[displs[r] : displs[r] + counts[r]]
        if not np.array_equal(out, want):
            errors.append(f"scatterv of overlapping blocks, call {t} (rank {r}): {out} != {want}")
    # alltoallv: rank i sends rank j the (j + 1) elements from j % 2 of the same array
    sc = [j + 1 for j in range(p)]
    sd = [j % 2 for j in range(p)]
    rc = [r + 1] * p
    send = np.empty(p + 1, I32)
    recv = np.empty(p * (r + 1), I32)
    for t in range(5):
        send[...] = _values(I32, p + 1, r + 1, t)
        recv[...] = -1
        comm.alltoallv(send, recv, sc, rc, sd)
        want = np.concatenate([_values(I32, p + 1, i + 1, t)[r % 2 : r % 2 + r + 1]
                               for i in range(p)])
        if not np.array_equal(recv, want):
            errors.append(f"alltoallv of overlapping blocks, call {t} (rank {r}): {recv} != "
                          f"{want}")
    # gatherv to rank 0: block i (2 elements) at i, so each overlaps the next (the root's
    # own first: written last, it would cover rank 1's first element)
    grecv = np.empty(p + 1, F64) if r == 0 else None
    for t in range(5):
        if grecv is not None:
            grecv[...] = -1
        comm.gatherv(_values(F64, 2, r + 1, t), grecv, [2] * p if r == 0 else None,
                     list(range(p)) if r == 0 else None, root=0)
        if grecv is not None:
            want = np.full(p + 1, -1.0)
            for i in range(p):
                want[i : i + 2] = _values(F64, 2, i + 1, t)
            if not np.array_equal(grecv, want):
                errors.append(f"gatherv into overlapping blocks, call {t}: {grecv} != {want}")
    if p > 1:
        for coll in ("scatterv", "alltoallv", "gatherv"):
            run = comm._cache.vector[coll][10]
            if run is None or run is RUN[coll]:
                errors.append(f"{coll} of overlapping blocks (rank {r}): kept runner {run}")
    return errors


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("size", [2, 3])
def test_overlapping_send_blocks(size: int) -> None:
    results = run_processes(size, _overlapping, timeout=WAIT)
    assert [e for errs in results for e in errs] == []


# ---------------------------------------------------------------------------- freed
def _freed(comm: ringworld.Communicator) -> list[str]:
    """The runners hold their arena: a freed communicator's kept runners go with its cache,
    and its arena with them (through ``ringworld.MPI`` too, whose adapter keeps the native
    entries)."""
    import gc
    import weakref

    from ringworld import MPI

    p, r = comm.size, comm.rank
    dup = comm.dup()
    ch = Checker(dup)
    for coll, root in _variants(p):
        ch.repeats(Shape(coll, p, F64, shift=1, layout="gapped", root=root), PLAN[:3])
        ch.kept(coll, True, f"{coll} on the duplicate")
    arena = weakref.ref(dup._arena)
    dup.free()
    mdup = MPI.COMM_WORLD.Dup()
    counts = [1 + i % 2 for i in range(p)]
    displs = [sum(counts[:i]) for i in range(p)]
    send, recv = np.empty(counts[r]), np.empty(sum(counts))
    for t in range(4):
        send[...] = _values(F64, counts[r], r + 1, t)
        mdup.Allgatherv([send, MPI.DOUBLE], [recv, counts, displs, MPI.DOUBLE])
        want = np.concatenate([_values(F64, counts[i], i + 1, t) for i in range(p)])
        if not np.array_equal(recv, want):
            ch.errors.append(f"Allgatherv on the MPI duplicate, call {t}: {recv}")
    native: Any = mdup._native
    marena = weakref.ref(native._arena)
    run = native._cache.vector["allgatherv"][10]
    if run is None or run is RUN["allgatherv"]:
        ch.errors.append(f"Allgatherv on the MPI duplicate: kept runner {run}")
    del native, run
    mdup.Free()
    gc.collect()
    if arena() is not None:
        ch.errors.append("the freed communicator's arena is still alive")
    if marena() is not None:
        ch.errors.append("the freed MPI communicator's arena is still alive")
    return ch.errors


@pytest.mark.usefixtures("roomy")
def test_a_freed_communicator_leaves_no_runner_behind() -> None:
    assert run_processes(3, _freed, timeout=WAIT) == [[]] * 3
