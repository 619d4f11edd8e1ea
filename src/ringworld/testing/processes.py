"""Run a function on every rank of a job made of forked processes (the failure-semantics harness).

Forking skips interpreter start-up, so a world of 8 starts in milliseconds. The parent serves the
job's store and collects one pickled outcome per rank over a pipe (an 8-byte little-endian length,
then the pickle of ``(ok, value_or_traceback_text)``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from ringworld.launch._proc import (
    describe_returncode,
    prepare_parent_death_signal,
    set_parent_death_signal,
)
from ringworld.launch.job import JobStore, new_job_id, new_secret, rank_env, remove_shm_segments

T = TypeVar("T")

_HEADER = struct.Struct("<Q")
#: How long a rank that has reported its outcome may take to exit before it is killed.
_EXIT_GRACE = 2.0
_SECONDARY_MARKERS = ("ringworld.errors.PeerFailure", "ringworld.errors.CommBroken")


class RankFailed(Exception):
    """A rank of :func:`run_processes` raised or died; the message carries its traceback.

    Attributes:
        rank: the rank that failed first.
        detail: the remote traceback text, or how the process died.
    """

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"rank {rank} failed:\n{detail}")
        self.rank = rank
        self.detail = detail


@dataclass(slots=True)
class _Child:
    rank: int
    pid: int
    fd: int
    data: bytearray = field(default_factory=bytearray)
    reported: bool = False
    reaped: bool = False
    status: int = 0

    def message(self) -> tuple[bool, Any] | None:
        """The decoded outcome once it has fully arrived, else ``None``."""
        if len(self.data) < _HEADER.size:
            return None
        (n,) = _HEADER.unpack_from(self.data)
        if len(self.data) < _HEADER.size + n:
            return None
        ok, value = pickle.loads(self.data[_HEADER.size : _HEADER.size + n])
        return bool(ok), value


def _child_main(
    rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: Mapping[str, str],
    fd: int,
    parent: int,
) -> NoReturn:
    """Body of a forked rank: never returns, never runs the parent's atexit handlers."""
    status = 1
    try:
        set_parent_death_signal(signal.SIGKILL, parent)
        try:
            os.environ.clear()
            os.environ.update(env)
            import ringworld

            comm = ringworld.init()
            result = fn(comm, *args)
            ringworld.finalize()
            payload = pickle.dumps((True, result), protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        except BaseException:
            payload = pickle.dumps((False, traceback.format_exc()))
        _flush_std()  # before reporting: the parent may kill us once it has every outcome
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        _flush_std()
        os._exit(status)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _is_secondary(failure: tuple[int, str]) -> bool:
    return any(marker in failure[1] for marker in _SECONDARY_MARKERS)


def run_processes(
    size: int,
    fn: Callable[..., T],
    *args: Any,
    transport: str = "shm",
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> list[T]:
    """Run ``fn(comm, *args)`` on ``size`` forked ranks of one job; return results in rank order.

    Each child sets the job environment (plus ``env``), calls ``ringworld.init()``, runs ``fn``,
    calls ``ringworld.finalize()`` and leaves with ``os._exit``. Results travel back pickled, so
    they must be picklable. Processes, the store and ``/dev/shm/ringworld-<job>-*`` are cleaned up
    however the call ends.

    Raises:
        ValueError: ``size`` < 1 or ``timeout`` <= 0.
        RuntimeError: this process has called ``ringworld.init()`` or ``finalize()`` itself.
        RankFailed: a rank raised (or died); the first to fail is reported, peers that failed only
            because of it (``PeerFailure``/``CommBroken``) are not. The others are killed.
        TimeoutError: not every rank finished within ``timeout`` seconds; names those still running.
    Cost: one fork per rank plus the store's rendezvous; the parent sleeps in ``select``.
    """
    if size < 1:
        raise ValueError(f"size={size} must be at least 1")
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be positive")
    import ringworld

    if ringworld.initialized() or ringworld.finalized():
        raise RuntimeError(
            "run_processes: this process already ran ringworld.init()/finalize(); its forked ranks "
            "would inherit that world instead of joining their own job. Start worlds only inside "
            "run_processes (or in a subprocess)."
        )
    job_id = new_job_id()
    secret = new_secret()
    deadline = time.monotonic() + timeout
    prepare_parent_death_signal()
    children: dict[int, _Child] = {}
    try:
        with JobStore(secret) as store:
            try:
                base = dict(os.environ)
                base.update(env or {})
                parent = os.getpid()
                _flush_std()  # or the children would flush copies of pending output
                for rank in range(size):
                    child_env = rank_env(base, rank=rank, size=size, store=store.address,
                                         job_id=job_id, transport=transport)
                    child_env["RINGWORLD_SECRET"] = secret.hex()
                    r, w = os.pipe()
                    pid = os.fork()
                    if pid == 0:  # pragma: no cover - runs in the child
                        os.close(r)
                        for other in children.values():
                            os.close(other.fd)
                        _child_main(rank, fn, args, child_env, w, parent)
                    os.close(w)
                    children[rank] = _Child(rank, pid, r)
                return _collect(children, deadline, timeout)
            finally:
                _kill_all(children)
    finally:
        remove_shm_segments(job_id)


def _collect(children: dict[int, _Child], deadline: float, timeout: float) -> list[Any]:
    results: dict[int, Any] = {}
    by_fd = {c.fd: c for c in children.values()}
    with selectors.DefaultSelector() as sel:
        for c in children.values():
            sel.register(c.fd, selectors.EVENT_READ)
        while len(results) < len(children):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = sorted(set(children) - set(results))
                raise TimeoutError(
                    f"run_processes: rank(s) {', '.join(map(str, waiting))} of {len(children)} "
                    f"had not finished after {timeout:g} s"
                )
            failures: list[tuple[int, str]] = []
            for key, _ in sel.select(remaining):
                c = by_fd[key.fd]
                chunk = os.read(c.fd, 1 << 20)
                if chunk:
                    c.data += chunk
                    msg = c.message()
                    if msg is None:
                        continue
                    sel.unregister(c.fd)
                    c.reported = True
                    ok, value = msg
                    if ok:
                        results[c.rank] = value
                    else:
                        failures.append((c.rank, str(value)))
                    continue
                sel.unregister(c.fd)  # EOF before a complete message: the process died
                _reap(c, block=True)
                failures.append(
                    (c.rank, f"process {c.pid} {describe_returncode(c.status)} "
                             "before reporting a result")
                )
            if failures:
                rank, detail = min(failures, key=_is_secondary)
                raise RankFailed(rank, detail)
    return [results[rank] for rank in sorted(results)]


def _reap(c: _Child, block: bool) -> None:
    if c.reaped:
        return
    try:
        pid, status = os.waitpid(c.pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        c.reaped = True
        return
    if pid == 0:
        return
    c.reaped = True
    c.status = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill_all(children: dict[int, _Child]) -> None:
    """Reap every child: those that reported are exiting on their own, the rest get SIGKILL."""
    exit_by = time.monotonic() + _EXIT_GRACE
    for c in children.values():
        _reap(c, block=False)
        while c.reported and not c.reaped and time.monotonic() < exit_by:
            time.sleep(0.001)
            _reap(c, block=False)
        if not c.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, signal.SIGKILL)
    for c in children.values():
        _reap(c, block=True)
        with contextlib.suppress(OSError):
            os.close(c.fd)
