"""Bad buffer specs and misuse raise clear errors naming the call and argument; native errors
(truncation, bad rank or tag) propagate as themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ringworld.errors import MismatchError, TruncationError
from ringworld.testing import run_processes


def _outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except Exception as exc:  # the record of what was raised is the point
        return type(exc).__name__, str(exc)
    return "no error", ""


def _errors(comm: object) -> dict[str, tuple[str, str]]:
    from ringworld import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    me = rank  # a message to oneself needs no partner, at every world size
    x = np.arange(10, dtype="d")
    ro = np.zeros(3)
    ro.setflags(write=False)
    cases: dict[str, Callable[[], object]] = {
        "count_too_big": lambda: world.Send([x, 20, MPI.DOUBLE], me),
        "displ_too_big": lambda: world.Isend([x, (3, 8), MPI.DOUBLE], me),
        "four_item_too_big": lambda: world.Send([x, 5, 6, MPI.DOUBLE], me),
        "not_multiple": lambda: world.Send([np.arange(3, dtype="i4"), MPI.DOUBLE], me),
        "negative_count": lambda: world.Send([x, -1, MPI.DOUBLE], me),
        "float_count": lambda: world.Send([x, 2.0, MPI.DOUBLE], me),
        "strided": lambda: world.Send(x[::2], me),
        "strided_recv": lambda: world.Recv(np.zeros((4, 4))[:, 1], me),
        "read_only_recv": lambda: world.Recv(ro, me),
        # mpi4py's usual [array, datatype]: the plain-array fast paths must not take these
        "strided_spec": lambda: world.Send([x[::2], MPI.DOUBLE], me),
        "strided_spec_isend": lambda: world.Isend([x[::2], MPI.DOUBLE], me),
        "strided_spec_irecv": lambda: world.Irecv([np.zeros((4, 4))[:, 1], MPI.DOUBLE], me),
        "read_only_spec_recv": lambda: world.Recv([ro, MPI.DOUBLE], me),
        "read_only_spec_irecv": lambda: world.Irecv([ro, MPI.DOUBLE], me),
        "object_spec": lambda: world.Send([np.array([None, 1]), MPI.DOUBLE], me),
        "bytes_recv": lambda: world.Irecv(b"abc", me),
        "not_a_buffer": lambda: world.Send(5, me),
        "none_buffer": lambda: world.Send(None, me),
        "bad_datatype": lambda: world.Send([x, 2, object()], me),
        "bad_second_item": lambda: world.Send([x, 2.5], me),
        "bad_typecode": lambda: world.Send([x, "zz"], me),
        "five_items": lambda: world.Send([x, 1, 2, 3, MPI.DOUBLE], me),
        "float16_inferred": lambda: world.Send(np.zeros(3, "f2"), me),
        "structured_inferred": lambda: world.Send(np.zeros(3, "i4,f8"), me),
        "sendrecv_recvbuf": lambda: world.Sendrecv(x, me, 0, b"ro", me, 0),
        "sendrecv_no_recvbuf": lambda: world.Sendrecv(x, me),
        "dest_out_of_range": lambda: world.Send(x, size),
        "obj_dest_out_of_range": lambda: world.send("x", size + 3),
        "negative_tag": lambda: world.send("x", me, tag=-5),
        "tag_too_big": lambda: world.Send(x, me, tag=MPI.TAG_UB + 1),
        "free_world": world.Free,
        "null_comm": MPI.COMM_NULL.Get_rank,
        "unknown_attr": lambda: world.Get_attr(12345),
    }
    out = {name: _outcome(call) for name, call in cases.items()}
    # A message longer than the receive buffer: the native TruncationError, as itself.
    world.Send(np.arange(5, dtype="i4"), me, tag=7)
    out["truncation"] = _outcome(lambda: world.Recv(np.zeros(2, "i4"), me, 7))
    try:
        world.Send(np.arange(5, dtype="i4"), me, tag=8)
        world.Recv(np.zeros(2, "i4"), me, 8)
    except TruncationError as exc:
        out["truncation_sizes"] = ("sizes", f"{exc.message_bytes} {exc.buffer_bytes}")
    return out


EXPECTED: dict[str, tuple[str, list[str]]] = {
    "count_too_big": ("ValueError", ["Send(buf)", "count 20 of MPI_DOUBLE", "160 bytes", "80"]),
    "displ_too_big": ("ValueError", ["Isend(buf)", "displacement 8", "88 bytes"]),
    "four_item_too_big": ("ValueError", ["count 5", "displacement 6"]),
    "not_multiple": ("ValueError", ["12 bytes", "not a whole number of MPI_DOUBLE"]),
    "negative_count": ("ValueError", ["count must be >= 0, got -1"]),
    "float_count": ("TypeError", ["count must be an int", "float"]),
    "strided": ("ValueError", ["Send(buf)", "not contiguous"]),
    "strided_recv": ("ValueError", ["Recv(buf)", "not contiguous"]),
    "read_only_recv": ("TypeError", ["Recv(buf)", "read-only"]),
    "strided_spec": ("ValueError", ["Send(buf)", "not contiguous"]),
    "strided_spec_isend": ("ValueError", ["Isend(buf)", "not contiguous"]),
    "strided_spec_irecv": ("ValueError", ["Irecv(buf)", "not contiguous"]),
    "read_only_spec_recv": ("TypeError", ["Recv(buf)", "read-only"]),
    "read_only_spec_irecv": ("TypeError", ["Irecv(buf)", "read-only"]),
    "object_spec": ("TypeError", ["Send(buf)", "holds Python objects"]),
    "bytes_recv": ("TypeError", ["Irecv(buf)", "read-only", "bytes"]),
    "not_a_buffer": ("TypeError", ["Send(buf)", "expected a buffer", "got int"]),
    "none_buffer": ("TypeError", ["Send(buf)", "expected a buffer", "NoneType"]),
    "bad_datatype": ("TypeError", ["datatype must be an MPI.Datatype", "object"]),
    "bad_second_item": ("TypeError", ["datatype must be an MPI.Datatype", "float 2.5"]),
    "bad_typecode": ("TypeError", ["no MPI datatype for type code 'zz'"]),
    "five_items": ("TypeError", ["5-item sequence"]),
    "float16_inferred": ("TypeError", ["cannot infer an MPI datatype", "'e'"]),
    "structured_inferred": ("TypeError", ["cannot infer an MPI datatype"]),
    "sendrecv_recvbuf": ("TypeError", ["Sendrecv(recvbuf)", "read-only"]),
    "sendrecv_no_recvbuf": ("TypeError", ["Sendrecv(recvbuf)", "expected a buffer"]),
    "dest_out_of_range": ("ValueError", ["dest="]),
    "obj_dest_out_of_range": ("ValueError", ["dest="]),
    "negative_tag": ("ValueError", ["tag=-5"]),
    "tag_too_big": ("ValueError", ["tag="]),
    "free_world": ("Exception", ["cannot free the predefined communicator MPI_COMM_WORLD"]),
    "null_comm": ("Exception", ["Invalid communicator", "null"]),
    "unknown_attr": ("Exception", ["12345", "TAG_UB"]),
    "truncation": ("TruncationError", ["20 bytes", "8 bytes"]),
    "truncation_sizes": ("sizes", ["20 8"]),
}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_errors_name_the_call_and_argument(size: int, transport: str) -> None:
    results: list[dict[str, Any]] = run_processes(size, _errors, transport=transport, timeout=60)
    for rank, found in enumerate(results):
        assert found.keys() == EXPECTED.keys()
        for case, (kind, fragments) in EXPECTED.items():
            got_kind, message = found[case]
            assert got_kind == kind, f"rank {rank} {case}: {got_kind}: {message}"
            for fragment in fragments:
                assert fragment in message, f"rank {rank} {case}: {fragment!r} not in {message!r}"


def _mpi_exception_is_raised_and_caught(comm: object) -> list[Any]:
    from ringworld import MPI

    try:
        MPI.COMM_SELF.Free()
    except MPI.Exception as exc:
        return [exc.Get_error_class(), exc.Get_error_code(), exc.error_string, int(exc),
                exc == MPI.ERR_COMM, isinstance(exc, RuntimeError)]
    return []


def test_mpi_exception_carries_an_error_class() -> None:
    from ringworld import MPI

    (got,) = run_processes(1, _mpi_exception_is_raised_and_caught, timeout=30)
    assert got == [MPI.ERR_COMM, MPI.ERR_COMM, "Invalid communicator", MPI.ERR_COMM, True, True]


def _vector_mismatch(comm: object) -> list[str]:
    """Rank 2 gives one count less for its own block than the others (gatherv) and than the
    root gives it (scatterv), then an allreduce; each outcome."""
    from ringworld import MPI

    world = MPI.COMM_WORLD
    r = world.Get_rank()
    c = [3, 3, 2] if r == 2 else [3, 3, 3]
    out = []
    for call in ("Gatherv", "Scatterv"):
        try:
            if call == "Gatherv":
                recv = np.empty(9) if r == 0 else None
                world.Gatherv(np.ones(c[r]), [recv, c, MPI.DOUBLE] if r == 0 else None, root=0)
            else:
                world.Scatterv([np.ones(9), [3, 3, 3], MPI.DOUBLE] if r == 0 else None,
                               np.empty(c[r]), root=0)
            out.append("ok")
        except MismatchError as exc:  # native errors propagate as themselves
            out.append(str(exc))
    got = np.empty(1)
    world.Allreduce(np.ones(1), got)
    out.append(str(got[0]))
    return out


def test_a_vector_count_mismatch_in_the_shared_windows_is_told_in_bytes() -> None:
    """The layer passes its buffers as bytes: the error's amounts say bytes, not elements."""
    res = run_processes(3, _vector_mismatch, transport="shm", timeout=60)
    assert res[0][0].endswith("rank 2 sent 16 bytes, this rank (the root, rank 0) expects 24 "
                              "bytes (counts[2])"), res
    assert res[2][1].endswith("the root (rank 0) sends 24 bytes to this rank (rank 2), which "
                              "expects 16 bytes"), res
    assert [res[1][:2], res[2][0], res[0][1]] == [["ok", "ok"], "ok", "ok"], res
    assert [x[2] for x in res] == ["3.0"] * 3, res


def _waitall_with_a_failed_request(comm: object) -> list[Any]:
    """Rank 0's first receive is too small (a TruncationError), its second comes 0.3 s later:
    Waitall raises the first error once both are complete."""
    import time

    from ringworld import MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() == 1:
        world.Send(np.arange(4.0), 0, tag=1)
        time.sleep(0.3)
        world.Send(np.arange(4.0) + 10, 0, tag=2)
        return []
    small, late = np.zeros(1), np.zeros(4)
    reqs = [world.Irecv(small, 1, tag=1), world.Irecv(late, 1, tag=2)]
    try:
        MPI.Request.Waitall(reqs)
    except TruncationError as exc:
        return ["TruncationError", late.tolist(), [bool(r) for r in reqs], str(exc)[:40]]
    return ["no error"]


def test_waitall_raises_the_first_error_once_every_request_is_complete() -> None:
    got = run_processes(2, _waitall_with_a_failed_request, timeout=60)[0]
    assert got[:3] == ["TruncationError", [10.0, 11.0, 12.0, 13.0], [True, True]], got
