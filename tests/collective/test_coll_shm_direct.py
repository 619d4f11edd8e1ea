"""Paths of the shared-memory collectives the broad matrix does not reach: direct reads (peers
copy straight out of each other's buffers, forced on smaller buffers by lowering the thresholds
in the forked ranks), a streamed broadcast whose ranks disagree on the size, and a rank that leaves
while the others wait on a shared-memory sync."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np
import pytest
from coll_support import AFFINE, AFFINE_OP, P_AFF, affine

import ringworld
from ringworld import runtime
from ringworld.algorithms import shm_collectives as shm
from ringworld.algorithms.shm_policy import DIRECT, Policy
from ringworld.testing import run_processes


def _direct(comm: ringworld.Communicator, policy: Policy) -> list[str]:
    comm.selector.shm_policy = policy  # before the windows are mapped
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 5000 + 7  # elements per rank block: not a multiple of anything convenient
    mine = np.arange(n, dtype=np.float64) * 3 + r * 1_000_000
    everyone = [np.arange(n, dtype=np.float64) * 3 + i * 1_000_000 for i in range(p)]
    out = np.full(p * n, -1.0)
    comm.allgather(mine, out, algorithm="shm")
    if not np.array_equal(out, np.concatenate(everyone)):
        errors.append(f"allgather rank {r}")
    inplace = np.full(p * n, -1.0)
    inplace[r * n : (r + 1) * n] = mine
    comm.allgather(ringworld.IN_PLACE, inplace, algorithm="shm")
    if not np.array_equal(inplace, np.concatenate(everyone)):
        errors.append(f"allgather in place rank {r}")
    send = np.arange(p * n, dtype=np.int64) + r * 10_000_000
    recv = np.full(p * n, -1, dtype=np.int64)
    comm.alltoall(send, recv, algorithm="shm")
    want = np.concatenate([(np.arange(p * n, dtype=np.int64) + i * 10_000_000)[r * n:(r + 1) * n]
                           for i in range(p)])
    if not np.array_equal(recv, want):
        errors.append(f"alltoall rank {r}")
    for root in range(p):
        buf = mine.copy() if r == root else np.zeros(n)
        comm.bcast(buf, root, algorithm="shm")
        if not np.array_equal(buf, everyone[root]):
            errors.append(f"bcast root {root} rank {r}")
    # allreduce: slices of the inputs read and combined, spanning several chunks on few ranks
    big = 800_003
    vals = [np.arange(big, dtype=np.float64) * 0.25 + i * 1.5 for i in range(p)]
    want = vals[0].copy()
    for v in vals[1:]:
        want += v  # rank order, as every slice is combined
    got = np.full(big, -1.0)
    comm.allreduce(vals[r], got, algorithm="shm")
    if not np.array_equal(got, want):
        errors.append(f"allreduce rank {r}: {np.count_nonzero(got != want)} wrong")
    inplace_sum = vals[r].copy()
    comm.allreduce(ringworld.IN_PLACE, inplace_sum, algorithm="shm")
    if not np.array_equal(inplace_sum, want):
        errors.append(f"allreduce in place rank {r}: {np.count_nonzero(inplace_sum != want)} "
                      "wrong")
    ints = (np.arange(big, dtype=np.int64) * 7919 + r * 104729) % 1_000_003
    top = np.empty_like(ints)
    comm.allreduce(ints, top, ringworld.MAX, algorithm="shm")
    want_top = np.max([(np.arange(big, dtype=np.int64) * 7919 + i * 104729) % 1_000_003
                       for i in range(p)], axis=0)
    if not np.array_equal(top, want_top):
        errors.append(f"allreduce max rank {r}")
    # a non-commutative op: combined strictly in rank order
    maps = []
    for i in range(p):
        m = np.empty(big // 2, dtype=AFFINE)
        m["m"] = (np.arange(big // 2) * 31 + i * 17) % P_AFF + 1
        m["c"] = (np.arange(big // 2) * 7 + i * 1009) % P_AFF
        maps.append(m)
    want_maps = maps[0]
    for m in maps[1:]:
        want_maps = affine(want_maps, m)
    got_maps = np.empty_like(maps[r])
    comm.allreduce(maps[r], got_maps, AFFINE_OP, algorithm="shm")
    if not np.array_equal(got_maps, want_maps):
        errors.append(f"allreduce of a non-commutative op rank {r}")
    # reduce_scatter_block: each rank reads its block of every input, spanning two chunks,
    # combined in rank order; in place too; and a non-commutative op
    blk = 300_007
    rs_in = [np.arange(p * blk, dtype=np.float64) * 0.5 + i * 3.25 for i in range(p)]
    rs_want = rs_in[0][r * blk : (r + 1) * blk].copy()
    for v in rs_in[1:]:
        rs_want += v[r * blk : (r + 1) * blk]
    rs_out = np.full(blk, -1.0)
    comm.reduce_scatter_block(rs_in[r], rs_out, algorithm="shm")
    if not np.array_equal(rs_out, rs_want):
        errors.append(f"reduce_scatter_block rank {r}: {np.count_nonzero(rs_out != rs_want)} "
                      "wrong")
    rs_buf = rs_in[r].copy()
    comm.reduce_scatter_block(ringworld.IN_PLACE, rs_buf, algorithm="shm")
    if not np.array_equal(rs_buf[:blk], rs_want):
        errors.append(f"reduce_scatter_block in place rank {r}")
    k = 1000
    rs_maps = [m[: p * k] for m in maps]
    got_rs = np.empty(k, dtype=AFFINE)
    comm.reduce_scatter_block(rs_maps[r], got_rs, AFFINE_OP, algorithm="shm")
    want_rs = rs_maps[0][r * k : (r + 1) * k]
    for m in rs_maps[1:]:
        want_rs = affine(want_rs, m[r * k : (r + 1) * k])
    if not np.array_equal(got_rs, want_rs):
        errors.append(f"reduce_scatter_block of a non-commutative op rank {r}")
    errors += _rooted(comm, shm.EAGER_MAX // 8 + 1001)  # blocks past the eager rings
    arena: Any = comm._arena
    if arena is None or not arena.direct:
        errors.append(f"rank {r}: direct reads were not enabled")
    return errors


def _rooted(comm: ringworld.Communicator, n: int) -> list[str]:
    """gather and scatter of ``n`` elements a block through the shared memory, from every root,
    in place and not; data unique per element."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    blocks = [np.arange(n, dtype=np.float64) * 3 + i * 1e7 for i in range(p)]
    for root in range(p):
        for inplace in (False, True):
            out = np.full(p * n, -1.0) if r == root else None
            if inplace and out is not None:
                out[r * n : (r + 1) * n] = blocks[r]
            send = ringworld.IN_PLACE if inplace and r == root else blocks[r]
            comm.gather(send, out, root, algorithm="shm")
            if out is not None and not np.array_equal(out, np.concatenate(blocks)):
                errors.append(f"gather root {root} in place {inplace}: "
                              f"{np.count_nonzero(out != np.concatenate(blocks))} wrong")
            whole = np.concatenate(blocks) + 0.5 if r == root else None
            got = np.full(n, -1.0)
            into: Any = got
            if inplace and whole is not None:
                into, got = ringworld.IN_PLACE, whole[r * n : (r + 1) * n]
            comm.scatter(whole, into, root, algorithm="shm")
            if not np.array_equal(got, blocks[r] + 0.5):
                errors.append(f"scatter root {root} in place {inplace} rank {r}: "
                              f"{np.count_nonzero(got != blocks[r] + 0.5)} wrong")
    if comm.last_algorithm != "shm":
        errors.append(f"rank {r}: gather and scatter ran {comm.last_algorithm}")
    return errors


