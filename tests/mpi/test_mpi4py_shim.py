"""``ringworld run --mpi4py``: the stand-in ``mpi4py`` package, and nothing shadowed without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringworld.launch.job import SHIM_DIR, with_mpi4py_shim

REPO = Path(__file__).resolve().parents[2]
MPI_PYTHON = os.environ.get("RINGWORLD_MPI_PYTHON", "")
HAVE_MPI4PY = bool(MPI_PYTHON) and Path(MPI_PYTHON).exists()
FIND = ("import importlib.util as u; s = u.find_spec('mpi4py'); "
        "print(None if s is None else s.origin)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def launch(*args: str, n: int = 1, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", str(n), *args],
                          check=False, capture_output=True, text=True, timeout=60, env=_env(),
                          stdin=subprocess.DEVNULL, cwd=REPO)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_shim_dir_is_the_package_directory() -> None:
    import ringworld.mpi.shim

    assert os.path.isdir(os.path.join(SHIM_DIR, "mpi4py"))
    assert SHIM_DIR == ringworld.mpi.shim.PATH


def test_with_mpi4py_shim_prepends_once() -> None:
    env = with_mpi4py_shim({"PYTHONPATH": f"/a{os.pathsep}/b", "X": "1"}, "/shim")
    assert env == {"PYTHONPATH": os.pathsep.join(["/shim", "/a", "/b"]), "X": "1"}
    assert with_mpi4py_shim(env, "/shim") == env
    assert with_mpi4py_shim({}, "/shim") == {"PYTHONPATH": "/shim"}
    assert with_mpi4py_shim({"PYTHONPATH": ""}, "/shim") == {"PYTHONPATH": "/shim"}


def test_without_the_flag_nothing_is_shadowed() -> None:
    origin = launch("-c", FIND).stdout.strip()
    assert SHIM_DIR not in origin and "ringworld" not in origin


def test_with_the_flag_mpi4py_is_the_stand_in() -> None:
    origin = launch("--mpi4py", "-c", FIND).stdout.strip()
    assert origin == os.path.join(SHIM_DIR, "mpi4py", "__init__.py")


@pytest.mark.skipif(not HAVE_MPI4PY, reason="RINGWORLD_MPI_PYTHON is not set to a Python with "
                    "mpi4py (scripts/install-peers.sh)")
def test_real_mpi4py_is_found_without_the_flag_and_shadowed_with_it() -> None:
    plain = launch(MPI_PYTHON, "-c", FIND).stdout.strip()
    assert "site-packages" in plain and SHIM_DIR not in plain
    shadowed = launch("--mpi4py", MPI_PYTHON, "-c", FIND).stdout.strip()
    assert shadowed.startswith(SHIM_DIR)


PACKAGE_BASICS = """
import mpi4py
assert mpi4py.__ringworld__ and mpi4py.__version__.split('.')[0] == '4'
assert repr(mpi4py.rc) == '<mpi4py.rc>' and mpi4py.rc.initialize is True
mpi4py.rc(thread_level='serialized')
assert mpi4py.rc.thread_level == 'serialized'
try:
    mpi4py.rc(no_such_option=1)
except TypeError as exc:
    assert 'no_such_option' in str(exc)
else:
    raise AssertionError('unknown rc option accepted')
mpi4py.rc.initialize = False
import ringworld.MPI
MPI = mpi4py.MPI                       # attribute access imports it
assert MPI is ringworld.MPI and not MPI.Is_initialized()
from mpi4py import MPI as again
import mpi4py.MPI as third
assert again is MPI is third
MPI.Init()
assert MPI.Is_initialized()
comm = MPI.COMM_WORLD
print(comm.Get_rank(), comm.Get_size(), comm.allreduce(comm.Get_rank()))
"""


def test_package_basics_and_rc() -> None:
    out = launch("--mpi4py", "-c", PACKAGE_BASICS, n=2).stdout.split("\n")
    assert sorted(out[:2]) == ["0 2 1", "1 2 1"]


def test_import_initializes_by_default() -> None:
    out = launch("--mpi4py", "-c", "from mpi4py import MPI; print(MPI.Is_initialized())").stdout
    assert out == "True\n"


def test_python_m_mpi4py_runs_a_script(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom mpi4py import MPI\nstarted = MPI.Is_initialized()\n"
                    "print(MPI.COMM_WORLD.Get_rank(), sys.argv[1:], __name__, started)\n")
    out = launch("--mpi4py", sys.executable, "-m", "mpi4py", "-rc", "initialize=false",
                 str(prog), "a", "b", n=2).stdout
    assert sorted(out.splitlines()) == ["0 ['a', 'b'] __main__ False",
                                        "1 ['a', 'b'] __main__ False"]
    out = launch("--mpi4py", sys.executable, "-m", "mpi4py", "-c",
                 "import sys; from mpi4py import MPI; print(MPI.COMM_WORLD.size, sys.argv)",
                 "x").stdout
    assert out == "1 ['-c', 'x']\n"


def test_python_m_mpi4py_rejects_bad_usage() -> None:
    done = launch("--mpi4py", sys.executable, "-m", "mpi4py", "-rc", "bogus=1", "x.py",
                  check=False)
    assert done.returncode != 0 and "bogus" in done.stderr
    done = launch("--mpi4py", sys.executable, "-m", "mpi4py", check=False)
    assert done.returncode != 0 and "no program given" in done.stderr


def test_uncaught_exception_in_an_mpi4py_program_fails_the_job(tmp_path: Path) -> None:
    prog = tmp_path / "fail.py"
    prog.write_text("from mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1:\n"
                    "    raise SystemExit(3)\nMPI.COMM_WORLD.Barrier()\n")
    done = launch("--mpi4py", sys.executable, str(prog), n=2, check=False)
    assert done.returncode == 3
