"""Every collective algorithm, checked at the schedule level without starting processes.

Each test builds the schedules of all ranks of one world with :func:`ringworld.algorithms.registry
.build` and runs them together in :func:`ringworld.algorithms.check.run`, which executes them
with rendezvous semantics and raises on deadlock, mismatched message sizes, leftover messages or
racing steps. The results are compared element by element with numpy references.

The algorithms come from ``REGISTRY``, so a new algorithm is covered as soon as it is registered
(and a new collective fails :func:`test_every_collective_is_checked` until a checker is written).
Coverage per algorithm: world sizes 1..17; every root up to 9 ranks and roots {0, p/2, p-1}
above; counts {0, 1, p-1, p+1, 13, 1000}; data unique per element (a function of rank and
index); SUM and MAX, plus a non-commutative associative user op (composition of affine maps
mod a prime) for every algorithm not marked ``commutative_only``, and MAXLOC with ties for
allreduce; in-place variants (with SUM); irregular v-layouts (zero counts, reversed order, gaps
that must stay untouched); inputs must be unchanged. Separately: every numpy dtype through every
allreduce, segmented broadcasts, barrier causality, and that schedules are pure.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest

from ringworld.algorithms import registry
from ringworld.algorithms.check import ScheduleError, run
from ringworld.algorithms.registry import REGISTRY, Algorithm
from ringworld.algorithms.schedule import Schedule, Spec, Step, Xfer
from ringworld.comm import ops
from ringworld.comm.ops import Op

Array = np.ndarray[Any, Any]

SIZES = tuple(range(1, 18))
BIG = 1000


def counts_for(p: int) -> list[int]:
    """The element counts every algorithm is run with in a world of ``p`` ranks."""
    return sorted({0, 1, p - 1, p + 1, 13, BIG})


def roots_for(p: int) -> list[int]:
    """Every root in small worlds; the first, a middle and the last one above."""
    return list(range(p)) if p <= 9 else [0, p // 2, p - 1]


# --------------------------------------------------------------------------------------------
# data and reduction ops

SENTINEL = -1  # RECV starts filled with it; data is never negative


def ints(rank: int, n: int) -> Array:
    """Unique per (rank, index) and never the sentinel."""
    return rank * 100_003 + np.arange(n, dtype=np.int64)


def scrambled(rank: int, n: int) -> Array:
    """Unique per (rank, index) but not monotone in rank (so MAX picks different ranks)."""
    return (ints(rank, n) * 2_654_435_761 + 12_345) % 1_000_000_007


P = 1_000_003  # prime modulus of the affine maps
AFFINE = np.dtype([("m", "i8"), ("c", "i8")])


def compose(a: Array, b: Array) -> Array:
    """x -> m x + c maps, ``a`` applied first: associative but not commutative."""
    out = np.empty(a.shape, AFFINE)
    out["m"] = a["m"] * b["m"] % P
    out["c"] = (a["c"] * b["m"] + b["c"]) % P
    return out


def affine(rank: int, n: int) -> Array:
    out = np.empty(n, AFFINE)
    i = np.arange(n, dtype=np.int64)
    out["m"] = 2 + (rank * 7919 + i * 104_729) % (P - 2)
    out["c"] = (rank * 100_003 + i) % P
    return out


LOC = np.dtype([("v", "f8"), ("i", "i8")])


def loc_pairs(rank: int, n: int) -> Array:
    """(value, index) pairs with many ties in value and indices not in rank order."""
    out = np.empty(n, LOC)
    i = np.arange(n)
    out["v"] = ((rank * 5 + i) % 4).astype(np.float64)
    out["i"] = (rank * 7 + 3 * i) % 11 + 100 * (i % 2)
    return out


def maxloc(a: Array, b: Array) -> Array:
    take_b = (b["v"] > a["v"]) | ((b["v"] == a["v"]) & (b["i"] < a["i"]))
    return np.where(take_b, b, a)


@functools.cache
def _dtype(make: Callable[[int, int], Array]) -> np.dtype[Any]:
    return make(0, 0).dtype


class OpCase(NamedTuple):
    """A reduction op, the data each rank contributes and a reference for ``left op right``."""

    name: str
    op: Op
    make: Callable[[int, int], Array]
    combine: Callable[[Array, Array], Array]

    @property
    def commutative(self) -> bool:
        return self.op.commutative

    def empty(self, n: int) -> Array:
        """An output buffer of ``n`` elements holding the sentinel."""
        out = np.empty(n, _dtype(self.make))
        out.view(np.int64)[...] = SENTINEL
        return out


SUM = OpCase("sum", ops.SUM, ints, np.add)
MAX = OpCase("max", ops.MAX, scrambled, np.maximum)
NONCOMM = OpCase("affine", Op.create(compose, commutative=False, name="affine"), affine, compose)
MAXLOC = OpCase("maxloc", ops.MAXLOC, loc_pairs, maxloc)


def op_cases(algo: Algorithm) -> list[OpCase]:
    return [SUM, MAX] + ([] if algo.commutative_only else [NONCOMM])


def in_place_modes(case: OpCase) -> tuple[bool, ...]:
    """In-place runs use SUM only: aliasing does not depend on the op (this halves the runtime)."""
    return (False, True) if case is SUM else (False,)


def fold(case: OpCase, parts: Sequence[Array]) -> Array:
    """``parts[0] op parts[1] op ...`` in rank order."""
    return functools.reduce(case.combine, parts)


def sentinel_like(dtype: np.dtype[Any], n: int) -> Array:
    out = np.empty(n, dtype)
    out.view(np.uint8)[...] = 0xA5
    return out


# --------------------------------------------------------------------------------------------
# running and checking


def schedules(collective: str, name: str, specs: Sequence[Spec]) -> list[Schedule]:
    return [registry.build(collective, name, s) for s in specs]


def simulate(ctx: str, scheds: Sequence[Schedule], buffers: Sequence[list[Array]],
             op: Op | None = None) -> None:
    try:
        run(scheds, buffers, op)
    except ScheduleError as e:
        raise AssertionError(f"{ctx}: schedule error: {e}") from e


def expect(got: Array, want: Array, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    if got.dtype == want.dtype and got.tobytes() == want.tobytes():
        return
    if got.dtype.names is None and got.dtype.kind in "fc":
        bad = np.flatnonzero(~((got == want) | (np.isnan(got) & np.isnan(want))))
    else:
        bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} of {want.size} elements wrong, first at "
                             f"index {i}: got {got[i]!r}, want {want[i]!r}")


class Inputs:
    """Copies of the input buffers, to check that a collective leaves them unchanged."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, Array, Array]] = []

    def keep(self, what: str, arr: Array) -> Array:
        self.saved.append((what, arr, arr.copy()))
        return arr

    def check(self, ctx: str) -> None:
        for what, arr, before in self.saved:
            expect(arr, before, f"{ctx}: input {what} was modified")


def v_counts(p: int, n: int, salt: int = 0) -> tuple[int, ...]:
    """Irregular per-rank counts around ``n``, including zeros (for p > 2 or small n)."""
    return tuple((n + i * (salt + 1) + salt) % (n + 2) for i in range(p))


def v_displs(counts: Sequence[int], irregular: bool) -> tuple[tuple[int, ...], int]:
    """(displacements, buffer size): packed, or reversed rank order with one-element gaps."""
    displs = [0] * len(counts)
    at = 1 if irregular else 0
    order = reversed(range(len(counts))) if irregular else range(len(counts))
    for i in order:
        displs[i] = at
        at += counts[i] + (1 if irregular else 0)
    return tuple(displs), at


def v_layouts(p: int, n: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], int, str]]:
    """(counts, displs, total, description) for the v-variants."""
    for irregular in (False, True):
        counts = v_counts(p, n, 1 if irregular else 0)
        displs, total = v_displs(counts, irregular)
        yield counts, displs, total, f"counts={counts} displs={displs}"


# --------------------------------------------------------------------------------------------
# one checker per collective: run every size/root/count/op/in-place combination

Checker = Callable[[str, Algorithm], None]
CHECKERS: dict[str, Checker] = {}


def checks(*collectives: str) -> Callable[[Checker], Checker]:
    def register(fn: Checker) -> Checker:
        for c in collectives:
            CHECKERS[c] = fn
        return fn
    return register


