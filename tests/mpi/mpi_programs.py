"""mpi4py-style programs used by the MPI-layer tests.

Each ``prog_*`` takes the ``MPI`` module and returns a JSON-able record of what this rank saw.
They touch nothing but the mpi4py API, so the same programs run under ``ringworld.MPI`` (via
``run_processes``) and under real mpi4py, and the records must be equal. Implementation-specific
values (``PROC_NULL``, ``UNDEFINED``, pickle sizes) are only compared, never recorded.

The records of mpi4py are kept in ``mpi4py_records.json``. To record them again, with a Python
that has mpi4py and an ``mpiexec`` (e.g. ``pip install mpi4py mpich`` in a virtual environment)::

    python tests/mpi/mpi_programs.py --record /path/to/mpiexec
"""

from __future__ import annotations

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


PROGRAMS = [name for name in sorted(globals()) if name.startswith("prog_")]
SIZES = [1, 2, 3, 5]
RECORDS = Path(__file__).with_name("mpi4py_records.json")


def _run_one(name: str) -> None:  # pragma: no cover - runs under real mpi4py via mpiexec
    from mpi4py import MPI

    record = globals()[name](MPI)
    records = MPI.COMM_WORLD.gather(record, root=0)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(records))


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
    else:
        _run_one(sys.argv[1])
