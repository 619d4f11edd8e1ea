"""Which CPU a process runs on: for waits that must not hand their core to the wrong task.

A rank that waits for a peer on the same host has two ways to wait well, and which one is right
depends on where the peer is. If the peer is queued on this rank's own CPU, only giving the CPU
up (``sched_yield``) lets it run. If it is on another CPU, giving up this one helps nobody but
an unrelated process: under Linux's EEVDF scheduler a yield moves the yielder's deadline a whole
slice (3 ms) back, so beside one busy process a yielding rank loses its core for milliseconds
(8-byte allreduce at np=2 on 2 cores beside one busy process: 75-100 us per call yielding, 10.6
us spinning; both ranks on one core and spinning: 3.9 ms per call).

:class:`CpuWatch` reads the CPU a process last ran on, the ``processor`` field of
``/proc/<pid>/stat`` (for a process waiting to run, the CPU whose queue it waits in), and this
thread's CPU via ``sched_getcpu``. Cost: about 5 us per peer read (a ``pread`` of a kept
descriptor), 0.15 us for this thread's CPU. Where ``/proc`` or ``sched_getcpu`` are missing
every answer is -1 (unknown), and callers fall back to yielding.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterable

_PROCESSOR = 36  # index of field 39 (processor) among the fields after the command's ")"


def _getcpu() -> Callable[[], int]:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return lambda: -1
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


this_cpu: Callable[[], int] = _getcpu()
"""The CPU the calling thread runs on now (-1: unknown)."""


class CpuWatch:
    """The CPUs that processes (by pid) last ran on, from their ``/proc`` stat files kept open.

    Safe to use from several threads (a descriptor is opened once per pid).
    """

    __slots__ = ("_fds",)

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def cpu_of(self, pid: int, runnable: bool = False) -> int:
        """The CPU process ``pid`` last ran on or waits to run on; -1 when unknown (no
        ``/proc``, the process gone), or (``runnable``) when it is not running or waiting to
        run (asleep, it needs no CPU). Cost: one ``pread`` (about 5 us)."""
        fd = self._fds.get(pid)
        try:
            if fd is None:
                new = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
                fd = self._fds.setdefault(pid, new)
                if fd != new:  # another thread opened it meanwhile
                    os.close(new)
            text = os.pread(fd, 1024, 0)
            fields = text[text.rindex(b")") + 2 :].split(None, _PROCESSOR + 1)
            if runnable and fields[0] != b"R":  # (the state, the first field after the name)
                return -1
            return int(fields[_PROCESSOR])
        except (OSError, ValueError, IndexError):
            return -1

    def shares_cpu(self, pids: Iterable[int], *, runnable: bool = False,
                   unknown: bool = True) -> bool:
        """Whether any of ``pids`` last ran (or waits to run) on the calling thread's CPU;
        ``unknown`` where that cannot be told (True, the default: then yielding is the safe
        way to wait, as for shared memory's peers; a TCP transport's may well be elsewhere).
        ``runnable``: count only processes running or waiting to run (see :meth:`cpu_of`; one
        asleep counts as unknown)."""
        mine = this_cpu()
        if mine < 0:
            return unknown
        for pid in pids:
            cpu = self.cpu_of(pid, runnable)
            if cpu == mine or (cpu < 0 and unknown):
                return True
        return False

    def close(self) -> None:
        """Close the kept descriptors (the watch stays usable: they reopen on demand)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


class Runnable:
    """How many tasks on this host run or wait to run now: Linux's count of runnable tasks,
    the fourth field of ``/proc/loadavg`` (host-wide: in a container it may count the host's).
    None where it cannot be read. Cost: one ``pread`` of a kept descriptor (0.5 us)."""

    __slots__ = ("_fd",)

    def __init__(self) -> None:
        self._fd = -1

    def __call__(self) -> int | None:
        if self._fd < 0:
            try:
                self._fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            field = os.pread(self._fd, 128, 0).split()[3]
            return int(field[: field.index(b"/")])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        """Close the kept descriptor (it reopens on the next call)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def move_off(cpu: int) -> bool:
    """Have the scheduler move the calling thread off ``cpu`` at once: its affinity is narrowed
    to the others for an instant, then restored exactly. False (nothing changed) when ``cpu``
    is not in its affinity or is its only CPU. Cost: two system calls and the migration."""
    try:
        mask = os.sched_getaffinity(0)
        if cpu < 0 or cpu not in mask or len(mask) < 2:
            return False
        os.sched_setaffinity(0, mask - {cpu})
        os.sched_setaffinity(0, mask)
    except (OSError, AttributeError):
        return False
    return True
