"""Starting benchmark jobs: ``ringworld run``, MPICH's ``mpiexec``, gloo and a socket pair.

Every job runs in its own session with its output in a temporary file; a job that outlives its
timeout is killed as a whole process group. Nothing here imports the communication layers, so
the driver works even when a library under test cannot start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RANK_PROGRAM = HERE / "pingpong_rank.py"
BARRIER_PROGRAM = HERE / "barrier_rank.py"
SWEEP_PROGRAM = HERE / "sweep_rank.py"
GLOO_LAUNCHER = HERE / "gloo_launch.py"
OUTPUT_TAIL_LINES = 25  # lines of a failed job's output shown in the report


@dataclass(slots=True)
class JobOutcome:
    """How one launched job ended."""

    returncode: int
    seconds: float
    output: str
    timed_out: bool = False

    def describe(self) -> str:
        """One line for a report, plus the output's tail when the job failed."""
        if self.timed_out:
            head = f"timed out after {self.seconds:.0f} s"
        else:
            head = f"exit code {self.returncode}"
        tail = "\n".join(self.output.rstrip().splitlines()[-OUTPUT_TAIL_LINES:])
        return f"{head}\n{tail}" if tail else head


@dataclass(slots=True)
class RunResult:
    """One measured configuration (a library over a transport)."""

    label: str
    backend: str
    transport: str
    ok: bool = False
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] | None = None

    @property
    def library(self) -> str:
        """The library's own version string, as its rank 0 reported it."""
        return str(self.data.get("library", self.backend))

    @property
    def errors(self) -> int:
        """Verification errors counted by the ranks (0 when the job never reported)."""
        v = self.data.get("verify", {})
        return int(v.get("wrong_bytes", 0) + v.get("wrong_counts", 0) + v.get("wrong_objects", 0))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the session this benchmark started for ``proc`` (and only that)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_job(
    argv: Sequence[str],
    timeout: float,
    *,
    pass_fds: Sequence[int] = (),
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> JobOutcome:
    """Run ``argv`` to completion (or kill it at ``timeout``), capturing its output.

    With ``on_line`` the output is read through a pipe and every line is also passed to it as it
    arrives (for progress reports); the job's output is captured all the same.
    """
    if on_line is not None:
        return _run_streaming(argv, timeout, env, on_line)
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, pass_fds=tuple(pass_fds), env=env,
        )
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        seconds = time.perf_counter() - t0
        log.seek(0)
        output = log.read().decode(errors="replace")
    return JobOutcome(proc.returncode, seconds, output, timed_out)


