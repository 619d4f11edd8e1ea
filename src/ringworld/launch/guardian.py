"""A guardian that ends what the ranks started when the launcher dies without cleaning up.

Ranks get ``PR_SET_PDEATHSIG=SIGKILL``, so they die with a launcher killed by ``SIGKILL``; the
processes a rank started do not (they are not the launcher's children). The launcher normally
kills each rank's process group itself, but a ``SIGKILL`` leaves it no chance. So the launcher
starts this guardian, a small process of its own (``python -I -S`` running this file: a few
standard modules, about 10 ms of start-up, overlapping the ranks'), in a session of its own so
that whatever takes down the launcher's process group spares it. They share one pipe::

    launcher                         guardian (blocked in read(2): costs nothing while the job runs)
      +<sid>\\n   rank started, leading session <sid>      -> remember it
      -<sid>\\n   rank about to be reaped by the launcher  -> forget it (its id may be reused then)
      done\\n     the launcher cleaned up                   -> exit at once, killing nothing
      EOF        the launcher died: every copy of the write end closes with it
                                                       -> kill the sessions still remembered

On EOF without ``done``, the guardian kills (``SIGKILL``, by process group) every process of a
remembered session that started no later than the EOF, a few rounds until none is left, then exits.
A session id is only reused once the session is empty, and a reused one belongs to a process
started after the launcher died, so the start-time check keeps unrelated processes safe. The
guardian never outlives the job: it exits on ``done`` or right after EOF (at most
:data:`KILL_ROUNDS` rounds). A process that left the rank's session (``setsid``) is out of its
reach, as it is of the launcher's.

The launcher's side is :class:`Guardian`: if the guardian cannot be started or stops taking
messages, it is killed and the job goes on without one (the ranks still have their parent-death
signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing's own costs the guardian's start-up 5 ms; mypy knows this one
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterable
    from typing import IO

#: How many times the guardian looks for and kills what is left, :data:`ROUND_SECONDS` apart.
KILL_ROUNDS = 50
ROUND_SECONDS = 0.02
#: How long the launcher waits for the guardian to exit after ``done``.
EXIT_SECONDS = 2.0
_DONE = b"done"


# -- the guardian process (standard library only: run as ``python -I -S guardian.py``) -------

def _ticks_now() -> int:
    """Now, in the clock ticks since boot that ``/proc/<pid>/stat`` gives start times in."""
    with open("/proc/uptime", "rb") as f:
        uptime = float(f.read().split()[0])
    return int(uptime * os.sysconf("SC_CLK_TCK")) + 1  # +1: a start within this very tick


def _members(sessions: set[int], started_by: int) -> dict[int, set[int]]:
    """Live processes (not zombies) of ``sessions`` that started no later than ``started_by``
    ticks, as {session: {process group}}."""
    found: dict[int, set[int]] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            state, pgrp, sid, start = fields[0], int(fields[2]), int(fields[3]), int(fields[19])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if sid in sessions and state not in (b"Z", b"X") and start <= started_by:
            found.setdefault(sid, set()).add(pgrp)
    return found


def kill_sessions(sessions: Iterable[int]) -> None:
    """Kill every process of ``sessions`` that started by now (see the module docstring)."""
    left = set(sessions)
    for _ in range(KILL_ROUNDS):
        found = _members(left, _ticks_now())
        left = set(found)  # an empty session is never looked at again: its id may be reused
        if not left:
            return
        for groups in found.values():
            for pgrp in groups:  # a group seen with a member just now: its id is still held
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgrp, signal.SIGKILL)
        time.sleep(ROUND_SECONDS)


def serve(fd: int) -> None:
    """Read the launcher's messages from ``fd`` until ``done`` (return) or EOF (kill, return)."""
    sessions: set[int] = set()
    pending = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line == _DONE:
                return
            with contextlib.suppress(ValueError):  # not from the launcher: ignored
                if line.startswith(b"+"):
                    sessions.add(int(line[1:]))
                elif line.startswith(b"-"):
                    sessions.discard(int(line[1:]))
    if sessions:
        kill_sessions(sessions)


# -- the launcher's side --------------------------------------------------------------------

class Guardian:
    """The launcher's handle on its guardian process (see the module docstring).

    :meth:`start` returns None where no guardian can run (no ``/proc``, no Python executable);
    every method is best effort and never raises.
    """

    def __init__(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        self._proc = proc
        self._fd = fd

    @classmethod
    def start(cls) -> Guardian | None:
        """Start a guardian. Cost: one fork+exec of a Python without site packages."""
        if not sys.executable or not os.path.isdir("/proc/self"):
            return None
        import subprocess

        r, w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,  # spared by signals to the launcher's group
                close_fds=True, cwd="/",
            )
        except OSError:
            os.close(w)
            return None
        finally:
            os.close(r)
        os.set_blocking(w, False)  # never wait on the guardian: drop it instead
        return cls(proc, w)

    def watch(self, sid: int) -> None:
        """A rank started, leading session (and process group) ``sid``."""
        self._send(b"+%d\n" % sid)

    def forget(self, sid: int) -> None:
        """The rank leading ``sid`` is about to be reaped (call before reaping it)."""
        self._send(b"-%d\n" % sid)

    def close(self) -> None:
        """The launcher cleaned up: tell the guardian, and reap it. Idempotent."""
        if self._fd < 0:
            return
        import subprocess

        if self._send(_DONE + b"\n"):
            os.close(self._fd)
            self._fd = -1
            try:
                self._proc.wait(EXIT_SECONDS)
                return
            except subprocess.TimeoutExpired:  # stuck: killed below
                pass
        self._drop()

    def _send(self, message: bytes) -> bool:
        if self._fd < 0:
            return False
        try:
            if os.write(self._fd, message) == len(message):  # < PIPE_BUF: all or nothing
                return True
        except OSError:  # full (the guardian is not reading) or gone
            pass
        self._drop()
        return False

    def _drop(self) -> None:
        """Go on without the guardian: killed first, so it never acts on stale sessions."""
        import subprocess

        try:
            self._proc.kill()
            self._proc.wait(EXIT_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _main(stdin: IO[bytes]) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):  # meant for the launcher, never for this
        signal.signal(sig, signal.SIG_IGN)
    serve(stdin.fileno())
    os._exit(0)  # nothing to tear down


if __name__ == "__main__":
    _main(sys.stdin.buffer)
