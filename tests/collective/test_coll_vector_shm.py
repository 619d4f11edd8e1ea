"""The v-variants in the shared windows (``algorithms.shm_vector``): allgatherv, gatherv,
scatterv, alltoallv and reduce_scatter with per-rank counts on ranks that share memory, with
blocks of any size (zero, one, uneven, larger than the slots: then straight between the ranks'
buffers, or the message path after the windows' sync), in place, repeated on the same arrays
while the data and the counts change (a counts list changed in place must not match the kept
call), through ``ringworld.MPI`` too; and disagreements raise MismatchError where they are
seen while the communicator stays usable."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld import MPI, runtime
from ringworld.algorithms import shm_arena
from ringworld.errors import MismatchError
from ringworld.testing import run_processes

BIG = 40_000  # float64 elements: a block larger than a slot (256 KiB)
# a non-commutative op (rank order shows): named, so every rank's signature reads alike
_TWICE_PLUS = ringworld.Op.create(lambda a, b: a * 2 + b, name="twice_plus")


def _block(i: int, n: int, k: int, dt: Any = np.float64) -> np.ndarray:
    """Rank i's block of n elements in round k (unique per element, rank and round)."""
    return (np.arange(n) * 3 + i * 100_000 + k * 7).astype(dt)


def _layout(counts: list[int]) -> tuple[list[int], int]:
    """Displacements with gaps (and in reverse rank order), and the buffer's length."""
    p = len(counts)
    displs, at = [0] * p, 1
    for i in reversed(range(p)):
        displs[i] = at
        at += counts[i] + 2
    return displs, at


def _round_counts(p: int, k: int, big: bool) -> list[int]:
    counts = [(i * 5 + k) % 4 for i in range(p)]  # zeros, ones, uneven
    if big:
        counts[k % p] = BIG
    return counts


def _ran(comm: ringworld.Communicator, want: str) -> bool:
    """Whether the last call ran ``want``: "shm" (all in the windows), "shm+" (begun there,
    the data moved on the message path)."""
    got = comm.last_algorithm
    return got.startswith("shm+") if want == "shm+" else got == want


