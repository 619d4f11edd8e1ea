"""Communicator management and concurrency over real processes.

``dup``, ``split`` (colors, keys, None / UNDEFINED), ``create`` and ``free``; collectives on
sub-communicators running at the same time; collectives on a dup while point-to-point traffic
on the parent is in flight; several nonblocking collectives in flight on one communicator,
waited newest first, mixed with point-to-point messages that use the same tag values as the
collectives' sequence numbers.
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import pytest
from coll_support import LARGE_VEC, WAIT, pair, sentinel, values

import ringworld
from ringworld import ANY_TAG, IN_PLACE, UNDEFINED, CommError, Communicator, Request
from ringworld.testing import run_processes

SIZES = [1, 2, 3, 4, 5, 8]
TRANSPORTS = ["shm", "tcp"]
I64 = np.dtype(np.int64)


class Checks:
    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.fails: list[str] = []

    def expect(self, what: str, got: Any, want: Any) -> None:
        ok = (np.array_equal(got, want) if isinstance(got, np.ndarray | list)
              else got == want)
        if not ok:
            self.fails.append(f"{what} (world rank {self.comm.rank} of {self.comm.size}): "
                              f"got {got!r:.300}, want {want!r:.300}")


def _sum_of(ranks: list[int], n: int) -> np.ndarray:
    return np.sum([values(w, n, I64) for w in ranks], axis=0, dtype=np.int64)


def _check_members(ck: Checks, sub: Communicator | None, what: str,
                   members: list[int] | None) -> None:
    """``sub`` holds world ranks ``members`` in that rank order (None: not a member here)."""
    comm = ck.comm
    if members is None:
        ck.expect(f"{what}: returns None on a rank outside it", sub, None)
        return
    if sub is None:
        ck.fails.append(f"{what}: returned None on member rank {comm.rank}")
        return
    ck.expect(f"{what}: size", sub.size, len(members))
    ck.expect(f"{what}: rank", sub.rank, members.index(comm.rank))
    ck.expect(f"{what}: world_ranks", list(sub.world_ranks), members)
    for n in (1, 5000, 40_000):
        out = np.empty(n, np.int64)
        sub.allreduce(values(comm.rank, n, I64), out, timeout=WAIT)
        ck.expect(f"{what}: allreduce n={n}", out, _sum_of(members, n))
    got = sub.allgather_obj(comm.rank, timeout=WAIT)
    ck.expect(f"{what}: allgather_obj of world ranks", got, members)


def _management(comm: Communicator) -> list[str]:
    ck = Checks(comm)
    p, r = comm.size, comm.rank
    world = list(range(p))

    # dup: same ranks, its own contexts (a message on the dup never matches the parent's)
    d = comm.dup()
    _check_members(ck, d, "dup", world)
    if p > 1:
        right, left = (r + 1) % p, (r - 1) % p
        comm.send_obj(("parent", r), right, tag=7)
        d.send_obj(("dup", r), right, tag=7)
        ck.expect("dup: message on the dup", d.recv_obj(left, 7, timeout=WAIT), ("dup", left))
        ck.expect("dup: message on the parent", comm.recv_obj(left, 7, timeout=WAIT),
                  ("parent", left))
    dd = d.dup("named")
    ck.expect("dup of a dup: name", dd.name, "named")
    _check_members(ck, dd, "dup of a dup", world)

    # split by parity, ranked by descending old rank (key = -rank)
    sub = comm.split(r % 2, key=-r)
    _check_members(ck, sub, "split(color=rank%2, key=-rank)",
                   sorted((w for w in world if w % 2 == r % 2), reverse=True))
    # a split of a split: members are still named by world rank
    if sub is not None:
        inner = sub.split(sub.rank % 2)
        outer = sorted((w for w in world if w % 2 == r % 2), reverse=True)
        _check_members(ck, inner, "split of a split",
                       [w for i, w in enumerate(outer) if i % 2 == sub.rank % 2])
    # equal keys keep the old order; None and UNDEFINED give no communicator
    color: int | None = None if r == 0 else (UNDEFINED if r == p - 1 and p > 2 else 3)
    members = None if color in (None, UNDEFINED) else [w for w in world
                                                        if w != 0 and (w != p - 1 or p <= 2)]
    _check_members(ck, comm.split(color, key=5), "split(None/UNDEFINED on some ranks)", members)
    # every rank its own color
    _check_members(ck, comm.split(r, key=0), "split(color=rank)", [r])

    # create from a list of ranks (in new-rank order)
    group = [p - 1, 0] if p > 1 else [0]
    _check_members(ck, comm.create(group), f"create({group})", group if r in group else None)
    rev = world[::-1]
    _check_members(ck, comm.create(rev), f"create({rev})", rev)

    # free, then use: CommError (buffer collectives)
    f = comm.dup()
    f.free()
    x = np.ones(3, np.int64)
    for what, call in (("allreduce", lambda: f.allreduce(x, np.empty(3, np.int64))),
                       ("iallreduce", lambda: f.iallreduce(x, np.empty(3, np.int64))),
                       ("barrier", f.barrier),
                       ("bcast", lambda: f.bcast(np.empty(3, np.int64))),
                       ("alltoall", lambda: f.alltoall(np.ones(p, np.int64),
                                                       np.empty(p, np.int64))),
                       ("dup", f.dup)):
        try:
            call()
        except CommError:
            pass
        else:
            ck.fails.append(f"{what} on a freed communicator did not raise CommError")

    # the parent and the other communicators still work after all this
    _check_members(ck, comm, "the parent at the end", world)
    _check_members(ck, d, "the first dup at the end", world)
    return ck.fails


def _freed_object_collectives(comm: Communicator) -> list[str]:
    """Object collectives and point-to-point calls on a freed communicator raise CommError too
    (free's contract). Every rank calls them alike, so a call that does not raise completes
    (or times out) and the next one is tried."""
    f = comm.dup()
    f.free()
    fails = []
    peer = (comm.rank + 1) % comm.size
    buf = np.zeros(2, np.int32)
    for what, call in (("send", lambda: f.send(buf, peer)),  # point-to-point too
                       ("isend", lambda: f.isend(buf, peer)),
                       ("recv", lambda: f.recv(buf, peer, timeout=2)),
                       ("recv(ANY_SOURCE)", lambda: f.recv(buf, timeout=2)),
                       ("irecv(ANY_SOURCE)", lambda: f.irecv(buf)),
                       ("sendrecv", lambda: f.sendrecv(buf, peer, np.empty_like(buf), peer)),
                       ("send_obj", lambda: f.send_obj(1, peer)),
                       ("iprobe(ANY_SOURCE)", f.iprobe),
                       ("bcast_obj", lambda: f.bcast_obj(1)),
                       ("allreduce_obj", lambda: f.allreduce_obj(1)),
                       ("allgather_obj", lambda: f.allgather_obj(1)),
                       ("gather_obj", lambda: f.gather_obj(1)),
                       ("scan_obj", lambda: f.scan_obj(1))):
        try:
            call()
        except CommError as exc:
            if "was freed" not in str(exc):  # (a Timeout is a CommError too)
                fails.append(f"{what} on a freed communicator raised {exc!r}")
        else:
            fails.append(f"{what} on a freed communicator of size {comm.size} did not raise "
                         "CommError")
    return fails


def _concurrent_subcomms(comm: Communicator) -> list[str]:
    """Collectives on sub-communicators at the same time: both halves of one split run theirs
    simultaneously; each rank also has collectives of two different splits in flight."""
    ck = Checks(comm)
    p, r = comm.size, comm.rank
    parity = comm.split(r % 2)
    halves = comm.split(int(r >= p // 2))
    assert parity is not None and halves is not None
    par_members = [w for w in range(p) if w % 2 == r % 2]
    half_members = [w for w in range(p) if (w >= p // 2) == (r >= p // 2)]
    n = 3000
    a_out = np.empty(n, np.int64)
    b_out = np.empty(n * halves.size, np.int64)
    c_buf = values(100 + par_members[0], 2 * n, I64) if parity.rank == 0 else sentinel(I64, 2 * n)
    d_out = np.empty(LARGE_VEC, np.int64)
    reqs: list[tuple[str, Request[None]]] = [
        ("parity iallreduce", parity.iallreduce(values(r, n, I64), a_out, algorithm="ring")),
        ("halves iallgather", halves.iallgather(values(r, n, I64), b_out)),
        ("parity ibcast", parity.ibcast(c_buf, 0, algorithm="binomial")),
        ("halves iallreduce large", halves.iallreduce(values(r, LARGE_VEC, I64), d_out,
                                                      algorithm="rabenseifner")),
    ]
    # blocking collectives on the parent (and, through shared memory, on a sub-communicator)
    # while they are in flight
    e_out = np.empty(7, np.int64)
    comm.allreduce(values(r, 7, I64), e_out, timeout=WAIT)
    f_out = np.empty(9000, np.int64)
    shm = "shm" if comm.transport == "shm" and halves.size > 1 else None
    halves.allreduce(values(r, 9000, I64), f_out, algorithm=shm, timeout=WAIT)
    ck.expect(f"halves allreduce[{shm}] among the others", f_out, _sum_of(half_members, 9000))
    for _, req in reversed(reqs):
        req.wait(WAIT)
    ck.expect("parent allreduce among sub-communicator collectives", e_out,
              _sum_of(list(range(p)), 7))
    ck.expect("parity iallreduce", a_out, _sum_of(par_members, n))
    ck.expect("halves iallgather", b_out,
              np.concatenate([values(w, n, I64) for w in half_members]))
    ck.expect("parity ibcast", c_buf, values(100 + par_members[0], 2 * n, I64))
    ck.expect("halves iallreduce large", d_out, _sum_of(half_members, LARGE_VEC))
    return ck.fails


def _dup_during_p2p(comm: Communicator) -> list[str]:
    """Point-to-point traffic in flight on the parent (large: rendezvous) while a dup is made
    and used for collectives."""
    ck = Checks(comm)
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    big_in = np.empty(LARGE_VEC, np.int64)
    small_in = np.empty(5, np.int64)
    recvs = [comm.irecv(big_in, left, tag=0), comm.irecv(small_in, left, tag=1)]
    sends = [comm.isend(values(pair(r, right), LARGE_VEC, I64), right, tag=0)]
    d = comm.dup()
    out = np.empty(40_000, np.int64)
    d.allreduce(values(r, 40_000, I64), out, algorithm="ring", timeout=WAIT)
    ck.expect("allreduce on the dup", out, _sum_of(list(range(p)), 40_000))
    if comm.transport == "shm":  # maps the dup's shared windows while the p2p is in flight
        d.allreduce(values(r, 40_000, I64), out, algorithm="shm", timeout=WAIT)
        ck.expect("allreduce[shm] on the dup", out, _sum_of(list(range(p)), 40_000))
    req = d.ibarrier()
    sends.append(comm.isend(values(pair(r, right), 5, I64), right, tag=1))
    obj = d.bcast_obj({"from": 0} if r == 0 else None, timeout=WAIT)
    req.wait(WAIT)
    ringworld.wait_all(recvs + sends, WAIT)
    ck.expect("bcast_obj on the dup", obj, {"from": 0})
    ck.expect("large p2p on the parent", big_in, values(pair(left, r), LARGE_VEC, I64))
    ck.expect("small p2p on the parent", small_in, values(pair(left, r), 5, I64))
    return ck.fails


def _inflight_with_p2p(comm: Communicator) -> list[str]:
    """Seven nonblocking collectives in flight on one communicator, waited newest first,
    with point-to-point messages carrying the same tag values as their sequence numbers
    (and an ANY_TAG receive) posted before and sent while they run."""
    ck = Checks(comm)
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    tags = list(range(12))
    p2p_in = [np.empty(4, np.int64) for _ in tags]
    recvs = [comm.irecv(buf, left, tag=t) for t, buf in zip(tags, p2p_in, strict=True)]
    any_in = np.empty(4, np.int64)
    any_req = comm.irecv(any_in, left, ANY_TAG)
    n = 2 * p + 1
    ar = np.empty(n, np.int64)
    bc = values(7, n, I64) if r == p - 1 else sentinel(I64, n)
    ag = np.empty(n * p, np.int64)
    a2a = np.concatenate([values(pair(r, j), n, I64) for j in range(p)])
    rsb = np.empty(n, np.int64)
    sc = values(r, n, I64)
    colls: list[tuple[str, Request[None]]] = [
        ("iallreduce", comm.iallreduce(values(r, n, I64), ar, algorithm="recursive_doubling")),
        ("ibcast", comm.ibcast(bc, p - 1, algorithm="ring")),
        ("iallgather", comm.iallgather(values(r, n, I64), ag, algorithm="bruck")),
        ("ialltoall in place", comm.ialltoall(IN_PLACE, a2a, algorithm="pairwise")),
        ("ibarrier", comm.ibarrier()),
        ("ireduce_scatter_block", comm.ireduce_scatter_block(
            values(r, n * p, I64), rsb, algorithm="pairwise")),
        ("iscan in place", comm.iscan(IN_PLACE, sc, algorithm="linear")),
    ]
    comm.send(np.full(4, -1, np.int64), right, tag=99)  # what the ANY_TAG receive must get
    sends = [comm.isend(values(pair(r, t), 4, I64), right, tag=t) for t in reversed(tags)]
    for _, req in reversed(colls):
        req.wait(WAIT)
    ringworld.wait_all(recvs + sends, WAIT)
    st = any_req.wait(WAIT)
    ck.expect("ANY_TAG receive: tag", st.tag, 99)
    ck.expect("ANY_TAG receive: data", any_in, np.full(4, -1, np.int64))
    for t, buf in zip(tags, p2p_in, strict=True):
        ck.expect(f"p2p tag {t}", buf, values(pair(left, t), 4, I64))
    everyone = list(range(p))
    ck.expect("iallreduce", ar, _sum_of(everyone, n))
    ck.expect("ibcast", bc, values(7, n, I64))
    ck.expect("iallgather", ag, np.concatenate([values(i, n, I64) for i in everyone]))
    ck.expect("ialltoall in place", a2a, np.concatenate([values(pair(i, r), n, I64)
                                                         for i in everyone]))
    ck.expect("ireduce_scatter_block", rsb, _sum_of(everyone, n * p)[r * n : (r + 1) * n])
    ck.expect("iscan in place", sc, _sum_of(list(range(r + 1)), n))
    return ck.fails


def _buffer_kinds(comm: Communicator) -> list[str]:
    """Buffers need not be flat numpy arrays: multi-dimensional arrays, bytearray, memoryview
    and array.array work; a strided array is rejected naming the argument."""
    ck = Checks(comm)
    p, r = comm.size, comm.rank
    mat = values(r, 12, I64).reshape(3, 4)
    out = np.empty((3, 4), np.int64)
    comm.allreduce(mat, out, timeout=WAIT)
    ck.expect("allreduce of 3x4 arrays", out, _sum_of(list(range(p)), 12).reshape(3, 4))
    raw = bytearray(f"root{p - 1:04d}".encode()) if r == p - 1 else bytearray(8)
    comm.bcast(raw, p - 1, timeout=WAIT)
    ck.expect("bcast of a bytearray", bytes(raw), f"root{p - 1:04d}".encode())
    doubles = array.array("d", [r + 0.5] * 3)
    table = array.array("d", [0.0] * (3 * p))
    comm.allgather(memoryview(doubles), table, timeout=WAIT)
    ck.expect("allgather of array.array through a memoryview", list(table),
              [i + 0.5 for i in range(p) for _ in range(3)])
    try:
        comm.allreduce(np.ones((4, 4))[:, 1], np.empty(4))
    except ValueError as exc:
        ck.expect("strided sendbuf: message names it", "sendbuf" in str(exc), True)
    else:
        ck.fails.append("a strided sendbuf did not raise ValueError")
    return ck.fails


def _all(comm: Communicator) -> list[str]:
    fails = _management(comm)
    fails += _buffer_kinds(comm)
    fails += _concurrent_subcomms(comm)
    if comm.size > 1:
        fails += _dup_during_p2p(comm)
        fails += _inflight_with_p2p(comm)
    return fails


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"p{s}")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_management_and_concurrency(transport: str, size: int) -> None:
    out = run_processes(size, _all, transport=transport, timeout=100)
    failures = [f for fails in out for f in fails]
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("size", [1, 3])
def test_freed_communicator_rejects_object_collectives_and_p2p(size: int) -> None:
    out = run_processes(size, _freed_object_collectives, timeout=60)
    failures = sorted({f for fails in out for f in fails})
    assert not failures, "\n".join(failures)
