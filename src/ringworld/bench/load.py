"""Background load for benchmarks: ``ringworld bench ... --load N`` runs beside N busy processes.

Users' machines always run something else (data loaders, a monitoring agent, a second job), so
every table can be taken quiet and loaded in one command. :func:`busy` starts N processes that
spin in pure Python for the duration of a ``with`` block and stops them however the block ends;
:func:`describe` is the line each table prints so that the conditions travel with the figures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

_SPIN = "while True:\n    pass\n"


def describe(n: int) -> str:
    """How a table says under what load it was taken."""
    if n <= 0:
        return "conditions: quiet (no background load started by the benchmark)"
    return (f"conditions: beside {n} busy process{'es' if n > 1 else ''} started by the "
            f"benchmark (--load {n}; {os.cpu_count() or 1} CPUs)")


@contextlib.contextmanager
def busy(n: int) -> Iterator[list[int]]:
    """Run ``n`` busy processes (each in a session of its own) for the block; yields their
    pids. They are killed, and reaped, when the block ends by any means (an exception or a
    KeyboardInterrupt included). Cost: ``n`` interpreter starts (~20 ms each).

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"--load {n}: the number of busy processes must be >= 0")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", _SPIN],
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