@checks("barrier")
def check_barrier(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        ctx = f"{coll}/{algo.name} size={p}"
        scheds = schedules(coll, algo.name, [Spec(p, r) for r in range(p)])
        simulate(ctx, scheds, [[np.empty(0, np.uint8), np.empty(0, np.uint8)]] * p)
        heard = heard_from(scheds)
        for r in range(p):
            missing = sorted(set(range(p)) - heard[r])
            assert not missing, f"{ctx}: rank {r} can leave before hearing from ranks {missing}"


def heard_from(scheds: Sequence[Schedule]) -> list[set[int]]:
    """For every rank, the ranks whose entry it causally depends on when its schedule ends."""
    p = len(scheds)
    send_step: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
    for a, sch in enumerate(scheds):
        for si, st in enumerate(sch.steps):
            for x in st.sends:
                send_step[(a, x.peer)].append(si)
    # know[r][s]: ranks r has heard from before its step s
    know = [[{r} for _ in range(len(sch.steps) + 1)] for r, sch in enumerate(scheds)]
    changed = True
    while changed:
        changed = False
        for r, sch in enumerate(scheds):
            nth: defaultdict[int, int] = defaultdict(int)
            for si, st in enumerate(sch.steps):
                new = set(know[r][si])
                for x in st.recvs:
                    new |= know[x.peer][send_step[(x.peer, r)][nth[x.peer]]]
                    nth[x.peer] += 1
                if not new <= know[r][si + 1]:
                    know[r][si + 1] |= new
                    changed = True
    return [know[r][-1] for r in range(p)]


@checks("bcast")
def check_bcast(coll: str, algo: Algorithm, segment: int = 0,
                sizes: Sequence[int] = SIZES,
                counts: Callable[[int], list[int]] = counts_for) -> None:
    for p in sizes:
        for root in roots_for(p):
            for n in counts(p):
                specs = [Spec(p, r, n, root, segment=segment) for r in range(p)]
                scheds = schedules(coll, algo.name, specs)
                want = ints(root, n)
                for in_place in (False, True):
                    ctx = (f"{coll}/{algo.name} size={p} root={root} n={n} segment={segment} "
                           f"in_place={in_place}")
                    bufs = []
                    for r in range(p):
                        recv = want.copy() if r == root else SUM.empty(n)
                        send = recv if in_place else np.empty(0, np.int64)
                        bufs.append([send, recv])
                    simulate(ctx, scheds, bufs)
                    for r in range(p):
                        expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")


@checks("reduce")
def check_reduce(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for root in roots_for(p):
            for n in counts_for(p):
                for case in op_cases(algo):
                    specs = [Spec(p, r, n, root, commutative=case.commutative)
                             for r in range(p)]
                    scheds = schedules(coll, algo.name, specs)
                    data = [case.make(r, n) for r in range(p)]
                    want = fold(case, data)
                    for in_place in in_place_modes(case):
                        ctx = (f"{coll}/{algo.name} size={p} root={root} n={n} op={case.name} "
                               f"in_place={in_place}")
                        inputs = Inputs()
                        bufs = []
                        for r in range(p):
                            if in_place and r == root:
                                recv = data[r].copy()
                                bufs.append([recv, recv])
                            else:
                                send = inputs.keep(f"SEND of rank {r}", data[r].copy())
                                bufs.append([send, case.empty(n)])
                        simulate(ctx, scheds, bufs, case.op)
                        expect(bufs[root][1], want, f"{ctx}: root RECV")
                        inputs.check(ctx)


@checks("allreduce")
def check_allreduce(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for n in counts_for(p):
            for case in [*op_cases(algo), MAXLOC]:
                specs = [Spec(p, r, n, commutative=case.commutative) for r in range(p)]
                scheds = schedules(coll, algo.name, specs)
                data = [case.make(r, n) for r in range(p)]
                want = fold(case, data)
                for in_place in in_place_modes(case):
                    ctx = f"{coll}/{algo.name} size={p} n={n} op={case.name} in_place={in_place}"
                    inputs = Inputs()
                    bufs = []
                    for r in range(p):
                        if in_place:
                            recv = data[r].copy()
                            bufs.append([recv, recv])
                        else:
                            send = inputs.keep(f"SEND of rank {r}", data[r].copy())
                            bufs.append([send, case.empty(n)])
                    simulate(ctx, scheds, bufs, case.op)
                    for r in range(p):
                        expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")
                    inputs.check(ctx)


@checks("scan", "exscan")
def check_scan(coll: str, algo: Algorithm) -> None:
    exclusive = coll == "exscan"
    for p in SIZES:
        for n in counts_for(p):
            for case in op_cases(algo):
                specs = [Spec(p, r, n, commutative=case.commutative) for r in range(p)]
                scheds = schedules(coll, algo.name, specs)
                data = [case.make(r, n) for r in range(p)]
                prefix = list(data)
                for r in range(1, p):
                    prefix[r] = case.combine(prefix[r - 1], data[r])
                for in_place in in_place_modes(case):
                    ctx = f"{coll}/{algo.name} size={p} n={n} op={case.name} in_place={in_place}"
                    inputs = Inputs()
                    bufs = []
                    for r in range(p):
                        if in_place:
                            recv = data[r].copy()
                            bufs.append([recv, recv])
                        else:
                            send = inputs.keep(f"SEND of rank {r}", data[r].copy())
                            bufs.append([send, case.empty(n)])
                    simulate(ctx, scheds, bufs, case.op)
                    for r in range(p):
                        if not exclusive:
                            want = prefix[r]
                        elif r:
                            want = prefix[r - 1]
                        else:  # rank 0's RECV must be left untouched
                            want = data[0] if in_place else case.empty(n)
                        expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")
                    inputs.check(ctx)


@checks("gather", "gatherv")
def check_gather(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for root in roots_for(p):
            for n in counts_for(p):
                if coll == "gather":
                    layouts = [((n,) * p, tuple(i * n for i in range(p)), p * n, "")]
                else:
                    layouts = list(v_layouts(p, n))
                for counts, displs, total, desc in layouts:
                    if coll == "gather":
                        specs = [Spec(p, r, n, root) for r in range(p)]
                    else:
                        specs = [Spec(p, r, counts[r], root, counts, displs) if r == root
                                 else Spec(p, r, counts[r], root) for r in range(p)]
                    scheds = schedules(coll, algo.name, specs)
                    data = [ints(r, counts[r]) for r in range(p)]
                    want = SUM.empty(total)
                    for r in range(p):
                        want[displs[r]:displs[r] + counts[r]] = data[r]
                    for in_place in (False, True):
                        ctx = (f"{coll}/{algo.name} size={p} root={root} n={n} {desc} "
                               f"in_place={in_place}")
                        inputs = Inputs()
                        bufs = []
                        for r in range(p):
                            if r != root:
                                send = inputs.keep(f"SEND of rank {r}", data[r].copy())
                                bufs.append([send, np.empty(0, np.int64)])
                                continue
                            recv = SUM.empty(total)
                            if in_place:
                                send = recv[displs[r]:displs[r] + counts[r]]
                                send[...] = data[r]
                            else:
                                send = inputs.keep("SEND of the root", data[r].copy())
                            bufs.append([send, recv])
                        simulate(ctx, scheds, bufs)
                        expect(bufs[root][1], want, f"{ctx}: root RECV")
                        inputs.check(ctx)


@checks("scatter", "scatterv")
def check_scatter(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for root in roots_for(p):
            for n in counts_for(p):
                if coll == "scatter":
                    layouts = [((n,) * p, tuple(i * n for i in range(p)), p * n, "")]
                else:
                    layouts = list(v_layouts(p, n))
                for counts, displs, total, desc in layouts:
                    if coll == "scatter":
                        specs = [Spec(p, r, n, root) for r in range(p)]
                    else:
                        specs = [Spec(p, r, counts[r], root, counts, displs) if r == root
                                 else Spec(p, r, counts[r], root) for r in range(p)]
                    scheds = schedules(coll, algo.name, specs)
                    source = ints(root, total)
                    for in_place in (False, True):
                        ctx = (f"{coll}/{algo.name} size={p} root={root} n={n} {desc} "
                               f"in_place={in_place}")
                        inputs = Inputs()
                        bufs = []
                        for r in range(p):
                            if r != root:
                                bufs.append([np.empty(0, np.int64), SUM.empty(counts[r])])
                                continue
                            send = inputs.keep("SEND of the root", source.copy())
                            recv = (send[displs[r]:displs[r] + counts[r]] if in_place
                                    else SUM.empty(counts[r]))
                            bufs.append([send, recv])
                        simulate(ctx, scheds, bufs)
                        for r in range(p):
                            want = source[displs[r]:displs[r] + counts[r]]
                            expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")
                        inputs.check(ctx)


@checks("allgather", "allgatherv")
def check_allgather(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for n in counts_for(p):
            if coll == "allgather":
                layouts = [((n,) * p, tuple(i * n for i in range(p)), p * n, "")]
            elif algo.equal_blocks_only:
                continue
            else:
                layouts = list(v_layouts(p, n))
            for counts, displs, total, desc in layouts:
                if coll == "allgather":
                    specs = [Spec(p, r, n) for r in range(p)]
                else:
                    specs = [Spec(p, r, counts[r], 0, counts, displs) for r in range(p)]
                scheds = schedules(coll, algo.name, specs)
                data = [ints(r, counts[r]) for r in range(p)]
                want = SUM.empty(total)
                for r in range(p):
                    want[displs[r]:displs[r] + counts[r]] = data[r]
                for in_place in (False, True):
                    ctx = f"{coll}/{algo.name} size={p} n={n} {desc} in_place={in_place}"
                    inputs = Inputs()
                    bufs = []
                    for r in range(p):
                        recv = SUM.empty(total)
                        if in_place:
                            send = recv[displs[r]:displs[r] + counts[r]]
                            send[...] = data[r]
                        else:
                            send = inputs.keep(f"SEND of rank {r}", data[r].copy())
                        bufs.append([send, recv])
                    simulate(ctx, scheds, bufs)
                    for r in range(p):
                        expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")
                    inputs.check(ctx)


def pair_counts(p: int, n: int, salt: int) -> list[list[int]]:
    """c[i][j]: elements rank i sends to rank j, irregular, with zeros."""
    return [[(n + 3 * i + j + salt) % (n + 2) for j in range(p)] for i in range(p)]


@checks("alltoall", "alltoallv")
def check_alltoall(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for n in counts_for(p):
            if coll == "alltoall":
                layouts: list[tuple[list[list[int]], bool, bool]] = [
                    ([[n] * p] * p, False, False)]
            elif algo.equal_blocks_only:
                continue
            else:
                layouts = [(pair_counts(p, n, 0), False, True),
                           (pair_counts(p, n, 1), True, False)]
            for c, s_irregular, r_irregular in layouts:
                sl = [v_displs(c[r], s_irregular) for r in range(p)]
                rl = [v_displs([c[i][r] for i in range(p)], r_irregular) for r in range(p)]
                if coll == "alltoall":
                    specs = [Spec(p, r, n) for r in range(p)]
                    desc = ""
                else:
                    specs = [Spec(p, r, 0, 0, tuple(c[r]), sl[r][0],
                                  tuple(c[i][r] for i in range(p)), rl[r][0])
                             for r in range(p)]
                    desc = f"counts={c} gaps(send, recv)={s_irregular, r_irregular}"
                scheds = schedules(coll, algo.name, specs)
                ctx = f"{coll}/{algo.name} size={p} n={n} {desc}"
                inputs = Inputs()
                sends = [inputs.keep(f"SEND of rank {r}", ints(r, sl[r][1])) for r in range(p)]
                bufs = [[sends[r], SUM.empty(rl[r][1])] for r in range(p)]
                simulate(ctx, scheds, bufs)
                for j in range(p):
                    want = SUM.empty(rl[j][1])
                    for i in range(p):
                        src, dst = sl[i][0][j], rl[j][0][i]
                        want[dst:dst + c[i][j]] = sends[i][src:src + c[i][j]]
                    expect(bufs[j][1], want, f"{ctx}: rank {j} RECV")
                inputs.check(ctx)


@checks("alltoallw")
def check_alltoallw(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for n in counts_for(p):
            c = pair_counts(p, n, 0)
            specs = [Spec(p, r, 0, 0, tuple(c[r]), None, tuple(c[i][r] for i in range(p)))
                     for r in range(p)]
            scheds = schedules(coll, algo.name, specs)
            ctx = f"{coll}/{algo.name} size={p} n={n} counts={c}"
            inputs = Inputs()
            data = [[((ints(r, c[r][j]) + 7 * j) % 251).astype(np.uint8) for j in range(p)]
                    for r in range(p)]
            bufs, recvs = [], []
            for r in range(p):
                # schedule buffer 3+i is send_i, 3+p+i is recv_i: the simulator puts TMP at 2
                sends = [inputs.keep(f"send buffer {j} of rank {r}", data[r][j].copy())
                         for j in range(p)]
                recvs.append([np.full(c[i][r], 0xA5, np.uint8) for i in range(p)])
                bufs.append([np.empty(0, np.uint8), np.empty(0, np.uint8), *sends, *recvs[r]])
            simulate(ctx, scheds, bufs)
            for j in range(p):
                for i in range(p):
                    expect(recvs[j][i], data[i][j],
                           f"{ctx}: rank {j} receive buffer from {i}")
            inputs.check(ctx)


@checks("reduce_scatter_block", "reduce_scatter")
def check_reduce_scatter(coll: str, algo: Algorithm) -> None:
    for p in SIZES:
        for n in counts_for(p):
            for case in op_cases(algo):
                counts = (n,) * p if coll == "reduce_scatter_block" else v_counts(p, n, 1)
                displs, total = v_displs(counts, False)
                if coll == "reduce_scatter_block":
                    specs = [Spec(p, r, n, commutative=case.commutative) for r in range(p)]
                else:
                    specs = [Spec(p, r, counts[r], 0, counts, commutative=case.commutative)
                             for r in range(p)]
                scheds = schedules(coll, algo.name, specs)
                data = [case.make(r, total) for r in range(p)]
                want = fold(case, data)
                ctx = f"{coll}/{algo.name} size={p} n={n} counts={counts} op={case.name}"
                inputs = Inputs()
                bufs = [[inputs.keep(f"SEND of rank {r}", data[r].copy()),
                         case.empty(counts[r])] for r in range(p)]
                simulate(ctx, scheds, bufs, case.op)
                for r in range(p):
                    expect(bufs[r][1], want[displs[r]:displs[r] + counts[r]],
                           f"{ctx}: rank {r} RECV")
                inputs.check(ctx)


# --------------------------------------------------------------------------------------------
# the tests

ALGORITHMS = [(c, a) for c, algos in REGISTRY.items() for a in algos]
IDS = [f"{c}-{a}" for c, a in ALGORITHMS]


def test_every_collective_is_checked() -> None:
    assert set(REGISTRY) <= set(CHECKERS), f"no checker for {set(REGISTRY) - set(CHECKERS)}"


@pytest.mark.parametrize(("collective", "name"), ALGORITHMS, ids=IDS)
def test_algorithm(collective: str, name: str) -> None:
    CHECKERS[collective](collective, REGISTRY[collective][name])


@pytest.mark.parametrize("name", list(REGISTRY["bcast"]))
@pytest.mark.parametrize("segment", [1, 3, 64, 999])
def test_bcast_segmented(name: str, segment: int) -> None:
    """Pipelining in segments gives the same result (at most ~200 segments, for runtime)."""
    def counts(p: int) -> list[int]:
        return [n for n in [*counts_for(p), 4099] if n <= 200 * segment]

    check_bcast("bcast", REGISTRY["bcast"][name], segment, (1, 2, 3, 4, 5, 8, 9, 16, 17), counts)


def test_bcast_ring_segments_pipeline() -> None:
    """Segmenting really cuts the ring's messages (so the segmented test is not vacuous)."""
    p, n, seg = 5, 100, 7
    sched = registry.build("bcast", "ring", Spec(p, 2, n, 0, segment=seg))
    lengths = [x.length for st in sched.steps for x in st.recvs + st.sends]
    assert lengths and max(lengths) == seg, lengths
    assert sum(x.length for st in sched.steps for x in st.recvs) == n


DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.longdouble,
          np.complex64, np.complex128, np.clongdouble, np.bool_]


def small_values(dtype: np.dtype[Any], rank: int, n: int) -> Array:
    """Values whose sums over 17 ranks are exact in ``dtype``, unique-ish per element."""
    i = np.arange(n)
    if dtype.kind == "b":
        return (rank * 7 + i) % 5 == 0
    if dtype.kind == "u":
        return ((rank * 3 + i) % 7).astype(dtype)
    if dtype.kind == "c":
        return (((rank * 3 + i) % 7 - 3) + 1j * ((rank + 2 * i) % 5 - 2)).astype(dtype)
    return ((rank * 3 + i) % 7 - 3).astype(dtype)


@pytest.mark.parametrize("dtype", [np.dtype(d) for d in DTYPES], ids=str)
def test_allreduce_dtypes(dtype: np.dtype[Any]) -> None:
    op = ops.LOR if dtype.kind == "b" else ops.SUM
    ufunc: Any = np.logical_or if dtype.kind == "b" else np.add
    for name in REGISTRY["allreduce"]:
        for p in (1, 2, 3, 4, 5, 7, 8, 13, 16, 17):
            for n in (0, 1, 13, BIG):
                specs = [Spec(p, r, n) for r in range(p)]
                scheds = schedules("allreduce", name, specs)
                data = [small_values(dtype, r, n) for r in range(p)]
                want = functools.reduce(ufunc, data).astype(dtype)
                ctx = f"allreduce/{name} dtype={dtype} size={p} n={n}"
                bufs = [[data[r], sentinel_like(dtype, n)] for r in range(p)]
                simulate(ctx, scheds, bufs, op)
                for r in range(p):
                    expect(bufs[r][1], want, f"{ctx}: rank {r} RECV")


V_COLLECTIVES = ("gatherv", "scatterv", "allgatherv", "alltoallv", "alltoallw", "reduce_scatter")


def spec_variants(collective: str, p: int, r: int, n: int, root: int) -> list[Spec]:
    """A few specs of the shapes the collective takes, for the purity test."""
    spec = Spec(p, r, n, root)
    if collective in V_COLLECTIVES:
        counts = v_counts(p, n, 1)
        displs, _ = v_displs(counts, True)
        spec = Spec(p, r, counts[r], root, counts, displs, counts, displs)
    return [spec, spec._replace(commutative=False), spec._replace(segment=3)]


@pytest.mark.parametrize(("collective", "name"), ALGORITHMS, ids=IDS)
def test_schedules_are_pure(collective: str, name: str) -> None:
    """Building twice gives equal, hashable (immutable) schedules of the IR's types."""
    algo = REGISTRY[collective][name]
    for p in (1, 2, 3, 6, 8, 11, 17):
        for root in sorted({0, p - 1}):
            for r in range(p):
                for spec in spec_variants(collective, p, r, 13, root):
                    first, second = algo.build(spec), algo.build(spec)
                    ctx = f"{collective}/{name} {spec}"
                    assert first == second, f"{ctx}: two builds differ"
                    assert registry.build(collective, name, spec) == first, ctx
                    hash(first)
                    assert isinstance(first, Schedule), ctx
                    for st in first.steps:
                        assert isinstance(st, Step), ctx
                        assert all(isinstance(x, Xfer) for x in st.recvs + st.sends), ctx
