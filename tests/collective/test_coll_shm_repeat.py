"""The quick runners of repeated small shared-memory collectives
(:mod:`ringworld.algorithms.shm_repeat`): allreduce, allgather, alltoall and
reduce_scatter_block, repeated on the same arrays and on fresh arrays of a kept shape, give the
numpy reference's result for every dtype and op the library accepts (a non-commutative op in
rank order), at counts 0, 1 and 7 a block, in place, and with other collectives in between that
move the arena's sync count (so repeats start at both slot parities). Every call has new data
(per element, rank and call), so a runner that read another call's slots returns a wrong
result; and after each small call every rank's slot of that sync's parity must hold its input,
so a runner that went through the wrong parity is caught even where no rank overtook another.
A last test checks that small repeats really run a quick runner and large ones the plain
``shm_collectives.RUN`` entry.

bcast's runner (``Arena.bcast_runner``: up to EAGER_MAX bytes, through the small entries of
the root's eager ring up to EAGER_SMALL, its large ones above) is checked alike: every dtype,
counts 0, 1, 7, EAGER_SMALL bytes and one element more (a large entry), EAGER_MAX bytes and one
element more (the plain path), from root 0 and from the last rank, with the receivers' buffers
filled with bytes the root never sends; then long runs of repeats (more than twice the ring's
EAGER_RING entries) while the receivers fall behind at times, so that the root waits for ring
space, with other calls between them. Last, ``ringworld.MPI``'s repeated
Bcast (its first call runs on byte views, its repeats on the typed arrays), Allreduce,
Allgather and Alltoall."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from coll_support import AFFINE, AFFINE_OP, P_AFF, RING_POLICY, affine

import ringworld
from ringworld import Op
from ringworld.algorithms import shm_collectives, shm_policy
from ringworld.algorithms.shm_policy import EAGER_MAX, EAGER_RING, EAGER_SMALL
from ringworld.testing import run_processes

Array = np.ndarray[Any, Any]

COLLS = ("allreduce", "allgather", "alltoall", "reduce_scatter_block")
REDUCING = ("allreduce", "reduce_scatter_block")
INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                    np.uint8, np.uint16, np.uint32, np.uint64))
FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))
COMPLEX = tuple(np.dtype(t) for t in (np.complex64, np.complex128))
BOOL = np.dtype(np.bool_)
PLAIN = (*INTS, *FLOATS, *COMPLEX, BOOL)
#: elements per block (per rank's vector for allreduce and allgather): none, one, and one that
#: no world size here divides
COUNTS = (0, 1, 7)
#: each call shape runs this often: False on the arrays used before, True on new ones (the
#: first call takes the checked path and keeps the runner; the others are repeats)
PLAN = (False, False, False, True, False, True, False)


def _ops_for(dt: np.dtype[Any]) -> tuple[Op, ...]:
    """The ops ``ringworld.comm.ops`` accepts on ``dt`` among those under test."""
    if dt == AFFINE:
        return (AFFINE_OP,)
    if dt.kind == "c":  # max and min are refused on complex
        return (ringworld.SUM, ringworld.PROD)
    if dt.kind == "f":  # bitwise ops are refused on floats
        return (ringworld.SUM, ringworld.PROD, ringworld.MAX, ringworld.MIN)
    return (ringworld.SUM, ringworld.PROD, ringworld.MAX, ringworld.MIN, ringworld.BXOR)


def _values(dt: np.dtype[Any], n: int, who: int, t: int, op: Op | None = None) -> Array:
    """``n`` elements of ``dt`` contributed by rank ``who`` to call number ``t``: they differ
    from element to element, from rank to rank, and every element changes from one call to
    the next; small enough that no sum or product in any of these dtypes rounds or overflows
    differently from numpy's in rank order."""
    i = np.arange(n, dtype=np.int64)
    base = i * 7 + who * 131 + t * 37
    if dt == AFFINE:
        big = i * 7919 + who * 104729 + t * 1299709 + 1
        out = np.empty(n, AFFINE)
        out["m"] = big % (P_AFF - 1) + 1
        out["c"] = (big * 3 + 5) % P_AFF
        return out
    name = "" if op is None else op.name
    if dt.kind == "b":  # sparse trues for or-like ops, sparse falses for and-like ones
        h = (base * 2654435761) % (1 << 32) >> 8
        bits: Array = h % 5 != 0 if name in ("prod", "min") else h % 5 == 0
        return bits
    if name == "prod":  # +-1, +-2, +-3: products of five stay exact
        v = base % 3 + 1
        if dt.kind != "u":
            v = np.where(base // 3 % 2 == 1, -v, v)
        if dt.kind == "c":
            return (v + 1j * (base % 2)).astype(dt)
        return v.astype(dt)
    v = base % 101
    if dt.kind != "u":
        v = v - 50
    if dt.kind == "c":
        return (v + 1j * (base % 7 - 3)).astype(dt)
    return v.astype(dt)


#: the byte the receivers' buffers hold before a broadcast: no element :func:`_bcast_data`
#: makes is all FILL bytes (nor, in a bool array, has any FILL byte)
FILL = 0xFF


def _bcast_data(dt: np.dtype[Any], n: int, root: int, t: int) -> Array:
    """``n`` elements of ``dt`` that ``root`` broadcasts in call ``t``, made as raw bytes
    (compared as bytes: a float may be a NaN): every element's bytes differ from those of
    every other element of the call (as far as ``dt`` has values: below 256 one-byte ones)
    and from those of the same element in any other call (bool: every element flips from one
    call to the next, 0 or 1); no element is all :data:`FILL` bytes."""
    i = np.arange(n, dtype=np.int64)
    if dt.kind == "b":
        bits = ((i * 0x9E3779B1 >> 16) + t + root) & 1
        out = np.empty(n, dt)
        out.view(np.uint8)[...] = bits
        return out
    k = dt.itemsize
    key = i + ((t * 8 + root) << 15)  # unique per element (n < 2**15), root and call
    low = min(k, 4)
    v = key % ((1 << (8 * low)) - 1)  # (never all FILL bytes; a bijection while key is small)
    raw = np.empty((n, k), np.uint8)
    for j in range(k):
        raw[:, j] = (v >> (8 * j)) & 0xFF if j < low else ((key * (2 * j + 1) + j) >> (j % 5))
    return raw.reshape(-1).view(dt)


def _reduce(op: Op, parts: list[Array]) -> Array:
    """``parts`` combined in rank order, as numpy does it."""
    acc = parts[0].copy()
    for x in parts[1:]:
        if op is AFFINE_OP:
            acc = affine(acc, x)
        else:
            uf = op.ufunc
            assert uf is not None
            uf(acc, x, out=acc)
    return acc


def _sizes(coll: str, p: int, n: int) -> tuple[int, int]:
    """(send, recv) elements of a call of ``coll`` with ``n`` elements a block."""
    return {"allreduce": (n, n), "allgather": (n, p * n), "alltoall": (p * n, p * n),
            "reduce_scatter_block": (p * n, n)}[coll]


def _want(coll: str, op: Op | None, r: int, n: int, parts: list[Array]) -> Array:
    """Rank ``r``'s result of ``coll`` when rank i sends ``parts[i]`` (``n`` a block)."""
    if coll == "allreduce":
        assert op is not None
        return _reduce(op, parts)
    if coll == "reduce_scatter_block":
        assert op is not None
        return _reduce(op, parts)[r * n : (r + 1) * n]
    if coll == "allgather":
        return np.concatenate(parts)
    return np.concatenate([x[r * n : (r + 1) * n] for x in parts])


def _call(comm: ringworld.Communicator, coll: str, send: Any, recv: Array,
          op: Op | None) -> None:
    if coll == "allreduce":
        assert op is not None
        comm.allreduce(send, recv, op)
    elif coll == "reduce_scatter_block":
        assert op is not None
        comm.reduce_scatter_block(send, recv, op)
    else:
        getattr(comm, coll)(send, recv)


def _slots_hold(comm: ringworld.Communicator, dt: np.dtype[Any], parts: list[Array],
                what: str) -> list[str]:
    """After a small call through the slots: every rank's slot of the parity of the sync just
    made holds that rank's input (``parts[i]``), as ``shm_collectives`` writes them (the
    slots of ``next_parity()`` before the sync). No rank can overwrite that slot before this
    rank reaches its next sync. Nothing to check on one rank or for an empty call."""
    p = comm.size
    if p == 1 or parts[0].size == 0:
        return []
    if comm.last_algorithm != "shm":
        return [f"{what}: ran {comm.last_algorithm}, not shm"]
    a = comm._arena
    assert a is not None
    slots = a.slots(a.epoch & 1, dt, parts[0].size)
    return [f"{what}: rank {i}'s slot of this sync's parity (epoch {a.epoch}) holds "
            f"{slots[i]}, not its input {parts[i]}"
            for i in range(p) if not np.array_equal(slots[i], parts[i])]


class Checker:
    """One rank's calls with fresh data, each checked against numpy; ``t`` numbers the calls
    (the same on every rank, so the data of every rank's call is known everywhere)."""

    def __init__(self, comm: ringworld.Communicator) -> None:
        self.comm = comm
        self.t = 0
        self.errors: list[str] = []

    def call(self, coll: str, dt: np.dtype[Any], op: Op | None, n: int, send: Array,
             recv: Array, tag: str = "", in_place: bool = False) -> None:
        """``coll`` on ``send`` and ``recv`` (``n`` elements a block) with new data, checked:
        the result, and the slots where the call is small."""
        comm, p, r = self.comm, self.comm.size, self.comm.rank
        self.t += 1
        t = self.t
        parts = [_values(dt, send.size, i, t, op) for i in range(p)]
        send[...] = parts[r]
        if not in_place:  # what no rank sent: a result left unwritten shows
            recv[...] = _values(dt, recv.size, p + 3, t + 1, op)
        _call(comm, coll, ringworld.IN_PLACE if in_place else send, recv, op)
        want = _want(coll, op, r, n, parts)
        what = (f"{coll} {dt} {'' if op is None else op.name} n={n}"
                f"{' in place' if in_place else ''} {tag} (call {t}, rank {r})")
        if recv.shape != want.shape or not np.array_equal(recv, want):
            self.errors.append(f"{what}: got {recv}, want {want}")
        if send.nbytes <= 4096:
            self.errors += _slots_hold(comm, dt, parts, what)

    def repeats(self, coll: str, dt: np.dtype[Any], op: Op | None, n: int,
                in_place: bool = False) -> None:
        """A call shape run as :data:`PLAN` says: on the same arrays and on new ones."""
        ns, nr = _sizes(coll, self.comm.size, n)
        send = recv = np.empty(nr, dt)
        for k, fresh in enumerate(PLAN):
            if k == 0 or fresh:
                recv = np.empty(nr, dt)
                send = recv if in_place else np.empty(ns, dt)
            self.call(coll, dt, op, n, send, recv, f"repeat {k}{' (new arrays)' * fresh}",
                      in_place)

    def bcast(self, dt: np.dtype[Any], root: int, buf: Array, tag: str = "") -> None:
        """``comm.bcast(buf, root)`` with new data (:func:`_bcast_data`), the receivers'
        ``buf`` first filled with :data:`FILL` bytes, checked byte for byte on every rank."""
        comm, r = self.comm, self.comm.rank
        self.t += 1
        want = _bcast_data(dt, buf.size, root, self.t).reshape(buf.shape)
        if r == root:
            buf[...] = want
        else:
            buf.reshape(-1).view(np.uint8)[...] = FILL
        comm.bcast(buf, root)
        got, exp = buf.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)
        if not np.array_equal(got, exp):
            bad = np.flatnonzero(got != exp)
            i = bad[0] // dt.itemsize
            self.errors.append(
                f"bcast {dt} n={buf.size} root={root} {tag} (call {self.t}, rank {r}): "
                f"{bad.size} bytes wrong, first in element {i}: "
                f"{got[i * dt.itemsize:(i + 1) * dt.itemsize].tobytes().hex()}, want "
                f"{exp[i * dt.itemsize:(i + 1) * dt.itemsize].tobytes().hex()}"
                f"{' (never sent: unwritten)' if got[bad[0]] == FILL else ''}")

    def bcast_repeats(self, dt: np.dtype[Any], n: int, root: int) -> None:
        """A broadcast's shape run as :data:`PLAN` says, on the same array and on new ones."""
        buf = np.empty(n, dt)
        for k, fresh in enumerate(PLAN):
            if fresh:
                buf = np.empty(n, dt)
            self.bcast(dt, root, buf, f"repeat {k}{' (new array)' * fresh}")


