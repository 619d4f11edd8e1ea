"""Classic mpi4py programs (``tests/mpi4py_programs``) run unchanged under
``ringworld run --mpi4py`` and print exactly what they print under mpi4py over MPICH.

The outputs of mpi4py are recorded in ``tests/mpi4py_programs/expected``; where mpi4py is at hand
(``RINGWORLD_MPI_PYTHON``, with ``mpiexec`` beside it) each program also runs live under it. To
record again::

    python tests/mpi/test_mpi4py_programs.py --record /tmp/peers/bin/python
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAMS_DIR = REPO / "tests" / "mpi4py_programs"
EXPECTED = PROGRAMS_DIR / "expected"
#: program -> world size (odd sizes where uneven splits matter; 2 for the ping-pong loops)
PROGRAMS = {
    "pi": 4, "matvec": 3, "ring": 4, "prefix_sums": 3, "osu_latency": 2, "osu_bw": 2,
    "split_groups": 5, "requests": 3, "buffer_specs": 3, "environment": 2,
}  # fmt: skip
MPI_PYTHON = os.environ.get("RINGWORLD_MPI_PYTHON", "")
MPIEXEC = Path(MPI_PYTHON).with_name("mpiexec") if MPI_PYTHON else None
HAVE_MPI4PY = MPIEXEC is not None and MPIEXEC.exists()
SHIM = str(REPO / "src" / "ringworld" / "mpi" / "shim")


def _env() -> dict[str, str]:
    """This environment without job variables; src first on the path, as in the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def _run(argv: list[str], timeout: float = 120) -> str:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                          env=_env(), stdin=subprocess.DEVNULL, cwd=REPO)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def ringworld_output(name: str, *extra: str) -> str:
    """The program's output under ``ringworld run --mpi4py``."""
    return _run([sys.executable, "-m", "ringworld", "run", "--mpi4py", "-n", str(PROGRAMS[name]),
                 *extra, sys.executable, str(PROGRAMS_DIR / f"{name}.py")])


def mpi4py_output(name: str, python: str) -> str:
    """The program's output under mpi4py: ``mpiexec -n N python PROG`` beside ``python``."""
    mpiexec = str(Path(python).with_name("mpiexec"))
    return _run([mpiexec, "-n", str(PROGRAMS[name]), python, str(PROGRAMS_DIR / f"{name}.py")],
                timeout=300)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_prints_what_mpi4py_prints(name: str) -> None:
    ours = ringworld_output(name)
    assert ours, "the program printed nothing"
    assert ours == (EXPECTED / f"{name}.out").read_text(), "differs from the recorded mpi4py run"
    if HAVE_MPI4PY:
        assert ours == mpi4py_output(name, MPI_PYTHON), "differs from the live mpi4py run"


def test_programs_run_over_tcp_too() -> None:
    for name in ("ring", "buffer_specs"):
        expected = (EXPECTED / f"{name}.out").read_text()
        assert ringworld_output(name, "--transport", "tcp") == expected, name


def test_every_program_has_a_record() -> None:
    scripts = {p.stem for p in PROGRAMS_DIR.glob("*.py")}
    assert scripts == set(PROGRAMS)
    assert {p.stem for p in EXPECTED.glob("*.out")} == set(PROGRAMS)


def test_programs_import_mpi4py_unchanged() -> None:
    for name in PROGRAMS:
        text = (PROGRAMS_DIR / f"{name}.py").read_text()
        assert "from mpi4py import MPI" in text and "ringworld" not in text, name


def _record(python: str) -> None:
    EXPECTED.mkdir(exist_ok=True)
    for name in sorted(PROGRAMS):
        (EXPECTED / f"{name}.out").write_text(mpi4py_output(name, python))
        print(f"recorded {name}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--record":
        sys.exit("usage: test_mpi4py_programs.py --record PYTHON_WITH_MPI4PY")
    _record(sys.argv[2])
