"""One rank of the soak run: tests/soak/test_soak.py starts it with ``ringworld run``.

Every rank draws the same sequence of steps from one seeded generator: each step is one
operation (a collective with a forced algorithm drawn at random, blocking or nonblocking, a batch
of nonblocking collectives in flight together, an object collective, a point-to-point pattern
with buffers or objects, wildcards and probes, or creating/freeing a sub-communicator) on the
world or on a live sub-communicator; ranks outside that communicator draw the same numbers and
skip the call, so the sequence never diverges. Data are a function of (contributing rank, element
index, step), small integers so every reduction is exact in any order; every result is compared
with numpy's and every differing element is counted (the first few are described on stderr).

Leak checks: after the warm-up and at the end (every sub-communicator freed, the library's
bounded caches emptied, ``gc.collect()``) each rank records its RSS, open file descriptors,
threads, shared-memory mappings and the job's /dev/shm files; after ``ringworld.finalize()`` it
compares descriptors and threads with what it had before ``ringworld.init()``. With
``RINGWORLD_SOAK_DIR`` set, rank 0 waits until every rank has finalized and then lists the job's
/dev/shm files.

Environment: ``RINGWORLD_SOAK_OPS`` (steps, default 5000), ``RINGWORLD_SOAK_SEED`` (default 1),
``RINGWORLD_SOAK_WARMUP`` (steps, default a fifth of them), ``RINGWORLD_SOAK_DIR`` (each rank
writes ``started.<rank>`` with its pid and job id there first), ``RINGWORLD_SOAK_TRACEMALLOC=1``
(also record the bytes Python and numpy hold, to tell a leak from allocator slack; slower),
``RINGWORLD_SOAK_CORRUPT=<rank>`` (that rank flips a bit of one result it checks: the checks'
own test).
Output: one line ``SOAK {json}`` per rank.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import ringworld
from ringworld import IN_PLACE, Communicator, Op, Request
from ringworld.algorithms import registry
from ringworld.algorithms.registry import REGISTRY
from ringworld.tuning.cost import SHM_MODELS

Array = np.ndarray[Any, Any]
WAIT = 60.0  # every blocking call and wait: a hang shows up as a Timeout naming the call
P_AFF = 1_000_003
LOC = np.dtype([("v", "f8"), ("i", "i8")])
AFFINE = np.dtype([("m", "i8"), ("c", "i8")])
PLAIN = tuple(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, np.bool_))
MOVE_DTYPES = (*PLAIN, LOC)  # for collectives that only move data
#: Element counts: 0, odd and prime counts, around the 16 KiB shared-memory slot and the
#: 128 KiB eager limit (for 8-byte elements); LARGE (> the 1 MiB bcast segment) is rare.
COUNTS = (0, 1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 100, 127, 255, 1000, 1023, 2049, 4097, 20011)
SMALL_COUNTS = (0, 1, 2, 3, 5, 7, 13, 31, 100, 257)
LARGE = 140_001
LARGE_ODDS = 0.01


def _affine(a: Array, b: Array) -> Array:
    """x -> m*x + c mod P, first ``a`` then ``b``: associative and not commutative."""
    out = np.empty_like(a)
    out["m"] = a["m"] * b["m"] % P_AFF
    out["c"] = (a["c"] * b["m"] + b["c"]) % P_AFF
    return out


AFFINE_OP = Op.create(_affine, commutative=False, name="affine")
UFUNCS: dict[str, np.ufunc] = {
    "sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
    "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}
_ARITH = (ringworld.SUM, ringworld.PROD, ringworld.MAX, ringworld.MIN)
_BITS = (ringworld.BAND, ringworld.BOR, ringworld.BXOR, ringworld.LAND, ringworld.LOR,
         ringworld.LXOR)
#: Every (dtype, op) pair a buffer reduction is drawn from.
REDUCTIONS: tuple[tuple[np.dtype[Any], Op], ...] = (
    *((d, o) for d in PLAIN if d.kind in "iub" for o in (*_ARITH, *_BITS)),
    *((d, o) for d in PLAIN if d.kind == "f" for o in _ARITH),
    *((d, o) for d in PLAIN if d.kind == "c" for o in (ringworld.SUM, ringworld.PROD)),
    (LOC, ringworld.MAXLOC), (LOC, ringworld.MINLOC), (AFFINE, AFFINE_OP),
)


# ------------------------------------------------------------------------ data and references
def data(dt: np.dtype[Any], n: int, who: int, salt: int, op: str = "") -> Array:
    """Element i of contributor ``who`` at step ``salt``: never constant, small, exact."""
    i = np.arange(n, dtype=np.int64)
    base = (i * 7 + who * 13 + salt * 5 + (i * (who + 1)) % 3) % 16
    if dt == LOC:
        out = np.empty(n, LOC)
        out["v"] = base % 5  # many ties: the smaller index must win
        out["i"] = who
        return out
    if dt == AFFINE:
        out = np.empty(n, AFFINE)
        out["m"] = 1 + (base * 37 + who) % (P_AFF - 1)
        out["c"] = (base * 11 + who * 5 + i) % P_AFF
        return out
    if op == "prod":  # products of 4 ranks stay tiny
        base = np.where(base % 5 == 0, -1, 1 + base % 2) if dt.kind in "ifc" else 1 + base % 2
    elif dt.kind in "if":
        base = base - 8
    if dt.kind == "b":
        return base % 3 == 0
    if dt.kind == "c":
        return (base + 1j * ((base * 3 + who) % 3)).astype(dt)
    return base.astype(dt)


def sentinel(dt: np.dtype[Any], n: int) -> Array:
    """A receive buffer's initial contents, outside the range of :func:`data`."""
    out = np.zeros(n, dt)
    if dt == LOC:
        out["v"], out["i"] = 777.0, -5
    elif dt != AFFINE and dt.kind != "b":
        out[...] = 77
    return out


