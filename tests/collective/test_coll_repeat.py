"""Small collectives repeated on the same arrays skip their checks (the communicator keeps weak
references to the last call's buffers): the results stay right when the data changes, when the
arrays' dtype, shape or writability change in place, when the call switches to and from
``IN_PLACE``, and when the arrays are freed and new ones take their place. Covers allreduce,
bcast, allgather, alltoall, reduce_scatter_block and reduce."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from coll_support import AFFINE, AFFINE_OP, affine

import ringworld
from ringworld import runtime
from ringworld.testing import run_processes


def _expect(p: int, k: int, n: int, dtype: type) -> np.ndarray:
    return sum((np.arange(n) * 7 + i * 1000 + k) for i in range(p)).astype(dtype)


def _freed_dup_refuses(comm: ringworld.Communicator, name: str, *args: Any) -> list[str]:
    """A duplicate freed after repeating the call ``name(*args)`` refuses the same call again."""
    dup = comm.dup()
    call = getattr(dup, name)
    for _ in range(2):
        call(*args)
    dup.free()
    try:
        call(*args)
        return [f"a freed communicator ran a repeated {name}"]
    except ringworld.CommError as exc:
        return [] if "freed" in str(exc) else [f"freed-communicator error unclear: {exc}"]


def _repeat(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 5
    send = np.empty(n, dtype=np.int64)
    recv = np.full(n, -1, dtype=np.int64)
    for k in range(20):  # the same arrays, new data each time
        send[:] = np.arange(n) * 7 + r * 1000 + k
        comm.allreduce(send, recv)
        if not np.array_equal(recv, _expect(p, k, n, np.int64)):
            errors.append(f"repeat {k}: {recv}")
    if comm.size > 1 and comm.last_algorithm != "shm":
        errors.append(f"small allreduce ran {comm.last_algorithm}, not shm")
    # in place with the cached recvbuf, then out of place again
    recv[:] = np.arange(n) * 7 + r * 1000 + 50
    comm.allreduce(ringworld.IN_PLACE, recv)
    if not np.array_equal(recv, _expect(p, 50, n, np.int64)):
        errors.append(f"in place: {recv}")
    send[:] = np.arange(n) * 7 + r * 1000 + 51
    comm.allreduce(send, recv)
    if not np.array_equal(recv, _expect(p, 51, n, np.int64)):
        errors.append(f"out of place after in place: {recv}")
    # the dtype reassigned in place (same itemsize): float64 sums, not int64 ones
    send.dtype = np.float64
    recv.dtype = np.float64
    send[:] = np.arange(n) * 0.5 + r
    comm.allreduce(send, recv)
    want = sum(np.arange(n) * 0.5 + i for i in range(p))
    if not np.array_equal(recv, want):
        errors.append(f"after a dtype change: {recv} != {want}")
    # a bitwise op, then the same arrays turned to float: the op's dtype check still runs
    send.dtype = recv.dtype = np.int64
    send[:] = np.arange(n) + r
    comm.allreduce(send, recv, ringworld.BOR)
    send.dtype = recv.dtype = np.float64
    try:
        comm.allreduce(send, recv, ringworld.BOR)
        errors.append("bitwise or of float64 was accepted")
    except TypeError as exc:
        if "bitwise op bor needs an integer" not in str(exc):
            errors.append(f"bitwise or of float64 refused unclearly: {exc}")
    send[:] = np.arange(n) * 0.5 + r
    comm.allreduce(send, recv)
    # a 2-D view of the same memory
    grid = recv.reshape(1, n)
    comm.allreduce(ringworld.IN_PLACE, grid)
    if not np.array_equal(grid.ravel(), want * p):
        errors.append(f"2-D in place: {grid}")
    # recvbuf made read-only: a clear error, on every rank alike
    recv.flags.writeable = False
    try:
        comm.allreduce(send, recv)
        errors.append("a read-only recvbuf was accepted")
    except TypeError as exc:
        if "recvbuf is read-only" not in str(exc):
            errors.append(f"read-only error does not say so: {exc}")
    errors += _freed_dup_refuses(comm, "allreduce", np.arange(3.0) + r, np.empty(3))
    # freed arrays: new ones (maybe at the same addresses) with another dtype and size
    del send, recv, grid
    gc.collect()
    for k in range(3):
        send32 = (np.arange(n + 2) + r * 100 + k).astype(np.int32)
        recv32 = np.zeros(n + 2, dtype=np.int32)
        comm.allreduce(send32, recv32, ringworld.MAX)
        want32 = (np.arange(n + 2) + (p - 1) * 100 + k).astype(np.int32)
        if not np.array_equal(recv32, want32):
            errors.append(f"new arrays {k}: {recv32}")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeated_small_allreduce(size: int) -> None:
    results = run_processes(size, _repeat, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _others(comm: ringworld.Communicator) -> list[str]:
    """bcast, allgather, alltoall and reduce_scatter_block, each repeated on the same arrays."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 6
    ar = np.arange(p * n)
    buf = np.empty(p * n, dtype=np.int64)
    send = np.empty(p * n, dtype=np.int64)
    recv = np.empty(p * n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for k in range(6):
        root = k % p if k >= 3 else 0  # repeats with one root, then the root changes each call
        buf[:] = ar * 3 + root * 100 + k if r == root else -1
        comm.bcast(buf, root)
        bcast_algo = comm.last_algorithm
        if not np.array_equal(buf, ar * 3 + root * 100 + k):
            errors.append(f"bcast {k} root {root}: {buf}")
        send[:n] = np.arange(n) * 5 + r * 1000 + k
        comm.allgather(send[:n], recv)  # a new view each call: checked every time
        want = np.concatenate([np.arange(n) * 5 + i * 1000 + k for i in range(p)])
        if not np.array_equal(recv, want):
            errors.append(f"allgather (views) {k}: {recv}")
        mine = send[:n].copy()
        for j in range(3):
            mine[:] = np.arange(n) * 5 + r * 1000 + k + j
            comm.allgather(mine, recv)
            if not np.array_equal(recv, want + j):
                errors.append(f"allgather {k}.{j}: {recv}")
        send[:] = ar * 7 + r * 1000 + k  # block j goes to rank j
        comm.alltoall(send, recv)
        want = np.concatenate([np.arange(r * n, (r + 1) * n) * 7 + i * 1000 + k
                               for i in range(p)])
        if not np.array_equal(recv, want):
            errors.append(f"alltoall {k}: {recv}")
        comm.reduce_scatter_block(send, out)
        want = sum(np.arange(r * n, (r + 1) * n) * 7 + i * 1000 + k for i in range(p))
        if not np.array_equal(out, want):
            errors.append(f"reduce_scatter_block {k}: {out}")
        comm.reduce_scatter_block(send, out, ringworld.MAX)
        if not np.array_equal(out, np.arange(r * n, (r + 1) * n) * 7 + (p - 1) * 1000 + k):
            errors.append(f"reduce_scatter_block max {k}: {out}")
    if p > 1 and comm.last_algorithm != "shm":
        errors.append(f"small reduce_scatter_block ran {comm.last_algorithm}, not shm")
    # the repeats took the short path (small broadcasts take shared memory on a crowded host
    # too)
    if p > 1 and bcast_algo != "shm":
        errors.append(f"small bcast ran {bcast_algo}, not shm")
    kept = sorted(comm._cache.last) if p > 1 else []
    want_kept = ["allgather", "alltoall", "bcast", "reduce_scatter_block"]
    if p > 1 and kept != want_kept:
        errors.append(f"calls kept for repeating: {kept}, expected {want_kept}")
    # dtypes reassigned in place: the float64 values must come through as float64
    for a in (buf, send, recv):
        a.dtype = np.float64
    send[:] = ar * 0.25 + r
    comm.alltoall(send, recv)
    want_f = np.concatenate([np.arange(r * n, (r + 1) * n) * 0.25 + i for i in range(p)])
    if not np.array_equal(recv, want_f):
        errors.append(f"alltoall after a dtype change: {recv}")
    # a shape changed in place: 2-D arrays take the checked path
    send.shape = (p, n)
    recv.shape = (p, n)
    comm.alltoall(send, recv)
    if not np.array_equal(recv.ravel(), want_f):
        errors.append(f"alltoall 2-D: {recv}")
    send.shape = recv.shape = (p * n,)
    # read-only on a receiving rank: a clear error before anything is sent (the root, which
    # would wait for it, does not call)
    if r != 0:
        buf.flags.writeable = False
        try:
            comm.bcast(buf, 0)
            errors.append("bcast into a read-only buffer was accepted")
        except TypeError as exc:
            if "read-only" not in str(exc):
                errors.append(f"read-only bcast error does not say so: {exc}")
    # the communicator keeps no user array alive
    tmp_in, tmp_out = np.arange(n) + r, np.empty(p * n, dtype=np.int64)
    for _ in range(2):
        comm.allgather(tmp_in, tmp_out)
    gone = [weakref.ref(tmp_in), weakref.ref(tmp_out)]
    del tmp_in, tmp_out
    gc.collect()
    if any(w() is not None for w in gone):
        errors.append("a repeated allgather kept its arrays alive")
    errors += _freed_dup_refuses(comm, "allgather", np.arange(n) + r,
                                 np.empty(p * n, dtype=np.int64))
    return errors


def _fresh(comm: ringworld.Communicator) -> list[str]:
    """New arrays every call, of shapes seen before: they take the kept shape's short path, and
    a change of op, root, dtype or shape (or a strided or read-only array) is not taken for
    the kept one."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 3
    for k in range(8):
        op = ringworld.SUM if k % 2 else ringworld.MAX
        dtype = np.int64 if k < 4 else np.float64
        shape = (n,) if k < 6 else (1, n)
        send = (np.arange(n) * 10 + r + k).astype(dtype).reshape(shape)
        recv = np.zeros(shape, dtype=dtype)
        comm.allreduce(send, recv, op)
        parts = [np.arange(n) * 10 + i + k for i in range(p)]
        want = sum(parts) if op is ringworld.SUM else np.max(parts, axis=0)
        if not np.array_equal(recv.ravel(), want):
            errors.append(f"fresh allreduce {k} ({op.name}, {dtype.__name__}, {shape}): {recv}")
        root = k % p
        buf = np.full(n + 1, k if r == root else -1, dtype=dtype)
        comm.bcast(buf, root)
        if not np.array_equal(buf, np.full(n + 1, k, dtype=dtype)):
            errors.append(f"fresh bcast {k} from {root}: {buf}")
    # a strided recvbuf of a kept shape: the checks refuse it, as on a first call
    wide = np.zeros(2 * n, dtype=np.float64)
    try:
        comm.allreduce(np.ones(n), wide[::2])
        errors.append("a strided recvbuf was accepted")
    except ValueError as exc:
        if "C-contiguous" not in str(exc):
            errors.append(f"strided recvbuf refused unclearly: {exc}")
    if p > 1 and not comm._cache.shapes:
        errors.append("no call shape was kept")
    return errors


def test_fresh_arrays_of_a_kept_shape() -> None:
    results = run_processes(3, _fresh, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeated_small_collectives(size: int) -> None:
    results = run_processes(size, _others, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _mismatch(comm: ringworld.Communicator) -> str:
    """Rank 0 repeats an allgather on the same arrays; rank 1 then calls it with a longer block."""
    n = 4 if comm.rank == 0 else 5
    send, recv = np.arange(n, dtype=np.float32), np.empty(2 * n, dtype=np.float32)
    if comm.rank == 0:
        for _ in range(2):
            comm.allgather(send, recv)
    else:
        s4, r4 = np.arange(4, dtype=np.float32), np.empty(8, dtype=np.float32)
        for _ in range(2):
            comm.allgather(s4, r4)
    try:
        comm.allgather(send, recv, timeout=20)
        return "no error"
    except ringworld.MismatchError as exc:
        first = str(exc)
    # the same arrays again on both ranks, then rank 0 reinterprets its arrays as float64
    a, b = np.arange(4, dtype=np.int64), np.empty(8, dtype=np.int64)
    for _ in range(2):
        comm.allgather(a, b)
    if comm.rank == 0:
        a.dtype = b.dtype = np.float64
    try:
        comm.allgather(a, b, timeout=20)
        return "no error after a dtype change"
    except ringworld.MismatchError as exc:
        return f"{first} / {exc}"


def test_a_repeated_call_still_detects_a_mismatch() -> None:
    results = run_processes(2, _mismatch, transport="shm", timeout=60)
    assert all(r.count("differently") + r.count("expect") == 2 for r in results), results


def _reduce_repeat(comm: ringworld.Communicator, crowded: bool) -> list[str]:
    """Reduce repeated on the same arrays: roots and ops change between calls, ranks other than
    the root pass no recvbuf (their sendbuf is then what the repeat is kept under, and must come
    out untouched), and a root that passes none refuses the call on every rank waiting for it
    (a small reduce's others do not where ranks share cores (``crowded``): as a small gather's,
    their part is done once their vector is in their ring)."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 6
    send = np.empty(n, dtype=np.int64)
    recv = np.full(n, -1, dtype=np.int64)
    for k in range(24):
        root, none = k % p, (k // p) % 2 == 1
        op = ringworld.MAX if k % 5 == 4 else ringworld.SUM
        send[:] = np.arange(n) * 7 + r * 1000 + k
        before = send.copy()
        recv[:] = -1
        comm.reduce(send, None if none and r != root else recv, op, root)
        if r == root:
            want = (_expect(p, k, n, np.int64) if op is ringworld.SUM
                    else np.arange(n) * 7 + (p - 1) * 1000 + k)
            if not np.array_equal(recv, want):
                errors.append(f"call {k} (root {root}, {op}): {recv} != {want}")
        elif not np.array_equal(recv, np.full(n, -1)):
            errors.append(f"call {k}: rank {r}'s ignored recvbuf was written")
        if not np.array_equal(send, before):
            errors.append(f"call {k}: rank {r}'s sendbuf changed")
    if p > 1 and comm.last_algorithm != "shm":
        errors.append(f"small reduce ran {comm.last_algorithm}, not shm")
    # a read-only sendbuf off the root, with no recvbuf: not repeated, still right
    frozen = np.arange(n, dtype=np.int64) + r
    frozen.setflags(write=False)
    for _ in range(3):
        comm.reduce(frozen, recv if r == 0 else None, ringworld.SUM, 0)
    if r == 0 and not np.array_equal(recv, sum(np.arange(n) + i for i in range(p))):
        errors.append(f"read-only sendbuf: {recv}")
    # the root passing no recvbuf (after repeats as a rank that may): every rank gets an error,
    # the root's sendbuf is not taken for it, and the communicator stays usable
    if p > 1:
        for _ in range(3):
            comm.reduce(send, None if r != 1 else recv, ringworld.SUM, 1)
        before = send.copy()
        try:
            comm.reduce(send, None, ringworld.SUM, 1, timeout=20)
            if r == 1 or not crowded:
                errors.append(f"rank {r}: a root without a recvbuf raised nothing")
        except (TypeError, ValueError):
            pass
        if not np.array_equal(send, before):
            errors.append(f"rank {r}: the refused call wrote its sendbuf")
        comm.reduce(send, recv if r == 1 else None, ringworld.SUM, 1)
        if r == 1 and not np.array_equal(recv, sum(np.arange(n) * 7 + i * 1000 + 23
                                                   for i in range(p))):
            errors.append(f"after the refusal: {recv}")
        # a root in place with no recvbuf cannot size the call: it refuses in the windows
        # all the same (small and chunked calls), and the next call lines up on every rank
        for count in (n, 300_007):
            big = np.arange(count, dtype=np.float64) + r
            try:
                if r == 1:
                    comm.reduce(ringworld.IN_PLACE, None, ringworld.SUM, 1, timeout=20)
                else:
                    comm.reduce(big, None, ringworld.SUM, 1, timeout=20)
                if r == 1 or not (crowded and count == n):
                    errors.append(f"rank {r}: a root in place without a recvbuf raised nothing")
            except TypeError as exc:
                if r != 1 and "refused" not in str(exc):
                    errors.append(f"rank {r}: unclear refusal: {exc}")
            out = np.empty(count) if r == 1 else None
            comm.reduce(big, out, ringworld.SUM, 1, timeout=20)
            if r == 1 and not np.array_equal(out, sum(np.arange(count, dtype=np.float64) + i
                                                      for i in range(p))):
                errors.append(f"after the in-place refusal ({count}): wrong sum")
    arena: Any = comm._arena
    if p > 1 and arena.crowded != crowded:
        errors.append(f"rank {r}: crowded {arena.crowded}, want {crowded}")
    return errors


@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeated_small_reduce(size: int, crowded: bool,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    # (inherited by the forked ranks: they count one core each, or more than there are ranks)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    results = run_processes(size, _reduce_repeat, crowded, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _rooted_repeat(comm: ringworld.Communicator, crowded: bool) -> list[str]:
    """gather and scatter repeated on the same arrays: roots change between calls, ranks other
    than the root pass None for the buffer they do not use (the repeat is then kept under the
    other one, which must come out right and untouched), and a root whose own buffers are
    wrong (in place over a missing buffer; a block of the wrong length) refuses the call on
    every rank waiting for it (a small gather's others do not where it takes the eager rings,
    where ranks share cores (``crowded``) or there are two: their part is done once their
    block is in their ring), after which the next call lines up."""
    p, r = comm.size, comm.rank
    eager = crowded or p == 2
    errors: list[str] = []
    n = 5
    send = np.empty(n, dtype=np.int64)
    whole = np.full(p * n, -1, dtype=np.int64)
    for k in range(4 * p + 4):
        root, none = k % p, (k // p) % 2 == 1
        send[:] = np.arange(n) * 7 + r * 1000 + k
        before = send.copy()
        whole[:] = -1
        comm.gather(send, None if none and r != root else whole, root)
        want = np.concatenate([np.arange(n) * 7 + i * 1000 + k for i in range(p)])
        if r == root and not np.array_equal(whole, want):
            errors.append(f"gather {k} (root {root}): {whole} != {want}")
        if r != root and not np.array_equal(whole, np.full(p * n, -1)):
            errors.append(f"gather {k}: rank {r}'s ignored recvbuf was written")
        if not np.array_equal(send, before):
            errors.append(f"gather {k}: rank {r}'s sendbuf changed")
        whole[:] = np.arange(p * n) * 3 + k if r == root else -1
        ignored = whole.copy()
        comm.scatter(None if none and r != root else whole, send, root)
        if not np.array_equal(send, np.arange(r * n, (r + 1) * n) * 3 + k):
            errors.append(f"scatter {k} (root {root}) rank {r}: {send}")
        if r != root and not np.array_equal(whole, ignored):
            errors.append(f"scatter {k}: rank {r}'s ignored sendbuf was written")
    if p > 1 and comm.last_algorithm != "shm":
        errors.append(f"small scatter ran {comm.last_algorithm}, not shm")
    if p == 1:
        return errors
    for count in (n, 300_007):  # a small and a chunked call
        mine = np.arange(count, dtype=np.float64) + r * 1e7
        out = np.zeros(p * count)
        for bad in ("gather in place", "gather block", "scatter in place", "scatter block"):
            try:
                if bad == "gather in place":
                    comm.gather(ringworld.IN_PLACE if r == 1 else mine, None, 1, timeout=20)
                elif bad == "gather block":
                    comm.gather(mine[:-1] if r == 1 else mine, out, 1, timeout=20)
                elif bad == "scatter in place":
                    comm.scatter(None, ringworld.IN_PLACE if r == 1 else mine, 1, timeout=20)
                else:
                    comm.scatter(out, mine[:-1] if r == 1 else mine, 1, timeout=20)
                if r == 1 or not (eager and bad.startswith("gather") and count == n):
                    errors.append(f"rank {r}: {bad} ({count}) raised nothing")
            except (TypeError, ValueError) as exc:
                if r != 1 and "refused" not in str(exc):
                    errors.append(f"rank {r}: {bad} ({count}): unclear refusal: {exc}")
            comm.gather(mine, out if r == 1 else None, 1, timeout=20)
            if r == 1 and not np.array_equal(out, np.concatenate(
                    [np.arange(count, dtype=np.float64) + i * 1e7 for i in range(p)])):
                errors.append(f"after the refusal of {bad} ({count}): wrong gather")
    arena: Any = comm._arena
    if arena.crowded != crowded:
        errors.append(f"rank {r}: crowded {arena.crowded}, want {crowded}")
    return errors


@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeated_small_gather_and_scatter(size: int, crowded: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # (inherited by the forked ranks: they count one core each, or more than there are ranks)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    results = run_processes(size, _rooted_repeat, crowded, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _scan_repeat(comm: ringworld.Communicator) -> list[str]:
    """scan and exscan repeated on the same arrays, in place and not, with the op changing
    between calls (a non-commutative one among them: combined in rank order); exscan leaves
    rank 0's recvbuf untouched."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 7
    send = np.empty(n, dtype=np.int64)
    recv = np.empty(n, dtype=np.int64)
    for k in range(12):
        op = ringworld.MAX if k % 3 == 2 else ringworld.SUM
        inputs = [np.arange(n) * 5 + i * 100 + k for i in range(p)]
        send[:] = inputs[r]
        for kind in ("scan", "exscan"):
            last = r if kind == "scan" else r - 1
            recv[:] = -7
            if k % 4 == 3:  # in place
                recv[:] = inputs[r]
                getattr(comm, kind)(ringworld.IN_PLACE, recv, op)
            else:
                getattr(comm, kind)(send, recv, op)
            if last < 0:
                want = recv if k % 4 == 3 else np.full(n, -7)  # untouched
            else:
                part = inputs[: last + 1]
                want = sum(part) if op is ringworld.SUM else np.max(part, axis=0)
            if not np.array_equal(recv, want):
                errors.append(f"{kind} {k} ({op.name}) rank {r}: {recv} != {want}")
    maps = np.empty(n, dtype=AFFINE)
    maps["m"], maps["c"] = np.arange(n) % 5 + r + 1, np.arange(n) * 3 + r
    want_maps = None
    for i in range(r + 1):
        m = np.empty(n, dtype=AFFINE)
        m["m"], m["c"] = np.arange(n) % 5 + i + 1, np.arange(n) * 3 + i
        want_maps = m if want_maps is None else affine(want_maps, m)
    got = np.empty(n, dtype=AFFINE)
    for _ in range(3):
        comm.scan(maps, got, AFFINE_OP)
        if not np.array_equal(got, want_maps):
            errors.append(f"scan of a non-commutative op rank {r}")
    if p > 1 and comm.last_algorithm != "shm":
        errors.append(f"small scan ran {comm.last_algorithm}, not shm")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_repeated_small_scan_and_exscan(size: int) -> None:
    results = run_processes(size, _scan_repeat, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []
