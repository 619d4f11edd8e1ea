"""The ``MPI`` module itself: names, datatypes, statuses, exceptions, ops, lazy start-up, Abort,
and the mpi4py ring example through the launcher."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ringworld
from ringworld import MPI

REPO = Path(__file__).resolve().parents[2]

DATATYPES = {
    "BYTE": ("MPI_BYTE", "u1"), "CHAR": ("MPI_CHAR", "S1"), "SIGNED_CHAR": ("MPI_SIGNED_CHAR", "b"),
    "UNSIGNED_CHAR": ("MPI_UNSIGNED_CHAR", "B"), "SHORT": ("MPI_SHORT", "h"),
    "UNSIGNED_SHORT": ("MPI_UNSIGNED_SHORT", "H"), "INT": ("MPI_INT", "i"),
    "UNSIGNED": ("MPI_UNSIGNED", "I"), "LONG": ("MPI_LONG", "l"),
    "UNSIGNED_LONG": ("MPI_UNSIGNED_LONG", "L"), "LONG_LONG": ("MPI_LONG_LONG", "q"),
    "UNSIGNED_LONG_LONG": ("MPI_UNSIGNED_LONG_LONG", "Q"), "FLOAT": ("MPI_FLOAT", "f"),
    "DOUBLE": ("MPI_DOUBLE", "d"), "LONG_DOUBLE": ("MPI_LONG_DOUBLE", "g"),
    "C_BOOL": ("MPI_C_BOOL", "?"), "BOOL": ("MPI_C_BOOL", "?"),
    "INT8_T": ("MPI_INT8_T", "i1"), "INT16_T": ("MPI_INT16_T", "i2"),
    "INT32_T": ("MPI_INT32_T", "i4"), "INT64_T": ("MPI_INT64_T", "i8"),
    "UINT8_T": ("MPI_UINT8_T", "u1"), "UINT16_T": ("MPI_UINT16_T", "u2"),
    "UINT32_T": ("MPI_UINT32_T", "u4"), "UINT64_T": ("MPI_UINT64_T", "u8"),
    "C_FLOAT_COMPLEX": ("MPI_C_FLOAT_COMPLEX", "c8"),
    "C_DOUBLE_COMPLEX": ("MPI_C_DOUBLE_COMPLEX", "c16"),
    "COMPLEX": ("MPI_COMPLEX", "c8"), "DOUBLE_COMPLEX": ("MPI_DOUBLE_COMPLEX", "c16"),
    "WCHAR": ("MPI_WCHAR", "U1"),
}  # fmt: skip


def clean_env() -> dict[str, str]:
    """The environment of a process started outside any job."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}


def python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False,
                          capture_output=True, text=True, timeout=timeout, env=clean_env(),
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name", sorted(DATATYPES))
def test_datatype_names_sizes_and_numpy_mapping(name: str) -> None:
    mpi_name, code = DATATYPES[name]
    dt = getattr(MPI, name)
    assert isinstance(dt, MPI.Datatype)
    assert dt.name == dt.Get_name() == mpi_name
    assert dt.size == dt.Get_size() == dt.extent == np.dtype(code).itemsize
    assert dt.Get_extent() == (0, dt.size)
    assert MPI.to_numpy_dtype(dt) == np.dtype(code)


def test_datatype_aliases_and_codes() -> None:
    assert MPI.BOOL is MPI.C_BOOL
    assert MPI.Datatype.fromcode("d") is MPI.DOUBLE
    assert MPI.Datatype.fromcode("i4") is MPI.INT32_T
    assert MPI.Datatype.fromcode("float32") is MPI.FLOAT
    assert MPI.DOUBLE.tocode() == "d" and MPI.INT8_T.tocode() == "i1"
    assert MPI.from_numpy_dtype(np.float64) is MPI.DOUBLE
    assert MPI.from_numpy_dtype(np.dtype("i1")) is MPI.SIGNED_CHAR
    with pytest.raises(TypeError, match="float16"):
        MPI.from_numpy_dtype(np.float16)
    with pytest.raises(TypeError, match="non-native"):
        MPI.from_numpy_dtype(np.dtype(">f8" if sys.byteorder == "little" else "<f8"))


def test_constants() -> None:
    assert MPI.ANY_SOURCE == ringworld.ANY_SOURCE and MPI.ANY_TAG == ringworld.ANY_TAG
    assert MPI.PROC_NULL not in (MPI.ANY_SOURCE, MPI.UNDEFINED) and MPI.PROC_NULL < 0
    assert MPI.TAG_UB == 2**31 - 1
    assert MPI.Get_version() == (3, 1)
    assert "Ringworld" in MPI.Get_library_version()
    assert isinstance(MPI.Get_processor_name(), str) and MPI.Get_processor_name()
    t0 = MPI.Wtime()
    assert isinstance(t0, float) and MPI.Wtime() >= t0 and 0 < MPI.Wtick() < 1e-3
    assert pickle.loads(pickle.dumps(MPI.IN_PLACE)) is MPI.IN_PLACE
    assert repr(MPI.IN_PLACE) == "IN_PLACE"


def test_status_is_mutable_like_mpi4py() -> None:
    st = MPI.Status()
    assert (st.source, st.tag, st.error, st.count, st.cancelled) == (
        MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS, 0, False)
    st.Set_source(3)
    st.Set_tag(9)
    st.Set_elements(MPI.DOUBLE, 2)
    assert (st.Get_source(), st.Get_tag(), st.count) == (3, 9, 16)
    assert st.Get_count(MPI.DOUBLE) == 2 and st.Get_count() == 16 and st.Get_count(MPI.INT) == 4
    st.count = 12
    assert st.Get_count(MPI.DOUBLE) == MPI.UNDEFINED and st.Get_elements(MPI.INT) == 3
    st.Set_error(MPI.ERR_TRUNCATE)
    st.Set_cancelled(True)
    copy = MPI.Status(st)
    assert (copy.source, copy.tag, copy.count, copy.Get_error(), copy.Is_cancelled()) == (
        3, 9, 12, MPI.ERR_TRUNCATE, True)
    st.source = 4
    assert copy.source == 3


