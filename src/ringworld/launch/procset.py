"""The ranks of one job as a set of processes: spawn, forward output, watch, stop.

One thread does everything: a selector waits on every rank's stdout/stderr pipe plus a wakeup pipe
written by signal handlers (``SIGCHLD`` for exits; ``SIGINT``/``SIGTERM``/``SIGHUP`` to stop).

* Output is forwarded whole lines at a time, so lines of different ranks never interleave; a final
  line without a newline is flushed at exit. The last lines of each stderr are kept for reports.
* Each rank leads its own session and process group and gets ``PR_SET_PDEATHSIG=SIGKILL``. When a
  rank exits, its process group is killed *before* it is reaped (the zombie pins the group id, so a
  recycled id can never be hit); leftover grandchildren go with it.
* The first rank to fail (non-zero exit or a signal) that the launcher had not signalled is the
  root cause: the rest get ``SIGTERM``, then ``SIGKILL`` after the grace period. A rank whose
  stderr ends in a ``PeerFailure``/``CommBroken`` failed because of another rank (it is
  *secondary*), which may not have been reaped yet; it is blamed only if no other failure shows
  up within a second.
* A rank can also fail without exiting: it stops responding (stopped by a signal, hung, cut off).
  Its peers' monitors declare it after the liveness timeout (``find_unresponsive`` reads those
  declarations from the job store), and ``/proc`` shows a stopped process (state ``T``). When a
  rank fails, a live rank declared unresponsive came first and is the root cause; so is a stopped
  one when the failure is secondary. It is killed with ``SIGKILL`` (nothing else ends a stopped
  process) and reported as having stopped responding; the ranks that failed on seeing it are
  secondary, never the cause. Once every rank still running has stopped responding (the others
  exited), they are killed too, so a stopped rank never keeps a job alive.
* With ``keep_going`` (``ringworld run --enable-recovery``) a failure is recorded but the other
  ranks run on, so programs that recover (``comm.shrink()``) can finish.
* A :class:`~ringworld.launch.guardian.Guardian` kills what the ranks started should the launcher
  itself be killed with ``SIGKILL`` (the parent-death signal only reaches the ranks).
* ``SIGUSR1`` calls ``on_dump`` (the launcher prints what every rank is doing); ``on_failure``
  hears of every rank that fails on its own (the launcher tells the other ranks at once).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import BinaryIO, NamedTuple, TextIO

from ringworld.launch._proc import (
    describe_returncode,
    exit_code,
    kill_group,
    prepare_parent_death_signal,
    process_state,
    set_parent_death_signal,
)
from ringworld.launch.guardian import Guardian

#: Signals that stop the job; they are forwarded to every rank.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: A line longer than this is forwarded in pieces rather than buffered whole.
MAX_LINE_BYTES = 1 << 16
#: Stderr lines kept for a report are cut to this length.
MAX_TAIL_LINE_BYTES = 4096
#: How long to keep reading pipes still held open by stray processes after every rank exited.
DRAIN_SECONDS = 1.0
_READ_BYTES = 1 << 16
_POLL_SECONDS = 0.5
_POLL_SECONDS_NO_SIGNALS = 0.02
#: How long a failure caused by a peer's (``PeerFailure``) waits for that peer's own exit before
#: it is blamed itself.
SECONDARY_WAIT_SECONDS = 1.0
#: Exception names whose presence marks a rank's failure as a consequence of another's.
_SECONDARY_MARKERS = (b"ringworld.errors.PeerFailure", b"ringworld.errors.CommBroken")
#: While some ranks have exited and others run, how often to look whether those left still
#: respond (a look: a ``/proc`` read per rank and a store round trip or two).
LOOK_SECONDS = 1.0


class RankExit(NamedTuple):
    """How one rank ended.

    Attributes:
        rank: the rank.
        pid: its process id.
        returncode: ``Popen`` style: the exit code, or minus the signal number.
        stopped: the launcher had signalled it before it exited (so it is not a root cause).
        secondary: it failed on its own because another rank did (its stderr shows a
            ``PeerFailure`` or ``CommBroken``).
        unresponsive: why the job found it no longer responding, if it did (the launcher then
            killed it: ``returncode`` is the launcher's doing).
    """

    rank: int
    pid: int
    returncode: int
    stopped: bool
    secondary: bool = False
    unresponsive: str | None = None

    @property
    def failed(self) -> bool:
        """Whether it exited non-zero or was killed by a signal."""
        return self.returncode != 0

    @property
    def exit_code(self) -> int:
        """The shell-style exit status (128 + signal number for signals)."""
        return exit_code(self.returncode)

    def describe(self) -> str:
        """``exited with code 3``, ``killed by SIGKILL`` or ``stopped responding: WHY``."""
        if self.unresponsive is not None:
            return f"stopped responding: {self.unresponsive}"
        return describe_returncode(self.returncode)


class JobResult(NamedTuple):
    """The outcome of a job.

    Attributes:
        exits: how each rank ended, in rank order (ranks never started are absent).
        root_cause: the first rank that failed on its own (exited, or stopped responding), if
            any.
        interrupted_by: the signal that stopped the launcher, if one did.
        stderr_tails: the last lines of each rank's stderr (decoded, newline stripped).
    """

    exits: tuple[RankExit, ...]
    root_cause: RankExit | None
    interrupted_by: int | None
    stderr_tails: Mapping[int, tuple[str, ...]]


class _Sink:
    """A destination for forwarded output that survives its reader going away."""

    def __init__(self, stream: BinaryIO | TextIO) -> None:
        self._stream = stream
        self._text = False
        self._write: Callable[[memoryview], object]
        if isinstance(stream, io.TextIOBase):
            self._text = True
            text = stream
            self._write = lambda data: text.write(bytes(data).decode(errors="replace"))
        else:
            self._write = stream.write  # type: ignore[assignment]
        self._broken = False
        self._dirty = False

    def write(self, data: bytes) -> None:
        """Write all of ``data``. An unbuffered binary stream (``sys.stdout.buffer`` under
        PYTHONUNBUFFERED is a raw FileIO) takes what one write(2) takes: a pipe's reader that
        lags, or a signal (a rank's SIGCHLD) during the call, leaves part of it unwritten, and
        a non-blocking one may take none (None; a buffered one over a non-blocking pipe raises
        BlockingIOError instead). The rest is written until all has gone."""
        if self._broken or not data:
            return
        try:
            view = memoryview(data)
            while view:
                try:
                    n = self._write(view)
                except BlockingIOError as exc:  # a buffered stream over a non-blocking pipe
                    n = exc.characters_written
                    if not n:
                        self._await_room()
                        continue
                if self._text or (isinstance(n, int) and n >= len(view)):
                    break
                if n is None:  # non-blocking and full: wait until the reader takes some
                    self._await_room()
                    continue
                view = view[int(n):]  # type: ignore[call-overload]
            self._dirty = True
        except (BrokenPipeError, ValueError):  # reader gone, or stream closed
            self._broken = True

    def _await_room(self) -> None:
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError):
            time.sleep(0.001)
            return
        select.select([], [fd], [], 1.0)

    def flush(self) -> None:
        if self._dirty and not self._broken:
            self._dirty = False
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self._broken = True


class _Pipe:
    """One rank's stdout or stderr: splits it into lines, forwards them, keeps a tail."""

    __slots__ = ("_at_line_start", "_partial", "_prefix", "_sink", "_tail", "fd", "rank")

    def __init__(
        self, fd: int, rank: int, sink: _Sink, prefix: bytes, tail: deque[bytes] | None
    ) -> None:
        self.fd = fd
        self.rank = rank
        self._sink = sink
        self._prefix = prefix
        self._tail = tail
        self._partial = b""
        self._at_line_start = True

    def feed(self, data: bytes) -> None:
        buf = self._partial + data
        end = buf.rfind(b"\n") + 1
        if end == 0 and len(buf) <= MAX_LINE_BYTES:
            self._partial = buf
            return
        if end == 0:
            end = len(buf)
        self._partial = buf[end:]
        self._emit(buf[:end])

    def finish(self) -> None:
        """Flush a last line that has no newline (tagged output gets one, to keep tags first)."""
        rest, self._partial = self._partial, b""
        if self._prefix and (rest or not self._at_line_start):
            self._emit(rest + b"\n")
        elif rest:
            self._emit(rest)

    def _emit(self, chunk: bytes) -> None:
        lines = chunk.split(b"\n")  # the last item is what follows the last newline
        if self._tail is not None:
            kept = [line[:MAX_TAIL_LINE_BYTES] for line in lines[:-1]]
            if lines[-1]:
                kept.append(lines[-1][:MAX_TAIL_LINE_BYTES])
            if kept and not self._at_line_start and self._tail:
                self._tail[-1] = (self._tail[-1] + kept.pop(0))[:MAX_TAIL_LINE_BYTES]
            self._tail.extend(kept)
        if not self._prefix:
            self._sink.write(chunk)
        else:
            out = bytearray()
            for i, line in enumerate(lines):
                last = i == len(lines) - 1
                if last and not line:
                    break
                if self._at_line_start:
                    out += self._prefix
                out += line
                if not last:
                    out += b"\n"
                self._at_line_start = not last
            self._sink.write(bytes(out))
        self._at_line_start = chunk.endswith(b"\n")


class _Rank:
    __slots__ = ("popen", "rank", "stopped")

    def __init__(self, rank: int, popen: subprocess.Popen[bytes], stopped: bool = False) -> None:
        self.rank = rank
        self.popen = popen
        self.stopped = stopped


def _is_secondary(tail: deque[bytes]) -> bool:
    return any(line.startswith(_SECONDARY_MARKERS) for line in tail)


class ProcessSet:
    """Runs the ranks of one job; use as a context manager around :meth:`spawn` and :meth:`wait`.

    Entering installs handlers for ``SIGCHLD`` and :data:`STOP_SIGNALS` (main thread only; elsewhere
    exits are polled); leaving restores them and kills whatever is still running.

    ``find_unresponsive()`` returns the ranks the job's monitors declared not responding (rank:
    why, first declared first); it must not raise. ``guard`` starts a guardian process with the
    first rank (see :mod:`ringworld.launch.guardian`).
    """

    def __init__(
        self,
        *,
        tag_output: bool = False,
        grace: float = 1.0,
        tail_lines: int = 20,
        stdout: BinaryIO | TextIO | None = None,
        stderr: BinaryIO | TextIO | None = None,
        keep_going: bool = False,
        on_dump: Callable[[], None] | None = None,
        on_failure: Callable[[RankExit], None] | None = None,
        find_unresponsive: Callable[[], Mapping[int, str]] | None = None,
        guard: bool = True,
    ) -> None:
        if grace < 0:
            raise ValueError(f"grace={grace!r} must be >= 0")
        self._tag_output = tag_output
        self._grace = grace
        self._tail_lines = tail_lines
        self._out = _Sink(stdout if stdout is not None else _binary(sys.stdout))
        self._err = _Sink(stderr if stderr is not None else _binary(sys.stderr))
        self._sel = selectors.DefaultSelector()
        self._live: dict[int, _Rank] = {}
        self._pipes: dict[int, _Pipe] = {}
        self._tails: dict[int, deque[bytes]] = {}
        self._exits: dict[int, RankExit] = {}
        self._root: RankExit | None = None
        self._root_rank: int | None = None  # set first; _root once that rank is reaped
        self._unresponsive: dict[int, str] = {}
        self._next_look: float | None = None
        self._suspect: RankExit | None = None
        self._suspect_until: float | None = None
        self._interrupt: int | None = None
        self._pending: list[int] = []
        self._child_exited = True  # whether a rank may have exited since the last look
        self._kill_at: float | None = None
        self._wakeup: tuple[int, int] | None = None
        self._saved: list[tuple[int, signal._HANDLER]] = []
        self._saved_wakeup = -1
        self._pid = os.getpid()
        self._keep_going = keep_going
        self._on_dump = on_dump
        self._on_failure = on_failure
        self._find_declared = find_unresponsive
        self._guard = guard
        self._guardian: Guardian | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ProcessSet:
        prepare_parent_death_signal()
        self._install_signals()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def interrupted_by(self) -> int | None:
        """The stop signal the launcher received, if any (checked between spawns)."""
        self._handle_signals()
        return self._interrupt

    def spawn(
        self,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        pass_fds: Sequence[int] = (),
        inherit_stdin: bool = False,
        stdin_data: bytes | None = None,
    ) -> int:
        """Start ``argv`` as ``rank``; stdin is the launcher's if ``inherit_stdin``, a pipe
        holding ``stdin_data`` (then closed) if given, else /dev/null.

        Returns the pid. Raises ``OSError`` (e.g. ``FileNotFoundError``) if it cannot be started.
        Cost: one fork+exec.
        """
        if self._guard and self._guardian is None:
            self._guard = False  # one try
            self._guardian = Guardian.start()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        parent = self._pid
        try:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=(subprocess.PIPE if stdin_data is not None
                       else None if inherit_stdin else subprocess.DEVNULL),
                stdout=out_w,
                stderr=err_w,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
                # Safe with the store's thread: it only calls a preloaded prctl and getppid.
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, parent),  # noqa: PLW1509
            )
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        if self._guardian is not None:
            self._guardian.watch(popen.pid)  # it leads its own session
        if stdin_data is not None and popen.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # it died at once: reaped as a failure
                popen.stdin.write(stdin_data)  # a short line: fits the pipe, never blocks
            with contextlib.suppress(BrokenPipeError):
                popen.stdin.close()
        self._live[rank] = _Rank(rank, popen)
        tail: deque[bytes] = deque(maxlen=self._tail_lines)
        self._tails[rank] = tail
        prefix = f"[{rank}] ".encode() if self._tag_output else b""
        for fd, sink, keep in ((out_r, self._out, None), (err_r, self._err, tail)):
            os.set_blocking(fd, False)
            self._pipes[fd] = _Pipe(fd, rank, sink, prefix, keep)
            self._sel.register(fd, selectors.EVENT_READ)
        if self._interrupt is not None:  # a stop signal arrived earlier: this rank stops too
            self._signal_rank(self._live[rank], self._interrupt)
        return popen.pid

    def wait(self) -> JobResult:
        """Forward output until every rank has exited; stop the job on the first failure.

        Cost: one wakeup per output chunk, exit or signal (no busy polling with signal handlers).
        """
        drain_until: float | None = None
        while True:
            self._handle_signals()
            if self._child_exited or self._wakeup is None:
                self._child_exited = False
                self._reap()
            now = time.monotonic()
            if self._suspect_until is not None and now >= self._suspect_until:
                hung = self._find_unresponsive(stopped=True)
                if hung:
                    self._give_up(hung)
                else:
                    self._blame(self._suspect)
            if (not self._live or not self._exits or self._interrupt is not None
                    or (self._root_rank is not None and not self._keep_going)):
                self._next_look = None  # nothing to look at, or the job is being stopped
            elif self._next_look is None or now >= self._next_look:
                self._look(now)
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_at = None
                for r in list(self._live.values()):
                    self._signal_rank(r, signal.SIGKILL)
            if not self._live:
                self._blame(self._suspect)
                if not self._pipes:
                    break
                if drain_until is None:
                    drain_until = now + DRAIN_SECONDS
                elif now >= drain_until:
                    break
            timeout = _POLL_SECONDS if self._wakeup else _POLL_SECONDS_NO_SIGNALS
            for deadline in (self._suspect_until, self._kill_at, drain_until, self._next_look):
                if deadline is not None:
                    timeout = min(timeout, deadline - now)
            events = self._sel.select(max(timeout, 0.0))
            if not events:  # a quiet moment: check on the ranks even without a SIGCHLD
                self._child_exited = True
            for key, _ in events:
                if self._wakeup is not None and key.fd == self._wakeup[0]:
                    _drain_fd(key.fd)
                else:
                    self._read(key.fd)
            self._flush()
        self._close_pipes()
        return JobResult(
            exits=tuple(self._exits[r] for r in sorted(self._exits)),
            root_cause=self._root,
            interrupted_by=self._interrupt,
            stderr_tails={
                r: tuple(line.decode(errors="replace") for line in t)
                for r, t in self._tails.items()
            },
        )

    def close(self) -> None:
        """Kill and reap every rank still running, close pipes, restore signal handlers.

        Idempotent.
        """
        for r in list(self._live.values()):
            kill_group(r.popen.pid, signal.SIGKILL)
            self._forget(r)
            r.popen.wait()
            self._record(r)
        self._live.clear()
        if self._guardian is not None:
            self._guardian.close()  # every rank is reaped: nothing for it to do
            self._guardian = None
        self._close_pipes()
        self._restore_signals()
        self._sel.close()

    # -- internals ---------------------------------------------------------------------------

    def _stop_all(self, sig: int) -> None:
        for r in list(self._live.values()):
            self._signal_rank(r, sig)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self._grace

    def _signal_rank(self, r: _Rank, sig: int) -> None:
        r.stopped = True
        kill_group(r.popen.pid, sig)
        if sig != signal.SIGKILL and process_state(r.popen.pid) == "T":
            kill_group(r.popen.pid, signal.SIGCONT)  # a stopped process takes no other signal

    def _forget(self, r: _Rank) -> None:
        """Before reaping ``r``: its session id may be reused once it is reaped."""
        if self._guardian is not None:
            self._guardian.forget(r.popen.pid)

    def _handle_signals(self) -> None:
        while self._pending:
            sig = self._pending.pop(0)
            if sig == signal.SIGCHLD:
                self._child_exited = True
                continue
            if sig == signal.SIGUSR1:
                if self._on_dump is not None:
                    self._flush()
                    self._on_dump()
                continue
            if self._interrupt is None:
                if self._suspect is not None:  # that failure came first: it stays the cause
                    self._root = self._suspect
                    self._root_rank = self._suspect.rank
                    self._suspect = self._suspect_until = None
                self._interrupt = sig
                self._stop_all(sig)
            else:  # asked twice: no more grace
                self._kill_at = None
                for r in list(self._live.values()):
                    self._signal_rank(r, signal.SIGKILL)

    def _reap(self) -> None:
        fresh: list[RankExit] = []
        for r in list(self._live.values()):
            pid = r.popen.pid
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
                if r.popen.poll() is None:
                    continue
                self._forget(r)
            else:
                if info is None:
                    continue
                kill_group(pid, signal.SIGKILL)  # before reaping: the zombie pins the group id
                self._forget(r)
                r.popen.wait()
            del self._live[r.rank]
            for fd in [fd for fd, p in self._pipes.items() if p.rank == r.rank]:
                self._read(fd, until_empty=True)  # all of its stderr, to tell a secondary failure
            fresh.append(self._record(r))
        if self._on_failure is not None:
            for e in fresh:
                if e.failed and not e.stopped:
                    self._on_failure(e)
        if fresh:
            self._next_look = None  # look at those left at once
        if self._root_rank is None and self._interrupt is None:
            causes = [e for e in fresh if e.failed and not e.stopped]
            primary = [e for e in causes if not e.secondary]
            # A rank declared unresponsive before this failure was seen came first; a stopped
            # one explains a failure caused by a peer.
            hung = self._find_unresponsive(stopped=not primary) if causes else {}
            if hung:
                self._give_up(hung)
            elif primary:
                self._blame(primary[0])
            elif causes and self._suspect is None:
                # It failed because a peer did; that peer's own exit may still be under way
                # (sockets close before a process is reaped), so give it a moment to show up.
                self._suspect = causes[0]
                self._suspect_until = time.monotonic() + SECONDARY_WAIT_SECONDS

    def _blame(self, exit_: RankExit | None) -> None:
        """Make ``exit_`` the root cause (if there is none yet) and stop the rest."""
        self._suspect = None
        self._suspect_until = None
        if exit_ is not None and self._root_rank is None:
            self._root = exit_
            self._root_rank = exit_.rank
            if not self._keep_going:
                self._stop_all(signal.SIGTERM)

    def _find_unresponsive(self, stopped: bool) -> dict[int, str]:
        """Running ranks that stopped responding, with why, first found first: those the
        monitors declared and, with ``stopped``, those whose process is stopped."""
        declared = self._find_declared() if self._find_declared is not None else {}
        found: dict[int, str] = {}
        for rank, why in declared.items():
            r = self._live.get(rank)
            state = None if r is None else process_state(r.popen.pid)
            if r is None or state in ("Z", "X"):  # gone, or exiting: its exit tells
                continue
            found[rank] = why + ("; its process is stopped" if state == "T" else "")
        if stopped:
            for rank, r in sorted(self._live.items()):
                if rank not in found and process_state(r.popen.pid) == "T":
                    found[rank] = "its process is stopped (SIGSTOP or another stop signal)"
        return found

    def _look(self, now: float) -> None:
        """Some ranks exited: if none of those still running responds, give up on them."""
        self._next_look = now + LOOK_SECONDS
        hung = self._find_unresponsive(stopped=True)
        if hung and hung.keys() >= self._live.keys():
            self._give_up(hung)

    def _give_up(self, hung: Mapping[int, str]) -> None:
        """The ranks in ``hung`` stopped responding: kill them (``SIGKILL``: a stopped process
        takes no other signal); the first is the root cause if there is none yet."""
        for rank, why in hung.items():
            self._unresponsive.setdefault(rank, why)
            r = self._live.get(rank)
            if r is not None:
                self._signal_rank(r, signal.SIGKILL)
        if self._root_rank is None:
            self._root_rank = next(iter(hung))
            self._suspect = self._suspect_until = None
            if not self._keep_going:
                self._stop_all(signal.SIGTERM)

    def _record(self, r: _Rank) -> RankExit:
        rc = r.popen.returncode
        assert rc is not None
        secondary = rc != 0 and not r.stopped and _is_secondary(self._tails[r.rank])
        e = RankExit(r.rank, r.popen.pid, rc, r.stopped, secondary,
                     self._unresponsive.get(r.rank))
        self._exits[r.rank] = e
        if r.rank == self._root_rank and self._root is None:
            self._root = e
        return e

    def _read(self, fd: int, until_empty: bool = False) -> None:
        pipe = self._pipes.get(fd)
        if pipe is None:
            return
        while True:
            try:
                data = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                return
            if not data:
                self._close_pipe(pipe)
                return
            pipe.feed(data)
            if not until_empty:
                return

    def _close_pipe(self, pipe: _Pipe) -> None:
        pipe.finish()
        self._sel.unregister(pipe.fd)
        os.close(pipe.fd)
        del self._pipes[pipe.fd]

    def _close_pipes(self) -> None:
        for pipe in list(self._pipes.values()):
            self._read(pipe.fd, until_empty=True)
            if pipe.fd in self._pipes:
                self._close_pipe(pipe)
        self._flush()

    def _flush(self) -> None:
        self._out.flush()
        self._err.flush()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def _install_signals(self) -> None:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            self._saved_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: poll instead
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        self._sel.register(r, selectors.EVENT_READ)
        for sig in (signal.SIGCHLD, signal.SIGUSR1, *STOP_SIGNALS):
            self._saved.append((sig, signal.signal(sig, self._on_signal)))

    def _restore_signals(self) -> None:
        if self._wakeup is None:
            return
        for sig, handler in reversed(self._saved):
            signal.signal(sig, handler)
        self._saved.clear()
        signal.set_wakeup_fd(self._saved_wakeup)
        with contextlib.suppress(KeyError):
            self._sel.unregister(self._wakeup[0])
        for fd in self._wakeup:
            os.close(fd)
        self._wakeup = None


def _drain_fd(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _binary(stream: TextIO) -> BinaryIO | TextIO:
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else stream

