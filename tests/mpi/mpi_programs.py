"""mpi4py-style programs used by the MPI-layer tests.

Each ``prog_*`` takes the ``MPI`` module and returns a JSON-able record of what this rank saw.
They touch nothing but the mpi4py API, so the same programs run under ``ringworld.MPI`` (via
``run_processes``) and under real mpi4py, and the records must be equal. Implementation-specific
values (``PROC_NULL``, ``UNDEFINED``, pickle sizes) are only compared, never recorded.

The records of mpi4py are kept in ``mpi4py_records.json``. To record them again, with a Python
that has mpi4py and an ``mpiexec`` (e.g. ``pip install mpi4py mpich`` in a virtual environment)::

    python tests/mpi/mpi_programs.py --record /path/to/mpiexec

A job runs programs by name (rank 0 prints one JSON line per program), under mpi4py or, with
``--ringworld``, under ``ringworld.MPI``::

    mpiexec -n 3 python tests/mpi/mpi_programs.py prog_collectives
    ringworld run -n 3 python tests/mpi/mpi_programs.py prog_collectives --ringworld
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8", "c8", "c16", "?"]


def data(rank: int, n: int, dtype: str = "f8", salt: int = 0) -> np.ndarray:
    """Unique per element, rank and salt; small integers so every dtype holds them exactly."""
    base = np.arange(n, dtype=np.int64) * 3 + rank * 41 + salt * 7 + 1
    if dtype == "?":
        return base % 3 == 0
    return (base % 120).astype(dtype)


def ring(comm: Any) -> tuple[int, int, int, int]:
    rank, size = comm.Get_rank(), comm.Get_size()
    return rank, size, (rank + 1) % size, (rank - 1) % size


def prog_buffer_specs(MPI: Any) -> dict[str, Any]:
    """Every buffer-spec form around a ring, with Get_count under several datatypes."""
    comm = MPI.COMM_WORLD
    rank, _size, right, left = ring(comm)
    out: dict[str, Any] = {}
    st = MPI.Status()

    s = data(rank, 5)
    rb = np.empty(5)
    comm.Sendrecv(s, right, 1, rb, left, 1, st)
    out["plain"] = [rb.tolist(), st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE),
                    st.Get_count(), st.Get_count(MPI.INT), st.Get_count(MPI.BYTE), st.count,
                    st.Get_elements(MPI.DOUBLE), st.Get_error() == MPI.SUCCESS]

    rb = np.empty(5)
    comm.Sendrecv([s, MPI.DOUBLE], right, 2, [rb, MPI.DOUBLE], left, 2, st)
    out["with_datatype"] = [rb.tolist(), st.Get_count(MPI.DOUBLE)]

    rb = np.zeros(10)
    comm.Sendrecv([s, 3, MPI.DOUBLE], right, 3, [rb, MPI.DOUBLE], left, 3, st)
    out["count"] = [rb.tolist(), st.Get_count(MPI.DOUBLE)]

    s10 = data(rank, 10, salt=1)
    rb = np.zeros(10)
    comm.Sendrecv([s10, (2, 3), MPI.DOUBLE], right, 4, [rb, (2, 5), MPI.DOUBLE], left, 4, st)
    out["count_displ"] = [rb.tolist(), st.Get_count(MPI.DOUBLE)]

    si = data(rank, 6, "i4")
    rbi = np.zeros(6, "i4")
    comm.Sendrecv([si, 2, 1, MPI.INT], right, 5, [rbi, 4, 0, MPI.INT], left, 5, st)
    out["four_items"] = [rbi.tolist(), st.Get_count(MPI.INT)]

    raw = bytearray(64)
    comm.Sendrecv([s, MPI.BYTE], right, 6, raw, left, 6, st)
    out["as_bytes"] = [np.frombuffer(raw[:40]).tolist(), bytes(raw[40:]).hex(),
                       st.Get_count(MPI.BYTE), st.Get_count(MPI.DOUBLE), st.Get_count(MPI.SHORT)]

    s3 = data(rank, 3, "i4")
    rb = np.zeros(4)
    comm.Sendrecv(s3, right, 7, [rb, MPI.BYTE], left, 7, st)
    out["odd_bytes"] = [st.Get_count(MPI.DOUBLE) == MPI.UNDEFINED, st.Get_elements(MPI.INT),
                        st.Get_count(MPI.INT16_T)]

    rb = np.empty(5)
    comm.Sendrecv([s, "d"], right, 8, [rb, "d"], left, 8, st)
    out["typecode"] = [rb.tolist(), st.Get_count(MPI.DOUBLE)]

    inferred = []
    for i, code in enumerate(DTYPES):
        sd = data(rank, 7, code, salt=i)
        rd = np.zeros(7, code)
        comm.Sendrecv(sd, right, 20 + i, rd, left, 20 + i, st)
        dt = {"i1": MPI.INT8_T, "u1": MPI.UINT8_T, "i2": MPI.INT16_T, "u2": MPI.UINT16_T,
              "i4": MPI.INT32_T, "u4": MPI.UINT32_T, "i8": MPI.INT64_T, "u8": MPI.UINT64_T,
              "f4": MPI.FLOAT, "f8": MPI.DOUBLE, "c8": MPI.C_FLOAT_COMPLEX,
              "c16": MPI.C_DOUBLE_COMPLEX, "?": MPI.C_BOOL}[code]
        same = bool(np.array_equal(rd, data(left, 7, code, salt=i)))
        inferred.append([code, same, st.Get_count(dt), st.Get_count()])
    out["inferred"] = inferred

    for order in ("C", "F"):
        m = np.asarray(data(rank, 12).reshape(3, 4), order=order)
        rm = np.zeros((3, 4), order=order)
        comm.Sendrecv(m, right, 40, rm, left, 40, st)
        out[f"matrix_{order}"] = [rm.tolist(), st.Get_count(MPI.DOUBLE)]

    rbytes = bytearray(16)
    comm.Sendrecv(f"from {rank}".encode(), right, 41, rbytes, left, 41, st)
    out["bytes"] = [bytes(rbytes[: st.Get_count()]).decode(), st.Get_count(MPI.CHAR)]

    rmv = bytearray(4)
    comm.Sendrecv(memoryview(bytes([rank, 1, 2, 3])), right, 42, memoryview(rmv), left, 42, st)
    out["memoryview"] = list(rmv)

    rz = np.zeros(3)
    comm.Sendrecv(np.empty(0), right, 43, rz, left, 43, st)
    out["empty"] = [st.Get_count(MPI.DOUBLE), st.Get_source()]
    return out


def prog_any_source(MPI: Any) -> dict[str, Any]:
    """Rank 0 collects from everyone with ANY_SOURCE / ANY_TAG; statuses tell who sent what."""
    comm = MPI.COMM_WORLD
    rank, size, _right, _left = ring(comm)
    out: dict[str, Any] = {}
    if rank != 0:  # three phases, kept apart by barriers so ANY_TAG cannot mix them
        comm.Send(data(rank, rank + 2), 0, tag=100 + rank)
        comm.Barrier()
        comm.send({"from": rank}, 0, tag=200 + rank)
        comm.Barrier()
        comm.Send([data(rank, 2, "i4"), MPI.INT], 0, tag=300 + rank)
        return out
    seen = []
    for _ in range(size - 1):
        st = MPI.Status()
        comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
        buf = np.empty(st.Get_count(MPI.DOUBLE))
        comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
        seen.append([st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE),
                     bool(np.array_equal(buf, data(st.Get_source(), st.Get_source() + 2)))])
    out["buffers"] = sorted(seen)
    comm.Barrier()
    objs = []
    for _ in range(size - 1):
        st = MPI.Status()
        obj = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
        objs.append([st.source, st.tag, obj["from"]])
    out["objects"] = sorted(objs)
    comm.Barrier()
    fixed = []
    for src in range(size - 1, 0, -1):  # a specific source, any tag
        st = MPI.Status()
        buf = np.zeros(2, "i4")
        comm.Recv(buf, src, MPI.ANY_TAG, st)
        fixed.append([st.source, st.tag, buf.tolist()])
    out["fixed_source"] = fixed
    return out


def prog_nonblocking(MPI: Any) -> dict[str, Any]:
    """All-to-all with Isend/Irecv completed by Waitall, Waitany, Testall, Waitsome, Testsome."""
    comm = MPI.COMM_WORLD
    rank, size, right, left = ring(comm)
    out: dict[str, Any] = {}

    def exchange(salt: int) -> tuple[list[Any], list[Any], list[np.ndarray]]:
        bufs = [np.zeros(src + 2) for src in range(size)]
        recvs = [comm.Irecv(bufs[src], src, 1000 * salt + src) for src in range(size)]
        sends = [comm.Isend(data(rank, rank + 2, salt=salt), dst, 1000 * salt + rank)
                 for dst in range(size)]
        return recvs, sends, bufs

    def check(bufs: list[np.ndarray], salt: int) -> bool:
        return all(np.array_equal(b, data(src, src + 2, salt=salt)) for src, b in enumerate(bufs))

    recvs, sends, bufs = exchange(1)
    statuses: list[Any] = []
    flag = MPI.Request.Waitall(recvs, statuses)
    MPI.Request.Waitall(sends)
    out["waitall"] = [flag, check(bufs, 1), [[s.source, s.tag, s.Get_count(MPI.DOUBLE)]
                                             for s in statuses],
                      [r == MPI.REQUEST_NULL for r in recvs + sends], any(recvs + sends)]

    recvs, sends, bufs = exchange(2)
    order = []
    st = MPI.Status()
    for _ in range(size):
        i = MPI.Request.Waitany(recvs, st)
        order.append([i, st.source, st.tag])
    out["waitany"] = [check(bufs, 2), sorted(order), MPI.Request.Waitany(recvs) == MPI.UNDEFINED]
    MPI.Request.Waitall(sends)

    recvs, sends, bufs = exchange(3)
    while not MPI.Request.Testall(recvs + sends):
        pass
    out["testall"] = [check(bufs, 3), all(r == MPI.REQUEST_NULL for r in recvs + sends)]

    recvs, sends, bufs = exchange(4)
    done: list[int] = []
    while True:
        statuses = []
        indices = MPI.Request.Waitsome(recvs, statuses)
        if indices is None:
            break
        assert [statuses[k].source for k in range(len(indices))] == indices
        done.extend(indices)
    MPI.Request.Waitall(sends)
    out["waitsome"] = [check(bufs, 4), sorted(done)]

    recvs, sends, bufs = exchange(5)
    done = []
    while True:
        indices = MPI.Request.Testsome(recvs)
        if indices is None:
            break
        done.extend(indices)
    MPI.Request.Waitall(sends)
    out["testsome"] = [check(bufs, 5), sorted(done)]

    recvs, sends, bufs = exchange(6)
    found = []
    while len(found) < size:
        index, flag = MPI.Request.Testany(recvs, st)
        if flag and index != MPI.UNDEFINED:
            found.append([index, st.source])
    out["testany"] = [check(bufs, 6), sorted(found), MPI.Request.Testany(recvs)[1]]
    MPI.Request.Waitall(sends)

    sreqs = [comm.isend({"src": rank, "dst": d}, d, tag=7) for d in range(size)]
    rreqs = [comm.irecv(source=s, tag=7) for s in range(size)]
    out["obj_waitall"] = MPI.Request.waitall(rreqs)
    out["obj_sends"] = MPI.Request.waitall(sreqs)

    sreqs = [comm.isend(rank * 10 + d, d, tag=8) for d in range(size)]
    rreqs = [comm.irecv(source=s, tag=8) for s in range(size)]
    got = [MPI.Request.waitany(rreqs) for _ in range(size)]
    out["obj_waitany"] = sorted(got)
    MPI.Request.waitall(sreqs)

    sreqs = [comm.isend([rank, d], d, tag=9) for d in range(size)]
    rreqs = [comm.irecv(source=s, tag=9) for s in range(size)]
    while True:
        flag, objs = MPI.Request.testall(rreqs)
        if flag:
            break
        assert objs is None
    out["obj_testall"] = objs
    MPI.Request.waitall(sreqs)
    rreq = comm.irecv(source=left, tag=10)
    out["obj_wait"] = [comm.isend(f"x{rank}", right, 10).wait(), rreq.wait()]

    big = data(rank, 200_000, salt=7)
    rbig = np.empty(200_000)
    reqs = [comm.Irecv([rbig, MPI.DOUBLE], left, 11), comm.Isend([big, MPI.DOUBLE], right, 11)]
    MPI.Request.Waitall(reqs)
    out["large"] = bool(np.array_equal(rbig, data(left, 200_000, salt=7)))
    return out


def prog_proc_null(MPI: Any) -> dict[str, Any]:
    """A non-periodic shift (ends talk to PROC_NULL) and every operation on PROC_NULL."""
    comm = MPI.COMM_WORLD
    rank, size, _right, _left = ring(comm)
    left = rank - 1 if rank > 0 else MPI.PROC_NULL
    right = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    out: dict[str, Any] = {}

    def null_status(st: Any) -> list[Any]:
        return [st.source == MPI.PROC_NULL, st.tag == MPI.ANY_TAG, st.Get_count(),
                st.Get_count(MPI.DOUBLE)]

    st = MPI.Status()
    rb = np.full(4, -1.0)
    comm.Sendrecv(data(rank, 4), right, 3, rb, left, 3, st)
    out["shift"] = [rb.tolist(), null_status(st) if left == MPI.PROC_NULL else st.source]

    got = comm.sendrecv({"from": rank}, dest=right, sendtag=4, source=left, recvtag=4, status=st)
    out["shift_obj"] = [got, null_status(st) if left == MPI.PROC_NULL else st.source]

    comm.Send(data(rank, 4), MPI.PROC_NULL)
    comm.send("lost", MPI.PROC_NULL)
    comm.Ssend(data(rank, 4), MPI.PROC_NULL, 5)
    rb = np.full(4, -1.0)
    comm.Recv(rb, MPI.PROC_NULL, 5, st)
    out["recv"] = [rb.tolist(), null_status(st)]
    st = MPI.Status()
    out["recv_obj"] = [comm.recv(source=MPI.PROC_NULL, status=st), null_status(st)]
    st = MPI.Status()
    out["probe"] = [comm.Probe(MPI.PROC_NULL, 0, st), null_status(st)]
    st = MPI.Status()
    out["iprobe"] = [comm.iprobe(MPI.PROC_NULL, status=st), null_status(st)]

    reqs = [comm.Isend(data(rank, 4), MPI.PROC_NULL), comm.Irecv(rb, MPI.PROC_NULL),
            comm.isend(1, MPI.PROC_NULL), comm.irecv(source=MPI.PROC_NULL)]
    out["requests_active"] = [bool(r) for r in reqs]
    st = MPI.Status()
    out["waitany"] = [MPI.Request.Waitany(reqs, st), null_status(st)]
    statuses: list[Any] = []
    out["waitall"] = [MPI.Request.waitall(reqs, statuses), [null_status(s) for s in statuses]]
    st = MPI.Status()
    out["irecv_wait"] = [comm.irecv(source=MPI.PROC_NULL).wait(st), null_status(st)]
    return out


def prog_probe(MPI: Any) -> dict[str, Any]:
    """Probe / Iprobe to size a receive buffer; iprobe is False when nothing matches."""
    comm = MPI.COMM_WORLD
    rank, _size, right, left = ring(comm)
    out: dict[str, Any] = {"nothing": [comm.Iprobe(left, 999), comm.iprobe(MPI.ANY_SOURCE, 999)]}
    sreq = comm.Isend(data(rank, rank + 3, "i8"), right, 7)
    st = MPI.Status()
    out["probe"] = comm.Probe(MPI.ANY_SOURCE, 7, st)
    n = st.Get_count(MPI.INT64_T)
    buf = np.empty(n, "i8")
    comm.Recv(buf, st.source, st.tag)
    out["sized"] = [st.source, n, bool(np.array_equal(buf, data(left, left + 3, "i8")))]
    sreq.Wait()

    sreq = comm.isend({"payload": list(range(rank + 1))}, right, 8)
    st = MPI.Status()
    while not comm.Iprobe(left, 8, st):
        pass
    out["iprobe"] = [st.source, st.tag, comm.recv(source=st.source, tag=8)]
    sreq.wait()
    comm.Barrier()
    comm.barrier()
    return out


def prog_sendrecv(MPI: Any) -> dict[str, Any]:
    """sendrecv / Sendrecv with statuses, synchronous-mode sends, and COMM_SELF."""
    comm = MPI.COMM_WORLD
    rank, size, right, left = ring(comm)
    out: dict[str, Any] = {}
    st = MPI.Status()
    out["obj"] = [comm.sendrecv(("hi", rank), right, 3, None, left, 3, st), st.source, st.tag]
    out["obj_any"] = comm.sendrecv(rank * 2, dest=right, source=MPI.ANY_SOURCE)
    rb = np.zeros(3, "f4")
    comm.Sendrecv(data(rank, 3, "f4"), right, 4, rb, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
    out["buf"] = [rb.tolist(), st.source, st.tag, st.Get_count(MPI.FLOAT)]
    req = comm.issend(rank, right, 5)
    out["issend"] = [comm.recv(source=left, tag=5), req.wait()]
    req = comm.Issend(data(rank, 2), right, 6)
    rb = np.zeros(2)
    comm.Recv(rb, left, 6)
    req.Wait()
    out["Issend"] = rb.tolist()
    partner = rank ^ 1  # pairs (0, 1), (2, 3), ...; a blocking ssend to oneself would deadlock
    if partner < size:
        got: list[Any] = []
        for turn in (0, 1):
            if rank % 2 == turn:
                comm.ssend(f"from {rank}", partner, 9)
                comm.Ssend(data(rank, 2), partner, 9)
            else:
                got.append(comm.recv(source=partner, tag=9))
                rb = np.zeros(2)
                comm.Recv(rb, partner, 9)
                got.append(rb.tolist())
        out["ssend"] = got
    me = MPI.COMM_SELF
    rb = np.zeros(2)
    me.Sendrecv(data(rank, 2), 0, 1, rb, 0, 1, st)
    out["self"] = [me.Get_rank(), me.Get_size(), me.rank, me.size, rb.tolist(), st.source,
                   me.sendrecv("me", 0, source=0)]
    return out


def prog_requests(MPI: Any) -> dict[str, Any]:
    """Null-request semantics, Get_status without completing, and cancelling a receive."""
    comm = MPI.COMM_WORLD
    rank, _size, _right, _left = ring(comm)
    null = MPI.REQUEST_NULL
    out: dict[str, Any] = {
        "null_bool": bool(null),
        "Waitany_empty": MPI.Request.Waitany([]) == MPI.UNDEFINED,
        "Waitany_null": MPI.Request.Waitany([null, null]) == MPI.UNDEFINED,
        "Testany_null": [MPI.Request.Testany([null])[0] == MPI.UNDEFINED,
                         MPI.Request.Testany([null])[1]],
        "Testall_null": MPI.Request.Testall([null]),
        "Waitall_null": MPI.Request.Waitall([null]),
        "Waitsome_null": MPI.Request.Waitsome([null]),
        "Testsome_null": MPI.Request.Testsome([null]),
        "waitall_null": MPI.Request.waitall([null]),
        "waitany_null": [MPI.Request.waitany([null])[0] == MPI.UNDEFINED,
                         MPI.Request.waitany([null])[1]],
        "testall_null": MPI.Request.testall([null]),
        "Wait_null": null.Wait(),
        "wait_null": null.wait(),
        "test_null": null.test(),
        "Test_null": null.Test(),
    }
    st = MPI.Status()
    req = comm.irecv(source=rank, tag=50)
    out["pending"] = [req.Get_status(st), req.Test(), req.test(), bool(req)]
    comm.send({"me": rank}, rank, 50)
    while not req.Get_status(st):
        pass
    out["get_status"] = [st.source, st.tag, bool(req), req == null, req.wait(), req == null,
                         bool(req)]

    rb = np.zeros(3)
    req = comm.Irecv(rb, rank, 51)
    req.Cancel()
    st = MPI.Status()
    req.Wait(st)
    out["cancel"] = [st.Is_cancelled(), st.cancelled, req == null]
    req = comm.irecv(source=rank, tag=52)
    req.Cancel()
    out["cancel_obj"] = [req.test(), req == null]
    sreq = comm.Isend(data(rank, 3), rank, 53)
    rreq = comm.Irecv(rb, rank, 53)
    MPI.Request.Waitall([sreq, rreq])
    out["self_msg"] = rb.tolist()
    return out


def _vlayout(size: int, salt: int = 0) -> tuple[list[int], list[int], int]:
    """Uneven counts (some empty) and displacements with gaps, for the v-collectives."""
    counts = [(i * 2 + salt) % 4 for i in range(size)]
    displs, at = [], 1
    for c in counts:
        displs.append(at)
        at += c + 1
    return counts, displs, at


def _wlayout(MPI: Any, rank: int, size: int) -> tuple[list[Any], list[int], list[int], int]:
    """Alltoallw blocks: INT or DOUBLE by (rank + peer) parity, 1..3 of them, byte gaps."""
    types, counts, displs, at = [], [], [], 0
    for j in range(size):
        t = MPI.INT if (rank + j) % 2 == 0 else MPI.DOUBLE
        types.append(t)
        counts.append((rank + j) % 3 + 1)
        displs.append(at)
        at += counts[-1] * t.Get_size() + 4
    return types, counts, displs, at


def _wcode(MPI: Any, t: Any) -> str:
    return "i4" if t == MPI.INT else "f8"


def prog_collectives(MPI: Any) -> dict[str, Any]:
    """Every data-movement collective, blocking and nonblocking, plain, v- and in-place forms."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    out: dict[str, Any] = {}

    comm.Barrier()
    comm.Ibarrier().Wait()
    b = data(rank, 5) if rank == last else np.zeros(5)
    comm.Bcast(b, root=last)
    bi = data(rank, 6, "i4", salt=1) if rank == 0 else np.zeros(6, "i4")
    comm.Bcast([bi, 4, MPI.INT])
    bb = bytearray(f"root {rank}".encode()) if rank == 0 else bytearray(6)
    req = comm.Ibcast([bb, MPI.BYTE], root=0)
    req.Wait()
    out["bcast"] = [b.tolist(), bi.tolist(), bb.decode(), req == MPI.REQUEST_NULL]

    root = 1 % size
    s = data(rank, 3, salt=2)
    g = np.full(3 * size, -1.0) if rank == root else None
    comm.Gather(s, g, root=root)
    gi = np.full(2 * size, -1, "i4")
    gi[2 * rank : 2 * rank + 2] = data(rank, 2, "i4", salt=3)
    if rank == 0:
        comm.Gather(MPI.IN_PLACE, [gi, MPI.INT], root=0)
    else:
        comm.Gather([gi[2 * rank : 2 * rank + 2], MPI.INT], None, root=0)
    g2 = np.full(3 * size, -1.0)
    comm.Igather(s, [g2, 3, MPI.DOUBLE], root=last).Wait()
    out["gather"] = [None if g is None else g.tolist(), gi.tolist() if rank == 0 else None,
                     g2.tolist() if rank == last else None]

    counts, displs, n = _vlayout(size)
    sv = data(rank, counts[rank], salt=4)
    gv = np.full(n, -1.0)
    comm.Gatherv(sv, [gv, (counts, displs), MPI.DOUBLE], root=root)
    gv2 = np.full(sum(counts), -1.0)
    comm.Igatherv(sv, [gv2, counts], root=0).Wait()
    gv3 = np.full(n, -1.0)
    gv3[displs[rank] : displs[rank] + counts[rank]] = sv
    if rank == last:
        comm.Gatherv(MPI.IN_PLACE, [gv3, counts, displs, MPI.DOUBLE], root=last)
    else:
        comm.Gatherv(sv, None, root=last)
    out["gatherv"] = [gv.tolist() if rank == root else None, gv2.tolist() if rank == 0 else None,
                      gv3.tolist() if rank == last else None]

    sc = data(rank, 2 * size, salt=5)
    r = np.full(2, -1.0)
    comm.Scatter(sc if rank == root else None, r, root=root)
    r2 = np.full(2, -1.0)
    comm.Iscatter([sc, 2, MPI.DOUBLE], [r2, MPI.DOUBLE], root=last).Wait()
    sc3 = sc.copy()
    if rank == 0:
        comm.Scatter(sc3, MPI.IN_PLACE, root=0)
    else:
        comm.Scatter(None, sc3[:2], root=0)
    out["scatter"] = [r.tolist(), r2.tolist(), sc3.tolist()]

    scv = data(rank, n, salt=6)
    rv = np.full(counts[rank], -1.0)
    comm.Scatterv([scv, (counts, displs), MPI.DOUBLE] if rank == root else None, rv, root=root)
    rv2 = np.full(counts[rank] + 1, -1.0)
    comm.Iscatterv([scv, counts, displs, MPI.DOUBLE], [rv2, counts[rank], MPI.DOUBLE],
                   root=last).Wait()
    scv3 = scv.copy()
    if rank == 0:
        comm.Scatterv([scv3, (counts, displs), MPI.DOUBLE], MPI.IN_PLACE, root=0)
    else:
        comm.Scatterv(None, scv3[: counts[rank]], root=0)
    out["scatterv"] = [rv.tolist(), rv2.tolist(), scv3.tolist()]

    ag = np.full(2 * size, -1.0)
    comm.Allgather(data(rank, 2, salt=7), ag)
    ag2 = np.full(2 * size, -1, "i8")
    ag2[2 * rank : 2 * rank + 2] = data(rank, 2, "i8", salt=8)
    comm.Allgather(MPI.IN_PLACE, ag2)
    ag3 = np.full(2 * size, -1.0)
    comm.Iallgather([data(rank, 2, salt=9), MPI.DOUBLE], [ag3, MPI.DOUBLE]).Wait()
    out["allgather"] = [ag.tolist(), ag2.tolist(), ag3.tolist()]

    agv = np.full(n, -1.0)
    comm.Allgatherv(data(rank, counts[rank], salt=10), [agv, (counts, displs), MPI.DOUBLE])
    agv2 = np.full(n, -1.0)
    agv2[displs[rank] : displs[rank] + counts[rank]] = data(rank, counts[rank], salt=11)
    comm.Allgatherv(MPI.IN_PLACE, [agv2, counts, displs, MPI.DOUBLE])
    agv3 = np.full(sum(counts), -1.0)
    comm.Iallgatherv(data(rank, counts[rank], salt=12), [agv3, counts]).Wait()
    out["allgatherv"] = [agv.tolist(), agv2.tolist(), agv3.tolist()]

    at = np.full(2 * size, -1.0)
    comm.Alltoall(data(rank, 2 * size, salt=13), at)
    at2 = data(rank, 3 * size, "i4", salt=14)
    comm.Alltoall(MPI.IN_PLACE, [at2, MPI.INT])
    at3 = np.full(size, -1.0)
    comm.Ialltoall([data(rank, size, salt=15), 1, MPI.DOUBLE], at3).Wait()
    out["alltoall"] = [at.tolist(), at2.tolist(), at3.tolist()]

    sym = [(rank + j) % 3 for j in range(size)]  # symmetric: what j sends to me, I send to j
    sdis = [sum(sym[:j]) + j for j in range(size)]
    sbuf = data(rank, sum(sym) + size, salt=16)
    rcounts = sym
    rdis = [sum(rcounts[:j]) * 2 for j in range(size)]
    avv = np.full(2 * sum(rcounts) + 1, -1.0)
    comm.Alltoallv([sbuf, (sym, sdis), MPI.DOUBLE], [avv, (rcounts, rdis), MPI.DOUBLE])
    avv2 = data(rank, sum(sym), salt=17)
    comm.Alltoallv(MPI.IN_PLACE, [avv2, sym])
    avv3 = np.full(sum(sym), -1.0)
    comm.Ialltoallv([sbuf, sym, sdis, MPI.DOUBLE], [avv3, sym]).Wait()
    out["alltoallv"] = [avv.tolist(), avv2.tolist(), avv3.tolist()]

    types, wc, wd, nbytes = _wlayout(MPI, rank, size)
    wsend = bytearray(nbytes)
    for j in range(size):
        code = _wcode(MPI, types[j])
        np.frombuffer(wsend, code, wc[j], wd[j])[:] = data(rank, wc[j], code, salt=18 + j)
    wrecv = bytearray(b"\xff" * nbytes)
    comm.Alltoallw([wsend, (wc, wd), types], [wrecv, (wc, wd), types])
    wrecv2 = bytearray(wsend)
    comm.Alltoallw(MPI.IN_PLACE, [wrecv2, wc, wd, types])
    wrecv3 = bytearray(nbytes)
    comm.Ialltoallw([wsend, wc, wd, types], [wrecv3, wc, wd, types]).Wait()
    out["alltoallw"] = [[np.frombuffer(w, _wcode(MPI, types[j]), wc[j], wd[j]).tolist()
                         for j in range(size)] for w in (wrecv, wrecv2, wrecv3)]

    ra, rb = np.full(2 * size, -1.0), np.full(n, -1.0)
    reqs = [comm.Iallgather(data(rank, 2, salt=30), ra),
            comm.Iallgatherv(data(rank, counts[rank], salt=31), [rb, (counts, displs),
                                                                 MPI.DOUBLE]),
            comm.Ibarrier()]
    MPI.Request.Waitall(reqs)
    out["waitall"] = [ra.tolist(), rb.tolist(), [q == MPI.REQUEST_NULL for q in reqs]]

    out["objects"] = [
        comm.bcast({"root": rank, "v": [rank]} if rank == last else None, root=last),
        comm.gather((rank, f"r{rank}"), root=root),
        comm.scatter([{"to": i} for i in range(size)] if rank == 0 else None, root=0),
        comm.allgather([rank] * rank),
        comm.alltoall([f"{rank}->{j}" for j in range(size)]),
        comm.barrier(),
    ]
    return out