def test_exception_and_error_classes() -> None:
    exc = MPI.Exception(MPI.ERR_TRUNCATE)
    assert isinstance(exc, RuntimeError)
    assert exc.Get_error_class() == exc.Get_error_code() == int(exc) == MPI.ERR_TRUNCATE
    assert exc == MPI.ERR_TRUNCATE and exc.Get_error_string() == "Message truncated"
    assert MPI.Get_error_string(MPI.ERR_RANK) == "Invalid rank"
    assert MPI.Get_error_class(MPI.ERR_TAG) == MPI.ERR_TAG
    assert repr(exc) == "MPI.Exception(14)"


def test_op_names_and_user_ops() -> None:
    names = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
             "MAXLOC", "MINLOC"]
    for name in names:
        op = getattr(MPI, name)
        assert isinstance(op, MPI.Op) and op.name == f"MPI_{name}" and op.is_predefined
    assert len({id(getattr(MPI, n)) for n in names}) == len(names)

    def add(a: object, b: object, datatype: object) -> None:
        pass

    op = MPI.Op.Create(add, commute=True)
    assert op.Is_commutative() and op.is_commutative and not op.is_predefined and op
    assert op.function is add and op.name == "add"
    op.Free()
    assert not op
    assert not MPI.Op.Create(add).is_commutative
    with pytest.raises(MPI.Exception):
        MPI.SUM.Free()


def test_null_requests_need_no_world() -> None:
    st = MPI.Status()
    st.source = 5
    assert MPI.REQUEST_NULL.Wait(st) is True and st.source == MPI.ANY_SOURCE
    assert MPI.Request() == MPI.REQUEST_NULL and not MPI.Request()
    assert MPI.Request.Waitall([MPI.Request(), MPI.REQUEST_NULL]) is True


def test_import_and_names_do_not_start_the_runtime() -> None:
    # The guard fixture checks that nothing below started a world in this process.
    world = MPI.COMM_WORLD
    assert isinstance(world, MPI.Intracomm) and isinstance(MPI.COMM_SELF, MPI.Intracomm)
    assert world.Get_name() == world.name == "MPI_COMM_WORLD"
    assert MPI.COMM_SELF.name == "MPI_COMM_SELF"
    assert world.Is_intra() and not world.Is_inter() and world
    assert world.Get_attr(MPI.TAG_UB) == MPI.TAG_UB
    assert not MPI.COMM_NULL and MPI.Comm() == MPI.COMM_NULL
    assert not MPI.Is_initialized() and not MPI.Is_finalized()
    world.Send(np.zeros(2), MPI.PROC_NULL)  # PROC_NULL needs no communication
    world.Recv(np.zeros(2), MPI.PROC_NULL)


def test_first_use_starts_a_singleton_world_outside_a_job() -> None:
    r = python("""
        import numpy as np
        import ringworld
        from ringworld import MPI
        assert not ringworld.initialized() and not MPI.Is_initialized()
        comm = MPI.COMM_WORLD
        print(comm.Get_rank(), comm.Get_size(), MPI.Is_initialized())
        out = np.arange(3.0)
        got = np.zeros(3)
        st = MPI.Status()
        comm.Sendrecv(out, 0, 1, got, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
        print(got.tolist(), st.source, st.tag, st.Get_count(MPI.DOUBLE))
        print(MPI.COMM_SELF.sendrecv("self", 0, source=0))
        MPI.Finalize()
        print(MPI.Is_finalized(), MPI.Is_initialized())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 1 True", "[0.0, 1.0, 2.0] 0 1 3", "self", "True False"]


def test_init_starts_the_runtime_explicitly() -> None:
    r = python("""
        from ringworld import MPI
        MPI.Init()
        print(MPI.Is_initialized(), MPI.COMM_WORLD.size)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True 1\n"


def test_abort_exits_with_the_error_code() -> None:
    r = python("""
        from ringworld import MPI
        print("before", flush=True)
        MPI.COMM_WORLD.Abort(7)
        print("after")
    """)
    assert r.returncode == 7
    assert r.stdout == "before\n"
    assert r.stderr == "ringworld.MPI: called Abort(7) on MPI_COMM_WORLD\n"  # no world started


def launch(n: int, transport: str, program: Path | str, *args: str
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ringworld", "run", "-n", str(n), "--transport", transport,
         sys.executable, str(program), *args],
        check=False, capture_output=True, text=True, timeout=90, env=clean_env(),
        stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_abort_in_a_job_tears_it_down(tmp_path: Path, transport: str) -> None:
    program = tmp_path / "abort.py"
    program.write_text(textwrap.dedent("""
        from ringworld import MPI
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            comm.Abort(5)
        comm.recv(source=1)  # never sent: only the abort ends this rank
    """))
    r = launch(3, transport, program)
    assert r.returncode == 5
    assert "rank 1 called Abort(5)" in r.stderr


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_ring_example(n: int, transport: str) -> None:
    r = launch(n, transport, REPO / "examples" / "mpi4py_ring.py")
    assert r.returncode == 0, r.stderr
    total = n * (n - 1) // 2
    assert r.stdout == (f"token went round {n} processes: {total} (expected {total}), "
                        f"last hop from rank {n - 1}\n")
