"""``ringworld.MPI`` collectives, reductions and communicator management over real ranks.

Each (topic, size) runs once in forked ranks and checks many calls against numpy references;
data is unique per element, rank and call, so a wrong offset, source or order shows. The same
calls under real mpi4py are compared in ``test_mpi_programs.py``.
"""

from __future__ import annotations

import array
import weakref
from typing import Any

import numpy as np
import pytest

from ringworld import MPI, TruncationError
from ringworld.testing import RankFailed, run_processes

SIZES = [1, 2, 3, 5]


def data(rank: int, n: int, dtype: Any = "f8", salt: int = 0) -> np.ndarray:
    """Unique per element, rank and salt (exact in every dtype used here)."""
    base = np.arange(n, dtype=np.int64) + rank * 1000 + salt * 100 + 1
    if np.dtype(dtype).kind == "c":
        return (base + 1j * (base % 7)).astype(dtype)
    return base.astype(dtype)


def vlayout(p: int, salt: int = 0) -> tuple[list[int], list[int], int]:
    """Uneven counts (zeros included once p > 1) and displacements with gaps."""
    counts = [(3 * i + 1 + salt) % 4 for i in range(p)]
    displs, at = [], 2
    for c in counts:
        displs.append(at)
        at += c + 2
    return counts, displs, at


def expect_v(p: int, counts: list[int], displs: list[int], n: int, salt: int,
             fill: float = -1.0) -> np.ndarray:
    ref = np.full(n, fill)
    for i in range(p):
        ref[displs[i] : displs[i] + counts[i]] = data(i, counts[i], salt=salt)
    return ref