def _vectors(comm: ringworld.Communicator, dt: Any, big: bool, crowded: bool = False,
             direct: bool = True) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    warm = np.zeros(1)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    if arena is not None and not direct:
        arena.direct = False  # (on every rank alike) large blocks: the message path
    # large blocks: read or written straight where ranks may, else on the message path after
    large = "shm" if arena is not None and arena.direct else "shm+"
    counts = [0] * p  # one list, changed in place each round (the repeat path must notice)
    for k in range(6):
        counts[:] = _round_counts(p, k, big)
        displs, length = _layout(counts)
        want = np.full(length, -1, dtype=dt)
        for i in range(p):
            want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k, dt)
        send = _block(r, counts[r], k, dt)
        recv = np.full(length, -1, dtype=dt)
        comm.allgatherv(send, recv, counts, displs)
        if not np.array_equal(recv, want):
            errors.append(f"allgatherv round {k}: {recv} != {want}")
        root = k % p
        rb = np.full(length, -1, dtype=dt) if r == root else None
        comm.gatherv(send, rb, counts, displs, root=root)
        if rb is not None and not np.array_equal(rb, want):
            errors.append(f"gatherv round {k}: {rb}")
        out = np.full(counts[r], -1, dtype=dt)
        root = (k + 1) % p  # (not the rank of the large block: that one stays at its root)
        comm.scatterv(want if r == root else None, out, counts, displs, root=root)
        if not np.array_equal(out, send):
            errors.append(f"scatterv round {k}: {out} != {send}")
        if p > 1 and not _ran(comm, "shm" if not big else large):
            errors.append(f"round {k}: scatterv ran {comm.last_algorithm}")
        # alltoallv: rank r sends (r + 2 j + k) % 3 elements to rank j (one block BIG)
        sc = [(r + 2 * j + k) % 3 + (BIG if big and (r + j + k) % p == 0 else 0)
              for j in range(p)]
        rc = [(i + 2 * r + k) % 3 + (BIG if big and (i + r + k) % p == 0 else 0)
              for i in range(p)]
        sd = [sum(sc[:j]) for j in range(p)]
        rd, rlen = _layout(rc)
        sb = np.concatenate([_block(r * p + j, sc[j], k, dt) for j in range(p)])
        rbuf = np.full(rlen, -1, dtype=dt)
        comm.alltoallv(sb, rbuf, sc, rc, sd, rd)
        for i in range(p):
            if not np.array_equal(rbuf[rd[i] : rd[i] + rc[i]], _block(i * p + r, rc[i], k, dt)):
                errors.append(f"alltoallv round {k}: block from {i}: {rbuf[rd[i]:rd[i] + rc[i]]}")
        if dt in (np.float64, np.int8):  # reduce_scatter of the same counts, in rank order
            rs_send = np.concatenate([_block(r + 7 * i, counts[i], k, dt) for i in range(p)])
            rs_out = np.full(counts[r], -1, dtype=dt)
            comm.reduce_scatter(rs_send, rs_out, counts, op=_TWICE_PLUS)
            want_rs = _block(r * 7, counts[r], k, dt)  # rank 0's block r
            for q in range(1, p):
                want_rs = (want_rs * 2 + _block(q + 7 * r, counts[r], k, dt)).astype(dt)
            if not np.array_equal(rs_out, want_rs):
                errors.append(f"reduce_scatter round {k}: {rs_out} != {want_rs}")
            if p > 1 and not _ran(comm, "shm" if not big else large):
                errors.append(f"round {k}: reduce_scatter ran {comm.last_algorithm}")
        gaps = np.ones(rlen, dtype=bool)
        for i in range(p):
            gaps[rd[i] : rd[i] + rc[i]] = False
        if not np.array_equal(rbuf[gaps], np.full(int(gaps.sum()), -1, dtype=dt)):
            errors.append(f"alltoallv round {k}: wrote outside the blocks")
        if p > 1 and not _ran(comm, "shm" if not big else large):
            errors.append(f"round {k}: alltoallv ran {comm.last_algorithm}")
    if p > 1 and comm._arena is not None and comm._arena.crowded != crowded:
        errors.append(f"the windows' crowded is {comm._arena.crowded}, not {crowded}")
    return errors


@pytest.mark.parametrize(("size", "big", "direct"), [
    (1, False, True), (2, False, True), (3, True, True), (3, True, False), (5, False, True),
    (8, False, True)])
