"""Helpers for the launcher's end-to-end tests: run ``ringworld`` in a subprocess, watch pids."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
LAUNCHER = [sys.executable, "-m", "ringworld"]
TRANSPORTS = ["shm", "tcp"]


def ringworld(*args: str, timeout: float = 60, input: str | None = None,
              env: dict[str, str] | None = None, cwd: Path | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ringworld ARGS`` to completion (stdin closed unless ``input``)."""
    return subprocess.run(
        [*LAUNCHER, *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd=cwd,
    )


def script(tmp_path: Path, body: str, name: str = "prog.py") -> Path:
    """Write a dedented Python program into ``tmp_path``."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def wait_dead(pids: list[int], within: float) -> list[int]:
    """Poll until none of ``pids`` is alive or ``within`` seconds pass; return those still alive."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed test: SIGKILL whatever is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class Launcher:
    """A ``ringworld`` started in the background, with its stdout read line by line."""

    def __init__(self, *args: str, start_new_session: bool = False) -> None:
        self.proc = subprocess.Popen(
            [*LAUNCHER, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=start_new_session,
        )
        assert self.proc.stdout is not None
        self._out = self.proc.stdout
        os.set_blocking(self._out.fileno(), False)
        self._buf = b""
        self.lines: list[str] = []

    def read_lines(self, count: int, timeout: float) -> list[str]:
        """Wait until ``count`` stdout lines have arrived (fails the test on timeout)."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._out, selectors.EVENT_READ)
            while len(self.lines) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"only got {self.lines!r} from the launcher"
                if not sel.select(left):
                    continue
                chunk = self._out.read()
                if not chunk:
                    raise AssertionError(f"launcher closed stdout after {self.lines!r}: "
                                         f"{self.proc.wait(5)} {self.stderr()}")
                self._buf += chunk
                *done, self._buf = self._buf.split(b"\n")
                self.lines.extend(line.decode() for line in done)
        return self.lines

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def shm_files(job_id: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"ringworld-{job_id}-"))
