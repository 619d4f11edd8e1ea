"""mpi4py programs under ``ringworld.MPI`` give exactly the records real mpi4py gave.

The records in ``mpi4py_records.json`` come from mpi4py over MPICH (see ``mpi_programs.py``);
every program runs at world sizes 1, 2, 3 and 5 over both transports, and the collective ones
also as a script under ``ringworld run``, compared with a live ``mpiexec`` run where mpi4py is
at hand (``RINGWORLD_MPI_PYTHON``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mpi_programs
import pytest

from ringworld.testing import run_processes

RECORDS: dict[str, Any] = json.loads(mpi_programs.RECORDS.read_text())
#: A Python with mpi4py (as for the benchmarks: scripts/install-peers.sh); mpiexec beside it.
MPI_PYTHON = os.environ.get("RINGWORLD_MPI_PYTHON", "")
MPIEXEC = Path(MPI_PYTHON).with_name("mpiexec") if MPI_PYTHON else None


def _run(comm: object, name: str) -> Any:
    from ringworld import MPI

    record = getattr(mpi_programs, name)(MPI)
    return json.loads(json.dumps(record))  # tuples become lists, as in the recorded JSON


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", mpi_programs.SIZES)
@pytest.mark.parametrize("name", mpi_programs.PROGRAMS)
def test_program_matches_mpi4py(name: str, size: int, transport: str) -> None:
    got = run_processes(size, _run, name, transport=transport, timeout=60)
    expected = RECORDS[f"{name}/{size}"]
    for rank, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        for key in theirs:
            assert mine[key] == theirs[key], f"rank {rank}: {key!r} differs from mpi4py"
        assert mine.keys() == theirs.keys()


def test_records_cover_every_program_and_size() -> None:
    wanted = {f"{name}/{size}" for name in mpi_programs.PROGRAMS for size in mpi_programs.SIZES}
    assert wanted <= RECORDS.keys()


@pytest.mark.skipif(MPIEXEC is None or not MPIEXEC.exists(),
                    reason="RINGWORLD_MPI_PYTHON is not set to a Python with mpi4py and mpiexec")
def test_records_still_match_live_mpi4py() -> None:
    assert MPIEXEC is not None
    for name in mpi_programs.PROGRAMS:
        done = subprocess.run([str(MPIEXEC), "-n", "3", MPI_PYTHON, mpi_programs.__file__, name],
                              check=False, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == RECORDS[f"{name}/3"], name


#: The programs of the collective layer, run as one script by each launcher.
COLLECTIVE_PROGRAMS = ["prog_collectives", "prog_communicators", "prog_reductions"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}


def _json_lines(done: subprocess.CompletedProcess[str]) -> list[Any]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_collective_programs_under_the_launcher(transport: str) -> None:
    """The programs as a script under ``ringworld run`` against mpi4py (live if at hand)."""
    script = [mpi_programs.__file__, *COLLECTIVE_PROGRAMS]
    ours = _json_lines(subprocess.run(
        [sys.executable, "-m", "ringworld", "run", "-n", "3", "--transport", transport,
         sys.executable, *script, "--ringworld"],
        check=False, capture_output=True, text=True, timeout=120, env=_clean_env(),
        stdin=subprocess.DEVNULL))
    if MPIEXEC is not None and MPIEXEC.exists():
        theirs = _json_lines(subprocess.run(
            [str(MPIEXEC), "-n", "3", MPI_PYTHON, *script], check=False, capture_output=True,
            text=True, timeout=120, env=_clean_env(), stdin=subprocess.DEVNULL))
    else:
        theirs = [RECORDS[f"{name}/3"] for name in COLLECTIVE_PROGRAMS]
    for name, mine, expected in zip(COLLECTIVE_PROGRAMS, ours, theirs, strict=True):
        assert mine == expected, name