def _matrix(comm: ringworld.Communicator) -> list[str]:
    """Every collective, dtype, op and count, each repeated."""
    c = Checker(comm)
    for n in COUNTS:
        for dt in (*PLAIN, AFFINE):
            for coll in REDUCING:
                for op in _ops_for(dt):
                    c.repeats(coll, dt, op, n)
            if dt != AFFINE:
                for coll in ("allgather", "alltoall"):
                    c.repeats(coll, dt, None, n)
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeats_every_dtype_op_and_count(size: int) -> None:
    results = run_processes(size, _matrix, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _in_place(comm: ringworld.Communicator) -> list[str]:
    """In-place allreduce repeated (on the same array and on new ones), then out of place on
    the same recvbuf, and back."""
    c = Checker(comm)
    for n in COUNTS:
        for dt, op in ((np.dtype(np.int64), ringworld.SUM), (np.dtype(np.float32), ringworld.MAX),
                       (np.dtype(np.uint8), ringworld.BXOR), (np.dtype(np.complex128),
                                                              ringworld.PROD),
                       (BOOL, ringworld.MIN), (AFFINE, AFFINE_OP)):
            c.repeats("allreduce", dt, op, n, in_place=True)
            recv = np.empty(n, dt)
            send = np.empty(n, dt)
            for k in range(6):  # alternately in place and not, on the same recvbuf
                c.call("allreduce", dt, op, n, recv if k % 2 else send, recv,
                       f"mixed {k}", in_place=k % 2 == 1)
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeated_in_place_allreduce(size: int) -> None:
    results = run_processes(size, _in_place, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _interleaved(comm: ringworld.Communicator) -> list[str]:
    """Kept calls of every collective repeated with other calls between them, in an order
    that changes every round (the same on every rank): barriers, broadcasts (no sync), another
    allreduce and alltoall shape, a scan (a slot call without a quick runner), a large
    allreduce (several syncs), and calls on a duplicate (its own arena). Each kept call is made
    to start at both slot parities."""
    p, r = comm.size, comm.rank
    c = Checker(comm)
    dup = comm.dup()
    d = Checker(dup)
    i64, f32, f64 = np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.float64)
    i32, u16 = np.dtype(np.int32), np.dtype(np.uint16)

    def kept(coll: str, dt: np.dtype[Any], op: Op | None, n: int) -> Callable[[], None]:
        ns, nr = _sizes(coll, p, n)
        send, recv = np.empty(ns, dt), np.empty(nr, dt)
        return lambda: c.call(coll, dt, op, n, send, recv, "kept")

    kept_calls = {
        "allreduce sum": kept("allreduce", i64, ringworld.SUM, 5),
        "allreduce affine": kept("allreduce", AFFINE, AFFINE_OP, 3),
        "allgather": kept("allgather", f32, None, 3),
        "alltoall": kept("alltoall", i32, None, 2),
        "reduce_scatter_block": kept("reduce_scatter_block", f64, ringworld.MAX, 3),
        "reduce_scatter_block affine": kept("reduce_scatter_block", AFFINE, AFFINE_OP, 2),
    }
    in_place_recv = np.empty(4, f64)

    def in_place() -> None:
        c.call("allreduce", f64, ringworld.SUM, 4, in_place_recv, in_place_recv, "kept",
               in_place=True)

    kept_calls["allreduce in place"] = in_place
    other_ar = kept("allreduce", u16, ringworld.BXOR, 9)
    other_a2a = kept("alltoall", f64, None, 1)
    big = 40_000  # float64: over the slots of allreduce at any size here
    big_send, big_recv = np.empty(big, f64), np.empty(big, f64)
    dup_send, dup_recv = np.empty(5, i64), np.empty(5, i64)
    bcast_buf = np.empty(6, i64)
    scan_send, scan_recv = np.empty(3, i64), np.empty(3, i64)
    state = {"round": 0}

    def bcast() -> None:
        root = state["round"] % p
        want = np.arange(6) * 3 + root * 100 + state["round"]
        bcast_buf[:] = want if r == root else -1
        comm.bcast(bcast_buf, root)
        if not np.array_equal(bcast_buf, want):
            c.errors.append(f"bcast round {state['round']}: {bcast_buf}")

    def scan() -> None:
        k = state["round"]
        scan_send[:] = np.arange(3) + r * 10 + k
        comm.scan(scan_send, scan_recv)
        want = sum(np.arange(3) + i * 10 + k for i in range(r + 1))
        if not np.array_equal(scan_recv, want):
            c.errors.append(f"scan round {k}: {scan_recv} != {want}")

    def large() -> None:
        c.call("allreduce", f64, ringworld.SUM, big, big_send, big_recv, "large")

    def on_dup() -> None:
        d.call("allreduce", i64, ringworld.SUM, 5, dup_send, dup_recv, "on the duplicate")

    fillers: dict[str, Callable[[], None]] = {
        "barrier": comm.barrier, "bcast": bcast, "other allreduce": other_ar,
        "other alltoall": other_a2a, "scan": scan, "large allreduce": large,
        "duplicate": on_dup,
    }
    for f in kept_calls.values():  # first calls: every shape kept before the rounds
        f()
    parities: dict[str, set[int]] = {name: set() for name in kept_calls}
    names = list(kept_calls)
    for k in range(10):
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
                if a.epoch & 1 != want:
                    c.errors.append(f"two barriers did not move the sync count: {a.epoch}")
                parities[name].add(a.epoch & 1)
            kept_calls[name]()
    if p > 1:
        for name, seen in parities.items():
            if seen != {0, 1}:
                c.errors.append(f"{name}: repeats started at slot parities {seen} only")
        missing = sorted(set(COLLS) - set(comm._cache.last))
        if missing:
            c.errors.append(f"calls not kept: {missing}")
    dup.free()
    return c.errors + d.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeats_between_other_calls(size: int) -> None:
    results = run_processes(size, _interleaved, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _in_use(comm: ringworld.Communicator) -> list[str]:
    """Small repeats keep a quick runner (not ``shm_collectives.RUN``'s entry), on the same
    arrays and on new ones; large calls keep ``RUN``'s entry itself (bcast: over EAGER_SMALL
    bytes)."""
    p = comm.size
    c = Checker(comm)
    run = shm_collectives.RUN
    i64 = np.dtype(np.int64)
    for coll in COLLS:
        for op in ((ringworld.SUM, AFFINE_OP) if coll in REDUCING else (None,)):
            dt = AFFINE if op is AFFINE_OP else i64
            c.repeats(coll, dt, op, 2)
            last = comm._cache.last.get(coll)
            if not isinstance(last, tuple) or not callable(last[5]):
                c.errors.append(f"{coll}: no call kept ({last!r})")
            elif last[5] is run[coll]:
                c.errors.append(f"small {coll} ({op}): repeats run shm_collectives.RUN's "
                                "entry, not a quick runner")
    # large: 1 MiB allreduce, allgather of 512 KiB blocks (over the slots)
    big = (1 << 20) // 8
    for coll, ns, nr in (("allreduce", big, big), ("allgather", big // 2, p * big // 2)):
        send, recv = np.empty(ns, np.float64), np.empty(nr, np.float64)
        for k in range(3):
            c.call(coll, np.dtype(np.float64), ringworld.SUM if coll == "allreduce" else None,
                   ns, send, recv, f"large {k}")
        if comm.last_algorithm != "shm":
            c.errors.append(f"large {coll} ran {comm.last_algorithm}, not shm")
        last = comm._cache.last.get(coll)
        if not isinstance(last, tuple) or last[5] is not run[coll]:
            c.errors.append(f"large {coll}: kept {None if last is None else last[5]}, not "
                            f"shm_collectives.RUN's entry")
    # bcast: a runner up to EAGER_MAX bytes (from either root), RUN's entry 8 bytes over it
    for n in (2, EAGER_SMALL // 8, EAGER_SMALL // 8 + 1, EAGER_MAX // 8, EAGER_MAX // 8 + 1):
        for root in (0, p - 1):
            c.bcast_repeats(i64, n, root)
            c.errors += _bcast_kept(comm, i64, n, f"bcast of {8 * n} bytes from {root}")
    return c.errors


@pytest.mark.parametrize("size", [2, 3])
def test_small_repeats_use_a_quick_runner(size: int) -> None:
    results = run_processes(size, _in_use, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


# ------------------------------------------------------------------------------------ bcast
def _bcast_counts(dt: np.dtype[Any]) -> tuple[int, ...]:
    """A broadcast's counts: COUNTS, EAGER_SMALL bytes (the largest small entry) and one
    element more (a large entry), EAGER_MAX bytes (the ring's largest, where it takes them) and one
    element more (the plain path)."""
    small, most = EAGER_SMALL // dt.itemsize, EAGER_MAX // dt.itemsize
    return (*COUNTS, small, small + 1, most, most + 1)


def _bcast_kept(comm: ringworld.Communicator, dt: np.dtype[Any], n: int, what: str) -> list[str]:
    """After repeats of a bcast of ``n`` of ``dt`` on more than one rank: it ran in the shared
    windows, and the kept runner is a bcast runner where the call takes the root's eager ring
    (up to EAGER_MAX bytes, less where the direct path starts below that: see
    ``shm_policy.bcast_eager``), else ``shm_collectives.RUN``'s entry."""
    if comm.size == 1 or n == 0:
        return []
    if comm.last_algorithm != "shm":
        return [f"{what}: ran {comm.last_algorithm}, not shm"]
    last = comm._cache.last.get("bcast")
    if not isinstance(last, tuple) or not callable(last[5]):
        return [f"{what}: no call kept ({last!r})"]
    plain = last[5] is shm_collectives.RUN["bcast"]
    ring = shm_policy.bcast_eager(comm._arena, n * dt.itemsize)
    if n * dt.itemsize > EAGER_MAX and ring:
        return [f"{what}: over EAGER_MAX bytes, yet said to take the ring"]
    if ring and plain:
        return [f"{what}: repeats run shm_collectives.RUN's entry, not a bcast runner"]
    if not ring and not plain:
        return [f"{what}: past the ring's limit, kept {last[5]}, not shm_collectives.RUN's"]
    return []


def _bcast_matrix(comm: ringworld.Communicator) -> list[str]:
    """Broadcasts of every dtype and count, from root 0 and from the last rank, repeated."""
    c = Checker(comm)
    for dt in (*PLAIN, AFFINE):
        for n in _bcast_counts(dt):
            for root in sorted({0, comm.size - 1}):
                c.bcast_repeats(dt, n, root)
                c.errors += _bcast_kept(comm, dt, n, f"bcast {dt} n={n} root={root}")
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_bcast_repeats_every_dtype_and_count(size: int) -> None:
    results = run_processes(size, _bcast_matrix, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _bcast_ring(comm: ringworld.Communicator) -> list[str]:
    """Long runs of bcast repeats (over twice the ring's EAGER_RING small entries, so the
    root's entries wrap around), while the receivers fall behind at times: the root then runs
    a whole ring ahead and must wait for them before it writes an entry again. First runs of
    a new shape each, on one array, the receivers behind from its first call (which takes the
    checked path: a runner's entries must be those that path uses too) and again later; then
    shapes from both roots (EAGER_SMALL bytes too, and large entries: their ring of EAGER_BIG
    wraps many times), on new arrays at times, with allreduces, barriers and a broadcast of
    one element over EAGER_SMALL (a large entry) between them, in an order the same on every
    rank."""
    comm.selector.shm_policy = RING_POLICY  # (up to EAGER_MAX in the ring on any machine)
    p, r = comm.size, comm.rank
    c = Checker(comm)
    i64, f32 = np.dtype(np.int64), np.dtype(np.float32)
    last = p - 1
    for j, root in enumerate((last, 0, last)):
        n = 7 + j  # a new shape: its first call is checked, the others run the runner
        buf = np.empty(n, i64)
        comm.barrier()  # (every rank here: no rank still sleeps through the last run)
        for k in range(2 * EAGER_RING + 8):
            if r != root and k in (0, 40):  # behind by a ring: the root waits for ring space
                time.sleep(0.05)
            c.bcast(i64, root, buf, f"run {j}, {k}")
        c.errors += _bcast_kept(comm, i64, n, f"run {j}")
    shapes = [(i64, 7, 0), (i64, 7, last), (f32, 1, 0), (f32, EAGER_SMALL // 4, last),
              (f32, EAGER_SMALL // 4 + 1, 0), (i64, EAGER_MAX // 8, last)]
    bufs = [np.empty(n, dt) for dt, n, _ in shapes]
    big = np.empty(EAGER_SMALL // 8 + 1, i64)
    ar_send, ar_recv = np.empty(3, i64), np.empty(3, i64)
    rng = random.Random(7 * p)  # the same draws on every rank
    for k in range(4 * EAGER_RING):
        j = rng.randrange(len(shapes))
        dt, n, root = shapes[j]
        fresh, pause, between = rng.random() < 0.2, rng.random() < 0.05, rng.random()
        if fresh:
            bufs[j] = np.empty(n, dt)
        if between < 0.1:
            comm.barrier()
        elif between < 0.2:
            c.call("allreduce", i64, ringworld.SUM, 3, ar_send, ar_recv, f"between {k}")
        elif between < 0.25:
            c.bcast(i64, root, big, f"large between {k}")
        if pause and r != root:
            time.sleep(0.02)
        c.bcast(dt, root, bufs[j], f"mixed {k}{' (new array)' * fresh}")
    for dt, n, root in shapes:  # each again, checked as kept
        c.bcast(dt, root, np.empty(n, dt), "last")
        c.errors += _bcast_kept(comm, dt, n, f"bcast {dt} n={n} root={root} last")
    return c.errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_bcast_repeats_wrap_the_ring(size: int) -> None:
    results = run_processes(size, _bcast_ring, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


# ------------------------------------------------------------------------- ringworld.MPI
def _mpi_values(dt: str, n: int, who: int, t: int) -> Array:
    """``n`` elements of ``dt`` from rank ``who`` in call ``t``: unique per element, rank and
    call, positive, and small enough that sums of five stay exact in float32."""
    return (np.arange(n) + 1 + who * 64 + t * 512).astype(dt)


def _mpi_repeats(_: object) -> list[str]:
    """``ringworld.MPI``'s Bcast (its first call runs on byte views, its repeats on the
    typed arrays: the runner must be made for those), on float64 arrays of 1 and 7 elements,
    a (2, 3) one, an int32 one and ``[array, MPI.DOUBLE]`` specs, from root 0 and the last
    rank; then Allreduce, Allgather and Alltoall on float32 and int64 arrays: each repeated
    on the same arrays and on new ones, with new data every call, checked against numpy; on
    more than one rank the small repeats run a quick runner."""
    from ringworld import MPI

    comm = MPI.COMM_WORLD
    native = ringworld.world()
    r, p = comm.Get_rank(), comm.Get_size()
    errors: list[str] = []
    t = 0

    def runner_kept(coll: str, what: str) -> None:
        if p == 1:
            return
        last = native._cache.last.get(coll)
        if not isinstance(last, tuple) or not callable(last[5]):
            errors.append(f"{what}: no call kept ({last!r})")
        elif last[5] is shm_collectives.RUN[coll]:
            errors.append(f"{what}: repeats run shm_collectives.RUN's entry, not a runner")

    for dt, shape, spec in (("f8", (1,), False), ("f8", (7,), False), ("f8", (2, 3), False),
                            ("i4", (7,), False), ("f8", (1,), True), ("f8", (7,), True)):
        for root in sorted({0, p - 1}):
            buf = np.empty(shape, dt)
            for k, fresh in enumerate(PLAN):
                t += 1
                if fresh:
                    buf = np.empty(shape, dt)
                want = _mpi_values(dt, buf.size, root, t).reshape(shape)
                buf[...] = want if r == root else -1  # (never sent)
                comm.Bcast([buf, MPI.DOUBLE] if spec else buf, root)
                if not np.array_equal(buf, want):
                    errors.append(f"Bcast {dt} {shape}{' spec' * spec} root={root} repeat {k} "
                                  f"(call {t}, rank {r}): got {buf}, want {want}")
            runner_kept("bcast", f"Bcast {dt} {shape}{' spec' * spec} root={root}")
    for dt in ("f4", "i8"):
        for n in (1, 3):
            for coll in ("Allreduce", "Allgather", "Alltoall"):
                ns, nr = {"Allreduce": (n, n), "Allgather": (n, p * n),
                          "Alltoall": (p * n, p * n)}[coll]
                send, recv = np.empty(ns, dt), np.empty(nr, dt)
                for k, fresh in enumerate(PLAN):
                    t += 1
                    if fresh:
                        send, recv = np.empty(ns, dt), np.empty(nr, dt)
                    parts = [_mpi_values(dt, ns, q, t) for q in range(p)]
                    send[...] = parts[r]
                    recv[...] = -1
                    if coll == "Allreduce":
                        comm.Allreduce(send, recv, MPI.SUM)
                        want = np.sum(parts, axis=0, dtype=dt)
                    elif coll == "Allgather":
                        comm.Allgather(send, recv)
                        want = np.concatenate(parts)
                    else:
                        comm.Alltoall(send, recv)
                        want = np.concatenate([x[r * n:(r + 1) * n] for x in parts])
                    if not np.array_equal(recv, want):
                        errors.append(f"{coll} {dt} n={n} repeat {k} (call {t}, rank {r}): "
                                      f"got {recv}, want {want}")
                runner_kept(coll.lower(), f"{coll} {dt} n={n}")
    comm.Barrier()
    return errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_mpi_repeats_run_on_the_arrays_repeats_pass(size: int) -> None:
    results = run_processes(size, _mpi_repeats, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _shapes_and_paths(comm: ringworld.Communicator) -> list[str]:
    """Repeats whose sendbuf is not flat beside a flat recvbuf (each is flattened on its own);
    a rank that takes the checked path every call (``algorithm="shm"``) beside ranks that
    repeat through their runners, in the same calls; a kept call given a timeout. Every call
    has new data; the communicator stays usable throughout."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 3
    base = np.arange(p * n, dtype=np.float64)
    for k in range(6):
        send = (base + 100 * r + k).reshape(p, n)  # 2-D send, 1-D recv
        out = np.full(p * n, -1.0)
        comm.alltoall(send, out)
        want = np.concatenate([base[r * n : (r + 1) * n] + 100 * i + k for i in range(p)])
        if not np.array_equal(out, want):
            errors.append(f"alltoall of a 2-D sendbuf, call {k}: {out}")
        red = np.full(p * n, -1.0)
        comm.allreduce(send, red)
        if not np.array_equal(red, sum(base + 100 * i + k for i in range(p))):
            errors.append(f"allreduce of a 2-D sendbuf, call {k}: {red}")
        mine = np.full(n, -1.0)
        comm.reduce_scatter_block(send, mine)
        if not np.array_equal(mine, sum(base[r * n : (r + 1) * n] + 100 * i + k
                                        for i in range(p))):
            errors.append(f"reduce_scatter_block of a 2-D sendbuf, call {k}: {mine}")
    # rank 0 takes the checked path each call, the others their runners (after the first)
    kw: dict[str, Any] = {"algorithm": "shm"} if r == 0 and p > 1 else {}
    a = np.zeros(n)
    b = np.zeros(n)
    g = np.zeros(p * n)
    kept_before = None
    for k in range(8):
        a[:] = np.arange(n) + 10 * r + k
        comm.allreduce(a, b, **kw)
        if not np.array_equal(b, sum(np.arange(n) + 10 * i + k for i in range(p))):
            errors.append(f"mixed allreduce {k}: {b}")
        comm.allgather(a, g, **kw)
        if not np.array_equal(g, np.concatenate([np.arange(n) + 10 * i + k
                                                 for i in range(p)])):
            errors.append(f"mixed allgather {k}: {g}")
        for root in {0, p - 1}:
            buf = (np.arange(n) + 1000.0 * root + k) if r == root else np.full(n, -1.0)
            comm.bcast(buf, root, **kw)
            if not np.array_equal(buf, np.arange(n) + 1000 * root + k):
                errors.append(f"mixed bcast {k} from {root}: {buf}")
        if r == 0 and p > 1:  # the checked path keeps the shape's runner, not a new one
            kept = comm._cache.last["allreduce"][5]
            if k and kept is not kept_before:
                errors.append(f"call {k} with algorithm='shm' made a new runner")
            kept_before = kept
    # a kept call given a timeout (it begins through the checks), then without one again
    for k, timeout in enumerate((5.0, None, 5.0, None)):
        a[:] = np.arange(n) * 3 + r + k
        comm.allreduce(a, b, timeout=timeout)
        if not np.array_equal(b, sum(np.arange(n) * 3 + i + k for i in range(p))):
            errors.append(f"allreduce with timeout={timeout}: {b}")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeats_of_other_shapes_paths_and_timeouts(size: int) -> None:
    results = run_processes(size, _shapes_and_paths, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _one_off_shapes(comm: ringworld.Communicator) -> list[str]:
    """Calls of a new size every time make no runner (a bcast's would make 32 ring views);
    the first repeat of a shape makes one, and the shape's entries then hold it."""
    r = comm.rank
    errors: list[str] = []
    comm.barrier()
    comm.bcast(np.zeros(1), 0)  # (maps the windows)
    arena = comm._arena
    before = len(arena._ring_cache)
    for k in range(2, 22):
        buf = np.arange(k, dtype=np.float64) + 7 if r == 0 else np.zeros(k)
        comm.bcast(buf, 0)
        if not np.array_equal(buf, np.arange(k) + 7):
            errors.append(f"one-off bcast of {k}: {buf}")
    grown = len(arena._ring_cache) - before
    if grown > 40:  # one view a call (the general path's), not 32 (a runner's)
        errors.append(f"20 one-off broadcasts made {grown} ring views")
    buf = np.zeros(5)
    for k in range(3):  # the first call is checked, the next two repeat it
        buf[:] = np.arange(5) + k if r == 0 else -1
        comm.bcast(buf, 0)
        if not np.array_equal(buf, np.arange(5) + k):
            errors.append(f"repeated bcast {k}: {buf}")
    if comm._cache.last["bcast"][5] is shm_collectives.RUN["bcast"] or type(
            comm._cache.last["bcast"][5]).__name__ == "_FirstRepeat":
        errors.append("a repeated bcast does not run its runner directly")
    return errors


@pytest.mark.parametrize("size", [2, 3])
def test_one_off_shapes_make_no_runner(size: int) -> None:
    results = run_processes(size, _one_off_shapes, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []
