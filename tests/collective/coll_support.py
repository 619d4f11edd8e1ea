"""Shared machinery of the communicator-level collective tests (runs inside forked ranks).

A :class:`Case` is one collective call: collective, algorithm (always forced), dtype, op, count,
in-place or not, root, layout, blocking or not. :class:`Runner` starts cases on a communicator
(nonblocking ones stay in flight in batches and are waited in reverse order; blocking ones run
while the batch is still in flight), then checks every result against a numpy reference and
records a one-line failure naming the case and the rank. A job returns the list of failures, so
one job covers hundreds of combinations and still reports exactly which one went wrong.

Data is a function of (who, index) where ``who`` is the contributing rank (or a (sender,
receiver) pair id for alltoall): different on every rank and every element, never constant,
and small enough that float sums are exact in any order (products use +-1, +-2, i, 1+i).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringworld import IN_PLACE, Communicator, Op, Request
from ringworld.algorithms import shm_collectives as shm_algorithms
from ringworld.algorithms.registry import REGISTRY
from ringworld.comm import ops
from ringworld.tuning.cost import SHM_MODELS
from ringworld.tuning.shm_paths import DEFAULT

Array = np.ndarray[Any, Any]

#: the default policy but broadcasts never direct: up to EAGER_MAX bytes they take the root's
#: eager ring whatever the machine (where ranks have cores of their own, the default takes
#: the direct path from below EAGER_MAX). Set as ``comm.selector.shm_policy`` before the
#: communicator's first call in the windows.
RING_POLICY = dataclasses.replace(DEFAULT, direct={**DEFAULT.direct, "bcast": math.inf})

#: Timeout of every wait inside a rank: a hang shows as a Timeout naming the collective.
WAIT = 60.0
#: Elements of a whole-vector large case (int64: 2.4 MB, over the bcast segment of 1 MiB;
#: ring blocks of n/8 still exceed the 128 KiB eager limit).
LARGE_VEC = 300_000
#: Elements per rank block of a large blocked case (int64: 160 KB > 128 KiB eager limit).
LARGE_BLOCK = 20_000
P_AFF = 1_000_003  # prime modulus of the affine-map op
#: The shared-memory algorithm ("shm": blocking calls over the shm transport only) and its
#: chunk (bytes); its slots' limits are the default policy's (``Policy.small``).
SHM = "shm"
SHM_CHUNK = shm_algorithms.CHUNK

I64 = np.dtype(np.int64)
F64 = np.dtype(np.float64)
LOC = np.dtype([("v", "f8"), ("i", "i8")])
AFFINE = np.dtype([("m", "i8"), ("c", "i8")])
PLAIN_DTYPES = tuple(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, np.bool_))
ALL_DTYPES = (*PLAIN_DTYPES, LOC, AFFINE)
#: Dtype subsets for the profiles that do not run the full matrix.
REDUCED_DTYPES = (*(np.dtype(t) for t in (np.int8, np.uint16, np.int32, np.uint64, np.float16,
                                           np.float32, np.complex128, np.bool_)), LOC, AFFINE)
MINIMAL_DTYPES = (*(np.dtype(t) for t in (np.uint8, np.float32, np.complex64, np.bool_)), LOC,
                  AFFINE)


# ------------------------------------------------------------------------ ops
def affine(a: Array, b: Array) -> Array:
    """Compose affine maps x -> m*x + c mod P: first ``a`` then ``b``. Associative, and not
    commutative, so any algorithm that combines out of rank order gives a different result."""
    out = np.empty_like(a)
    out["m"] = a["m"] * b["m"] % P_AFF
    out["c"] = (a["c"] * b["m"] + b["c"]) % P_AFF
    return out


def _user_sum(a: Array, b: Array) -> Array:
    return a + b


AFFINE_OP = Op.create(affine, commutative=False, name="affine")
USER_SUM = Op.create(_user_sum, commutative=True, name="usum")

OPS: dict[str, Op] = {**ops.BUILTIN, "affine": AFFINE_OP, "usum": USER_SUM}
_UFUNCS: dict[str, np.ufunc] = {
    "sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
    "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def _loc(a: Array, b: Array, is_max: bool) -> Array:
    """MPI MAXLOC/MINLOC: the extreme value wins; on a tie the smaller index."""
    out = a.copy()
    better = b["v"] > a["v"] if is_max else b["v"] < a["v"]
    take = better | ((b["v"] == a["v"]) & (b["i"] < a["i"]))
    out[take] = b[take]
    return out


def combine(op: str, a: Array, b: Array) -> Array:
    """Reference ``a op b`` (``a`` from lower ranks), in the dtype of ``a``."""
    if op in _UFUNCS:
        out = _UFUNCS[op](a, b)
        return np.asarray(out).astype(a.dtype, copy=False)
    if op in ("maxloc", "minloc"):
        return _loc(a, b, op == "maxloc")
    if op == "affine":
        return affine(a, b)
    if op == "usum":
        return a + b
    raise AssertionError(f"no reference for op {op}")


def ops_for(dt: np.dtype[Any]) -> tuple[str, ...]:
    """Every op defined on ``dt``."""
    if dt == LOC:
        return ("maxloc", "minloc")
    if dt == AFFINE:
        return ("affine",)
    if dt.kind == "b":
        return ("land", "lor", "lxor", "band", "bor", "bxor")
    if dt.kind in "iu":
        return ("sum", "prod", "max", "min", "band", "bor", "bxor") + (
            ("usum",) if dt == I64 else ())
    if dt.kind == "f":
        return ("sum", "prod", "max", "min")
    return ("sum", "prod")  # complex


def commutative(op: str) -> bool:
    return OPS[op].commutative


# ------------------------------------------------------------------------ data
_PROD_REAL = np.array([1, 2, -1, -2, 1], dtype=np.int64)
_PROD_UINT = np.array([1, 2, 3, 1, 2], dtype=np.int64)
_PROD_COMPLEX = np.array([1, 2, 1j, -1, 1 + 1j], dtype=np.complex128)


def values(who: int, n: int, dt: np.dtype[Any], op: str = "sum") -> Array:
    """``n`` elements contributed by ``who`` (a rank, or a pair id), unique per element.

    Sums over 8 contributors stay exact in every float type (float16: < 2048, float32: < 2**24);
    products use +-1, +-2 (and i, 1+i), so they are exact too. Integers may wrap, identically in
    the reference. ``op`` picks a fitting distribution (``lor``: mostly False bools).
    """
    idx = np.arange(n, dtype=np.int64)
    base = idx * 7 + who * 1_000_003 + 3
    if dt == LOC:
        out = np.empty(n, LOC)
        out["v"] = (idx * 3 + who * 5) % 4          # many ties on the value ...
        out["i"] = (who * 11 + idx) % 13            # ... and on the index
        return out
    if dt == AFFINE:
        out = np.empty(n, AFFINE)
        out["m"] = base % (P_AFF - 1) + 1
        out["c"] = (base * 31 + 17) % P_AFF
        return out
    if dt.kind == "b":
        hit = (idx * 7 + who * 3) % 11 == 0
        return hit if op == "lor" else ~hit
    if op == "prod":
        code = (idx + who * 3) % 5
        if dt.kind == "c":
            return _PROD_COMPLEX[code].astype(dt)
        return (_PROD_UINT if dt.kind == "u" else _PROD_REAL)[code].astype(dt)
    if dt == np.float16:
        return (base % 211).astype(dt)
    if dt.kind == "f" or dt.kind == "c":
        small = (idx * 7 + who * 100_003 + 3) % 999_983
        if dt.kind == "c":
            return (small + 1j * ((small * 3 + 1) % 999_983)).astype(dt)
        return small.astype(dt) if dt.itemsize <= 4 else base.astype(dt)
    return base.astype(dt)


def sentinel(dt: np.dtype[Any], n: int) -> Array:
    """A receive buffer pre-filled with a pattern no data has (0xA5 bytes; bools alternate)."""
    if dt.kind == "b":
        return np.arange(n) % 2 == 0
    return np.full(n * dt.itemsize, 0xA5, dtype=np.uint8).view(dt)


def fold(op: str, parts: Iterable[Array]) -> Array:
    """Reference reduction of ``parts`` in the given (rank) order."""
    it = iter(parts)
    acc = next(it).copy()
    for x in it:
        acc = combine(op, acc, x)
    return acc


@functools.lru_cache(maxsize=24)
def reference(op: str, dt: np.dtype[Any], n: int, whos: tuple[int, ...]) -> Array:
    """``fold`` over the values of ``whos`` (memoised and read-only: every algorithm and
    in-place form of a case shares it)."""
    out = fold(op, (values(w, n, dt, op) for w in whos))
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=24)
def joined(op: str, dt: np.dtype[Any], ns: tuple[int, ...], whos: tuple[int, ...]) -> Array:
    """The values of ``whos`` (``ns[i]`` elements from ``whos[i]``) one after another
    (memoised and read-only)."""
    out = np.concatenate([values(w, k, dt, op) for w, k in zip(whos, ns, strict=True)])
    out.setflags(write=False)
    return out


def check(got: Array, want: Array, what: str) -> None:
    """Raise AssertionError unless ``got`` and ``want`` are bitwise identical."""
    g = np.ascontiguousarray(got).reshape(-1)
    w = np.ascontiguousarray(want).reshape(-1)
    if g.dtype != w.dtype or g.size != w.size:
        raise AssertionError(f"{what}: got {g.dtype}[{g.size}], want {w.dtype}[{w.size}]")
    if g.size == 0:
        return
    gb = g.view(np.uint8).reshape(g.size, -1)
    wb = w.view(np.uint8).reshape(w.size, -1)
    bad = np.flatnonzero((gb != wb).any(axis=1))
    if bad.size and g.dtype.kind in "fc":  # -0.0 vs 0.0: the order of complex products
        bad = bad[g[bad] != w[bad]]
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} of {g.size} elements differ, first at [{i}]: "
                             f"got {g[i]!r}, want {w[i]!r}")


def pair(i: int, j: int) -> int:
    """A data id for what rank ``i`` sends rank ``j``."""
    return i * 64 + j + 1000


def vcounts(n: int, p: int) -> list[int]:
    """Uneven per-rank counts around ``n`` (zeros among them once n > 0)."""
    return [0] * p if n == 0 else [max(0, n - 1 + i % 3) for i in range(p)]


def pcounts(n: int, i: int, j: int, symmetric: bool) -> int:
    """Count rank ``i`` sends rank ``j`` in alltoallv/w (symmetric: the same both ways)."""
    if n == 0:
        return 0
    return max(0, n - 1 + ((i + j) if symmetric else (2 * i + j)) % 3)


def vlayout(counts: Sequence[int], layout: str) -> tuple[list[int], int]:
    """(displs, buffer size): packed, or blocks in reverse rank order with gaps between."""
    displs = [0] * len(counts)
    if layout == "gapped":
        at = 1
        for i in reversed(range(len(counts))):
            displs[i] = at
            at += counts[i] + 2
        return displs, at + 1
    at = 0
    for i, c in enumerate(counts):
        displs[i] = at
        at += c
    return displs, at


# ------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    """One collective call and what it is checked against."""

    coll: str
    algo: str
    dtype: np.dtype[Any]
    n: int
    op: str = "sum"
    inplace: bool = False
    root: int = 0
    blocking: bool = False
    layout: str = ""

    def __str__(self) -> str:
        dt = {LOC: "loc(v:f8,i:i8)", AFFINE: "affine(m:i8,c:i8)"}.get(self.dtype,
                                                                     str(self.dtype))
        parts = [f"{self.coll}[{self.algo}]", f"dtype={dt}", f"n={self.n}"]
        if self.coll in REDUCTIONS:
            parts.append(f"op={self.op}")
        if self.coll in ROOTED:
            parts.append(f"root={self.root}")
        if self.layout:
            parts.append(f"layout={self.layout}")
        parts.append("in-place" if self.inplace else "out-of-place")
        parts.append("blocking" if self.blocking else "nonblocking")
        return " ".join(parts)


REDUCTIONS = frozenset({"reduce", "allreduce", "reduce_scatter_block", "reduce_scatter", "scan",
                        "exscan"})
ROOTED = frozenset({"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"})
VLAYOUT = frozenset({"gatherv", "scatterv", "allgatherv", "alltoallv"})
#: Collectives whose count is a per-rank block.
BLOCKED = frozenset({"gather", "gatherv", "scatter", "scatterv", "allgather", "allgatherv",
                     "alltoall", "alltoallv", "alltoallw", "reduce_scatter_block",
                     "reduce_scatter"})
GROUPS: dict[str, tuple[str, ...]] = {
    "reductions": ("reduce", "allreduce", "reduce_scatter_block", "reduce_scatter", "scan",
                   "exscan"),
    "movement": ("bcast", "gather", "gatherv", "scatter", "scatterv", "allgather",
                 "allgatherv"),
    "exchange": ("barrier", "alltoall", "alltoallv", "alltoallw"),
}


def _layouts(coll: str) -> tuple[str, ...]:
    if coll in VLAYOUT:
        return ("gapped", "packed")
    if coll == "alltoallw":
        return ("typed", "bytes")
    return ("",)


def _roots(coll: str, p: int) -> list[int]:
    return sorted({0, p // 2, p - 1}) if coll in ROOTED else [0]


def _can_run(coll: str, algo: str, op: str) -> bool:
    return algo == SHM or commutative(op) or not REGISTRY[coll][algo].commutative_only


def algorithms_for(coll: str, p: int, transport: str) -> list[str]:
    """Every algorithm of ``coll`` that can be forced here: the registry's, plus the
    shared-memory one on the shm transport (blocking calls, size > 1)."""
    extra = [SHM] if transport == "shm" and p > 1 and coll in SHM_MODELS else []
    return [*REGISTRY[coll], *extra]


def shm_counts(coll: str, p: int) -> list[int]:
    """Counts for the shm algorithm: both sides of the slot limit, one area chunk, and more
    than one chunk (where a rank's buffers stay reasonable)."""
    i64 = I64.itemsize
    small = int(DEFAULT.small(coll, p)) // i64  # (elements of the vector or send buffer)
    if coll in ("alltoall", "reduce_scatter_block"):  # slots of p blocks, chunks of CHUNK/p
        return [0, 1, p + 1, small // p, small // p + 1, LARGE_BLOCK, SHM_CHUNK // i64 // p + 7]
    if coll == "allgather":  # chunks over the per-rank block
        return [0, 1, p + 1, small, small + 1, LARGE_BLOCK] + (
            [SHM_CHUNK // i64 + 3] if p <= 4 else [])
    if coll == "barrier":
        return [0]
    return [0, 1, p + 1, small, small + 1, LARGE_VEC, SHM_CHUNK // i64 + 11]


def core_cases(coll: str, p: int, transport: str) -> list[Case]:
    """Every algorithm with int64 (SUM) and float64 data at counts 0, 1, p+1 and large, both
    in-place forms, several roots and layouts; plus the non-commutative affine op wherever the
    algorithm allows one. Some run blocking (among nonblocking ones in flight). The
    shared-memory algorithm (always blocking) runs at the limits of its slots and chunks, with
    fewer roots and in-place forms (its calls are the slow ones on few cores)."""
    if coll == "barrier":
        return [Case(coll, algo, I64, 0, blocking=b or algo == SHM)
                for algo in algorithms_for(coll, p, transport) for b in (True, False, False)]
    out: list[Case] = []
    large = LARGE_BLOCK if coll in BLOCKED else LARGE_VEC
    roots = _roots(coll, p)
    both = (False,) if coll == "alltoallw" else (False, True)
    for algo in algorithms_for(coll, p, transport):
        if algo == SHM:
            for k, n in enumerate(shm_counts(coll, p)):
                for inplace in both if n in (p + 1, shm_counts(coll, p)[-1]) else (k % 2 == 1,):
                    for root in roots if n == p + 1 else [p - 1]:
                        out.append(Case(coll, algo, I64, n, "sum", inplace, root, True))
            out.append(Case(coll, algo, F64, p + 1, "sum", True, p - 1, True))
            if coll in REDUCTIONS:
                out += [Case(coll, algo, AFFINE, n, "affine", inplace, p // 2, True)
                        for n, inplace in ((p + 1, False), (p + 1, True), (large // 10, True))]
            continue
        for n in (0, 1, p + 1, large):
            for inplace in both:
                for root in roots if n in (1, p + 1) else [p - 1]:
                    for layout in _layouts(coll):
                        blocking = (n == 0 or (n == large and inplace)
                                    or (n == p + 1 and not inplace and root == p - 1
                                        and layout in ("", "gapped", "typed")))
                        out.append(Case(coll, algo, I64, n, "sum", inplace, root, blocking,
                                        layout))
        for n in (0, 1, p + 1):
            for inplace in both:
                out.append(Case(coll, algo, F64, n, "sum", inplace, p - 1, n == 1 and inplace,
                                _layouts(coll)[0]))
        if coll in REDUCTIONS and _can_run(coll, algo, "affine"):
            for n in (1, p + 1, large // 10):
                for inplace in both:
                    for root in roots:
                        out.append(Case(coll, algo, AFFINE, n, "affine", inplace, root,
                                        n == 1 and inplace and root == roots[-1]))
    return out


def matrix_cases(coll: str, p: int, transport: str, profile: str) -> list[Case]:
    """The dtype x op matrix for every algorithm at count p+1 (nonblocking; the shm
    algorithm blocking).

    ``full``: every dtype and op; ``reduced``: a dtype subset; ``minimal``: a smaller subset,
    at most two ops per dtype. The shm algorithm (blocking, so slower to run) gets the next
    smaller subset. In-place and out-of-place alternate.
    """
    if coll == "barrier":
        return []
    subsets = {"full": ALL_DTYPES, "reduced": REDUCED_DTYPES, "minimal": MINIMAL_DTYPES}
    smaller = {"full": "reduced", "reduced": "minimal", "minimal": "minimal"}
    roots = _roots(coll, p)
    layouts = _layouts(coll)
    out: list[Case] = []
    k = 0
    for algo in algorithms_for(coll, p, transport):
        for dt in subsets[smaller[profile] if algo == SHM else profile]:
            if coll in REDUCTIONS:
                opnames = ops_for(dt)
                if profile == "minimal":
                    opnames = opnames[:2]
            else:
                opnames = ("sum",)
            for op in opnames:
                if not _can_run(coll, algo, op):
                    continue
                k += 1
                out.append(Case(coll, algo, dt, p + 1, op, k % 2 == 1 and coll != "alltoallw",
                                roots[k % len(roots)], algo == SHM, layouts[k % len(layouts)]))
    return out


# ------------------------------------------------------------------------ starting cases
Verify = Callable[[], None]


def _invoke(comm: Communicator, c: Case, *args: Any, **kw: Any) -> Request[None] | None:
    if c.blocking:
        getattr(comm, c.coll)(*args, algorithm=c.algo, timeout=WAIT, **kw)
        return None
    req: Request[None] = getattr(comm, "i" + c.coll)(*args, algorithm=c.algo, **kw)
    return req


def _v(c: Case, who: int, n: int | None = None) -> Array:
    return values(who, c.n if n is None else n, c.dtype, c.op)


def _ref(c: Case, whos: Iterable[int], n: int | None = None) -> Array:
    return reference(c.op, c.dtype, c.n if n is None else n, tuple(whos))


def _joined(c: Case, whos: Iterable[int]) -> Array:
    ids = tuple(whos)
    return joined(c.op, c.dtype, (c.n,) * len(ids), ids)


def _unchanged(buf: Any, want: Array, what: str) -> None:
    if buf is not IN_PLACE and buf is not None:
        check(buf, want, f"{what} (an input: must be unchanged)")


def _start_barrier(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    return _invoke(comm, c), lambda: None


def _start_bcast(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    want = _v(c, c.root)
    buf = want.copy() if comm.rank == c.root else sentinel(c.dtype, c.n)
    req = _invoke(comm, c, buf, c.root)
    return req, lambda: check(buf, want, "buf")


def _start_reduce(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    mine = _v(c, r)
    recv: Array | None = None
    send: Any = mine.copy()
    if r == c.root:
        recv = mine.copy() if c.inplace else sentinel(c.dtype, c.n)
        send = IN_PLACE if c.inplace else send
    req = _invoke(comm, c, send, recv, OPS[c.op], c.root)

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        if recv is not None:
            check(recv, _ref(c, range(p)), "recvbuf at the root")
    return req, verify


def _start_allreduce(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    mine = _v(c, r)
    recv = mine.copy() if c.inplace else sentinel(c.dtype, c.n)
    send = IN_PLACE if c.inplace else mine.copy()
    req = _invoke(comm, c, send, recv, OPS[c.op])

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        check(recv, _ref(c, range(p)), "recvbuf")
    return req, verify


def _start_scan(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r = comm.rank
    mine = _v(c, r)
    recv = mine.copy() if c.inplace else sentinel(c.dtype, c.n)
    before = recv.copy()
    send = IN_PLACE if c.inplace else mine.copy()
    req = _invoke(comm, c, send, recv, OPS[c.op])

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        if c.coll == "scan":
            check(recv, _ref(c, range(r + 1)), "recvbuf")
        elif r == 0:
            check(recv, before, "recvbuf of rank 0 (exscan leaves it untouched)")
        else:
            check(recv, _ref(c, range(r)), "recvbuf")
    return req, verify


def _start_reduce_scatter(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    counts = [c.n] * p if c.coll == "reduce_scatter_block" else vcounts(c.n, p)
    displs, total = vlayout(counts, "packed")
    mine = _v(c, r, total)
    mine_n = counts[r]
    recv = mine.copy() if c.inplace else sentinel(c.dtype, mine_n)
    send = IN_PLACE if c.inplace else mine.copy()
    if c.coll == "reduce_scatter_block":
        req = _invoke(comm, c, send, recv, OPS[c.op])
    else:
        req = _invoke(comm, c, send, recv, counts, OPS[c.op])

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        full = _ref(c, range(p), total)
        check(recv[:mine_n], full[displs[r] : displs[r] + mine_n], "recvbuf (this rank's block)")
    return req, verify


def _start_gather(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p, n = comm.rank, comm.size, c.n
    mine = _v(c, r)
    recv: Array | None = None
    send: Any = mine.copy()
    if r == c.root:
        recv = sentinel(c.dtype, p * n)
        if c.inplace:
            recv[r * n : (r + 1) * n] = mine
            send = IN_PLACE
    req = _invoke(comm, c, send, recv, c.root)

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        if recv is not None:
            check(recv, _joined(c, range(p)), "recvbuf at the root")
    return req, verify


def _fill(buf: Array, counts: Sequence[int], displs: Sequence[int],
          who: Callable[[int], int], c: Case) -> Array:
    """``buf`` with block i (``counts[i]`` at ``displs[i]``) set to ``values(who(i))``."""
    for i, (k, d) in enumerate(zip(counts, displs, strict=True)):
        buf[d : d + k] = _v(c, who(i), k)
    return buf


def _start_gatherv(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    counts = vcounts(c.n, p)
    displs, size = vlayout(counts, c.layout)
    mine = _v(c, r, counts[r])
    recv: Array | None = None
    send: Any = mine.copy()
    before = sentinel(c.dtype, size)
    if r == c.root:
        recv = before.copy()
        if c.inplace:
            recv[displs[r] : displs[r] + counts[r]] = mine
            send = IN_PLACE
    d_arg = displs if c.layout == "gapped" else None
    if r == c.root:
        req = _invoke(comm, c, send, recv, counts, d_arg, c.root)
    else:  # counts and displs matter only at the root
        req = _invoke(comm, c, send, None, None, None, c.root)

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        if recv is not None:
            check(recv, _fill(before.copy(), counts, displs, lambda i: i, c),
                  "recvbuf at the root (gaps must stay untouched)")
    return req, verify


def _start_scatter(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p, n = comm.rank, comm.size, c.n
    send: Array | None = None
    recv: Any = sentinel(c.dtype, n)
    full = _joined(c, range(p))
    if r == c.root:
        send = full.copy()
        if c.inplace:
            recv = IN_PLACE
    req = _invoke(comm, c, send, recv, c.root)

    def verify() -> None:
        _unchanged(send, full, "sendbuf at the root")
        if recv is not IN_PLACE:
            check(recv, _v(c, r), "recvbuf")
    return req, verify


def _start_scatterv(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    counts = vcounts(c.n, p)
    displs, size = vlayout(counts, c.layout)
    full = _fill(sentinel(c.dtype, size), counts, displs, lambda i: i, c)
    send: Array | None = None
    recv: Any = sentinel(c.dtype, counts[r])
    d_arg = displs if c.layout == "gapped" else None
    if r == c.root:
        send = full.copy()
        if c.inplace:
            recv = IN_PLACE
        req = _invoke(comm, c, send, recv, counts, d_arg, c.root)
    else:
        req = _invoke(comm, c, None, recv, None, None, c.root)

    def verify() -> None:
        _unchanged(send, full, "sendbuf at the root")
        if recv is not IN_PLACE:
            check(recv, _v(c, r, counts[r]), "recvbuf")
    return req, verify


def _start_allgather(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    if c.coll == "allgather":
        counts = [c.n] * p
        displs, size = vlayout(counts, "packed")
    else:
        counts = vcounts(c.n, p)
        displs, size = vlayout(counts, c.layout)
    mine = _v(c, r, counts[r])
    before = sentinel(c.dtype, size)
    recv = before.copy()
    send: Any = mine.copy()
    if c.inplace:
        recv[displs[r] : displs[r] + counts[r]] = mine
        send = IN_PLACE
    if c.coll == "allgather":
        req = _invoke(comm, c, send, recv)
    else:
        req = _invoke(comm, c, send, recv, counts, displs if c.layout == "gapped" else None)

    def verify() -> None:
        _unchanged(send, mine, "sendbuf")
        check(recv, _fill(before.copy(), counts, displs, lambda i: i, c),
              "recvbuf (gaps must stay untouched)")
    return req, verify


def _start_alltoall(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    data = _joined(c, [pair(r, j) for j in range(p)])
    recv = data.copy() if c.inplace else sentinel(c.dtype, p * c.n)
    send: Any = IN_PLACE if c.inplace else data.copy()
    req = _invoke(comm, c, send, recv)

    def verify() -> None:
        _unchanged(send, data, "sendbuf")
        check(recv, _joined(c, [pair(i, r) for i in range(p)]), "recvbuf")
    return req, verify


def _start_alltoallv(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    sc = [pcounts(c.n, r, j, c.inplace) for j in range(p)]
    rc = [pcounts(c.n, i, r, c.inplace) for i in range(p)]
    sd, ssize = vlayout(sc, c.layout)
    rd, rsize = vlayout(rc, c.layout)
    data = _fill(sentinel(c.dtype, ssize), sc, sd, lambda j: pair(r, j), c)
    gapped = c.layout == "gapped"
    if c.inplace:  # symmetric counts: the send side uses recvcounts/rdispls
        before = data.copy()
        recv = data.copy()
        send: Any = IN_PLACE
    else:
        before = sentinel(c.dtype, rsize)
        recv = before.copy()
        send = data.copy()
    req = _invoke(comm, c, send, recv, sc, rc, sd if gapped else None, rd if gapped else None)

    def verify() -> None:
        _unchanged(send, data, "sendbuf")
        check(recv, _fill(before.copy(), rc, rd, lambda i: pair(i, r), c),
              "recvbuf (gaps must stay untouched)")
    return req, verify


def _w_dtype(c: Case, i: int, j: int) -> np.dtype[Any]:
    mix = (c.dtype, np.dtype(np.int8), F64, LOC, np.dtype(np.complex64))
    return mix[(i + 2 * j) % len(mix)]


def _start_alltoallw(comm: Communicator, c: Case) -> tuple[Request[None] | None, Verify]:
    r, p = comm.rank, comm.size
    sends = [values(pair(r, j), pcounts(c.n, r, j, False), _w_dtype(c, r, j)) for j in range(p)]
    wants = [values(pair(i, r), pcounts(c.n, i, r, False), _w_dtype(c, i, r)) for i in range(p)]
    recvs = [sentinel(w.dtype, w.size) for w in wants]
    if c.layout == "bytes":  # receive from the next rank as raw bytes: only byte sizes matter
        i = (r + 1) % p
        recvs[i] = sentinel(np.dtype(np.uint8), wants[i].nbytes)
        wants[i] = wants[i].view(np.uint8)
    keep = [s.copy() for s in sends]
    req = _invoke(comm, c, sends, recvs)

    def verify() -> None:
        for j in range(p):
            check(sends[j], keep[j], f"sendbufs[{j}] (an input: must be unchanged)")
            check(recvs[j], wants[j], f"recvbufs[{j}]")
    return req, verify


STARTERS: dict[str, Callable[[Communicator, Case], tuple[Request[None] | None, Verify]]] = {
    "barrier": _start_barrier, "bcast": _start_bcast, "reduce": _start_reduce,
    "allreduce": _start_allreduce, "scan": _start_scan, "exscan": _start_scan,
    "reduce_scatter_block": _start_reduce_scatter, "reduce_scatter": _start_reduce_scatter,
    "gather": _start_gather, "gatherv": _start_gatherv, "scatter": _start_scatter,
    "scatterv": _start_scatterv, "allgather": _start_allgather,
    "allgatherv": _start_allgather, "alltoall": _start_alltoall,
    "alltoallv": _start_alltoallv, "alltoallw": _start_alltoallw,
}


# ------------------------------------------------------------------------ running cases
class Runner:
    """Starts cases on one communicator and collects failures as readable strings."""

    def __init__(self, comm: Communicator, batch: int = 48, batch_bytes: int = 24 << 20) -> None:
        self.comm = comm
        self.failures: list[str] = []
        self.batch = batch
        self.batch_bytes = batch_bytes
        self.ran = 0
        self._pending: list[tuple[Case, Request[None], Verify]] = []
        self._bytes = 0

    def fail(self, what: str, msg: str) -> None:
        self.failures.append(f"{what} (rank {self.comm.rank} of {self.comm.size}): {msg}")

    def add(self, c: Case) -> None:
        """Start ``c``; a blocking case completes (and is checked) at once, while the
        nonblocking cases started before it are still in flight."""
        try:
            req, verify = STARTERS[c.coll](self.comm, c)
        except (ValueError, TypeError) as exc:  # argument errors: every rank raises alike
            self.fail(str(c), f"raised {exc!r}")
            return
        except Exception as exc:  # the ranks may now disagree: stop with the case named
            raise AssertionError(f"{c} (rank {self.comm.rank}): raised {exc!r}\n"
                                 f"failures so far: {self.failures}") from exc
        self.ran += 1
        if self.comm.last_algorithm != c.algo:
            self.fail(str(c), f"last_algorithm={self.comm.last_algorithm!r}")
        if req is None:
            self._verify(c, verify)
            return
        self._pending.append((c, req, verify))
        self._bytes += c.n * c.dtype.itemsize * self.comm.size
        if len(self._pending) >= self.batch or self._bytes >= self.batch_bytes:
            self.flush()

    def add_all(self, cases: Iterable[Case]) -> None:
        for c in cases:
            self.add(c)
        self.flush()

    def flush(self) -> None:
        """Wait for every case in flight, newest first, then check them."""
        pending, self._pending, self._bytes = self._pending, [], 0
        for c, req, _ in reversed(pending):
            try:
                req.wait(WAIT)
            except Exception as exc:  # the ranks may now disagree: stop with the case named
                raise AssertionError(f"{c} (rank {self.comm.rank}): wait raised {exc!r}\n"
                                     f"failures so far: {self.failures}") from exc
        for c, _, verify in pending:
            self._verify(c, verify)

    def _verify(self, c: Case, verify: Verify) -> None:
        try:
            verify()
        except AssertionError as exc:
            self.fail(str(c), str(exc))


def digest(a: Array) -> Array:
    """A 32-byte digest of ``a``'s bytes, as uint8 (to compare large results across ranks)."""
    return np.frombuffer(hashlib.blake2b(a.tobytes(), digest_size=32).digest(), np.uint8).copy()


def same_on_every_rank(comm: Communicator, a: Array, what: str) -> str | None:
    """None if ``a`` is bitwise identical on every rank, else a description (allgather)."""
    mine = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    if mine.size > 65536:
        mine = digest(mine)
    table = np.empty(comm.size * mine.size, np.uint8)
    comm.allgather(mine, table, timeout=WAIT)
    rows = table.reshape(comm.size, mine.size)
    differ = [i for i in range(comm.size) if not np.array_equal(rows[i], rows[0])]
    return f"{what}: ranks {differ} differ from rank 0" if differ else None


def profile_for(p: int, transport: str) -> str:
    """Which dtype x op matrix a (world size, transport) job runs."""
    if p == 8:
        return "minimal"
    return "full" if transport == "shm" and p in (3, 5) else "reduced"