def _run_streaming(
    argv: Sequence[str], timeout: float, env: dict[str, str] | None,
    on_line: Callable[[str], None],
) -> JobOutcome:
    """:func:`run_job` reading the output line by line in a thread."""
    lines: list[str] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env=env,
    )
    stdout = proc.stdout
    assert stdout is not None

    def pump() -> None:
        for raw in stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            on_line(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    reader.join(5)  # a rank's orphaned child could hold the pipe open: do not wait forever
    stdout.close()
    return JobOutcome(proc.returncode, time.perf_counter() - t0, "".join(lines), timed_out)


# --------------------------------------------------------------------------------------------
# Locating the programs


def ringworld_command() -> list[str]:
    """The ``ringworld`` launcher of this installation."""
    beside = Path(sys.executable).parent / "ringworld"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ringworld")
    if found:
        return [found]
    return [sys.executable, "-m", "ringworld"]


def ringworld_run_argv(np: int, transport: str, program: Sequence[str]) -> list[str]:
    """``ringworld run -n NP --transport T PROGRAM...`` (PROGRAM: a script path and its args)."""
    return [*ringworld_command(), "run", "-n", str(np), "--transport", transport, *program]


@dataclass(frozen=True, slots=True)
class MpiPeer:
    """A Python with mpi4py and numpy, and the ``mpiexec`` that belongs to it."""

    python: str
    mpiexec: str

    def argv(self, np: int, program: Sequence[str]) -> list[str]:
        """``mpiexec -n NP python PROGRAM...``."""
        return [self.mpiexec, "-n", str(np), self.python, *program]


def find_mpi_peer(python: str | None) -> MpiPeer:
    """Locate mpi4py: ``python`` (a venv's python or the venv itself), else the current python.

    Raises:
        ValueError: no usable python or no ``mpiexec`` beside it, with what to do about it.
    """
    if python is None:
        if importlib.util.find_spec("mpi4py") is None:
            raise ValueError(
                "mpi4py is not importable here: pass --mpi-python /path/to/venv/bin/python "
                "(or set RINGWORLD_MPI_PYTHON); scripts/install-peers.sh makes one"
            )
        python = sys.executable
    path = Path(python)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file():
        raise ValueError(f"--mpi-python {python!r}: no such python")
    mpiexec = path.parent / "mpiexec"  # not resolved: a venv's python is a symlink
    found = str(mpiexec) if mpiexec.is_file() else shutil.which("mpiexec")
    if found is None:
        raise ValueError(f"no mpiexec beside {path} nor on PATH: pip install mpich into that venv")
    probe = run_job([str(path), "-c", "import mpi4py.MPI, numpy"], timeout=120)
    if probe.returncode != 0:
        raise ValueError(f"{path} cannot import mpi4py and numpy: {probe.describe()}")
    return MpiPeer(str(path), found)


@dataclass(frozen=True, slots=True)
class TorchPeer:
    """A Python with torch (gloo) and numpy; jobs start under ``gloo_launch.py``."""

    python: str

    def argv(self, np: int, program: Sequence[str]) -> list[str]:
        """``python gloo_launch.py -n NP -- python PROGRAM...``."""
        return [self.python, str(GLOO_LAUNCHER), "-n", str(np), "--", self.python, *program]


def find_torch_peer(candidates: Sequence[str | None]) -> TorchPeer:
    """The first of ``candidates`` (pythons or venvs; None entries skipped) with torch and numpy.

    The current python is tried last.

    Raises:
        ValueError: none of them has torch and numpy installed.
    """
    tried: list[str] = []
    for candidate in [*candidates, sys.executable]:
        if candidate is None:
            continue
        path = Path(candidate)
        if path.is_dir():
            path = path / "bin" / "python"
        if str(path) in tried:
            continue
        tried.append(str(path))
        if not path.is_file():
            continue
        # find_spec only: importing torch takes seconds; a torch without gloo fails the job
        probe = run_job([str(path), "-c", "import importlib.util as u, sys; sys.exit(not "
                         "(u.find_spec('torch') and u.find_spec('numpy')))"], timeout=120)
        if probe.returncode == 0:
            return TorchPeer(str(path))
    raise ValueError(
        f"no python with torch and numpy among {tried}: pass --torch-python "
        "(or set RINGWORLD_TORCH_PYTHON); scripts/install-peers.sh --torch makes one"
    )


# --------------------------------------------------------------------------------------------
# Running the measurements


def _collect(result: RunResult, outcome: JobOutcome, out: Path) -> RunResult:
    """Read rank 0's JSON; a job that failed or wrote nothing becomes an error."""
    if out.is_file() and out.stat().st_size:
        result.data = json.loads(out.read_text())
    if outcome.returncode != 0 or outcome.timed_out or not result.data:
        result.error = outcome.describe()
    if result.errors:
        note = f"{result.errors} verification errors: {result.data.get('verify')}"
        result.error = f"{note}\n{result.error}" if result.error else note
    result.ok = result.error is None
    return result


def measure_ringworld(
    np: int, transport: str, rank_args: Sequence[str], timeout: float, api: str = "native"
) -> RunResult:
    """Ringworld ranks under ``ringworld run``; ``api`` "mpi": the mpi4py backend's calls
    through ``ringworld.MPI``."""
    mpi = api == "mpi"
    result = RunResult(f"ringworld{'MPI' if mpi else ''}-{transport}", "ringworld", transport)
    with tempfile.TemporaryDirectory(prefix="rw-bench-") as tmp:
        out = Path(tmp) / "result.json"
        backend = "ringworld-mpi" if mpi else "ringworld"
        program = [str(RANK_PROGRAM), "--backend", backend, *rank_args, "--out", str(out)]
        outcome = run_job(ringworld_run_argv(np, transport, program), timeout)
        return _collect(result, outcome, out)


def measure_mpi4py(
    peer: MpiPeer, np: int, rank_args: Sequence[str], timeout: float
) -> RunResult:
    """The same rank program under ``mpiexec`` with the mpi4py backend."""
    result = RunResult("mpi4py", "mpi4py", "mpi")
    with tempfile.TemporaryDirectory(prefix="rw-bench-") as tmp:
        out = Path(tmp) / "result.json"
        program = [str(RANK_PROGRAM), "--backend", "mpi4py", *rank_args, "--out", str(out)]
        outcome = run_job(peer.argv(np, program), timeout)
        return _collect(result, outcome, out)


def measure_socket(rank_args: Sequence[str], timeout: float) -> RunResult:
    """Two processes over one loopback TCP connection (rank 1 inherits the listener)."""
    result = RunResult("socket", "socket", "tcp")
    with tempfile.TemporaryDirectory(prefix="rw-bench-") as tmp, socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        out = Path(tmp) / "result.json"
        base = [sys.executable, str(RANK_PROGRAM), "--backend", "socket", *rank_args]
        fd = listener.fileno()
        with tempfile.TemporaryFile() as log1:
            server = subprocess.Popen(
                [*base, "--socket-rank", "1", "--socket-fd", str(fd)],
                stdin=subprocess.DEVNULL, stdout=log1, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(fd,),
            )
            try:
                outcome = run_job(
                    [*base, "--socket-rank", "0", "--socket-port", str(port), "--out", str(out)],
                    timeout,
                )
                server.wait(30 if outcome.returncode == 0 else 1)
            except subprocess.TimeoutExpired:
                _kill_group(server)
            if server.returncode != 0:
                log1.seek(0)
                text = log1.read().decode(errors="replace")
                outcome.output += f"\n[socket rank 1: exit code {server.returncode}]\n{text}"
                outcome.returncode = outcome.returncode or 1
        return _collect(result, outcome, out)


def measure_startup(argv: Sequence[str], runs: int, timeout: float) -> dict[str, Any]:
    """Wall clock of a whole job command: one untimed warm-up, then the median of ``runs``."""
    samples: list[float] = []
    for i in range(runs + 1):
        outcome = run_job(argv, timeout)
        if outcome.returncode != 0 or outcome.timed_out:
            return {"error": outcome.describe(), "samples_s": samples}
        if i:
            samples.append(outcome.seconds)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples_s": samples}