@pytest.mark.parametrize("crowded", [False, True])
def test_vector_collectives_in_the_windows(size: int, big: bool, direct: bool, crowded: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # ranks that share cores take other paths (a scatterv the root's eager ring): both, on any
    # machine (the ranks are forked: they see the patched count)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    out = run_processes(size, _vectors, np.float64, big, crowded, direct, timeout=120)
    assert out == [[]] * size


@pytest.mark.parametrize("dt", [np.int8, np.complex128, np.dtype([("a", "<i4"), ("b", "<f8")])])
def test_vector_collectives_of_other_dtypes(dt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)  # (a scatterv through the ring)
    out = run_processes(3, _vectors, dt, False, True, timeout=120)
    assert out == [[]] * 3


def _same_arrays(comm: ringworld.Communicator) -> list[str]:
    """The same arrays and counts list, again and again: new data each time, then counts
    changed in place, then in place (IN_PLACE) and a 2-D buffer."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    counts = [2] * p
    displs = [2 * i for i in range(p)]
    send = np.zeros(2)
    recv = np.zeros(2 * p)
    for k in range(8):
        if k == 4:
            counts[-1] = 1  # (the last block shrinks: the other ranks keep their arrays)
            if r == p - 1:
                send = np.zeros(1)
        send[:] = _block(r, counts[r], k)
        recv[:] = -1
        comm.allgatherv(send, recv, counts, displs)
        want = np.full(2 * p, -1.0)
        for i in range(p):
            want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k)
        if not np.array_equal(recv, want):
            errors.append(f"repeat {k}: {recv} != {want}")
    recv[:] = -1
    recv[displs[r] : displs[r] + counts[r]] = _block(r, counts[r], 9)
    comm.allgatherv(ringworld.IN_PLACE, recv, counts, displs)
    want = np.full(2 * p, -1.0)
    for i in range(p):
        want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], 9)
    if not np.array_equal(recv, want):
        errors.append(f"in place: {recv}")
    # counts as a numpy array between list calls: compared, never truth-tested as an array
    send[:] = _block(r, counts[r], 11)
    want = np.full(2 * p, -1.0)
    for i in range(p):
        want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], 11)
    for form in (list, np.array, tuple, list):
        recv[:] = -1
        comm.allgatherv(send, recv, form(counts), form(displs))
        if not np.array_equal(recv, want):
            errors.append(f"counts as {form.__name__}: {recv}")
    grid = np.zeros((p, 2))
    comm.allgatherv(_block(r, 2, 10), grid, [2] * p)
    if not np.array_equal(grid.reshape(-1), np.concatenate([_block(i, 2, 10) for i in range(p)])):
        errors.append(f"2-D recvbuf: {grid}")
    return errors


def test_repeats_follow_data_and_counts() -> None:
    out = run_processes(3, _same_arrays, timeout=60)
    assert out == [[]] * 3


def _repeat_misfits(comm: ringworld.Communicator) -> list[str]:
    """A repeat's arrays that differ from the kept call's (a read-only, strided or other-typed
    recvbuf, a longer or 2-D sendbuf) take the checks: an error where the first call would
    raise one, else the right result; the communicator usable after. Rank 0's block is read
    straight from its memory (larger than a slot)."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    counts = [i + 1 for i in range(p)]
    counts[0] = BIG
    n = sum(counts)
    want = np.concatenate([_block(i, counts[i], 0) + 0.1 for i in range(p)])
    send = _block(r, counts[r], 0) + 0.1  # (not a float32's value)
    recv = np.zeros(n)
    for _ in range(3):
        comm.allgatherv(send, recv, counts)
    stiff = np.zeros(n)
    stiff.flags.writeable = False
    cases = [("read-only recvbuf", send, stiff), ("float32 recvbuf", send, np.zeros(n, np.float32)),
             ("strided recvbuf", send, np.zeros(2 * n)[::2]),
             ("longer sendbuf", np.append(send, 0.5), np.zeros(n)),
             ("2-D sendbuf", send.reshape(1, -1), np.zeros(n))]
    for name, sbuf, rbuf in cases:
        try:
            comm.allgatherv(sbuf, rbuf, counts)
        except (TypeError, ValueError):
            continue
        if not np.array_equal(rbuf, want):
            errors.append(f"a {name} passed with wrong data")
    recv[:] = 0
    comm.allgatherv(send, recv, counts)
    if not np.array_equal(recv, want):
        errors.append(f"after: {recv}")
    return errors


def test_repeats_check_arrays_unlike_the_kept_calls() -> None:
    assert run_processes(3, _repeat_misfits, timeout=60) == [[]] * 3


def _mismatches(comm: ringworld.Communicator, crowded: bool) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    one = np.ones(1)
    comm.allreduce(one.copy(), np.zeros(1))  # maps the windows
    # a gatherv's sender whose block is off raises too where the call has a sync (the slots)
    # or the block is large (it waits for the root's counts to write it); a small one through
    # the eager rings (ranks sharing cores) has gone on, as after a send
    eager = comm._arena is not None and comm._arena.crowded and comm._arena.direct
    if comm._arena is not None and comm._arena.crowded != crowded:
        errors.append(f"the windows' crowded is {comm._arena.crowded}, not {crowded}")
    wrong_raise = (0,) if eager else (0, 2)
    # allgatherv: rank 1 passes other counts: every rank raises, at the same sync
    counts = [1] * p if r != 1 else [1] * (p - 1) + [2]
    try:
        comm.allgatherv(np.ones(counts[r]), np.zeros(sum(counts)), counts)
        errors.append("allgatherv with counts that differ by rank passed")
    except MismatchError as exc:
        if "allgatherv" not in str(exc):
            errors.append(f"allgatherv's mismatch unclear: {exc}")
    # gatherv: rank 2 sends 2 elements where the root (0) expects 1: those two raise (the
    # root alone where the senders go on)
    send = np.ones(2 if r == 2 else 1)
    try:
        comm.gatherv(send, np.zeros(p) if r == 0 else None, [1] * p, root=0)
        if r in wrong_raise:
            errors.append("gatherv with a block of another size passed")
    except MismatchError as exc:
        if r not in wrong_raise or "expect" not in str(exc):
            errors.append(f"gatherv: rank {r} raised {exc}")
    # alltoallv: rank 0 expects 2 elements from rank 1, which sends 1
    rc = [1] * p if r != 0 else [1, 2] + [1] * (p - 2)
    try:
        comm.alltoallv(np.ones(p), np.zeros(sum(rc)), [1] * p, rc)
        if r == 0:
            errors.append("alltoallv with a block of another size passed")
    except MismatchError as exc:
        if r != 0 or "rank 1" not in str(exc):
            errors.append(f"alltoallv: rank {r} raised {exc}")
    if comm._arena is not None and comm._arena.direct:  # the same, with blocks read directly
        send = np.ones(BIG + 1 if r == 2 else BIG)
        try:
            comm.gatherv(send, np.zeros(p * BIG) if r == 0 else None, [BIG] * p, root=0)
            if r in (0, 2):
                errors.append("a large gatherv with a block of another size passed")
        except MismatchError as exc:
            if r not in (0, 2) or "expect" not in str(exc):
                errors.append(f"large gatherv: rank {r} raised {exc}")
        # a large block where the root expects small ones (its counts call for no large
        # block: the sender learns so from the root and writes nothing)
        send = np.ones(BIG if r == 2 else 1)
        try:
            comm.gatherv(send, np.zeros(p) if r == 0 else None, [1] * p, root=0)
            if r in (0, 2):
                errors.append("a large block where the root expects 1 element passed")
        except MismatchError as exc:
            if r not in (0, 2) or "expect" not in str(exc):
                errors.append(f"large block, small counts: rank {r} raised {exc}")
        rc = [BIG] * p if r != 0 else [BIG, BIG + 1] + [BIG] * (p - 2)
        try:
            comm.alltoallv(np.ones(p * BIG), np.zeros(sum(rc)), [BIG] * p, rc)
            if r == 0:
                errors.append("a large alltoallv with a block of another size passed")
        except MismatchError as exc:
            if r != 0 or "rank 1" not in str(exc):
                errors.append(f"large alltoallv: rank {r} raised {exc}")
        if comm.last_algorithm != "shm":
            errors.append(f"large alltoallv ran {comm.last_algorithm}")
    # reduce_scatter: rank 1 passes other counts: every rank raises, at the same sync
    counts = [1] * p if r != 1 else [1] * (p - 1) + [2]
    try:
        comm.reduce_scatter(np.ones(sum(counts)), np.zeros(counts[r]), counts)
        errors.append("reduce_scatter with counts that differ by rank passed")
    except MismatchError as exc:
        if "reduce_scatter" not in str(exc):
            errors.append(f"reduce_scatter's mismatch unclear: {exc}")
    # the communicator is still usable, in the windows
    recv = np.zeros(p)
    comm.allgatherv(one * r, recv, [1] * p)
    if not np.array_equal(recv, np.arange(p)):
        errors.append(f"after the mismatches: {recv}")
    if comm.last_algorithm != "shm":
        errors.append(f"after the mismatches: ran {comm.last_algorithm}")
    return errors


@pytest.mark.parametrize("crowded", [False, True])
def test_disagreements_raise_where_seen_and_leave_the_communicator_usable(
        crowded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1 if crowded else 64)
    out = run_processes(3, _mismatches, crowded, timeout=60)
    assert out == [[]] * 3


def _through_mpi(comm: ringworld.Communicator) -> list[str]:
    c = MPI.COMM_WORLD
    p, r = c.Get_size(), c.Get_rank()
    errors: list[str] = []
    counts = [1 + i % 2 for i in range(p)]
    displs = [sum(counts[:i]) for i in range(p)]
    send = np.zeros(counts[r])
    recv = np.zeros(sum(counts))
    a2a_s, a2a_r = np.zeros(p), np.zeros(p)
    ones, steps = [1] * p, list(range(p))
    rs_in, rs_out = np.zeros(sum(counts)), np.zeros(counts[r])
    for k in range(6):
        if k == 3:  # the same list objects, other values: a kept call must not match
            counts[:] = counts[1:] + counts[:1]
            displs[:] = [sum(counts[:i]) for i in range(p)]
            if send.size != counts[r]:  # (the others keep their arrays)
                send = np.zeros(counts[r])
        send[:] = _block(r, counts[r], k)
        want = np.concatenate([_block(i, counts[i], k) for i in range(p)])
        c.Allgatherv(send, [recv, (counts, displs), MPI.DOUBLE])
        if not np.array_equal(recv, want):
            errors.append(f"Allgatherv {k}: {recv}")
        gathered = np.full(sum(counts), -1.0)
        c.Gatherv([send, MPI.DOUBLE], [gathered, counts, displs, MPI.DOUBLE] if r == 0 else None,
                  root=0)
        if r == 0 and not np.array_equal(gathered, want):
            errors.append(f"Gatherv {k}: {gathered}")
        mine = np.full(counts[r], -1.0)
        c.Scatterv([want, (counts, displs), MPI.DOUBLE] if r == 0 else None, mine, root=0)
        if not np.array_equal(mine, send):
            errors.append(f"Scatterv {k}: {mine}")
        rs_in[:] = np.concatenate([_block(r + 7 * i, counts[i], k) for i in range(p)])
        if rs_out.size != counts[r]:  # (the others keep their arrays)
            rs_out = np.zeros(counts[r])
        c.Reduce_scatter(rs_in, rs_out, counts, MPI.SUM)
        if not np.array_equal(rs_out, sum(_block(q + 7 * r, counts[r], k) for q in range(p))):
            errors.append(f"Reduce_scatter {k}: {rs_out}")
        a2a_s[:] = _block(r, p, k)
        c.Alltoallv([a2a_s, (ones, steps), MPI.DOUBLE], [a2a_r, (ones, steps), MPI.DOUBLE])
        if not np.array_equal(a2a_r, [_block(i, p, k)[r] for i in range(p)]):
            errors.append(f"Alltoallv {k}: {a2a_r}")
    return errors


def test_mpi_vector_calls_repeat_with_changing_counts() -> None:
    out = run_processes(3, _through_mpi, timeout=60)
    assert out == [[]] * 3


def _freed(comm: ringworld.Communicator) -> list[str]:
    """A freed communicator's windows are not kept mapped by the v-variants' views (kept on
    the arena: they go with it)."""
    import gc
    import weakref

    dup = comm.dup()
    p = dup.size
    dup.allgatherv(np.ones(1), np.zeros(p), [1] * p)
    arena = weakref.ref(dup._arena)
    kept = [weakref.ref(v) for found in dup._arena.vector_views.values()
            for v in found[1]]  # (every rank's slot data, as the allgatherv's dtype)
    if not kept:
        return ["no views were kept for the arena"]
    dup.free()
    gc.collect()
    errors = []
    if arena() is not None:
        errors.append("the freed communicator's arena is still alive")
    if any(v() is not None for v in kept):
        errors.append("the freed communicator's views are still kept")
    return errors


def test_a_freed_communicator_leaves_no_views_behind() -> None:
    assert run_processes(2, _freed, timeout=60) == [[], []]


def _fresh_views(comm: ringworld.Communicator) -> list[str]:
    """Repeats on new arrays of the same dtype and shapes (a fresh view of the same memory each
    call, or new memory) take the kept call's path and fill the arrays passed; a strided
    array of the same shape is still refused."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    counts = [2] * p
    whole = np.zeros(2 * p + 3)
    for k in range(6):
        send = _block(r, 2, k)
        recv = whole[1 : 1 + 2 * p] if k % 2 else np.full(2 * p, -1.0)  # a view, or new memory
        comm.allgatherv(send, recv, counts)
        if not np.array_equal(recv, np.concatenate([_block(i, 2, k) for i in range(p)])):
            errors.append(f"round {k}: {recv}")
        if k and comm.last_algorithm != "shm":
            errors.append(f"round {k} ran {comm.last_algorithm}")
    try:
        comm.allgatherv(_block(r, 2, 9), np.zeros(4 * p)[::2], counts)
        errors.append("a strided recvbuf passed")
    except ValueError as exc:
        if "contiguous" not in str(exc):
            errors.append(f"strided recvbuf: {exc}")
    return errors


def test_repeats_take_new_arrays_of_the_same_shapes() -> None:
    assert run_processes(3, _fresh_views, timeout=60) == [[]] * 3


def _mpi_views(comm: ringworld.Communicator) -> list[str]:
    """ringworld.MPI's v-calls on views of other buffers repeat: right results while data and
    counts change. Views of a small numpy array's memory are held by the kept call until the
    next call of another shape (or Free); views of an mmap's memory (which a held view would
    keep from closing) are made again each call, and hold nothing."""
    import gc
    import mmap
    import weakref

    c = MPI.COMM_WORLD
    p, r = c.Get_size(), c.Get_rank()
    errors: list[str] = []
    base = np.zeros(4 * p + 8)
    sbase = np.zeros(8)
    counts = [2] * p
    displs = [2 * i for i in range(p)]
    send, recv = sbase[1:3], base[3 : 3 + 2 * p]  # views: their base owns the memory
    for k in range(6):
        if k == 3:  # the same list objects, other values
            counts[-1] = 1
            displs[:] = [sum(counts[:i]) for i in range(p)]
            if r == p - 1:
                send = sbase[1:2]
        send[:] = _block(r, counts[r], k)
        recv[:] = -1
        c.Allgatherv([send, MPI.DOUBLE], [recv, (counts, displs), MPI.DOUBLE])
        want = np.full(2 * p, -1.0)
        want[: sum(counts)] = np.concatenate([_block(i, counts[i], k) for i in range(p)])
        if not np.array_equal(recv, want):
            errors.append(f"Allgatherv on views, round {k}: {recv}")
    held = weakref.ref(base)
    del base, recv
    gc.collect()
    if held() is None:
        errors.append("the kept call made its views again (it may hold small numpy memory)")
    other = np.zeros(3 * p)  # a call of another shape: the kept call's views go
    c.Allgatherv([np.zeros(3), MPI.DOUBLE], [other, [3] * p, MPI.DOUBLE])
    gc.collect()
    if held() is not None:
        errors.append("a call of another shape left the last one's buffer held")
    mm = mmap.mmap(-1, 8 * (2 * p + 2))
    whole = np.frombuffer(mm, dtype=np.float64)  # (its base: the mmap, not a numpy array)
    send, recv = whole[:2], whole[2 : 2 + 2 * p]
    for k in range(3):
        send[:] = _block(r, 2, k)
        c.Allgatherv([send, MPI.DOUBLE], [recv, ([2] * p, None), MPI.DOUBLE])
        if not np.array_equal(recv, np.concatenate([_block(i, 2, k) for i in range(p)])):
            errors.append(f"Allgatherv on an mmap's views, round {k}: {recv}")
    del whole, send, recv
    gc.collect()
    try:
        mm.close()  # (BufferError while any view of it lives)
    except BufferError:
        errors.append("the kept call holds a view of an mmap")
    return errors


def test_mpi_vector_calls_on_views_repeat_and_hold_nothing() -> None:
    assert run_processes(3, _mpi_views, timeout=60) == [[]] * 3


def _mpi_kept_and_native(comm: ringworld.Communicator) -> list[str]:
    """ringworld.MPI's kept v-call runs the native kept call again without its checks only
    while that is still the kept one: a native call of other counts in between, or the
    array reshaped or made non-contiguous in place, sends the repeat through the checks (right
    results, or the error the checks give)."""
    c = MPI.COMM_WORLD
    p, r = c.Get_size(), c.Get_rank()
    errors: list[str] = []
    big = BIG // 4  # a receive buffer larger than the kept calls hold: its view made again
    counts, displs = [big] * p, [big * i for i in range(p)]
    recv, send = np.zeros(big * p), np.zeros(big)  # (the same arrays each call: kept)
    for k in range(5):
        send[:] = _block(r, big, k)
        c.Allgatherv(send, [recv, (counts, displs), MPI.DOUBLE])
        if not np.array_equal(recv.reshape(-1),
                              np.concatenate([_block(i, big, k) for i in range(p)])):
            errors.append(f"round {k}: wrong data")
        if k == 1:  # a native call of other counts on the same communicator
            other = np.zeros(2 * p)
            comm.allgatherv(_block(r, 2, 50), other, [2] * p)
            if not np.array_equal(other, np.concatenate([_block(i, 2, 50) for i in range(p)])):
                errors.append("the native call in between: wrong data")
        if k == 2:  # the same array, another shape: the same memory and size
            recv.shape = (p, big)
        if k == 3:
            recv.shape = (p * big,)
    # the same array made non-contiguous in place (numpy 2.4 deprecates setting strides): a
    # view of it made again would be a copy, so the repeat must go through the checks, which
    # move the bytes into its memory as they lie
    memory = recv.reshape(-1)  # (a view: the same memory)
    recv.shape = (p, big)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            recv.strides = (8, 8 * p)  # (a transposed view of the same memory)
        except (AttributeError, ValueError):
            return errors  # (a numpy that no longer sets them: nothing to test)
    send[:] = _block(r, big, 9)
    c.Allgatherv(send, [recv, (counts, displs), MPI.DOUBLE])
    if not np.array_equal(memory, np.concatenate([_block(i, big, 9) for i in range(p)])):
        errors.append("the buffer made non-contiguous: wrong data")
    return errors


def test_mpi_vector_repeat_leaves_the_native_checks_only_while_kept() -> None:
    assert run_processes(3, _mpi_kept_and_native, timeout=60) == [[]] * 3


def _eager_gatherv(comm: ringworld.Communicator) -> list[str]:
    """A gatherv of ranks that share cores (the senders' eager rings), and a scatterv (the
    root's): repeated past the ring's length with blocks small, medium and too large for an
    entry; a gatherv's root refusing its counts
    while a sender of a large block waits for it to take the block (the sender returns, the
    root raises); and the communicator usable after."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    root = p - 1
    for k in range(2 * shm_arena.EAGER_RING + 3):  # (past the ring's length, twice)
        counts = [(i + k) % 3 for i in range(p)]
        if k % 4 == 1:
            counts[k % p] = BIG  # (larger than an entry: read from the sender's memory)
        displs, length = _layout(counts)
        send = _block(r, counts[r], k)
        recv = np.full(length, -1.0) if r == root else None
        comm.gatherv(send, recv, counts, displs, root=root)
        send[:] = -7  # (a sender's block is the root's once the call returns)
        if recv is not None:
            want = np.full(length, -1.0)
            for i in range(p):
                want[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k)
            if not np.array_equal(recv, want):
                errors.append(f"round {k}: wrong data")
        if comm.last_algorithm != "shm":
            errors.append(f"round {k} ran {comm.last_algorithm}")
        # the scatterv of the same blocks from the root's ring: its blocks copied at once where
        # their span holds little else (medium: 3000 elements a block), else one by one (the
        # root's own large block lies between the others')
        if k % 4 == 3:
            counts = [3000 + i for i in range(p)]
            counts[root] = 20_000
            displs, at = [0] * p, 0
            for i in (0, root, *range(1, root)):
                displs[i], at = at, at + counts[i] + 2
            length = at
        elif k % 4 != 1:
            counts = [3000 * (k % 2) + (i + k) % 3 for i in range(p)]
            displs, length = _layout(counts)
        whole = np.zeros(length)
        for i in range(p):
            whole[displs[i] : displs[i] + counts[i]] = _block(i, counts[i], k)
        out = np.full(counts[r], -1.0)
        comm.scatterv(whole if r == root else None, out, counts, displs, root=root)
        if not np.array_equal(out, _block(r, counts[r], k)):
            errors.append(f"scatterv round {k}: wrong data")
    send = _block(r, BIG if r == 0 else 1, 20)
    try:
        comm.gatherv(send, np.zeros(BIG + p) if r == root else None, [-1] * p, root=root)
        if r == root:
            errors.append("the root's negative counts passed")
    except ValueError as exc:
        if r != root and "refused" not in str(exc):
            errors.append(f"rank {r} after the root's refusal: {exc}")
    out = np.zeros(p) if r == root else None
    comm.gatherv(np.ones(1) * r, out, [1] * p, root=root)
    if out is not None and not np.array_equal(out, np.arange(p)):
        errors.append(f"after the refusal: {out}")
    return errors


def test_gatherv_through_the_eager_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)
    assert run_processes(4, _eager_gatherv, timeout=60) == [[]] * 4
