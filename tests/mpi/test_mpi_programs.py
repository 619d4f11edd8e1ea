"""mpi4py programs under ``ringworld.MPI`` give exactly the records real mpi4py gave.

The records in ``mpi4py_records.json`` come from mpi4py over MPICH (see ``mpi_programs.py``);
every program runs at world sizes 1, 2, 3 and 5 over both transports.
"""

from __future__ import annotations

import json
import os
import subprocess
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
