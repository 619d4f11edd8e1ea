"""Process plumbing shared by the launcher and the test harness (Linux specifics kept here).

``PR_SET_PDEATHSIG`` makes the kernel signal a child when the thread that started it dies, so ranks
never outlive a launcher killed with ``SIGKILL``. It survives ``execve`` (except for set-uid
programs), so setting it between fork and exec covers the program the rank runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None = None
_prctl_loaded = False


def prepare_parent_death_signal() -> bool:
    """Load ``prctl`` from libc now, so a forked child need not import or load anything.

    Returns whether the call is available (Linux with a C library).
    Cost: one ``dlopen`` per process.
    """
    global _prctl, _prctl_loaded
    if not _prctl_loaded:
        _prctl_loaded = True
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _prctl = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                _prctl = None
    return _prctl is not None


def set_parent_death_signal(sig: int, parent_pid: int) -> None:
    """In a freshly forked child: receive ``sig`` when the parent dies; exit now if it already has.

    Call :func:`prepare_parent_death_signal` in the parent before forking. Safe to call from a
    ``preexec_fn``: no imports, no allocation beyond a few integers. Does nothing where ``prctl`` is
    unavailable.
    """
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 42`` for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """Describe a ``Popen``-style return code: ``exited with code 3`` / ``killed by SIGKILL``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"


def exit_code(returncode: int) -> int:
    """Shell-style exit status of a ``Popen``-style return code (128 + signal number)."""
    return 128 - returncode if returncode < 0 else returncode


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``, ignoring a group that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` from ``/proc/<pid>/stat`` (``R``, ``S``, ``T`` for
    stopped, ``Z`` ...), or None where it cannot be read (gone, or no ``/proc``).

    Cost: one small file read.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat.rpartition(b")")[2].split()  # the command name may hold spaces and brackets
    return rest[0].decode() if rest else None