def _affine(invec: Any, inoutvec: Any, datatype: Any) -> None:
    """Non-commutative on MPI.TWOINT elements (a, b), the maps x -> a*x + b: ``inoutvec``
    becomes ``invec`` followed by ``inoutvec``."""
    f = np.frombuffer(invec, dtype="i4").reshape(-1, 2)
    g = np.frombuffer(inoutvec, dtype="i4").reshape(-1, 2)
    g[:, 1] = f[:, 1] * g[:, 0] + g[:, 1]
    g[:, 0] = f[:, 0] * g[:, 0]


def _maps(rank: int, k: int) -> np.ndarray:
    m = np.zeros((k, 2), "i4")
    for j in range(k):
        m[j] = [(rank + j) % 3 + 1, (rank * 3 + j) % 7]
    return m


def prog_reductions(MPI: Any) -> dict[str, Any]:
    """Buffer and object reductions: predefined ops, MAXLOC/MINLOC pairs, user ops, in place."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    out: dict[str, Any] = {}

    x = data(rank, 4, "i4", salt=1)
    r = np.full(4, -1, "i4")
    comm.Reduce(x, r, op=MPI.SUM, root=last)
    r2 = np.full(4, -1.0)
    comm.Reduce([data(rank, 4, salt=2), MPI.DOUBLE], [r2, MPI.DOUBLE], MPI.MAX, 0)
    r3 = data(rank, 3, "i8", salt=3)
    if rank == 0:
        comm.Reduce(MPI.IN_PLACE, r3, op=MPI.MIN, root=0)
    else:
        comm.Reduce(r3, None, op=MPI.MIN, root=0)
    r4 = np.full(4, -1, "i4")
    comm.Ireduce(x, r4, op=MPI.BXOR, root=last).Wait()
    out["reduce"] = [r.tolist() if rank == last else None, r2.tolist() if rank == 0 else None,
                     r3.tolist(), r4.tolist() if rank == last else None]

    ints = data(rank, 5, "i4", salt=4) % 7 + 1
    allr = {}
    for name in ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"):
        res = np.full(5, -1, "i4")
        comm.Allreduce(ints - (name in ("LAND", "LOR", "LXOR")) * (rank % 2), res,
                       op=getattr(MPI, name))
        allr[name] = res.tolist()
    out["allreduce"] = allr
    f = data(rank, 3, "f8", salt=5)
    comm.Allreduce(MPI.IN_PLACE, f, op=MPI.SUM)
    c = data(rank, 3, "c16", salt=6)
    rc = np.zeros(3, "c16")
    comm.Iallreduce(c, rc, op=MPI.PROD).Wait()
    out["allreduce_more"] = [f.tolist(), [[z.real, z.imag] for z in rc.tolist()]]

    rs = np.full(2, -1.0)
    comm.Reduce_scatter_block(data(rank, 2 * size, salt=8), rs, op=MPI.SUM)
    rs2 = data(rank, 2 * size, "i8", salt=9)
    comm.Reduce_scatter_block(MPI.IN_PLACE, rs2, op=MPI.MAX)
    rs3 = np.full(3, -1.0)
    comm.Ireduce_scatter_block([data(rank, 3 * size, salt=10), MPI.DOUBLE], [rs3, MPI.DOUBLE],
                               op=MPI.MIN).Wait()
    out["reduce_scatter_block"] = [rs.tolist(), rs2[:2].tolist(), rs3.tolist()]

    counts = [(i % 3) + (i == 0) for i in range(size)]
    total = sum(counts)
    rsv = np.full(counts[rank], -1.0)
    comm.Reduce_scatter(data(rank, total, salt=11), rsv, counts, MPI.SUM)
    rsv2 = np.full(counts[rank], -1.0)
    comm.Reduce_scatter(data(rank, total, salt=12), rsv2, op=MPI.MAX)  # counts agreed
    rsv3 = data(rank, total, "i4", salt=13)
    comm.Reduce_scatter(MPI.IN_PLACE, rsv3, counts, MPI.SUM)
    rsv4 = np.full(counts[rank], -1.0)
    comm.Ireduce_scatter(data(rank, total, salt=14), rsv4, counts, MPI.PROD).Wait()
    out["reduce_scatter"] = [rsv.tolist(), rsv2.tolist(), rsv3[: counts[rank]].tolist(),
                             rsv4.tolist()]

    sc = np.full(3, -1, "i8")
    comm.Scan(data(rank, 3, "i8", salt=15), sc, op=MPI.SUM)
    ex = np.full(3, -1, "i8")
    comm.Exscan(data(rank, 3, "i8", salt=16), ex, op=MPI.SUM)
    sc2 = data(rank, 2, salt=17)
    comm.Scan(MPI.IN_PLACE, sc2, op=MPI.MAX)
    ex2 = data(rank, 2, salt=18)
    comm.Exscan(MPI.IN_PLACE, ex2, op=MPI.MAX)
    sc3, ex3 = np.full(2, -1.0), np.full(2, -1.0)
    MPI.Request.Waitall([comm.Iscan(data(rank, 2, salt=19), sc3, op=MPI.MIN),
                         comm.Iexscan(data(rank, 2, salt=20), ex3, op=MPI.MIN)])
    out["scan"] = [sc.tolist(), sc2.tolist(), sc3.tolist()]
    out["exscan"] = None if rank == 0 else [ex.tolist(), ex2.tolist(), ex3.tolist()]

    pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)
    p = np.zeros(4, pair)
    p["v"] = [rank % 2, -rank, (rank * 7) % 5, 3.0]
    p["i"] = [rank, rank * 10, rank + 100, last - rank]
    mx, mn = np.zeros(4, pair), np.zeros(4, pair)
    comm.Allreduce([p, MPI.DOUBLE_INT], [mx, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    comm.Allreduce([p, MPI.DOUBLE_INT], [mn, MPI.DOUBLE_INT], op=MPI.MINLOC)
    two = np.array([[rank % 3, rank], [-rank, rank]], "i4")
    two_r = np.zeros((2, 2), "i4")
    comm.Reduce([two, MPI.TWOINT], [two_r, MPI.TWOINT], op=MPI.MAXLOC, root=last)
    out["loc"] = [[list(t) for t in mx.tolist()], [list(t) for t in mn.tolist()],
                  two_r.tolist() if rank == last else None,
                  [MPI.DOUBLE_INT.Get_size(), MPI.DOUBLE_INT.Get_extent()[1],
                   MPI.TWOINT.Get_size(), MPI.FLOAT_INT.Get_extent()[1]]]

    matop = MPI.Op.Create(_affine, commute=False)
    k = 3
    m_red, m_all, m_scan = np.zeros((k, 2), "i4"), np.zeros((k, 2), "i4"), np.zeros((k, 2), "i4")
    m_ex, m_i = np.full((k, 2), -1, "i4"), np.zeros((k, 2), "i4")
    mine = [_maps(rank, k), MPI.TWOINT]
    comm.Reduce(mine, [m_red, MPI.TWOINT], op=matop, root=root_of(size))
    comm.Allreduce(mine, [m_all, MPI.TWOINT], op=matop)
    comm.Scan(mine, [m_scan, MPI.TWOINT], op=matop)
    comm.Exscan(mine, [m_ex, MPI.TWOINT], op=matop)
    m_rsb = np.zeros((1, 2), "i4")
    comm.Reduce_scatter_block([_maps(rank, size), MPI.TWOINT], [m_rsb, MPI.TWOINT], op=matop)
    comm.Iallreduce(mine, [m_i, MPI.TWOINT], op=matop).Wait()
    local = _maps(rank + 1, k)
    matop.Reduce_local(mine, [local, MPI.TWOINT])
    out["user_op"] = [matop.Is_commutative(), m_red.tolist() if rank == root_of(size) else None,
                      m_all.tolist(), m_scan.tolist(), None if rank == 0 else m_ex.tolist(),
                      m_rsb.tolist(), m_i.tolist(), local.tolist()]
    matop.Free()
    out["user_op_freed"] = [bool(matop), matop == MPI.OP_NULL]

    def concat(a: Any, b: Any, dt: Any) -> Any:
        return a + b

    cat = MPI.Op.Create(concat, commute=False)
    out["objects"] = [
        comm.reduce([rank], op=MPI.SUM, root=last),
        comm.allreduce(f"<{rank}>", op=MPI.SUM),
        comm.allreduce(rank * 3 % 5, op=MPI.MAX),
        comm.allreduce((rank % 2, rank), op=MPI.MAXLOC),
        comm.allreduce([-(rank % 2), rank], op=MPI.MINLOC),
        comm.allreduce(f"[{rank}]", op=cat),
        comm.allreduce((rank, -rank), op=lambda a, b: (a[0], b[1])),
        comm.scan([rank], op=MPI.SUM),
        comm.exscan(f"{rank}", op=cat),
        comm.scan((rank % 2, rank), op=MPI.MAXLOC),
        comm.reduce(rank, op=MPI.BOR, root=0),
        comm.allreduce(rank % 2, op=MPI.LAND),
    ]
    out["call"] = [MPI.SUM(2, 3), MPI.MAX(2, 3), MPI.MIN(2, 3), MPI.PROD(2, 3),
                   MPI.LXOR(1, 1), MPI.MAXLOC((1, 2), (1, 0)), MPI.MINLOC([3, 1], [2, 0]),
                   cat("a", "b")]
    return out


def root_of(size: int) -> int:
    return size // 2


def _compare(MPI: Any, value: int) -> str:
    return {MPI.IDENT: "IDENT", MPI.CONGRUENT: "CONGRUENT", MPI.SIMILAR: "SIMILAR",
            MPI.UNEQUAL: "UNEQUAL"}[value]


def _named(MPI: Any, ranks: list[int]) -> list[Any]:
    """Translated ranks with UNDEFINED named, not recorded as a number."""
    return ["UNDEFINED" if r == MPI.UNDEFINED else r for r in ranks]


def prog_communicators(MPI: Any) -> dict[str, Any]:
    """Dup, Split, Split_type, Create, Create_group, Free, groups, and traffic on new comms."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    out: dict[str, Any] = {}

    dup = world.Dup()
    clone = world.Clone()
    out["dup"] = [dup.Get_size(), dup.Get_rank(), _compare(MPI, world.Compare(dup)),
                  _compare(MPI, world.Compare(world)), _compare(MPI, dup.Compare(clone)),
                  dup.allreduce(rank), isinstance(dup, MPI.Intracomm)]
    # traffic on the dup does not mix with the same tags on the world
    if size > 1:
        right, left = (rank + 1) % size, (rank - 1) % size
        world.send(("world", rank), right, tag=5)
        dup.send(("dup", rank), right, tag=5)
        out["dup_isolated"] = [dup.recv(source=left, tag=5), world.recv(source=left, tag=5)]

    odd = world.Split(rank % 2, key=-rank)
    buf = np.zeros(odd.Get_size(), "i8")
    odd.Allgather(np.array([rank], "i8"), buf)
    out["split"] = [odd.Get_rank(), odd.Get_size(), buf.tolist(),
                    _compare(MPI, world.Compare(odd)),
                    odd.Get_group().Translate_ranks(None, world.Get_group())]
    rev = world.Split(0, key=size - rank)
    out["split_reversed"] = [rev.Get_rank(), _compare(MPI, world.Compare(rev)),
                             rev.bcast(rank, root=0)]
    none = world.Split(MPI.UNDEFINED if rank == 0 else 1, rank)
    out["split_undefined"] = [none == MPI.COMM_NULL, bool(none),
                              none.Get_size() if none else None]
    shared = world.Split_type(MPI.COMM_TYPE_SHARED)
    out["split_type"] = [shared.Get_size(), shared.Get_rank(),
                         _compare(MPI, world.Compare(shared))]

    g = world.Get_group()
    evens = g.Incl(list(range(0, size, 2)))
    odds = g.Excl(list(range(0, size, 2)))
    tail = g.Range_incl([(size - 1, 0, -2)])
    out["groups"] = [
        g.Get_size(), g.Get_rank(), evens.Get_size(), evens.Get_rank() == MPI.UNDEFINED,
        odds.Get_size(), odds.Get_rank() == MPI.UNDEFINED, tail.Translate_ranks(None, g),
        _named(MPI, evens.Translate_ranks(list(range(evens.Get_size())), odds)),
        MPI.Group.Union(odds, evens).Translate_ranks(None, g),
        MPI.Group.Intersection(g, tail).Translate_ranks(None, g),
        MPI.Group.Difference(g, evens).Translate_ranks(None, g),
        _compare(MPI, g.Compare(world.Get_group())),
        _compare(MPI, g.Compare(g.Range_incl([(size - 1, 0, -1)]))),
        _compare(MPI, g.Compare(evens)),
        MPI.GROUP_EMPTY.Get_size(), MPI.GROUP_EMPTY.Get_rank() == MPI.UNDEFINED,
        g == world.Get_group(),
        g.Translate_ranks([0, MPI.PROC_NULL], g)[1] == MPI.PROC_NULL,
    ]

    ec = world.Create(evens)
    out["create"] = [bool(ec), ec.Get_size() if ec else None, ec.Get_rank() if ec else None,
                     ec.allgather(rank) if ec else None, ec == MPI.COMM_NULL]
    mirror = g.Range_incl([(size - 1, 0, -1)])
    mc = world.Create(mirror)
    out["create_mirror"] = [mc.Get_rank(), mc.allreduce([rank], op=MPI.SUM),
                            _compare(MPI, world.Compare(mc))]
    if rank % 2:
        oc = world.Create_group(odds.Incl(list(range(odds.Get_size() - 1, -1, -1))), tag=7)
        out["create_group"] = [oc.Get_size(), oc.Get_rank(), oc.allgather(rank)]
        oc.Free()
    nested = odd.Dup().Split(0, key=-odd.Get_rank())
    out["nested"] = [nested.Get_size(), nested.Get_rank(), nested.allgather(rank)]
    self_dup = MPI.COMM_SELF.Dup()
    out["self_dup"] = [self_dup.Get_size(), self_dup.allreduce(rank + 1),
                       _compare(MPI, MPI.COMM_SELF.Compare(self_dup))]
    idup, req = world.Idup()
    req.Wait()
    out["idup"] = [idup.Get_size(), idup.allreduce(1)]
    for c in (dup, clone, odd, rev, shared, mc, nested, self_dup, idup):
        c.Free()
    if ec:
        ec.Free()
    out["freed"] = [dup == MPI.COMM_NULL, bool(odd), world.allreduce(rank)]
    return out