def _windows(comm: ringworld.Communicator, policy: Policy) -> list[str]:
    comm.selector.shm_policy = policy  # before the windows are mapped
    return _rooted(comm, shm.CHUNK // 8 + 1001)  # two chunks a block (scatter: p + 1)


@pytest.mark.parametrize("size", [2, 3])
def test_rooted_collectives_through_the_windows_in_chunks(size: int) -> None:
    # no direct copies, and the slots only up to SMALL: blocks of two and more window chunks
    never = dict.fromkeys(DIRECT, float("inf"))
    policy = Policy(direct=never, direct_crowded=never, race=False, slot_max=shm.SMALL)
    results = run_processes(size, _windows, policy, transport="shm", timeout=120)
    assert [e for errs in results for e in errs] == []


@pytest.mark.parametrize("size", [2, 3, 5])
def test_direct_reads(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # every direct path from 4 KiB, also where ranks share cores (3 and 5 do here)
    low = dict.fromkeys(DIRECT, 4096)
    # and the slots only up to SMALL (their size reaches past these buffers)
    policy = Policy(direct=low, direct_crowded=low, race=False, slot_max=shm.SMALL)
    monkeypatch.setattr(shm, "GATHER_WHOLE", 4096)  # blocks of 40 KB go in 10 uneven pieces
    monkeypatch.setattr(shm, "GATHER_PIECE", 4100)  # (inherited by the forked ranks)
    results = run_processes(size, _direct, policy, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _bcast_mismatch(comm: ringworld.Communicator) -> str:
    warm = np.zeros(100)
    comm.allreduce(warm.copy(), warm)  # maps the shared windows
    buf = np.zeros(100_000 + 8 * comm.rank)  # streamed broadcast, sizes disagree
    try:
        comm.bcast(buf, 0, algorithm="shm", timeout=20)
    except ringworld.MismatchError as exc:
        return str(exc)
    return "no error"


def test_streamed_bcast_mismatch_fails_every_rank() -> None:
    results = run_processes(3, _bcast_mismatch, transport="shm", timeout=60)
    assert all("expect" in r for r in results), results


def _leaves_early(comm: ringworld.Communicator, collective: str) -> str:
    warm = np.ones(1000)
    comm.allreduce(warm.copy(), warm)  # maps the shared windows
    if comm.rank == 1:
        return "left"  # exits without joining the next collective
    t = time.monotonic()
    try:
        if collective == "allreduce":
            comm.allreduce(np.ones(300_000), np.empty(300_000), algorithm="shm")
        else:
            comm.bcast(np.ones(300_000), 1, algorithm="shm")
    except ringworld.PeerFailure as exc:
        return f"{time.monotonic() - t:.1f}s {exc}"
    return "no error"


@pytest.mark.parametrize("collective", ["allreduce", "bcast"])
def test_a_rank_that_leaves_fails_the_shared_memory_collective(collective: str) -> None:
    results = run_processes(3, _leaves_early, collective, transport="shm", timeout=60)
    assert results[1] == "left"
    for r in (0, 2):
        seconds, _, message = results[r].partition(" ")
        assert "rank 1" in message and collective in message, results[r]
        assert float(seconds.rstrip("s")) < 5, results[r]


def _disagree(comm: ringworld.Communicator) -> list[str]:
    """Rank 0 counted fewer cores than the others at start-up (see the test): the ranks must
    still agree on crowding, which picks between the direct and the window paths."""
    p, r = comm.size, comm.rank
    errors: list[str] = []
    n = 65536  # float64: 512 KiB blocks, direct only where ranks are not crowded
    mine = np.arange(n, dtype=np.float64) + r * n
    out = np.full(p * n, -1.0)
    comm.allgather(mine, out, algorithm="shm", timeout=30)
    if not np.array_equal(out, np.arange(p * n, dtype=np.float64)):
        errors.append(f"allgather rank {r}")
    send = np.arange(p * n, dtype=np.float64) * (r + 1)
    part = np.empty(n)
    comm.reduce_scatter_block(send, part, algorithm="shm", timeout=30)
    want = np.arange(r * n, (r + 1) * n, dtype=np.float64) * sum(range(1, p + 1))
    if not np.array_equal(part, want):
        errors.append(f"reduce_scatter_block rank {r}")
    arena: Any = comm._arena
    if arena is None or not arena.crowded:
        errors.append(f"rank {r}: crowding not agreed ({arena and arena.crowded})")
    return errors


def test_ranks_that_count_their_cores_differently_agree_on_the_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # inherited by the forked ranks: rank 0 counts 1 core (as with its own affinity mask), the
    # other 2 (the job, 2 ranks, is then crowded on rank 0 only, before the counts are shared)
    monkeypatch.setattr(runtime, "usable_cpus",
                        lambda: 1 if os.environ.get("RINGWORLD_RANK") == "0" else 2)
    results = run_processes(2, _disagree, transport="shm", timeout=60)
    assert [e for errs in results for e in errs] == []


def _shared_bcast(comm: ringworld.Communicator, slow: int) -> dict[str, Any]:
    """Direct broadcasts on two ranks whose copying is shared out as it goes; rank ``slow``
    dawdles before its first piece of each call, so the other must take more of the pieces."""
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    arena.crowded = False  # on both ranks alike (a crowded job splits in fixed parts)
    pieces = {"read": 0, "write": 0}
    first = [True]
    read, write = shm.Arena.read, shm.Arena.write

    def dawdle(kind: str) -> None:
        pieces[kind] += 1
        if first[0] and comm.rank == slow:
            first[0] = False
            time.sleep(0.05)

    def reading(self: shm.Arena, rank: int, which: int, offset: int, into: Any) -> None:
        dawdle("read")
        read(self, rank, which, offset, into)

    def writing(self: shm.Arena, rank: int, which: int, offset: int, data: Any) -> None:
        dawdle("write")
        write(self, rank, which, offset, data)

    shm.Arena.read, shm.Arena.write = reading, writing  # type: ignore[method-assign]
    errors: list[str] = []
    for k, nbytes in enumerate([shm.SHARE_FROM, shm.SHARE_FROM + 77, 3 * shm.SHARE_FROM + 8]):
        for root in (0, 1):
            dtype = np.float64 if nbytes % 8 == 0 else np.uint8
            n = nbytes // np.dtype(dtype).itemsize
            want = (np.arange(n) * 7 + k * 1009 + root * 131).astype(dtype)
            buf = want.copy() if comm.rank == root else np.zeros(n, dtype)
            first[0] = True
            comm.bcast(buf, root)
            if not np.array_equal(buf, want):
                errors.append(f"{nbytes} B from root {root}: "
                              f"{int(np.count_nonzero(buf != want))} elements wrong")
    return {"errors": errors, "direct": bool(arena.direct), **pieces}


@pytest.mark.parametrize("slow", [0, 1])
def test_two_rank_direct_bcast_shares_its_copying(slow: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The root writes pieces from the back while the receiver reads from the front; the rank
    that dawdles copies fewer of them, and every byte arrives (pieces of an odd size, a last
    piece shorter than the others; inherited by the forked ranks)."""
    monkeypatch.setattr(shm, "SHARE_FROM", 1 << 20)
    monkeypatch.setattr(shm, "SHARE_PIECE", (64 << 10) + 64)
    results = run_processes(2, _shared_bcast, slow, transport="shm", timeout=60)
    assert [e for r in results for e in r["errors"]] == []
    assert all(r["direct"] for r in results)
    # the root writes pieces, the receiver reads them: six calls, each size from both roots
    done = [r["read"] + r["write"] for r in results]
    sizes = [shm.SHARE_FROM, shm.SHARE_FROM + 77, 3 * shm.SHARE_FROM + 8]
    total = sum(2 * -(-nbytes // shm.SHARE_PIECE) for nbytes in sizes)
    assert sum(done) >= total, (done, total)  # (a piece both took counts twice)
    assert done[1 - slow] > done[slow] * 2, done  # the prompt rank took most of them


def _dawdling_reads(comm: ringworld.Communicator, slow: int) -> tuple[list[int], list[bool]]:
    """Count this rank's direct reads (the pieces it takes); rank ``slow`` sleeps before its
    first read after ``first[0]`` is set (a call's start), so the other must take more."""
    taken = [0]
    first = [True]
    read = shm.Arena.read

    def reading(self: shm.Arena, rank: int, which: int, offset: int, into: Any) -> None:
        taken[0] += 1
        if first[0] and comm.rank == slow:
            first[0] = False
            time.sleep(0.05)
        read(self, rank, which, offset, into)

    shm.Arena.read = reading  # type: ignore[method-assign]
    return taken, first


_TWICE_PLUS = ringworld.Op.create(lambda a, b: a * 2 + b, name="twice_plus")


def _shared_reduce_scatter(comm: ringworld.Communicator, slow: int) -> dict[str, Any]:
    """Direct reduce_scatter_blocks on two ranks whose combining is shared out as it goes
    (each rank its own block from the front, then the other's from the back); rank ``slow``
    dawdles before its first piece of each call, so the other combines some of its block."""
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    arena.crowded = False  # on both ranks alike (a crowded job keeps the fixed blocks)
    arena.direct_min["reduce_scatter_block"] = 1 << 20
    arena.policy = dataclasses.replace(arena.policy, race=False)  # (the threshold's path)
    taken, first = _dawdling_reads(comm, slow)
    errors: list[str] = []
    for k, nbytes in enumerate([shm.SHARE_FROM, shm.SHARE_FROM + 144, 3 * shm.SHARE_FROM + 16]):
        for dtype, op in ((np.float64, ringworld.SUM), (np.int32, _TWICE_PLUS)):
            n = nbytes // np.dtype(dtype).itemsize // 2  # a block
            x = [(np.arange(2 * n) % 1013 * 7 + k * 11 + i * 3).astype(dtype) for i in (0, 1)]
            full = x[0] + x[1] if op is ringworld.SUM else x[0] * 2 + x[1]
            out = np.zeros(n, dtype)
            first[0] = True
            comm.reduce_scatter_block(x[comm.rank], out, op=op)
            want = full[comm.rank * n : (comm.rank + 1) * n]
            if not np.array_equal(out, want):
                errors.append(f"{nbytes} B {dtype.__name__}: "
                              f"{int(np.count_nonzero(out != want))} elements wrong")
    return {"errors": errors, "direct": bool(arena.direct), "taken": taken[0]}


def _shared_allreduce(comm: ringworld.Communicator, slow: int) -> dict[str, Any]:
    """Direct allreduces on two ranks whose combining is shared out as it goes (each piece read
    from the peer once by whichever rank takes it); rank ``slow`` dawdles before its first
    piece of each call, so the other must take more of the pieces."""
    warm = np.zeros(4)
    comm.allreduce(warm.copy(), warm)  # maps the windows
    arena: Any = comm._arena
    arena.crowded = False  # on both ranks alike (a crowded job keeps the fixed slices)
    arena.direct_min["allreduce"] = 1 << 20
    taken, first = _dawdling_reads(comm, slow)
    errors: list[str] = []
    for k, nbytes in enumerate([shm.SHARE_FROM, shm.SHARE_FROM + 72, 3 * shm.SHARE_FROM + 8]):
        for dtype, op in ((np.float64, ringworld.SUM), (np.int32, _TWICE_PLUS)):
            n = nbytes // np.dtype(dtype).itemsize
            mine = (np.arange(n) % 1013 * 7 + k * 11 + comm.rank * 3).astype(dtype)
            x0, x1 = (mine - comm.rank * 3, mine + (1 - comm.rank) * 3)  # rank 0's, rank 1's
            want = x0 + x1 if op is ringworld.SUM else x0 * 2 + x1
            out = np.zeros(n, dtype)
            first[0] = True
            comm.allreduce(mine, out, op=op)
            if not np.array_equal(out, want):
                errors.append(f"{nbytes} B {dtype.__name__}: "
                              f"{int(np.count_nonzero(out != want))} elements wrong")
        inplace = mine.copy()  # in place: the fixed slices (a peer may not write into it)
        comm.allreduce(ringworld.IN_PLACE, inplace, op=_TWICE_PLUS)
        if not np.array_equal(inplace, want):
            errors.append(f"{nbytes} B in place: wrong")
    return {"errors": errors, "direct": bool(arena.direct), "taken": taken[0]}


@pytest.mark.parametrize("slow", [0, 1])
@pytest.mark.parametrize(("run", "most"), [
    # rank 0 combines pieces from the front and rank 1 from the back, each writing the result
    # into both ranks' buffers (in place keeps the fixed slices)
    (_shared_allreduce, 2.0),
    # each rank combines its block from the front and then the other's from the back
    (_shared_reduce_scatter, 1.5)])
def test_two_rank_direct_calls_share_their_combining(slow: int, run: Any, most: float,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank that dawdles combines fewer pieces (the prompt one takes ``most`` times as
    many), and every element is the rank-ordered result (a non-commutative op; odd sizes)."""
    monkeypatch.setattr(shm, "SHARE_FROM", 1 << 20)
    monkeypatch.setattr(shm, "SHARE_PIECE", (64 << 10) + 64)
    results = run_processes(2, run, slow, transport="shm", timeout=60)
    assert [e for r in results for e in r["errors"]] == []
    assert all(r["direct"] for r in results)
    done = [r["taken"] for r in results]
    assert done[1 - slow] > done[slow] * most, done


def test_address_is_the_first_byte_of_any_array() -> None:
    from ringworld.algorithms.shm_direct import address

    base = np.arange(64, dtype=np.float64)
    frozen = base[3:9]
    frozen.flags.writeable = False
    dates = np.arange(4).astype("M8[D]")  # (a dtype a buffer cannot carry)
    for a in (base, base[5:], base[5:5], base[::2], frozen, np.zeros((0, 3)), dates):
        assert address(a) == a.__array_interface__["data"][0]