def ref_reduce(op: Op, arrays: Sequence[Array]) -> Array:
    """``op`` over ``arrays`` in rank order, with numpy."""
    if op.name in ("maxloc", "minloc"):
        vals = np.stack([a["v"] for a in arrays])
        idx = np.stack([a["i"] for a in arrays])
        best = vals.max(axis=0) if op.name == "maxloc" else vals.min(axis=0)
        out = np.empty(arrays[0].shape, LOC)
        out["v"] = best
        out["i"] = np.where(vals == best, idx, np.iinfo(np.int64).max).min(axis=0)
        return out
    if op is AFFINE_OP:
        return functools.reduce(_affine, arrays)
    acc = arrays[0].copy()
    for a in arrays[1:]:
        UFUNCS[op.name](acc, a, out=acc)
    return acc


def wrong(got: Array, want: Array) -> int:
    """Elements of ``got`` that differ from ``want`` (all of them if the shapes differ)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    if got.size == 0:
        return 0
    if got.dtype.names:  # structured: compare each element's bytes
        rows = got.view(np.uint8).reshape(got.size, -1) != want.view(np.uint8).reshape(
            want.size, -1)
        return int(np.count_nonzero(rows.any(axis=1)))
    return int(np.count_nonzero(got != want))


def obj_wrong(got: Any, want: Any) -> int:
    """Leaves of a Python value that differ (arrays count their differing elements)."""
    if isinstance(want, np.ndarray):
        return wrong(got, want) if isinstance(got, np.ndarray) else max(want.size, 1)
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return 1
        return sum(obj_wrong(got[k], want[k]) for k in want)
    if isinstance(want, list | tuple):
        if type(got) is not type(want) or len(got) != len(want):
            return 1
        return sum(obj_wrong(g, w) for g, w in zip(got, want, strict=True))
    return int(type(got) is not type(want) or got != want)


def packed(counts: Sequence[int], gaps: Sequence[int], order: Sequence[int]) -> list[int]:
    """Displacements placing block ``order[k]`` after the previous one plus ``gaps[k]``."""
    displs = [0] * len(counts)
    at = 0
    for k, b in enumerate(order):
        at += gaps[k]
        displs[b] = at
        at += counts[b]
    return displs


# ------------------------------------------------------------------------ state
@dataclass
class Group:
    """A communicator of the soak: its members (world ranks in its rank order) on every rank,
    the communicator itself only on members."""

    members: list[int]
    comm: Communicator | None
    shm_ok: bool  # the shared-memory algorithms can run on it (same answer on every rank)

    @property
    def p(self) -> int:
        return len(self.members)

    @property
    def r(self) -> int:
        return self.comm.rank if self.comm is not None else -1


@dataclass
class Pending:
    """A started operation: its request (None once complete) and the check of its results."""

    what: str
    req: Request[Any] | None
    check: Callable[[], int]


@dataclass
class Stats:
    steps: int = 0
    calls: int = 0
    wrong: int = 0
    checked: int = 0  # elements (or object leaves) compared
    kinds: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: (step, RSS KiB, gc objects, traced KiB) at each measurement
    curve: list[tuple[int, int, int, int]] = field(default_factory=list)


def clear_bounded_caches(world: Communicator) -> None:
    """Empty the library's caches that are bounded by design (schedules, call signatures,
    checked ops, algorithm choices): the soak's random layouts would fill them for a long time,
    hiding or faking growth. Run at the same point of the sequence on every rank."""

    registry.build.cache_clear()
    # private names: a cache renamed away is simply not cleared (the bounds then allow for it)
    engine = getattr(world, "_engine", None)
    calls = getattr(world, "_cache", None)  # the communicator's CallCache
    if calls is not None:
        calls.clear()
    for owner, name in ((world.selector, "_memo"),
                        (engine, "signed_calls"), (engine, "_marks"), (engine, "signatures")):
        cache = getattr(owner, name, None)
        if isinstance(cache, dict):
            cache.clear()


def probe_resources(job_id: str) -> dict[str, int]:
    """This process's resources now (after a full collection); with tracemalloc on, also the
    bytes Python and numpy hold (what RSS would be without the allocator's own slack)."""
    gc.collect()
    status = Path("/proc/self/status").read_text()
    rss = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {
        "rss_kib": rss,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")),
        "shm_maps": sum("/dev/shm/ringworld-" in ln for ln in maps),
        "shm_files": len(job_shm_files(job_id)),
        "gc_objects": len(gc.get_objects()),
        "traced_kib": tracemalloc.get_traced_memory()[0] // 1024 if tracemalloc.is_tracing()
        else -1,
    }


def job_shm_files(job_id: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"ringworld-{job_id}-"))
    except OSError:
        return []


