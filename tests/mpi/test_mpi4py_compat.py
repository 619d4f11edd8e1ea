"""The parts of the mpi4py layer that real programs use beyond communication: environment,
threads, Info, error handlers, attributes, derived contiguous types, persistent and combined
requests, and their errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ringworld import MPI
from ringworld.testing import run_processes


def test_thread_levels_and_versions() -> None:
    assert MPI.THREAD_SINGLE < MPI.THREAD_FUNNELED < MPI.THREAD_SERIALIZED < MPI.THREAD_MULTIPLE
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE and MPI.Is_thread_main()
    assert MPI.Get_version() == (MPI.VERSION, MPI.SUBVERSION)
    vendor, version = MPI.get_vendor()
    assert vendor == "Ringworld" and len(version) == 3


@pytest.mark.parametrize(("nnodes", "dims", "expected"), [
    (12, 2, [4, 3]), (16, 2, [4, 4]), (6, 3, [3, 2, 1]), (7, 2, [7, 1]), (24, 3, [4, 3, 2]),
    (30, [0, 3, 0], [5, 3, 2]), (1, 3, [1, 1, 1]), (8, [2, 0, 2], [2, 2, 2]), (36, 2, [6, 6]),
])
def test_compute_dims(nnodes: int, dims: Any, expected: list[int]) -> None:
    assert MPI.Compute_dims(nnodes, dims) == expected


@pytest.mark.parametrize(("nnodes", "dims"), [(10, [3, 0]), (-1, 2), (6, [4, 2]), (6, [-1, 0])])
def test_compute_dims_rejects_impossible_grids(nnodes: int, dims: Any) -> None:
    with pytest.raises(ValueError, match="Compute_dims"):
        MPI.Compute_dims(nnodes, dims)


def test_info_is_a_string_dictionary() -> None:
    info = MPI.Info.Create({"a": "1"})
    info["b"] = "2"
    assert (info.Get("a"), info.Get("zz"), info.Get_nkeys(), info.Get_nthkey(1)) == ("1", None,
                                                                                      2, "b")
    assert sorted(info) == ["a", "b"] and info.Dup().items() == info.items()
    with pytest.raises(MPI.Exception) as err:
        info.Delete("zz")
    assert err.value.Get_error_class() == MPI.ERR_INFO
    with pytest.raises(MPI.Exception):
        info.Set("k", 3)  # type: ignore[arg-type]
    info.Free()
    assert not info and info == info and not MPI.INFO_NULL
    with pytest.raises(MPI.Exception):
        info.Get("a")


def test_errhandlers_and_memory() -> None:
    assert MPI.ERRORS_RETURN and MPI.ERRORS_ARE_FATAL and not MPI.ERRHANDLER_NULL
    mem = MPI.Alloc_mem(16)
    assert len(mem) == 16 and not mem.readonly and bytes(mem) == bytes(16)
    MPI.Free_mem(mem)
    with pytest.raises(ValueError, match="size"):
        MPI.Alloc_mem(-1)
    buf = bytearray(100)
    MPI.Attach_buffer(buf)
    assert MPI.Detach_buffer() is buf and MPI.Detach_buffer() is None


def test_contiguous_datatype() -> None:
    t = MPI.DOUBLE_INT.Create_contiguous(3).Commit()
    assert (t.Get_size(), t.Get_extent(), t.is_predefined) == (36, (0, 48), False)
    assert t.dtype == MPI.DOUBLE_INT.dtype and MPI.INT.Dup().Get_size() == 4
    t.Free()
    with pytest.raises(ValueError, match="count"):
        MPI.INT.Create_contiguous(-1)
    with pytest.raises(MPI.Exception):
        MPI.INT.Free()


def _requests(comm: object) -> dict[str, Any]:
    from ringworld import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    out: dict[str, Any] = {}
    # persistent: inactive before Start, Start twice is an error, stays non-null after Wait
    box = np.zeros(2, dtype="i")
    recv = world.Recv_init(box, source=left, tag=3)
    out["inactive_test"] = recv.Test() and bool(recv)
    send = world.Send_init(np.array([rank, 1], dtype="i"), dest=right, tag=3)
    recv.Start()
    try:
        recv.Start()
        out["double_start"] = "no error"
    except MPI.Exception as exc:
        out["double_start"] = exc.Get_error_class() == MPI.ERR_REQUEST
    send.Start()
    st = MPI.Status()
    recv.Wait(st)
    send.Wait()
    out["persistent"] = (box.tolist(), st.Get_source(), bool(recv), repr(recv))
    recv.Free()
    send.Free()
    try:
        send.Start()
    except MPI.Exception:
        out["start_freed"] = not send
    # combined send-receive requests, and the PROC_NULL forms
    got = np.zeros(3)
    req = world.Isendrecv(np.full(3, float(rank)), right, 4, got, left, 4)
    req.Wait(st)
    out["isendrecv"] = (got.tolist(), st.Get_source(), st.Get_count(MPI.DOUBLE))
    buf = np.full(2, rank, dtype="l")
    world.Isendrecv_replace(buf, right, 5, left, 5).Wait()
    out["isendrecv_replace"] = buf.tolist()
    nothing = world.Isendrecv(np.zeros(1), MPI.PROC_NULL, 6, np.zeros(1), MPI.PROC_NULL, 6)
    nothing.Wait(st)
    out["proc_null"] = st.Get_source() == MPI.PROC_NULL
    buf2 = np.full(2, rank, dtype="i")
    world.Sendrecv_replace(buf2, MPI.PROC_NULL, 0, MPI.PROC_NULL, 0)
    out["replace_proc_null"] = buf2.tolist()
    # Bsend / Rsend / Ibsend are standard sends
    world.Bsend(np.array([rank], dtype="i"), right, 7)
    world.Rsend(np.array([rank], dtype="i"), right, 8)
    world.Ibsend(np.array([rank], dtype="i"), right, 9).Wait()
    got3 = [np.zeros(1, dtype="i") for _ in range(3)]
    for tag, g in zip((7, 8, 9), got3, strict=True):
        world.Recv(g, left, tag)
    out["modes"] = [int(g[0]) for g in got3]
    # nonblocking and combined calls on plain arrays (their fast path), a list spec and a 2-D
    # array (validated), completed by Waitall without statuses: every request becomes null, a
    # persistent one inactive (and it starts again)
    mine = np.arange(4, dtype="f8") + 10 * rank
    into = [np.zeros(4), np.zeros(4, dtype="i"), np.zeros((2, 2))]
    again = world.Recv_init(np.zeros(1, dtype="i"), source=left, tag=13)
    again.Start()
    reqs = [world.Irecv(into[0], left, 10), world.Irecv([into[1], MPI.INT], left, 11),
            world.Irecv(into[2], left, 12), again,
            world.Isend(mine, right, 10), world.Isend([mine.astype("i"), MPI.INT], right, 11),
            world.Isend(mine.reshape(2, 2), right, 12),
            world.Isend(np.array([rank], dtype="i"), right, 13)]
    assert MPI.Request.Waitall(reqs) is True
    theirs = np.arange(4, dtype="f8") + 10 * left
    out["nonblocking"] = ([g.ravel().tolist() for g in into] == [theirs.tolist(),
                          theirs.astype("i").tolist(), theirs.tolist()],
                          [bool(r) for r in reqs], repr(again))
    again.Start()
    world.Send(np.array([rank], dtype="i"), right, 13)
    statuses = [MPI.Status()]
    MPI.Request.Waitall([again], statuses)
    out["restarted"] = (statuses[0].Get_source(), repr(again))
    again.Free()
    back = np.zeros(4)
    world.Sendrecv(mine, right, 14, back, left, 14, st)
    out["sendrecv"] = (back.tolist() == theirs.tolist(), st.Get_source(), st.Get_count(MPI.DOUBLE))
    # attributes and handlers
    world.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    out["attrs"] = (world.Get_attr(MPI.UNIVERSE_SIZE), world.Get_attr(MPI.APPNUM),
                    world.Get_attr(MPI.WTIME_IS_GLOBAL),
                    world.Get_errhandler() is MPI.ERRORS_ARE_FATAL,
                    MPI.COMM_SELF.Get_errhandler() is MPI.ERRORS_RETURN,
                    MPI.Comm.Get_parent() == MPI.COMM_NULL, MPI.Init_thread() == 3)
    return out


def test_requests_and_modes() -> None:
    results = run_processes(3, _requests, timeout=60)
    for rank, got in enumerate(results):
        left = (rank - 1) % 3
        assert got == {
            "inactive_test": True, "double_start": True,
            "persistent": ([left, 1], left, True, "<MPI.Prequest inactive>"),
            "start_freed": True,
            "isendrecv": ([float(left)] * 3, left, 3),
            "isendrecv_replace": [left, left], "proc_null": True,
            "replace_proc_null": [rank, rank], "modes": [left] * 3,
            "nonblocking": (True, [False] * 3 + [True] + [False] * 4, "<MPI.Prequest inactive>"),
            "restarted": (left, "<MPI.Prequest inactive>"),
            "sendrecv": (True, left, 4),
            "attrs": (3, 0, False, True, True, True, True),
        }, rank