# ------------------------------------------------------------------------------ data movement
def _movement(_: object) -> int:
    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()
    eq = np.testing.assert_array_equal
    checks = 0
    for dtype in ("f8", "i2", "c16", "u8"):
        for root in range(p):
            buf = data(root, 5, dtype, salt=1) if r == root else np.zeros(5, dtype)
            comm.Bcast(buf, root=root)
            eq(buf, data(root, 5, dtype, salt=1))

            rb = np.zeros(3 * p, dtype) if r == root else None
            comm.Gather(data(r, 3, dtype, salt=2), rb, root=root)
            if r == root:
                eq(rb, np.concatenate([data(i, 3, dtype, salt=2) for i in range(p)]))

            sb = data(r, 2 * p, dtype, salt=3)
            got = np.zeros(2, dtype)
            comm.Scatter(sb if r == root else None, got, root=root)
            eq(got, data(root, 2 * p, dtype, salt=3)[2 * r : 2 * r + 2])
            checks += 3
        ag = np.zeros(4 * p, dtype)
        comm.Allgather(data(r, 4, dtype, salt=4), ag)
        eq(ag, np.concatenate([data(i, 4, dtype, salt=4) for i in range(p)]))
        at = np.zeros(2 * p, dtype)
        comm.Alltoall(data(r, 2 * p, dtype, salt=5), at)
        eq(at, np.concatenate([data(i, 2 * p, dtype, salt=5)[2 * r : 2 * r + 2]
                               for i in range(p)]))
        checks += 2

    # in place
    root = p - 1
    g = np.full(3 * p, -1.0)
    g[3 * r : 3 * r + 3] = data(r, 3, salt=6)
    comm.Gather(MPI.IN_PLACE if r == root else g[3 * r : 3 * r + 3], g, root=root)
    if r == root:
        eq(g, np.concatenate([data(i, 3, salt=6) for i in range(p)]))
    s = data(r, 2 * p, salt=7)
    keep = s.copy()
    comm.Scatter(s, MPI.IN_PLACE if r == root else s[:2], root=root)
    eq(s[:2] if r != root else s, data(root, 2 * p, salt=7)[2 * r : 2 * r + 2]
       if r != root else keep)
    ag = np.full(2 * p, -1.0)
    ag[2 * r : 2 * r + 2] = data(r, 2, salt=8)
    comm.Allgather(MPI.IN_PLACE, ag)
    eq(ag, np.concatenate([data(i, 2, salt=8) for i in range(p)]))
    at = data(r, 3 * p, "i4", salt=9)
    comm.Alltoall(MPI.IN_PLACE, [at, MPI.INT])
    eq(at, np.concatenate([data(i, 3 * p, "i4", salt=9)[3 * r : 3 * r + 3] for i in range(p)]))
    checks += 4

    # v-variants with uneven counts, gaps, every spec form
    counts, displs, n = vlayout(p)
    for root in range(p):
        gv = np.full(n, -1.0)
        comm.Gatherv(data(r, counts[r], salt=10), [gv, (counts, displs), MPI.DOUBLE],
                     root=root)
        if r == root:
            eq(gv, expect_v(p, counts, displs, n, 10))
        rv = np.full(counts[r], -1.0)
        sv = expect_v(p, counts, displs, n, 11, fill=-7.0) if r == root else None
        comm.Scatterv([sv, counts, displs, MPI.DOUBLE] if r == root else None, rv, root=root)
        eq(rv, data(r, counts[r], salt=11))
        checks += 2
    gv = np.full(n, -1.0)
    gv[displs[r] : displs[r] + counts[r]] = data(r, counts[r], salt=12)
    comm.Gatherv(MPI.IN_PLACE if r == 0 else data(r, counts[r], salt=12),
                 [gv, (counts, displs)] if r == 0 else None, root=0)
    if r == 0:
        eq(gv, expect_v(p, counts, displs, n, 12))
    sv = expect_v(p, counts, displs, n, 13)
    keep = sv.copy()
    comm.Scatterv([sv, (counts, displs), MPI.DOUBLE], MPI.IN_PLACE if r == 0 else
                  sv[: counts[r]], root=0)
    if r == 0:
        eq(sv, keep)
    else:
        eq(sv[: counts[r]], data(r, counts[r], salt=13))
    agv = np.full(n, -1.0)
    comm.Allgatherv(data(r, counts[r], salt=14), [agv, counts, displs, MPI.DOUBLE])
    eq(agv, expect_v(p, counts, displs, n, 14))
    agv = np.full(n, -1.0)
    agv[displs[r] : displs[r] + counts[r]] = data(r, counts[r], salt=15)
    comm.Allgatherv(MPI.IN_PLACE, [agv, (counts, displs), MPI.DOUBLE])
    eq(agv, expect_v(p, counts, displs, n, 15))
    # counts as None (an even split, remainder to the first blocks), ints and strided displs
    total = 2 * p + 1
    agv = np.full(total, -1.0)
    share = [total // p + (total % p > i) for i in range(p)]
    comm.Allgatherv(data(r, share[r], salt=16), agv)
    eq(agv, np.concatenate([data(i, share[i], salt=16) for i in range(p)]))
    agv = np.full(3 * p, -1.0)
    comm.Allgatherv(data(r, 2, salt=17), [agv, (2, 3), MPI.DOUBLE])
    ref = np.full(3 * p, -1.0)
    for i in range(p):
        ref[3 * i : 3 * i + 2] = data(i, 2, salt=17)
    eq(agv, ref)
    checks += 7

    # alltoallv: asymmetric counts; in place needs symmetric ones
    sc = [(r + 2 * j) % 3 for j in range(p)]  # I send sc[j] to j
    rc = [(i + 2 * r) % 3 for i in range(p)]  # I receive rc[i] from i
    sd = [sum(sc[:j]) + j for j in range(p)]
    rd = [sum(rc[:i]) + 2 * i + 1 for i in range(p)]
    sbuf = data(r, sum(sc) + p, salt=18)
    rbuf = np.full(sum(rc) + 2 * p + 1, -1.0)
    comm.Alltoallv([sbuf, (sc, sd), MPI.DOUBLE], [rbuf, (rc, rd), MPI.DOUBLE])
    ref = np.full(rbuf.size, -1.0)
    for i in range(p):
        src = data(i, sum((i + 2 * j) % 3 for j in range(p)) + p, salt=18)
        their_sd = [sum((i + 2 * k) % 3 for k in range(j)) + j for j in range(p)]
        ref[rd[i] : rd[i] + rc[i]] = src[their_sd[r] : their_sd[r] + rc[i]]
    eq(rbuf, ref)
    sym = [(r + j) % 3 + 1 for j in range(p)]
    buf = data(r, sum(sym), salt=19)
    comm.Alltoallv(MPI.IN_PLACE, [buf, sym])
    ref = np.concatenate([data(i, sum((i + j) % 3 + 1 for j in range(p)), salt=19)[
        sum((i + j) % 3 + 1 for j in range(r)) :][: sym[i]] for i in range(p)])
    eq(buf, ref)
    checks += 2

    # alltoallw: block j of rank i has (i + j) % 3 + 1 items of INT or DOUBLE by parity
    def wlayout(me: int) -> tuple[list[Any], list[int], list[int], int]:
        types, cs, ds, at = [], [], [], 3
        for j in range(p):
            types.append(MPI.INT if (me + j) % 2 == 0 else MPI.DOUBLE)
            cs.append((me + j) % 3 + 1)
            ds.append(at)
            at += cs[-1] * types[-1].Get_size() + 5
        return types, cs, ds, at

    types, cs, ds, nbytes = wlayout(r)
    wsend = bytearray(nbytes)
    for j in range(p):
        np.frombuffer(wsend, types[j].dtype, cs[j], ds[j])[:] = data(r, cs[j], types[j].dtype,
                                                                     salt=20 + j)
    wrecv = bytearray(b"\xee" * nbytes)
    comm.Alltoallw([wsend, (cs, ds), types], [wrecv, cs, ds, types])
    inplace = bytearray(wsend)
    comm.Alltoallw(MPI.IN_PLACE, [inplace, (cs, ds), types])
    for w in (wrecv, inplace):
        for i in range(p):
            eq(np.frombuffer(w, types[i].dtype, cs[i], ds[i]),
               data(i, cs[i], types[i].dtype, salt=20 + r))
    assert wrecv[:3] == b"\xee" * 3
    checks += 1

    # nonblocking: everything in flight at once, then Waitall
    bc = data(0, 4, salt=30) if r == 0 else np.zeros(4)
    ga = np.zeros(2 * p) if r == 0 else None
    scr = np.zeros(2)
    agr = np.zeros(2 * p)
    atr = np.zeros(p)
    gvr = np.full(n, -1.0)
    svr = np.full(counts[r], -1.0)
    agvr = np.full(n, -1.0)
    avr = np.full(sum(sym), -1.0)
    wr = bytearray(nbytes)
    reqs = [
        comm.Ibarrier(),
        comm.Ibcast(bc, root=0),
        comm.Igather(data(r, 2, salt=31), ga, root=0),
        comm.Iscatter(data(p - 1, 2 * p, salt=32), scr, root=p - 1),
        comm.Iallgather(data(r, 2, salt=33), agr),
        comm.Ialltoall(data(r, p, salt=34), atr),
        comm.Igatherv(data(r, counts[r], salt=35), [gvr, (counts, displs), MPI.DOUBLE],
                      root=p // 2),
        comm.Iscatterv([expect_v(p, counts, displs, n, 36), (counts, displs), MPI.DOUBLE],
                       svr, root=0),
        comm.Iallgatherv(data(r, counts[r], salt=37), [agvr, (counts, displs), MPI.DOUBLE]),
        comm.Ialltoallv([data(r, sum(sym), salt=38), sym], [avr, sym]),
        comm.Ialltoallw([wsend, (cs, ds), types], [wr, (cs, ds), types]),
    ]
    assert all(reqs)
    statuses = [MPI.Status() for _ in reqs]
    MPI.Request.Waitall(reqs, statuses)
    assert not any(reqs) and all(st.Get_source() == MPI.ANY_SOURCE for st in statuses)
    eq(bc, data(0, 4, salt=30))
    if r == 0:
        eq(ga, np.concatenate([data(i, 2, salt=31) for i in range(p)]))
    eq(scr, data(p - 1, 2 * p, salt=32)[2 * r : 2 * r + 2])
    eq(agr, np.concatenate([data(i, 2, salt=33) for i in range(p)]))
    eq(atr, [data(i, p, salt=34)[r] for i in range(p)])
    if r == p // 2:
        eq(gvr, expect_v(p, counts, displs, n, 35))
    eq(svr, data(r, counts[r], salt=36))
    eq(agvr, expect_v(p, counts, displs, n, 37))
    eq(avr, np.concatenate([data(i, sum((i + j) % 3 + 1 for j in range(p)), salt=38)[
        sum((i + j) % 3 + 1 for j in range(r)) :][: sym[i]] for i in range(p)]))
    for i in range(p):
        eq(np.frombuffer(wr, types[i].dtype, cs[i], ds[i]),
           data(i, cs[i], types[i].dtype, salt=20 + r))
    req = comm.Ibcast(bc, root=0)
    while not req.Test():
        pass
    checks += 12

    # argument errors name the call and argument
    with pytest.raises(ValueError, match=r"Allgather\(sendbuf\) has 24 bytes"):
        comm.Allgather(np.zeros(3), np.zeros(2 * p))
    if p > 1:
        with pytest.raises(ValueError, match=r"Allgather\(recvbuf\).*equal blocks"):
            comm.Allgather(np.zeros(2), np.zeros(2 * p + 1))
    with pytest.raises(ValueError, match=r"Scatter\(recvbuf\) has 8 bytes"):
        comm.Scatter(np.zeros(2 * p), np.zeros(1), root=r)
    with pytest.raises(ValueError, match="counts"):
        comm.Allgatherv(np.zeros(1), [np.zeros(p + 1), [1] * (p + 1)])
    with pytest.raises(ValueError, match="outside"):
        comm.Allgatherv(np.zeros(1), [np.zeros(p), [1] * p, [p] * p, MPI.DOUBLE])
    comm.Barrier()
    return checks


# ------------------------------------------------------------------------------ reductions
def _affine(invec: Any, inoutvec: Any, datatype: Any) -> None:
    """(a, b) pairs are maps x -> a*x + b: inoutvec becomes invec, then inoutvec."""
    assert datatype is MPI.TWOINT
    f = np.frombuffer(invec, dtype="i4").reshape(-1, 2)
    g = np.frombuffer(inoutvec, dtype="i4").reshape(-1, 2)
    g[:, 1] = f[:, 1] * g[:, 0] + g[:, 1]
    g[:, 0] = f[:, 0] * g[:, 0]


def maps(rank: int, k: int, salt: int = 0) -> np.ndarray:
    m = np.empty((k, 2), "i4")
    m[:, 0] = (np.arange(k) + rank + salt) % 2 + 1
    m[:, 1] = (np.arange(k) * 3 + rank * 5 + salt) % 11 - 5
    return m


def compose(ms: list[np.ndarray]) -> np.ndarray:
    out = ms[0].copy()
    for g in ms[1:]:
        out = np.stack([out[:, 0] * g[:, 0], out[:, 1] * g[:, 0] + g[:, 1]], axis=1)
    return out.astype("i4")


def _reductions(_: object) -> int:
    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()
    eq = np.testing.assert_array_equal
    checks = 0

    ints = [(data(i, 6, "i4", salt=1) % 7 + 1) for i in range(p)]
    refs = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
            "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor,
            "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor}
    for name, uf in refs.items():
        vals = [v * (i % 2) if name.startswith("L") else v for i, v in enumerate(ints)]
        ref = uf.reduce(np.stack(vals)).astype("i4")
        got = np.full(6, -1, "i4")
        comm.Allreduce(vals[r], got, op=getattr(MPI, name))
        eq(got, ref)
        for root in range(p):
            got = np.full(6, -1, "i4")
            comm.Reduce([vals[r], MPI.INT], [got, MPI.INT], getattr(MPI, name), root)
            eq(got, ref if r == root else np.full(6, -1, "i4"))
        checks += 1 + p

    floats = [data(i, 7, salt=2) for i in range(p)]
    total = np.sum(floats, axis=0)
    x = floats[r].copy()
    comm.Allreduce(MPI.IN_PLACE, x)
    eq(x, total)
    x = floats[r].copy()
    comm.Allreduce(x, x)  # the same memory twice runs in place (as in mpi4py 4.1+)
    eq(x, total)
    x = floats[r].copy()
    comm.Reduce(MPI.IN_PLACE if r == 0 else x, x if r == 0 else None)
    if r == 0:
        eq(x, total)
    c = data(r, 3, "c16", salt=3)
    rc = np.zeros(3, "c16")
    comm.Allreduce(c, rc, op=MPI.PROD)
    eq(rc, np.prod([data(i, 3, "c16", salt=3) for i in range(p)], axis=0))
    checks += 4

    # reduce_scatter_block / reduce_scatter (uneven, agreed, in place)
    full = [data(i, 3 * p, salt=4) for i in range(p)]
    rs = np.zeros(3)
    comm.Reduce_scatter_block(full[r], rs, op=MPI.SUM)
    eq(rs, np.sum(full, axis=0)[3 * r : 3 * r + 3])
    rs = full[r].copy()
    comm.Reduce_scatter_block(MPI.IN_PLACE, rs, op=MPI.MAX)
    eq(rs[:3], np.max(full, axis=0)[3 * r : 3 * r + 3])
    counts = [(2 * i + 1) % 4 for i in range(p)]
    at = [sum(counts[:i]) for i in range(p)]
    vec = [data(i, sum(counts), salt=5) for i in range(p)]
    ref = np.sum(vec, axis=0)[at[r] : at[r] + counts[r]]
    for given in (counts, None):
        got = np.full(counts[r], -1.0)
        comm.Reduce_scatter(vec[r], got, given, MPI.SUM)
        eq(got, ref)
    buf = vec[r].copy()
    comm.Reduce_scatter(MPI.IN_PLACE, buf, counts, MPI.SUM)
    eq(buf[: counts[r]], ref)
    checks += 5

    # scans
    ranks_ints = [data(i, 4, "i8", salt=6) for i in range(p)]
    sc = np.zeros(4, "i8")
    comm.Scan(ranks_ints[r], sc)
    eq(sc, np.sum(ranks_ints[: r + 1], axis=0))
    ex = np.full(4, -9, "i8")
    comm.Exscan(ranks_ints[r], ex)
    eq(ex, np.sum(ranks_ints[:r], axis=0) if r else np.full(4, -9, "i8"))
    sc = ranks_ints[r].copy()
    comm.Scan(MPI.IN_PLACE, sc, op=MPI.MAX)
    eq(sc, np.max(ranks_ints[: r + 1], axis=0))
    ex = ranks_ints[r].copy()
    comm.Exscan(MPI.IN_PLACE, ex, op=MPI.MIN)
    eq(ex, np.min(ranks_ints[:r], axis=0) if r else ranks_ints[r])
    checks += 4

    # MAXLOC / MINLOC on every pair type, ties going to the smaller index
    for dt in (MPI.DOUBLE_INT, MPI.FLOAT_INT, MPI.LONG_INT, MPI.SHORT_INT, MPI.TWOINT,
               MPI.LONG_DOUBLE_INT):
        assert dt.dtype.itemsize == dt.extent and dt.Get_size() <= dt.extent
        pairs = []
        for i in range(p):
            a = np.zeros(4, dt.dtype)
            a["v"] = [i % 2, -i, (i * 7) % 3, 5]
            a["i"] = [i, 10 * i, 100 + i, p - 1 - i]
            pairs.append(a)
        for op, pick in ((MPI.MAXLOC, np.argmax), (MPI.MINLOC, np.argmin)):
            got = np.zeros(4, dt.dtype)
            comm.Allreduce([pairs[r], dt], [got, dt], op=op)
            for k in range(4):
                v = np.array([pairs[i]["v"][k] for i in range(p)])
                best = v[pick(v)]
                idx = min(pairs[i]["i"][k] for i in range(p) if v[i] == best)
                assert (got["v"][k], got["i"][k]) == (best, idx), (dt, op, k)
        checks += 2

    # a non-commutative user op, applied in rank order by every collective and root
    op = MPI.Op.Create(_affine, commute=False)
    for k in (1, 3, 200):
        mine = maps(r, k)
        everyone = [maps(i, k) for i in range(p)]
        whole = compose(everyone)
        for root in range(p):
            got = np.zeros((k, 2), "i4")
            comm.Reduce([mine, MPI.TWOINT], [got, MPI.TWOINT], op=op, root=root)
            if r == root:
                eq(got, whole)
        got = np.zeros((k, 2), "i4")
        comm.Allreduce([mine, MPI.TWOINT], [got, MPI.TWOINT], op=op)
        eq(got, whole)
        got = np.zeros((k, 2), "i4")
        comm.Scan([mine, MPI.TWOINT], [got, MPI.TWOINT], op=op)
        eq(got, compose(everyone[: r + 1]))
        got = np.full((k, 2), 7, "i4")
        comm.Exscan([mine, MPI.TWOINT], [got, MPI.TWOINT], op=op)
        eq(got, compose(everyone[:r]) if r else np.full((k, 2), 7, "i4"))
        blocks = [maps(i, k * p, salt=1) for i in range(p)]
        got = np.zeros((k, 2), "i4")
        comm.Reduce_scatter_block([blocks[r], MPI.TWOINT], [got, MPI.TWOINT], op=op)
        eq(got, compose(blocks)[k * r : k * (r + 1)])
        checks += p + 4
    local = maps(r + 1, 3)
    op.Reduce_local([maps(r, 3), MPI.TWOINT], [local, MPI.TWOINT])
    eq(local, compose([maps(r, 3), maps(r + 1, 3)]))

    # a commutative user op writing through mpi4py-style byte buffers (array.array)
    def vmax(a: Any, b: Any, dt: Any) -> None:
        x, y = array.array("d", bytes(a)), array.array("d", bytes(b))
        b[:] = array.array("d", map(max, x, y))

    vop = MPI.Op.Create(vmax, commute=True)
    got = np.zeros(7)
    comm.Allreduce(floats[r], got, op=vop)
    eq(got, np.max(floats, axis=0))
    assert vop.is_commutative and not op.is_commutative
    checks += 2

    # nonblocking reductions together
    outs = [np.zeros(6, "i4"), np.zeros(6, "i4"), np.zeros(3), np.full(4, -9, "i8"),
            np.zeros(4, "i8"), np.zeros((3, 2), "i4"), np.full(counts[r], -1.0)]
    reqs = [comm.Iallreduce(ints[r], outs[0], op=MPI.MAX),
            comm.Ireduce(ints[r], outs[1], op=MPI.SUM, root=p - 1),
            comm.Ireduce_scatter_block(full[r], outs[2], op=MPI.MIN),
            comm.Iexscan(ranks_ints[r], outs[3]),
            comm.Iscan(ranks_ints[r], outs[4], op=MPI.PROD),
            comm.Iallreduce([maps(r, 3), MPI.TWOINT], [outs[5], MPI.TWOINT], op=op),
            comm.Ireduce_scatter(vec[r], outs[6], counts, op=MPI.SUM)]
    MPI.Request.Waitall(reqs)
    eq(outs[0], np.max(ints, axis=0))
    if r == p - 1:
        eq(outs[1], np.sum(ints, axis=0))
    eq(outs[2], np.min(full, axis=0)[3 * r : 3 * r + 3])
    eq(outs[3], np.sum(ranks_ints[:r], axis=0) if r else np.full(4, -9))
    eq(outs[4], np.prod(ranks_ints[: r + 1], axis=0))
    eq(outs[5], compose([maps(i, 3) for i in range(p)]))
    eq(outs[6], ref)
    checks += 7

    # argument errors
    with pytest.raises(ValueError, match="count"):
        comm.Allreduce(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="datatypes"):
        comm.Allreduce(np.zeros(3, "f4"), np.zeros(3))
    with pytest.raises(TypeError, match="bxor"):
        comm.Allreduce(np.zeros(3), np.zeros(3), op=MPI.BXOR)
    with pytest.raises(MPI.Exception):
        comm.Allreduce(np.zeros(3), np.zeros(3), op=MPI.OP_NULL)
    with pytest.raises(TypeError, match="recvcounts"):
        comm.Reduce_scatter(MPI.IN_PLACE, np.zeros(p))
    comm.Barrier()
    op.Free()
    return checks


# ------------------------------------------------------------------------------ objects, comms
def _objects_and_comms(_: object) -> int:
    world = MPI.COMM_WORLD
    r, p = world.Get_rank(), world.Get_size()
    checks = 0

    for root in range(p):
        mine = {"rank": r, "list": [r]}
        got = world.bcast(mine, root=root)
        assert got == {"rank": root, "list": [root]}
        assert got is not mine  # a copy at the root too, as mpi4py's unpickling gives
        gathered = world.gather([r, "x" * r], root=root)
        assert gathered == ([[i, "x" * i] for i in range(p)] if r == root else None)
        scattered = world.scatter([(root, i) for i in range(p)] if r == root else None,
                                  root=root)
        assert scattered == (root, r)
        assert world.reduce([r], op=MPI.SUM, root=root) == (list(range(p)) if r == root
                                                             else None)
        checks += 4
    assert world.allgather({r}) == [{i} for i in range(p)]
    assert world.alltoall([(r, j) for j in range(p)]) == [(i, r) for i in range(p)]
    assert world.allreduce(f"<{r}>") == "".join(f"<{i}>" for i in range(p))
    assert world.allreduce((r % 2, r), op=MPI.MAXLOC) == ((1, 1) if p > 1 else (0, 0))
    assert world.allreduce([-(r % 3), r], op=MPI.MINLOC) == (
        (-2, 2) if p > 2 else (-1, 1) if p == 2 else [0, 0])  # one value: no op, a copy
    assert world.scan([r]) == list(range(r + 1))
    assert world.exscan([r]) == (list(range(r)) if r else None)
    assert world.allreduce((r, 2 * r), op=lambda a, b: (a[0], b[1])) == (0, 2 * (p - 1))
    seen: list[Any] = []

    def cat(a: Any, b: Any, dt: Any) -> Any:
        seen.append(dt)
        return a + b

    cat_op = MPI.Op.Create(cat, commute=False)
    assert world.allreduce(str(r), op=cat_op) == "".join(map(str, range(p)))
    assert world.scan((r,), op=cat_op) == tuple(range(r + 1))
    assert all(dt is None for dt in seen)
    assert world.exscan(r, op=MPI.MAX) == (r - 1 if r else None)
    assert MPI.SUM(2, 3) == 5 and MPI.MAXLOC([3, 1], [3, 0]) == (3, 0) and cat_op("a", "b") == "ab"
    world.barrier()
    checks += 12

    # communicator management
    dup = world.Dup()
    assert isinstance(dup, MPI.Intracomm) and dup and dup.Get_size() == p
    assert world.Compare(dup) == MPI.CONGRUENT and world.Compare(world) == MPI.IDENT
    assert dup.Compare(world.Clone()) == MPI.CONGRUENT
    idup, req = world.Idup()
    req.Wait()
    assert idup.allreduce(1) == p
    # collectives on two communicators in flight at once stay apart
    a, b = np.zeros(p), np.zeros(p)
    reqs = [world.Iallgather(np.array([float(r)]), a),
            dup.Iallgather(np.array([float(r + 100)]), b)]
    MPI.Request.Waitall(reqs)
    np.testing.assert_array_equal(a, np.arange(p))
    np.testing.assert_array_equal(b, np.arange(p) + 100)
    checks += 4

    colors = [i % 3 if i != 1 else MPI.UNDEFINED for i in range(p)]
    keys = [(-i) % 4 for i in range(p)]
    sub = world.Split(colors[r], keys[r])
    if colors[r] == MPI.UNDEFINED:
        assert sub == MPI.COMM_NULL and not sub and isinstance(sub, MPI.Intracomm)
    else:
        members = sorted((keys[i], i) for i in range(p) if colors[i] == colors[r])
        order = [i for _, i in members]
        assert sub.Get_size() == len(order) and sub.Get_rank() == order.index(r)
        assert sub.Get_group().Translate_ranks(None, world.Get_group()) == order
        got = np.zeros(len(order))
        sub.Allgather(np.array([float(r)]), got)
        np.testing.assert_array_equal(got, order)
        assert sub.allreduce([r]) == order
        sub.Free()
        assert sub == MPI.COMM_NULL
    shared = world.Split_type(MPI.COMM_TYPE_SHARED, key=-r)
    assert shared.Get_size() == p and shared.Get_rank() == p - 1 - r
    assert world.Compare(shared) == (MPI.SIMILAR if p > 1 else MPI.CONGRUENT)
    assert world.Split_type(MPI.UNDEFINED) == MPI.COMM_NULL
    checks += 3

    g = world.Get_group()
    assert (g.Get_size(), g.Get_rank()) == (p, r) and g == world.group
    picked = g.Incl(list(range(p - 1, -1, -2)))
    assert picked.Get_rank() == (picked.Translate_ranks(None, g).index(r)
                                 if r in picked.Translate_ranks(None, g) else MPI.UNDEFINED)
    made = world.Create(picked)
    if r in range(p - 1, -1, -2):
        assert made.Get_size() == picked.Get_size() and made.Get_rank() == picked.Get_rank()
        assert made.allgather(r) == list(range(p - 1, -1, -2))
    else:
        assert made == MPI.COMM_NULL
    odd = g.Excl(list(range(0, p, 2)))
    if r % 2:
        og = world.Create_group(odd.Range_incl([(odd.Get_size() - 1, 0, -1)]), tag=3)
        assert og.allgather(r) == list(range(p - 1 - (p % 2 == 1), 0, -2))
        assert og.Get_group().Compare(odd) == (MPI.IDENT if og.Get_size() == 1 else
                                               MPI.SIMILAR)
    else:
        assert odd.Get_rank() == MPI.UNDEFINED
    # a Create_group on the evens meanwhile, on the same tag: groups keep them apart
    if r % 2 == 0:
        eg = world.Create_group(g.Excl(list(range(1, p, 2))), tag=3)
        assert eg.allgather(r) == list(range(0, p, 2))
    world.Barrier()
    checks += 4

    # freeing, and the null communicator
    dup.Free()
    assert dup == MPI.COMM_NULL
    for call in (dup.Get_size, dup.Barrier, lambda: dup.allreduce(1), dup.Dup, dup.Free):
        with pytest.raises(MPI.Exception):
            call()
    with pytest.raises(MPI.Exception):
        world.Free()
    world.Barrier()
    return checks


# ------------------------------------------------------------------------------ the fast paths
def _fast_paths(_: object) -> int:
    """Allreduce, Send and Recv of plain 1-D arrays skip the buffer validation (the native
    call gets the user's arrays). Every form that takes that path, and every one beside it
    that must not (aliasing, other datatypes, strides, non-predefined ops), gives what the
    validated path gives, repeated over the same arrays (the native repeat path) and not."""
    from ringworld.mpi._buffer import plain_array

    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()
    eq = np.testing.assert_array_equal
    checks = 0
    for dtype, mpitype in (("f8", MPI.DOUBLE), ("i4", MPI.INT), ("u1", MPI.BYTE),
                           ("c8", MPI.C_FLOAT_COMPLEX), ("?", MPI.C_BOOL)):
        n = 7
        send = data(r, n, dtype, salt=3) if dtype != "?" else np.arange(n) % (r + 2) == 0
        every = [data(i, n, dtype, salt=3) if dtype != "?" else np.arange(n) % (i + 2) == 0
                 for i in range(p)]
        want = np.sum(every, axis=0, dtype=dtype) if dtype != "?" else np.any(every, axis=0)
        op = MPI.SUM if dtype != "?" else MPI.LOR
        for form in range(4):
            recv = np.zeros(n, dtype)
            for _ in range(3):  # the same arrays again: the repeat path
                if form == 0:
                    comm.Allreduce(send, recv, op)
                elif form == 1:
                    comm.Allreduce([send, mpitype], [recv, mpitype], op)
                elif form == 2:
                    recv[...] = send
                    comm.Allreduce(MPI.IN_PLACE, recv, op)
                else:  # a view of the same memory as recvbuf: in place, as mpi4py runs it
                    recv[...] = send
                    comm.Allreduce(recv[:], recv, op)
                eq(recv, want)
                checks += 1
    # what must take the validated path, with its answers and errors
    x = data(r, 8)
    assert plain_array(x, True) is x and plain_array([x, MPI.DOUBLE], False) is x
    for spec in ([x, MPI.INT], [x, 2.5], [x, None], x[::2], x.reshape(2, 4), x.astype(">f8"),
                 np.zeros(3, "f2"), (x, MPI.FLOAT), [x, 8, MPI.DOUBLE]):
        assert plain_array(spec, False) is None, spec
    ro = data(r, 8)
    ro.flags.writeable = False
    assert plain_array(ro, False) is ro and plain_array(ro, True) is None
    with pytest.raises(TypeError, match="read-only"):
        comm.Allreduce(x, ro)
    with pytest.raises(ValueError, match="mismatch in send count 4 and receive count 8"):
        comm.Allreduce(x[:4], np.zeros(8))
    with pytest.raises(TypeError, match=r"datatype must be an MPI\.Datatype"):
        comm.Allreduce([x, 2.5], np.zeros(8))
    def add(a: Any, b: Any, t: Any) -> None:  # mpi4py's form: raw buffers and the datatype
        out = np.frombuffer(b, "f8")
        out += np.frombuffer(a, "f8")

    user = MPI.Op.Create(add, commute=True)
    got = np.zeros(8)
    comm.Allreduce(x, got, user)  # a user op: validated path
    eq(got, sum(data(i, 8) for i in range(p)))
    user.Free()
    # Send/Recv of plain arrays and of the forms beside them, status included
    if p > 1:
        right, left = (r + 1) % p, (r - 1) % p
        for buf in (data(r, 5), data(r, 5, "i2"), data(r, 6)[::2].copy()):
            got = np.zeros_like(buf)
            st = MPI.Status()
            if r % 2 == 0:
                comm.Send(buf, right, tag=4)
                comm.Recv(got, left, tag=4, status=st)
            else:
                comm.Recv(got, left, tag=4, status=st)
                comm.Send(buf, right, tag=4)
            eq(got, buf - r * 1000 + left * 1000)
            assert st.Get_source() == left and st.Get_count(MPI.BYTE) == buf.nbytes
            checks += 1
        short = np.zeros(2)
        if r == 0:
            comm.Send(data(0, 5), 1, tag=5)
        elif r == 1:  # as the validated path raises it (a bytearray takes that one)
            with pytest.raises(TruncationError, match=r"40 bytes .* only 16 bytes"):
                comm.Recv(short, 0, tag=5)
        if r == 0:
            comm.Send(data(0, 5), 1, tag=6)
        elif r == 1:
            with pytest.raises(TruncationError, match=r"40 bytes .* only 16 bytes"):
                comm.Recv(bytearray(16), 0, tag=6)
    comm.Barrier()
    return checks


def _repeats(_: object) -> int:
    """The repeat path of the buffer collectives (Bcast, Allgather, Alltoall, Allreduce,
    Reduce, Reduce_scatter_block): repeated on the same arrays with new data each time, on new
    arrays of the same shape, with other datatypes per rank (bytes move as bytes), beside
    native calls on the same arrays, and while a tool observes; a read-only buffer of a kept
    shape still fails as the checks say, and the communicator stays usable."""
    import ringworld
    from ringworld.collective.cache import AdapterKey
    from ringworld.comm import hooks

    comm = MPI.COMM_WORLD
    native = ringworld.world()
    r, p = comm.Get_rank(), comm.Get_size()
    eq = np.testing.assert_array_equal
    checks = 0
    n = 5

    def one_round(salt: int, fresh: bool, mixed: bool) -> None:
        nonlocal checks
        # mixed: odd ranks see their float32 data as int32 (the same bytes)
        def own(dtype: str, q: int, count: int) -> np.ndarray:
            return data(q, count, dtype, salt)

        def typed(a: np.ndarray) -> np.ndarray:
            return a.view("i4") if mixed and r % 2 else a

        root = salt % p
        buf = typed(own("f4", r, n).copy() if r == root else np.zeros(n, "f4"))
        comm.Bcast(buf, root)
        eq(buf.view("f4"), own("f4", root, n))
        send = typed(own("f4", r, n))
        got = typed(np.zeros(n * p, "f4")) if fresh or salt == 0 else gathered
        comm.Allgather(send, got)
        eq(got.view("f4"), np.concatenate([own("f4", q, n) for q in range(p)]))
        blocks = typed(data(r, n * p, "f4", salt))
        into = typed(np.zeros(n * p, "f4"))
        comm.Alltoall(blocks, into)
        eq(into.view("f4"), np.concatenate([data(q, n * p, "f4", salt)[r * n:(r + 1) * n]
                                            for q in range(p)]))
        x, total = data(r, n, "f8", salt), np.zeros(n)
        comm.Allreduce(x, total, MPI.SUM)
        eq(total, sum(data(q, n, "f8", salt) for q in range(p)))
        comm.Allreduce(x, total, MPI.MAX)
        eq(total, data(p - 1, n, "f8", salt))
        at = np.full(n, -1.0) if r == root or salt % 2 else None  # None: kept under x
        comm.Reduce(x, at, MPI.SUM, root)
        if r == root:
            eq(at, sum(data(q, n, "f8", salt) for q in range(p)))
        elif at is not None:
            eq(at, np.full(n, -1.0))  # ignored off the root
        eq(x, data(r, n, "f8", salt))
        part = np.zeros(n, "i8")
        comm.Reduce_scatter_block(data(r, n * p, "i8", salt), part, MPI.SUM)
        eq(part, sum(data(q, n * p, "i8", salt) for q in range(p))[r * n:(r + 1) * n])
        # Gather and Scatter: off the root the unused buffer is None in odd rounds (kept under
        # the other one), an ignored array in even ones (left untouched)
        whole = typed(np.full(n * p, -1.0, "f4")) if r == root or salt % 2 == 0 else None
        comm.Gather(send, whole, root)
        if r == root:
            eq(whole.view("f4"), np.concatenate([own("f4", q, n) for q in range(p)]))
        elif whole is not None:
            eq(whole.view("f4"), np.full(n * p, -1.0, "f4"))
        src = typed(data(root, n * p, "f4", salt)) if r == root or salt % 2 == 0 else None
        mine = typed(np.zeros(n, "f4"))
        comm.Scatter(src, mine, root)
        eq(mine.view("f4"), data(root, n * p, "f4", salt)[r * n:(r + 1) * n])
        if src is not None:
            eq(src.view("f4"), data(root, n * p, "f4", salt))
        prefix = np.full(n, -1.0)
        comm.Scan(x, prefix, MPI.SUM)
        eq(prefix, sum(data(q, n, "f8", salt) for q in range(r + 1)))
        prefix[:] = -1.0
        comm.Exscan(x, prefix, MPI.MAX)
        eq(prefix, data(r - 1, n, "f8", salt) if r else np.full(n, -1.0))
        checks += 1

    gathered = np.zeros(n * p, "f4")
    for salt in range(4):  # the same receive arrays (Allgather) and new ones of one shape
        one_round(salt, fresh=False, mixed=False)
        one_round(salt, fresh=True, mixed=False)
    for salt in range(3):
        one_round(salt, fresh=True, mixed=True)
    if native._arena is not None:  # shared windows: the repeats ran there, under our keys
        kept = native._cache.last
        assert isinstance(kept["allgather"][2], AdapterKey), kept["allgather"]
        assert isinstance(kept["allreduce"][2], AdapterKey), kept["allreduce"]
        assert isinstance(kept["reduce"][2][0], AdapterKey), kept["reduce"]
        for coll in ("gather", "scatter", "scan", "exscan"):
            assert isinstance(kept[coll][2], AdapterKey), kept[coll]
    # mpi4py's common form, [array, datatype] (a new list each call): repeats run no checks
    f4, f8, i8 = MPI.FLOAT, MPI.DOUBLE, MPI.INT64_T
    runs: list[Any] = []
    checked = native._run

    def counted_run(*args: Any, **kwargs: Any) -> Any:
        runs.append(args[0])
        return checked(*args, **kwargs)

    for time in range(4):
        if time == 1:
            native._run = counted_run  # type: ignore[method-assign]
        buf = data(0, n, "f4", time) if r == 0 else np.zeros(n, "f4")
        comm.Bcast([buf, f4], 0)
        eq(buf, data(0, n, "f4", time))
        send, got = data(r, n, "f4", time), np.zeros(n * p, "f4")
        comm.Allgather([send, f4], [got, f4])
        eq(got, np.concatenate([data(q, n, "f4", time) for q in range(p)]))
        blocks, into = data(r, n * p, "f4", time), np.zeros(n * p, "f4")
        comm.Alltoall([blocks, f4], [into, f4])
        eq(into, np.concatenate([data(q, n * p, "f4", time)[r * n:(r + 1) * n]
                                 for q in range(p)]))
        x, total = data(r, n, "f8", time), np.zeros(n)
        comm.Allreduce([x, f8], [total, f8], MPI.SUM)
        eq(total, sum(data(q, n, "f8", time) for q in range(p)))
        # (an op no call before used: its key is made here, not by Allreduce)
        comm.Reduce([x, f8], [total, f8] if r == 0 else None, MPI.MIN, 0)
        if r == 0:
            eq(total, data(0, n, "f8", time))
        part = np.zeros(n, "i8")
        comm.Reduce_scatter_block([data(r, n * p, "i8", time), i8], [part, i8], MPI.SUM)
        eq(part, sum(data(q, n * p, "i8", time) for q in range(p))[r * n:(r + 1) * n])
        whole = np.zeros(n * p, "f4")
        comm.Gather([send, f4], [whole, f4] if r == 0 else None, 0)
        if r == 0:
            eq(whole, np.concatenate([data(q, n, "f4", time) for q in range(p)]))
        mine = np.zeros(n, "f4")
        comm.Scatter([blocks, f4] if r == 0 else None, [mine, f4], 0)
        eq(mine, data(0, n * p, "f4", time)[r * n:(r + 1) * n])
        comm.Scan([x, f8], [total, f8], MPI.SUM)
        eq(total, sum(data(q, n, "f8", time) for q in range(r + 1)))
        checks += 1
    del native._run
    if native._arena is not None:
        assert runs == [], runs  # every repeat took the repeat path
        # ... ringworld.MPI's, not the native one behind the MPI layer's checks
        assert native._cache.last["reduce"][2][0] == AdapterKey("MPI_MIN", False)
    # native calls on the same arrays keep their own (typed) semantics
    send, got = data(r, n, "f4"), np.zeros(n * p, "f4")
    for _ in range(2):
        comm.Allgather(send, got)
        native.allgather(send, got)
        eq(got, np.concatenate([data(q, n, "f4") for q in range(p)]))
        x, total = data(r, n), np.zeros(n)
        native.allreduce(x, total)
        comm.Allreduce(x, total, MPI.SUM)
        eq(total, sum(data(q, n) for q in range(p)))
        checks += 1
    # the repeat path holds no array but small ones that own their memory (by their byte
    # views, for speed): a bytearray under the arrays can grow again, a large array is freed
    from ringworld.collective.cache import HELD_BYTES

    under = bytearray(8 * n * (p + 1))
    mem = np.frombuffer(under, "f8")
    mem[:n] = data(r, n)
    for _ in range(2):
        comm.Allgather(mem[:n], mem[n:])
    eq(mem[n:], np.concatenate([data(q, n) for q in range(p)]))
    del mem
    under.extend(b"more")  # BufferError while any array still holds its memory
    big = np.zeros(HELD_BYTES // 8 + 1)
    big_all = np.zeros(big.size * p)
    for _ in range(2):
        comm.Allgather(big, big_all)
    gone = weakref.ref(big_all)
    del big_all
    assert gone() is None
    checks += 1
    # a read-only buffer of a kept shape fails as the checks say; nothing is left half-done
    ro = np.zeros(n * p, "f4")
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        comm.Allgather(send, ro)
    comm.Allgather(send, got)
    eq(got, np.concatenate([data(q, n, "f4") for q in range(p)]))
    # while a tool observes, every call goes through the native methods it wraps
    seen: list[str] = []

    def wrap(mark: Any, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return fn(*args, **kwargs)
        return counted

    hooks.observe(wrap)
    right, left = (r + 1) % p, (r - 1) % p
    into = np.zeros(n, "i8")
    try:
        for i in range(3):
            comm.Allgather(send, got)
            comm.Allreduce(x, total, MPI.SUM)
            comm.Bcast(got, 0)
            # (and so do the point-to-point calls, whose fast paths skip the native ones)
            MPI.Request.Waitall([comm.Irecv(into, left, i), comm.Isend(data(r, n, "i8", i),
                                                                       right, i)])
            eq(into, data(left, n, "i8", i))
    finally:
        hooks.unobserve()
    assert seen.count("allgather") == 3 and seen.count("allreduce") == 3, seen
    assert seen.count("bcast") == 3, seen
    assert seen.count("isend") == 3 and seen.count("irecv") == 3, seen
    comm.Barrier()
    return checks


TOPICS = {"movement": _movement, "reductions": _reductions, "objects_comms": _objects_and_comms,
          "fast_paths": _fast_paths, "repeats": _repeats}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_collectives(topic: str, size: int) -> None:
    checks = run_processes(size, TOPICS[topic], timeout=60)
    assert len(set(checks)) == 1 and checks[0] > 0


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_collectives_over_tcp(topic: str) -> None:
    run_processes(3, TOPICS[topic], transport="tcp", timeout=60)


def _mismatch(_: object) -> None:
    comm = MPI.COMM_WORLD
    comm.Allreduce(np.zeros(2 + comm.Get_rank()), np.zeros(2 + comm.Get_rank()))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_mismatched_sizes_fail_rather_than_corrupt(transport: str) -> None:
    # messages: the rank with the smaller buffer gets more than fits; shared memory: every
    # rank compares the call signatures at the first sync
    with pytest.raises(RankFailed, match=r"TruncationError|MismatchError"):
        run_processes(2, _mismatch, transport=transport, timeout=30)


# ------------------------------------------------------------------------------ local
def test_the_spec_repeat_takes_only_arrays_with_their_own_datatype() -> None:
    from ringworld.mpi._collectives import _again_specs

    class Native:  # stands for the communicator: records what the repeat path was given
        def __init__(self) -> None:
            self.got: list[tuple[Any, Any]] = []

        def _again(self, coll: str, s: Any, r: Any, key: Any, timeout: Any) -> bool:
            self.got.append((s, r))
            return True

    x = np.zeros(3, np.float32)
    y = np.zeros(3, np.int64)
    for send, recv, want in (([x, MPI.FLOAT], [x, MPI.FLOAT], (x, x)),
                             (x, (x, MPI.FLOAT), (x, x)),
                             ((y, MPI.INT64_T), [x, MPI.FLOAT], (y, x)),
                             (MPI.IN_PLACE, [y, MPI.INT64_T], (MPI.IN_PLACE, y))):
        native = Native()
        assert _again_specs(native, "allgather", send, recv, None)  # type: ignore[arg-type]
        (s, r), = native.got
        assert s is want[0] and r is want[1]
    one = [x, MPI.FLOAT]  # Bcast's form: one spec as both buffers
    native = Native()
    assert _again_specs(native, "bcast", one, one, None)  # type: ignore[arg-type]
    (s, r), = native.got
    assert s is x and r is x
    wrong = [x, MPI.INT]
    assert not _again_specs(Native(), "bcast", wrong, wrong, None)  # type: ignore[arg-type]
    others = ([x, MPI.INT], [x, MPI.DOUBLE], [x], [x, 3, MPI.FLOAT], [x, None],
              [x.tolist(), MPI.FLOAT], [bytearray(12), MPI.FLOAT], "ab", None,
              bytearray(4), {"a": 1}, MPI.IN_PLACE)
    for other in others:
        for send, recv in ((other, [x, MPI.FLOAT]), ([x, MPI.FLOAT], other)):
            if send is MPI.IN_PLACE:
                continue  # (in place is a send buffer's form)
            native = Native()
            assert not _again_specs(native, "allgather", send, recv, None), (send, recv)  # type: ignore[arg-type]
            assert native.got == []


def test_pair_datatypes() -> None:
    assert (MPI.DOUBLE_INT.Get_size(), MPI.DOUBLE_INT.Get_extent()) == (12, (0, 16))
    assert (MPI.TWOINT.size, MPI.TWOINT.extent, MPI.TWOINT.name) == (8, 8, "MPI_2INT")
    assert MPI.INT_INT is MPI.TWOINT
    assert (MPI.SHORT_INT.size, MPI.SHORT_INT.extent) == (6, 8)
    assert MPI.DOUBLE_INT.dtype.names == ("v", "i")
    c_layout = np.dtype([("value", "f8"), ("index", "i4")], align=True)
    assert MPI.from_numpy_dtype(c_layout) is MPI.DOUBLE_INT
    with pytest.raises(TypeError):
        MPI.from_numpy_dtype(np.dtype([("a", "f8"), ("b", "f8")]))
    st = MPI.Status()
    st.Set_elements(MPI.DOUBLE_INT, 3)
    assert st.Get_count(MPI.DOUBLE_INT) == 3


def test_op_semantics_without_a_world() -> None:
    assert MPI.SUM(2, 3) == 5 and MPI.PROD(2, 3) == 6 and MPI.MAX(2, 3) == 3
    assert MPI.MIN("b", "a") == "a" and MPI.LXOR(1, 1) is False and MPI.BOR(4, 1) == 5
    assert MPI.MAXLOC((1, 2), (1, 0)) == (1, 0) and MPI.MINLOC([3, 1], [2, 0]) == (2, 0)
    op = MPI.Op.Create(lambda a, b, dt: (a, b, dt))
    assert op(1, 2) == (1, 2, None)
    with pytest.raises(MPI.Exception):
        MPI.OP_NULL(1, 2)
    op.Free()
    assert op == MPI.OP_NULL and not op
    with pytest.raises(MPI.Exception):
        op.Free()
    inout = np.array([1.0, 5.0])
    MPI.MAX.Reduce_local(np.array([3.0, 2.0]), inout)
    assert inout.tolist() == [3.0, 5.0]

    def swap_bytes(a: Any, b: Any, dt: Any) -> None:  # mpi4py's buffers: bytes, len in bytes
        assert dt is MPI.INT and len(a) == len(b) == 8
        b[:] = array.array("i", [a[0], b[0]])

    inout = np.array([10, 20], "i4")
    MPI.Op.Create(swap_bytes).Reduce_local(np.array([7, 8], "i4"), inout)
    assert inout.tolist() == [7, 10]


def test_groups_without_a_world() -> None:
    g = MPI.Group._make(range(6), 2)
    assert (g.Get_size(), g.Get_rank(), g.size, g.rank) == (6, 2, 6, 2)
    inc = g.Incl([4, 2, 0])
    assert inc.Get_rank() == 1 and inc.Translate_ranks(None, g) == [4, 2, 0]
    assert g.Excl([0, 2]).Get_rank() == MPI.UNDEFINED
    assert g.Range_incl([(5, 3, -1)]).Translate_ranks(None, g) == [5, 4, 3]
    assert g.Range_incl([(0, 4, 2), (5, 5, 1)]).Translate_ranks(None, g) == [0, 2, 4, 5]
    assert g.Range_excl([(1, 5, 2)]).Translate_ranks(None, g) == [0, 2, 4]
    assert inc.Translate_ranks([0, MPI.PROC_NULL, 2], g.Excl([4])) == [
        MPI.UNDEFINED, MPI.PROC_NULL, 0]
    u = MPI.Group.Union(inc, g.Incl([5, 4]))
    assert u.Translate_ranks(None, g) == [4, 2, 0, 5]
    assert MPI.Group.Intersection(g.Incl([5, 4, 3]), inc).Translate_ranks(None, g) == [4]
    assert MPI.Group.Difference(g, inc).Translate_ranks(None, g) == [1, 3, 5]
    assert g.Compare(g.Dup()) == MPI.IDENT and g.Compare(g.Incl([1, 0, 2, 3, 4, 5])) == \
        MPI.SIMILAR and g.Compare(inc) == MPI.UNEQUAL
    assert g.Excl(list(range(6))) == MPI.GROUP_EMPTY and MPI.GROUP_EMPTY.Get_size() == 0
    assert MPI.Group.Union(MPI.GROUP_EMPTY, g).Get_rank() == 2
    with pytest.raises(MPI.Exception):
        g.Incl([1, 1])
    with pytest.raises(MPI.Exception):
        g.Incl([6])
    with pytest.raises(MPI.Exception):
        g.Range_incl([(0, 3, 0)])
    with pytest.raises(MPI.Exception):
        MPI.GROUP_EMPTY.Free()
    d = g.Dup()
    d.Free()
    assert d == MPI.GROUP_NULL and not d
    with pytest.raises(MPI.Exception):
        d.Get_size()
