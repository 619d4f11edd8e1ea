"""The MPI backend: the native API over mpi4py, run under MPICH's mpiexec from the peers venv.

Needs ``RINGWORLD_MPI_PYTHON`` (a python with mpi4py and numpy, ``mpiexec`` beside it; CI sets
it from ``scripts/install-peers.sh``); the rank program imports ringworld from this checkout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
CHECKS = Path(__file__).with_name("mpi_rank_checks.py")
MPI_PYTHON = os.environ.get("RINGWORLD_MPI_PYTHON", "")
MPIEXEC = os.path.join(os.path.dirname(MPI_PYTHON), "mpiexec") if MPI_PYTHON else ""
needs_mpi = pytest.mark.skipif(
    not (MPI_PYTHON and os.access(MPIEXEC, os.X_OK)),
    reason="RINGWORLD_MPI_PYTHON is not set to a python with mpi4py and mpiexec beside it "
           "(scripts/install-peers.sh /tmp/peers; "
           "export RINGWORLD_MPI_PYTHON=/tmp/peers/bin/python)")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGWORLD_", "PMI_"))}
    env["PYTHONPATH"] = str(SRC)
    env.update(extra)
    return env


def _mpiexec(n: int, *args: str, env: dict[str, str] | None = None,
             timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MPIEXEC, "-n", str(n), MPI_PYTHON, *args], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


@needs_mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 3])
def test_every_call_matches_numpy_under_mpiexec(n: int) -> None:
    res = _mpiexec(n, str(CHECKS), "mpi")
    assert res.returncode == 0, res.stdout + res.stderr
    # mpiexec merges the ranks' output without keeping lines whole: find the records
    oks = re.findall(r"CHECKS OK (\d+) (\d+)", res.stdout)
    assert sorted(int(rank) for rank, _ in oks) == list(range(n)), res.stdout
    assert all(int(count) >= 55 for _, count in oks), res.stdout


@pytest.mark.timeout(200)
def test_the_same_checks_pass_on_the_native_backend() -> None:
    """The rank program's every call, in place included, gives the same on the native
    backend: the two backends share the collective table's checks."""
    env = {**_env(), "PYTHONPATH": str(SRC)}
    res = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "3", sys.executable,
                          str(CHECKS)], env=env, capture_output=True, text=True, timeout=180,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    oks = re.findall(r"CHECKS OK (\d+) (\d+)", res.stdout)
    assert sorted(int(rank) for rank, _ in oks) == [0, 1, 2], res.stdout


@needs_mpi
@pytest.mark.timeout(200)
def test_backend_from_the_environment_variable() -> None:
    code = ("import ringworld, numpy as np; c = ringworld.init(); "
            "o = np.empty(1); c.allreduce(np.array([c.rank + 1.0]), o); "
            "print(f'{type(c).__name__} {c.rank} {c.size} {o[0]}', flush=True)")
    res = _mpiexec(2, "-c", code, env=_env(RINGWORLD_BACKEND="mpi"))
    assert res.returncode == 0, res.stderr
    found = sorted(re.findall(r"MpiComm \d 2 3\.0", res.stdout))
    assert found == ["MpiComm 0 2 3.0", "MpiComm 1 2 3.0"], res.stdout


@needs_mpi
@pytest.mark.timeout(200)
def test_the_mpi4py_compatible_module_says_it_needs_the_native_backend() -> None:
    code = ("import ringworld\nfrom ringworld import MPI\nringworld.init(backend='mpi')\n"
            "import sys\n"
            "try:\n    MPI.COMM_WORLD.Get_rank()\nexcept RuntimeError as e:\n"
            # one write per rank: mpiexec interleaves the ranks' writes, not their lines
            "    sys.stdout.write(f'refused: {e}\\n'); sys.stdout.flush()\n")
    res = _mpiexec(2, "-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("refused: ringworld.MPI runs on the native backend") == 2


def _run_here(code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env["PYTHONPATH"] = str(SRC)
    env.update(extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_importing_ringworld_never_imports_mpi4py() -> None:
    res = _run_here("import sys, ringworld, ringworld.backends.mpi, ringworld.runtime; "
                    "print('mpi4py' in sys.modules)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_the_registry_names_every_backend_and_imports_none_until_asked() -> None:
    from ringworld import backends, config

    assert set(backends.BACKENDS) == set(config.BACKENDS) - {"native"}
    with pytest.raises(ValueError, match="backend='nccl'"):
        backends.start_world("nccl", None, expect_size=1)
    res = _run_here("import sys, ringworld, ringworld.runtime; "
                    "print(sorted(m for m in sys.modules if m.startswith('ringworld.backends')))")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['ringworld.backends']"


def test_missing_mpi4py_is_a_clear_config_error(tmp_path: Path) -> None:
    # a stand-in mpi4py package that fails to import, whatever this environment has
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text("raise ImportError('no mpi4py here')\n")
    code = ("import ringworld\n"
            "try:\n    ringworld.init(backend='mpi')\n"
            "except ringworld.ConfigError as e:\n    print('CONFIG', e)\n")
    res = _run_here(code, PYTHONPATH=f"{SRC}:{tmp_path}")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("CONFIG"), res.stdout
    assert "pip install mpi4py" in res.stdout


def test_bad_backend_names_are_rejected() -> None:
    res = _run_here("import ringworld\n"
                    "try:\n    ringworld.init()\n"
                    "except ringworld.ConfigError as e:\n    print('CONFIG', e)\n"
                    "try:\n    ringworld.init(backend='nccl')\n"
                    "except ValueError as e:\n    print('VALUE', e)\n",
                    RINGWORLD_BACKEND="bogus")
    assert res.returncode == 0, res.stderr
    assert "CONFIG RINGWORLD_BACKEND='bogus'" in res.stdout
    assert "VALUE backend='nccl'" in res.stdout