# ------------------------------------------------------------------------ the soak
class Soak:
    def __init__(self, world: Communicator, seed: int) -> None:
        self.world = world
        self.rng = np.random.default_rng(seed)  # identical on every rank: never rank-dependent
        self.stats = Stats()
        self.shm = world.transport == "shm"
        self.pool: list[Group] = []  # live sub-communicators
        self.salt = 0
        # RINGWORLD_SOAK_CORRUPT=<rank>: that rank flips a bit of one received element, once
        self.corrupt = os.environ.get("RINGWORLD_SOAK_CORRUPT") == str(world.rank)

    # -------------------------------------------------------------- drawing (shared)
    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def count(self, small: bool = False) -> int:
        if not small and self.chance(LARGE_ODDS):
            return LARGE
        return int(self.pick(SMALL_COUNTS if small else COUNTS))

    def algo(self, g: Group, coll: str, blocking: bool, *, commutative: bool = True,
             equal: bool = True) -> str | None:
        names: list[str | None] = [
            a.name for a in REGISTRY[coll].values()
            if (commutative or not a.commutative_only) and (equal or not a.equal_blocks_only)]
        if blocking and g.shm_ok and equal and coll in SHM_MODELS:
            names.append("shm")
        names.append(None)  # the cost model's choice
        return self.pick(names)

    def tag(self, k: int = 0) -> int:
        return (self.salt * 64 + k) % (ringworld.TAG_UB - 1) + 1  # unique per step and k

    # -------------------------------------------------------------- checking
    def compare(self, what: str, got: Array, want: Array) -> int:
        if self.corrupt and got.size and got.dtype.kind in "iu":  # the checks' own test
            self.corrupt = False
            got = got.copy()
            got.flat[0] ^= 1
        bad = wrong(got, want)
        self.stats.checked += max(want.size, 1)
        if bad:
            self.fail(f"{what}: {bad} of {want.size} elements wrong; got {got[:8]!r}, "
                      f"want {want[:8]!r}")
        return bad

    def compare_obj(self, what: str, got: Any, want: Any) -> int:
        bad = obj_wrong(got, want)
        self.stats.checked += 1
        if bad:
            self.fail(f"{what}: {bad} wrong; got {got!r:.300}, want {want!r:.300}")
        return bad

    def fail(self, text: str) -> None:
        if len(self.stats.failures) < 10:
            line = f"rank {self.world.rank} step {self.salt}: {text}"
            self.stats.failures.append(line)
            print(f"SOAK-WRONG {line}", file=sys.stderr, flush=True)

    def call(self, comm: Communicator, name: str, blocking: bool, *args: Any,
             **kw: Any) -> Request[Any] | None:
        self.stats.calls += 1
        if blocking:
            getattr(comm, name)(*args, timeout=WAIT, **kw)
            return None
        req: Request[Any] = getattr(comm, "i" + name)(*args, **kw)
        return req

    # -------------------------------------------------------------- buffer collectives
    def c_barrier(self, g: Group, blocking: bool) -> Pending | None:
        algo = self.algo(g, "barrier", blocking)
        if g.comm is None:
            return None
        return Pending("barrier", self.call(g.comm, "barrier", blocking, algorithm=algo),
                       lambda: 0)

    def c_bcast(self, g: Group, blocking: bool) -> Pending | None:
        dt, n, root = self.pick(MOVE_DTYPES), self.count(), int(self.rng.integers(g.p))
        algo = self.algo(g, "bcast", blocking)
        if g.comm is None:
            return None
        want = data(dt, n, root, self.salt)
        buf = want.copy() if g.r == root else sentinel(dt, n)
        what = f"bcast({dt}, n={n}, root={root}, {algo})"
        req = self.call(g.comm, "bcast", blocking, buf, root, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, buf, want))

    def c_reduce(self, g: Group, blocking: bool) -> Pending | None:
        dt, op = self.pick(REDUCTIONS)
        n, root, inplace = self.count(), int(self.rng.integers(g.p)), self.chance(0.3)
        algo = self.algo(g, "reduce", blocking, commutative=op.commutative)
        if g.comm is None:
            return None
        ins = [data(dt, n, i, self.salt, op.name) for i in range(g.p)]
        r = g.r
        what = f"reduce({dt}, {op.name}, n={n}, root={root}, in_place={inplace}, {algo})"
        if r == root:
            rb = ins[r].copy() if inplace else sentinel(dt, n)
            sb: Any = IN_PLACE if inplace else ins[r]
            want = ref_reduce(op, ins)
        else:
            rb, sb, want = None, ins[r], None
        req = self.call(g.comm, "reduce", blocking, sb, rb, op, root, algorithm=algo)
        return Pending(what, req, lambda: 0 if want is None else self.compare(what, rb, want))

    def c_allreduce(self, g: Group, blocking: bool) -> Pending | None:
        dt, op = self.pick(REDUCTIONS)
        n, inplace = self.count(), self.chance(0.3)
        algo = self.algo(g, "allreduce", blocking, commutative=op.commutative)
        if g.comm is None:
            return None
        ins = [data(dt, n, i, self.salt, op.name) for i in range(g.p)]
        rb = ins[g.r].copy() if inplace else sentinel(dt, n)
        want = ref_reduce(op, ins)
        what = f"allreduce({dt}, {op.name}, n={n}, in_place={inplace}, {algo})"
        req = self.call(g.comm, "allreduce", blocking, IN_PLACE if inplace else ins[g.r], rb,
                        op, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def c_reduce_scatter(self, g: Group, blocking: bool) -> Pending | None:
        dt, op = self.pick(REDUCTIONS)
        block = self.chance(0.5)
        p = g.p
        counts = [self.count(small=True)] * p if block else [self.count(small=True)
                                                             for _ in range(p)]
        inplace = self.chance(0.3)
        coll = "reduce_scatter_block" if block else "reduce_scatter"
        algo = self.algo(g, coll, blocking, commutative=op.commutative, equal=block)
        if g.comm is None:
            return None
        r, total = g.r, sum(counts)
        ins = [data(dt, total, i, self.salt, op.name) for i in range(p)]
        start = sum(counts[:r])
        want = ref_reduce(op, ins)[start : start + counts[r]]
        rb = ins[r].copy() if inplace else sentinel(dt, counts[r])
        sb: Any = IN_PLACE if inplace else ins[r]
        what = f"{coll}({dt}, {op.name}, counts={counts}, in_place={inplace}, {algo})"
        args: tuple[Any, ...] = (sb, rb) if block else (sb, rb, counts)
        req = self.call(g.comm, coll, blocking, *args, op, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb[: counts[r]], want))

    def c_scan(self, g: Group, blocking: bool) -> Pending | None:
        dt, op = self.pick(REDUCTIONS)
        n, inplace, ex = self.count(), self.chance(0.3), self.chance(0.5)
        coll = "exscan" if ex else "scan"
        algo = self.algo(g, coll, blocking, commutative=op.commutative)
        if g.comm is None:
            return None
        r = g.r
        ins = [data(dt, n, i, self.salt, op.name) for i in range(r + 1)]
        rb = ins[r].copy() if inplace else sentinel(dt, n)
        # exscan: rank 0's buffer stays as it was
        want = ref_reduce(op, ins[: r if ex else r + 1]) if r or not ex else rb.copy()
        what = f"{coll}({dt}, {op.name}, n={n}, in_place={inplace}, {algo})"
        req = self.call(g.comm, coll, blocking, IN_PLACE if inplace else ins[r], rb, op,
                        algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def c_gather(self, g: Group, blocking: bool) -> Pending | None:
        dt, n, root = self.pick(MOVE_DTYPES), self.count(), int(self.rng.integers(g.p))
        inplace = self.chance(0.3)
        scatter = self.chance(0.5)
        coll = "scatter" if scatter else "gather"
        algo = self.algo(g, coll, blocking)
        if g.comm is None:
            return None
        p, r = g.p, g.r
        what = f"{coll}({dt}, n={n}, root={root}, in_place={inplace}, {algo})"
        if scatter:
            full = data(dt, p * n, root, self.salt)
            want = full[r * n : (r + 1) * n]
            if r == root:
                sb: Any = full
                rb: Any = IN_PLACE if inplace else sentinel(dt, n)
                out = full[r * n : (r + 1) * n] if inplace else rb
            else:
                sb, rb = None, sentinel(dt, n)
                out = rb
            req = self.call(g.comm, "scatter", blocking, sb, rb, root, algorithm=algo)
            return Pending(what, req, lambda: self.compare(what, out, want))
        mine = data(dt, n, r, self.salt)
        if r != root:
            req = self.call(g.comm, "gather", blocking, mine, None, root, algorithm=algo)
            return Pending(what, req, lambda: 0)
        want = np.concatenate([data(dt, n, i, self.salt) for i in range(p)])
        rb = sentinel(dt, p * n)
        if inplace:
            rb[r * n : (r + 1) * n] = mine
        req = self.call(g.comm, "gather", blocking, IN_PLACE if inplace else mine, rb, root,
                        algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def _layout(self, p: int) -> tuple[list[int], list[int], int]:
        """Per-rank counts and displacements (packed, or with gaps in a shuffled order)."""
        counts = [self.count(small=True) for _ in range(p)]
        if self.chance(0.5):
            gaps, order = [0] * p, list(range(p))
        else:
            gaps = [int(x) for x in self.rng.integers(0, 4, p)]
            order = [int(x) for x in self.rng.permutation(p)]
        displs = packed(counts, gaps, order)
        return counts, displs, sum(counts) + sum(gaps)

    def c_gatherv(self, g: Group, blocking: bool) -> Pending | None:
        dt, root = self.pick(MOVE_DTYPES), int(self.rng.integers(g.p))
        counts, displs, total = self._layout(g.p)
        inplace, scatter = self.chance(0.3), self.chance(0.5)
        coll = "scatterv" if scatter else "gatherv"
        algo = self.algo(g, coll, blocking, equal=False)
        if g.comm is None:
            return None
        r = g.r
        what = (f"{coll}({dt}, counts={counts}, displs={displs}, root={root}, "
                f"in_place={inplace}, {algo})")
        if scatter:
            full = data(dt, total, root, self.salt)
            want = full[displs[r] : displs[r] + counts[r]]
            if r == root:
                rb: Any = IN_PLACE if inplace else sentinel(dt, counts[r])
                out = want if inplace else rb
                req = self.call(g.comm, "scatterv", blocking, full, rb, counts, displs, root,
                                algorithm=algo)
            else:
                out = sentinel(dt, counts[r])
                req = self.call(g.comm, "scatterv", blocking, None, out, None, None, root,
                                algorithm=algo)
            return Pending(what, req, lambda: self.compare(what, out, want))
        mine = data(dt, counts[r], r, self.salt)
        if r != root:
            req = self.call(g.comm, "gatherv", blocking, mine, None, None, None, root,
                            algorithm=algo)
            return Pending(what, req, lambda: 0)
        want, rb = self._gathered(dt, counts, displs, total, r, mine if inplace else None)
        req = self.call(g.comm, "gatherv", blocking, IN_PLACE if inplace else mine, rb, counts,
                        displs, root, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def _gathered(self, dt: np.dtype[Any], counts: list[int], displs: list[int], total: int,
                  r: int, own: Array | None) -> tuple[Array, Array]:
        """The expected gathered buffer (every rank's block at its displacement) and a
        sentinel-filled receive buffer, holding ``own`` at this rank's place for in-place calls."""
        want = sentinel(dt, total)
        for i in range(len(counts)):
            want[displs[i] : displs[i] + counts[i]] = data(dt, counts[i], i, self.salt)
        rb = sentinel(dt, total)
        if own is not None:
            rb[displs[r] : displs[r] + counts[r]] = own
        return want, rb

    def c_allgather(self, g: Group, blocking: bool) -> Pending | None:
        dt, inplace, v = self.pick(MOVE_DTYPES), self.chance(0.3), self.chance(0.4)
        p = g.p
        if v:
            counts, displs, total = self._layout(p)
        else:
            n = self.count()
            counts, displs, total = [n] * p, [i * n for i in range(p)], n * p
        coll = "allgatherv" if v else "allgather"
        algo = self.algo(g, coll, blocking, equal=not v)
        if g.comm is None:
            return None
        r = g.r
        mine = data(dt, counts[r], r, self.salt)
        want, rb = self._gathered(dt, counts, displs, total, r, mine if inplace else None)
        sb: Any = IN_PLACE if inplace else mine
        what = f"{coll}({dt}, counts={counts}, displs={displs}, in_place={inplace}, {algo})"
        args: tuple[Any, ...] = (sb, rb, counts, displs) if v else (sb, rb)
        req = self.call(g.comm, coll, blocking, *args, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def c_alltoall(self, g: Group, blocking: bool) -> Pending | None:
        dt, n, inplace = self.pick(MOVE_DTYPES), self.count(), self.chance(0.3)
        algo = self.algo(g, "alltoall", blocking)
        if g.comm is None:
            return None
        p, r = g.p, g.r
        sb = data(dt, p * n, r, self.salt)  # block j goes to rank j
        want = np.concatenate([data(dt, p * n, i, self.salt)[r * n : (r + 1) * n]
                               for i in range(p)])
        rb = sb.copy() if inplace else sentinel(dt, p * n)
        what = f"alltoall({dt}, n={n}, in_place={inplace}, {algo})"
        req = self.call(g.comm, "alltoall", blocking, IN_PLACE if inplace else sb, rb,
                        algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    def c_alltoallv(self, g: Group, blocking: bool) -> Pending | None:
        p = g.p
        dt = self.pick(MOVE_DTYPES)
        m = [[self.count(small=True) for _ in range(p)] for _ in range(p)]  # m[i][j]: i to j
        gaps = [[int(x) for x in self.rng.integers(0, 3, p)] for _ in range(p)]
        w = self.chance(0.4)
        dts = [[self.pick(MOVE_DTYPES) for _ in range(p)] for _ in range(p)]
        algo = self.algo(g, "alltoallw" if w else "alltoallv", blocking)
        if g.comm is None:
            return None
        r = g.r
        if w:
            sends = [data(dts[r][j], m[r][j], r * p + j, self.salt) for j in range(p)]
            recvs = [sentinel(dts[i][r], m[i][r]) for i in range(p)]
            wants = [data(dts[i][r], m[i][r], i * p + r, self.salt) for i in range(p)]
            what = f"alltoallw(counts={m}, {algo})"
            req = self.call(g.comm, "alltoallw", blocking, sends, recvs, algorithm=algo)
            return Pending(what, req, lambda: sum(self.compare(what, got, want)
                                                  for got, want in zip(recvs, wants,
                                                                       strict=True)))
        sdispls = [packed(m[i], gaps[i], range(p)) for i in range(p)]
        rcounts = [m[i][r] for i in range(p)]
        rdispls = packed(rcounts, [0] * p, range(p))
        full = [data(dt, sdispls[i][-1] + m[i][-1], i, self.salt) for i in range(p)]
        want = np.concatenate([full[i][sdispls[i][r] : sdispls[i][r] + m[i][r]]
                               for i in range(p)])
        rb = sentinel(dt, sum(rcounts))
        what = f"alltoallv({dt}, counts={m}, {algo})"
        req = self.call(g.comm, "alltoallv", blocking, full[r], rb, m[r], rcounts, sdispls[r],
                        rdispls, algorithm=algo)
        return Pending(what, req, lambda: self.compare(what, rb, want))

    COLLECTIVES: tuple[str, ...] = (
        "c_barrier", "c_bcast", "c_reduce", "c_allreduce", "c_allreduce", "c_reduce_scatter",
        "c_scan", "c_gather", "c_gatherv", "c_allgather", "c_alltoall", "c_alltoallv")

    def coll(self, g: Group) -> None:
        name = self.pick(self.COLLECTIVES)
        blocking = self.chance(0.6)
        self.count_kind(name + ("" if blocking else "(i)"))
        pend = getattr(self, name)(g, blocking)
        if pend is not None:
            if pend.req is not None:
                pend.req.wait(timeout=WAIT)
            self.stats.wrong += pend.check()

    def batch(self, g: Group) -> None:
        """2-4 nonblocking collectives in flight together (and a p2p exchange and a blocking
        collective meanwhile), waited in a random order."""
        k = int(self.rng.integers(2, 5))
        names = [self.pick(self.COLLECTIVES) for _ in range(k)]
        order = [int(x) for x in self.rng.permutation(k)]
        middle = self.chance(0.5)
        self.count_kind("batch")
        pends = [getattr(self, nm)(g, False) for nm in names]
        if middle:
            self.p2p_shift(g)
            self.coll(g)
        for i in order:
            pend = pends[i]
            if pend is not None:
                if pend.req is not None:
                    pend.req.wait(timeout=WAIT)
                self.stats.wrong += pend.check()

    # -------------------------------------------------------------- object collectives
    def value(self, who: int, small: bool = True) -> dict[str, Any]:
        n = self.salt % 5 * 3 + who
        return {"who": who, "step": self.salt, "s": "x" * (n % 7),
                "a": data(np.dtype(np.int32), n, who, self.salt),
                "t": (who, self.salt, None), "f": data(np.dtype(np.float64), 3, who, self.salt)}

    def objcoll(self, g: Group) -> None:
        kind = self.pick(("bcast", "gather", "scatter", "allgather", "alltoall", "reduce",
                          "allreduce", "scan", "exscan"))
        root = int(self.rng.integers(g.p))
        red = self.pick(("int", "tuple", "array"))
        op = self.pick((ringworld.SUM, ringworld.MAX, ringworld.MIN)) if red == "int" else (
            ringworld.SUM)
        self.count_kind(f"{kind}_obj")
        if g.comm is None:
            return
        c, p, r = g.comm, g.p, g.r
        what = f"{kind}_obj(root={root}, {red}, {op.name})"
        self.stats.calls += 1

        def val(i: int) -> Any:
            if red == "int":
                return (i * 7 + self.salt) % 11
            if red == "tuple":
                return (i, f"r{i}")
            return data(np.dtype(np.int64), 5, i, self.salt)

        def red_of(ids: Sequence[int]) -> Any:
            return functools.reduce(op.combine_obj, [val(i) for i in ids])

        if kind == "bcast":
            got = c.bcast_obj(self.value(root) if r == root else None, root, timeout=WAIT)
            want: Any = self.value(root)
        elif kind == "gather":
            got = c.gather_obj(self.value(r), root, timeout=WAIT)
            want = [self.value(i) for i in range(p)] if r == root else None
        elif kind == "scatter":
            got = c.scatter_obj([self.value(i) for i in range(p)] if r == root else None, root,
                                timeout=WAIT)
            want = self.value(r)
        elif kind == "allgather":
            got, want = c.allgather_obj(self.value(r), timeout=WAIT), [self.value(i)
                                                                       for i in range(p)]
        elif kind == "alltoall":
            got = c.alltoall_obj([self.value(r * p + j) for j in range(p)], timeout=WAIT)
            want = [self.value(i * p + r) for i in range(p)]
        elif kind == "reduce":
            got = c.reduce_obj(val(r), op, root, timeout=WAIT)
            want = red_of(range(p)) if r == root else None
        elif kind == "allreduce":
            got, want = c.allreduce_obj(val(r), op, timeout=WAIT), red_of(range(p))
        elif kind == "scan":
            got, want = c.scan_obj(val(r), op, timeout=WAIT), red_of(range(r + 1))
        else:
            got = c.exscan_obj(val(r), op, timeout=WAIT)
            want = red_of(range(r)) if r else None
        self.stats.wrong += self.compare_obj(what, got, want)

    # -------------------------------------------------------------- point to point
    def p2p_shift(self, g: Group) -> None:
        """Every rank sends to rank+k and receives from rank-k (k = 0: to itself)."""
        p = g.p
        k = int(self.rng.integers(p))
        dts = [self.pick(MOVE_DTYPES) for _ in range(p)]
        ns = [self.count() for _ in range(p)]
        form = self.pick(("sendrecv", "send_recv", "isend_irecv", "irecv_first", "sendrecv_any"))
        anysrc, anytag = self.chance(0.3), self.chance(0.3)
        self.count_kind(f"p2p_{form}")
        if g.comm is None:
            return
        c, r = g.comm, g.r
        dest, src = (r + k) % p, (r - k) % p
        tag = self.tag(1)
        out = data(dts[r], ns[r], r, self.salt)
        got = sentinel(dts[src], ns[src])
        want = data(dts[src], ns[src], src, self.salt)
        # a wildcard source is safe: this step's tag is unique; a wildcard tag is safe: the
        # only message from ``src`` not yet received is this step's
        rsrc = ringworld.ANY_SOURCE if anysrc else src
        rtag = ringworld.ANY_TAG if anytag and not anysrc else tag
        what = f"p2p {form} k={k} ({dts[src]}, n={ns[src]}, any_source={anysrc})"
        if form in ("sendrecv", "sendrecv_any"):
            st = c.sendrecv(out, dest, got, rsrc if form == "sendrecv_any" else src, tag,
                            rtag, timeout=WAIT)
            self.stats.calls += 1
        elif form == "send_recv":
            c.send(out, dest, tag, timeout=WAIT)
            st = c.recv(got, rsrc, rtag, timeout=WAIT)
            self.stats.calls += 2
        elif form == "isend_irecv":
            sreq = c.isend(out, dest, tag)
            rreq = c.irecv(got, rsrc, rtag)
            st = ringworld.wait_all([rreq, sreq], timeout=WAIT)[0]
            self.stats.calls += 2
        else:
            rreq = c.irecv(got, rsrc, rtag)
            sreq = c.isend(out, dest, tag)
            while not ringworld.test_all([sreq, rreq]):
                time.sleep(0)
            st = rreq.status
            self.stats.calls += 2
        bad = self.compare(what, got, want)
        if st is None or st.source != src or st.tag != tag or st.nbytes != want.nbytes:
            self.fail(f"{what}: status {st}, want source {src} tag {tag} {want.nbytes} bytes")
            bad += 1
        self.stats.wrong += bad

    def p2p_fan_in(self, g: Group) -> None:
        """Everyone sends to a root, which probes with wildcards, sizes the buffer from the
        status and receives; then acknowledges, so no later message can match a wildcard."""
        p = g.p
        root = int(self.rng.integers(p))
        dts = [self.pick(PLAIN) for _ in range(p)]
        ns = [self.count() for _ in range(p)]
        use_iprobe, nonblocking = self.chance(0.5), self.chance(0.5)
        self.count_kind("p2p_fan_in")
        if g.comm is None:
            return
        c, r = g.comm, g.r
        what = f"fan-in to {root} (iprobe={use_iprobe})"
        if r != root:
            out = data(dts[r], ns[r], r, self.salt)
            if nonblocking:
                c.isend(out, root, self.tag(2 + r)).wait(timeout=WAIT)
            else:
                c.send(out, root, self.tag(2 + r), timeout=WAIT)
            ack = c.recv_obj(root, self.tag(1), timeout=WAIT)
            self.stats.calls += 2
            self.stats.wrong += self.compare_obj(what + " ack", ack, ("ack", self.salt))
            return
        seen: set[int] = set()
        bad = 0
        for _ in range(p - 1):
            if use_iprobe:
                deadline = time.monotonic() + WAIT
                st = c.iprobe(ringworld.ANY_SOURCE, ringworld.ANY_TAG)
                while st is None:
                    if time.monotonic() > deadline:
                        raise ringworld.Timeout(f"{what}: nothing to iprobe for {WAIT} s")
                    time.sleep(0.0005)
                    st = c.iprobe(ringworld.ANY_SOURCE, ringworld.ANY_TAG)
            else:
                st = c.probe(ringworld.ANY_SOURCE, ringworld.ANY_TAG, timeout=WAIT)
            s = st.source
            if s in seen or not 0 <= s < p or s == root or st.tag != self.tag(2 + s):
                self.fail(f"{what}: unexpected probe status {st} (seen {sorted(seen)})")
                bad += 1
                break
            seen.add(s)
            got = np.empty(st.count(dts[s]), dts[s])
            st2 = c.recv(got, s, st.tag, timeout=WAIT)
            self.stats.calls += 2
            bad += self.compare(f"{what} from {s}", got, data(dts[s], ns[s], s, self.salt))
            if st2.source != s or st2.nbytes != st.nbytes:
                self.fail(f"{what}: recv status {st2} after probe {st}")
                bad += 1
        for i in range(p):
            if i != root:
                c.send_obj(("ack", self.salt), i, self.tag(1), timeout=WAIT)
                self.stats.calls += 1
        self.stats.wrong += bad

    def p2p_all_pairs(self, g: Group) -> None:
        """Every rank posts receives from all (some with a wildcard source; tags name the
        sender), sends to all, then completes them with wait_all, wait_any or test_any."""
        p = g.p
        dt = self.pick(MOVE_DTYPES)
        n = self.count(small=True)
        how = self.pick(("wait_all", "wait_any", "test_any"))
        anysrc = [self.chance(0.4) for _ in range(p)]
        self.count_kind(f"p2p_pairs_{how}")
        if g.comm is None:
            return
        c, r = g.comm, g.r
        got = [sentinel(dt, n + i) for i in range(p)]
        recvs = [c.irecv(got[i], ringworld.ANY_SOURCE if anysrc[i] else i, self.tag(8 + i * p + r))
                 for i in range(p)]
        sends = [c.isend(data(dt, n + r, r * p + j, self.salt), j, self.tag(8 + r * p + j))
                 for j in range(p)]
        self.stats.calls += 2 * p
        left: list[Request[Any]] = [*recvs, *sends]
        if how == "wait_all":
            ringworld.wait_all(left, timeout=WAIT)
        else:
            deadline = time.monotonic() + WAIT
            while left:
                if how == "wait_any":
                    i, _ = ringworld.wait_any(left, timeout=WAIT)
                else:
                    found = ringworld.test_any(left)
                    if found is None:
                        if time.monotonic() > deadline:
                            raise ringworld.Timeout("p2p_all_pairs: test_any never completed")
                        time.sleep(0)
                        continue
                    i = found
                left.pop(i)
        bad = 0
        for i in range(p):
            bad += self.compare(f"all-pairs from {i} ({dt}, n={n + i}, {how})", got[i],
                                data(dt, n + i, i * p + r, self.salt))
            st = recvs[i].status
            if st is None or st.source != i:
                self.fail(f"all-pairs: status {st} for the receive from {i}")
                bad += 1
        self.stats.wrong += bad

    def p2p_obj(self, g: Group) -> None:
        p = g.p
        k = int(self.rng.integers(p))
        form = self.pick(("send_recv", "isend_irecv", "sendrecv"))
        anysrc = self.chance(0.3)
        self.count_kind(f"obj_{form}")
        if g.comm is None:
            return
        c, r = g.comm, g.r
        dest, src = (r + k) % p, (r - k) % p
        tag = self.tag(3)
        rsrc = ringworld.ANY_SOURCE if anysrc else src
        if form == "send_recv":
            c.send_obj(self.value(r), dest, tag, timeout=WAIT)
            got = c.recv_obj(rsrc, tag, timeout=WAIT)
        elif form == "isend_irecv":
            rreq = c.irecv_obj(rsrc, tag)
            c.isend_obj(self.value(r), dest, tag).wait(timeout=WAIT)
            got = rreq.wait(timeout=WAIT)
            if rreq.status is None or rreq.status.source != src:
                self.fail(f"irecv_obj status {rreq.status}, want source {src}")
                self.stats.wrong += 1
        else:
            got = c.sendrecv_obj(self.value(r), dest, rsrc, tag, tag, timeout=WAIT)
        self.stats.calls += 2
        self.stats.wrong += self.compare_obj(f"obj {form} k={k}", got, self.value(src))

    # -------------------------------------------------------------- communicators
    def manage(self) -> None:
        """dup, split or create a communicator from a live one, or free one."""
        what = self.pick(("dup", "split", "split", "create", "free"))
        if what == "free" or len(self.pool) >= 5:
            if self.pool:
                self.free(self.pool.pop(int(self.rng.integers(len(self.pool)))))
            if what == "free":
                self.count_kind("free")
                return
        parent = self.pick([self.world_group, *self.pool])
        p = parent.p
        self.count_kind(what)
        picked: list[int] = []
        if what == "dup":
            groups = [list(parent.members)]
        elif what == "create":
            size = int(self.rng.integers(1, p + 1))
            picked += [int(x) for x in self.rng.permutation(p)[:size]]
            groups = [[parent.members[i] for i in picked]]
        else:
            colors = [self.pick((0, 1, 1, None)) for _ in range(p)]
            keys = [int(x) for x in self.rng.integers(-2, 3, p)]
            groups = [[parent.members[i] for i in sorted(
                (i for i in range(p) if colors[i] == col), key=lambda i: (keys[i], i))]
                for col in (0, 1)]
            groups = [m for m in groups if m]
        me = self.world.rank
        comm: Communicator | None = None
        if parent.comm is not None:
            self.stats.calls += 1
            if what == "dup":
                comm = parent.comm.dup()
            elif what == "create":
                comm = parent.comm.create(picked)
            else:
                comm = parent.comm.split(colors[parent.r], keys[parent.r])
        for members in groups:
            mine = comm if me in members else None
            if mine is not None:
                bad = int(mine.size != len(members) or mine.rank != members.index(me)
                          or tuple(mine.world_ranks) != tuple(members))
                if bad:
                    self.fail(f"{what}: got size {mine.size} rank {mine.rank} world ranks "
                              f"{mine.world_ranks}, want {members}")
                    self.stats.wrong += bad
            self.pool.append(Group(members, mine, self.shm and len(members) > 1))
        if parent.comm is not None and comm is not None and me not in {
                m for members in groups for m in members}:
            self.fail(f"{what}: a communicator for a rank outside every group")
            self.stats.wrong += 1

    def free(self, g: Group) -> None:
        if g.comm is not None:
            g.comm.free()
            self.stats.calls += 1

    def measure(self, job: str) -> dict[str, int]:
        """Resources at a quiet point: sub-communicators freed, bounded caches emptied."""
        self.free_all()
        self.world.barrier(timeout=WAIT)
        clear_bounded_caches(self.world)
        found = probe_resources(job)
        self.stats.curve.append((self.stats.steps, found["rss_kib"], found["gc_objects"],
                                 found["traced_kib"]))
        return found

    def free_all(self) -> None:
        while self.pool:
            self.free(self.pool.pop())

    # -------------------------------------------------------------- driver
    def count_kind(self, kind: str) -> None:
        self.stats.kinds[kind] = self.stats.kinds.get(kind, 0) + 1

    def step(self) -> None:
        self.salt += 1
        self.stats.steps += 1
        kind = self.pick(("coll",) * 9 + ("batch",) * 2 + ("obj",) * 2 + ("shift",) * 3
                         + ("fan_in", "pairs", "objp2p", "manage"))
        if kind == "manage":
            self.manage()
            return
        g = self.world_group if not self.pool or self.chance(0.5) else self.pick(self.pool)
        {"coll": self.coll, "batch": self.batch, "obj": self.objcoll, "shift": self.p2p_shift,
         "fan_in": self.p2p_fan_in, "pairs": self.p2p_all_pairs,
         "objp2p": self.p2p_obj}[kind](g)

    @property
    def world_group(self) -> Group:
        w = self.world
        return Group(list(range(w.size)), w, self.shm and w.size > 1)


def main() -> int:
    before_init = {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
                   "tasks": len(os.listdir("/proc/self/task"))}
    ops = int(os.environ.get("RINGWORLD_SOAK_OPS", "5000"))
    seed = int(os.environ.get("RINGWORLD_SOAK_SEED", "1"))
    warm = int(os.environ.get("RINGWORLD_SOAK_WARMUP", str(max(1, ops // 5))))
    sync_dir = os.environ.get("RINGWORLD_SOAK_DIR")
    if os.environ.get("RINGWORLD_SOAK_TRACEMALLOC") == "1":
        tracemalloc.start()
    if sync_dir is not None:  # who and where, for the test's cleanup even if the job hangs
        Path(sync_dir, f"started.{os.environ.get('RINGWORLD_RANK', '0')}").write_text(
            json.dumps({"pid": os.getpid(), "job": os.environ.get("RINGWORLD_JOB_ID", "")}))
    world = ringworld.init()
    transport = world.transport
    job = os.environ.get("RINGWORLD_JOB_ID", "")
    soak = Soak(world, seed)
    start = time.monotonic()
    warm_at = start
    probes: dict[str, dict[str, int]] = {}
    marks = {warm + k * (ops - warm) // 8 for k in range(8)} if warm < ops else set()

    for i in range(ops):
        if i in marks:
            found = soak.measure(job)
            if i == warm:
                probes["warm"] = found
                warm_at = time.monotonic()
        soak.step()
    probes["end"] = soak.measure(job)
    if "warm" not in probes:
        probes["warm"] = probes["end"]
    elapsed = time.monotonic() - start
    stats, rank, size = soak.stats, world.rank, world.size
    ringworld.finalize()
    del soak, world  # what a finalized program no longer references must be given back
    gc.collect()
    after = {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
             "tasks": len(os.listdir("/proc/self/task")),
             "shm_maps": sum("/dev/shm/ringworld-" in ln
                             for ln in Path("/proc/self/maps").read_text().splitlines())}
    report: dict[str, Any] = {
        "rank": rank, "size": size, "transport": transport, "job": job,
        "pid": os.getpid(), "steps": stats.steps, "calls": stats.calls,
        "wrong": stats.wrong, "checked": stats.checked,
        "failures": stats.failures, "seconds": round(elapsed, 2),
        "measured_seconds": round(time.monotonic() - warm_at, 2), "warmup_steps": warm,
        "probes": probes, "curve": stats.curve, "before_init": before_init, "after_finalize": after,
        "kinds": dict(sorted(stats.kinds.items())),
    }
    if sync_dir is not None:
        Path(sync_dir, f"done.{rank}").touch()
        if rank == 0:  # every rank has finalized: nothing of the job may be left
            deadline = time.monotonic() + 30
            while (len(list(Path(sync_dir).glob("done.*"))) < size
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            report["shm_after_all_finalized"] = job_shm_files(job)
    print("SOAK " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