PROGRAMS = [name for name in sorted(globals()) if name.startswith("prog_")]
SIZES = [1, 2, 3, 5]
RECORDS = Path(__file__).with_name("mpi4py_records.json")


def _run_one(names: list[str], use_ringworld: bool = False) -> None:  # pragma: no cover
    """Run programs in this job (mpiexec or ``ringworld run``); rank 0 prints one JSON line each."""
    MPI = importlib.import_module("ringworld.MPI" if use_ringworld else "mpi4py.MPI")
    for name in names:
        record = globals()[name](MPI)
        records = MPI.COMM_WORLD.gather(record, root=0)
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(json.dumps(records), flush=True)


def _record(mpiexec: str) -> None:  # pragma: no cover - needs mpi4py
    from mpi4py import MPI, __version__

    found: dict[str, Any] = {
        "_source": f"mpi4py {__version__}, {MPI.Get_library_version().splitlines()[0].strip()}"
    }
    for name in PROGRAMS:
        for size in SIZES:
            done = subprocess.run(
                [mpiexec, "-n", str(size), sys.executable, __file__, name],
                capture_output=True, text=True, timeout=120, check=True,
            )
            found[f"{name}/{size}"] = json.loads(done.stdout)
    lines = [f"{json.dumps(key)}: {json.dumps(found[key])}" for key in sorted(found)]
    RECORDS.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one line per record


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1] == "--record":
        _record(sys.argv[2])
    else:  # NAME... [--ringworld]: under ringworld.MPI instead of mpi4py
        args = sys.argv[1:]
        _run_one([a for a in args if a != "--ringworld"], "--ringworld" in args)
