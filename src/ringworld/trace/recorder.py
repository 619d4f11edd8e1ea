"""Record every communication call of this rank as Chrome/Perfetto trace events.

Tracing is opt-in (``RINGWORLD_TRACE=path`` or ``ringworld run --trace``) and costs nothing when
off: :func:`enable` hands timed wrappers to the hook points of :mod:`ringworld.comm.hooks`
(the methods the communicator marks observable: point-to-point, collectives, object
collectives, their nonblocking forms, communicator management, and the engine's blocking wait),
once per process. Each rank appends its events to
``<path>.rank<N>`` as JSON lines; the launcher (or :func:`ringworld.trace.merge.merge`) joins the
parts into one file that ui.perfetto.dev and chrome://tracing open.

What a rank records:
- one complete event ("ph": "X") per blocking call, on the track of its communicator, with the
  bytes, the peer or root, the tag and, for collectives, the algorithm that ran (a buffer
  collective's slice is named with its bytes and algorithm, "allreduce 8 B shm", the call
  itself in ``args.call``);
- for a nonblocking call, its posting ("post" category) and a span from posting to the moment a
  wait or test saw it complete, on a separate "requests" track of the communicator;
- every blocking wait of the progress engine ("wait" category) with what it waited for (for
  example ``recv from rank 1 tag 7``), which shows who waits for whom.
Timestamps are the wall clock (µs since the epoch) so the ranks of one host line up.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from ringworld.comm import hooks

FLUSH_EVERY = 4096        # events buffered before they are appended to the part file
REQUEST_TRACK = 1 << 20   # tid offset of a communicator's nonblocking-request track
WAIT_TRACK = 1 << 21      # tid of the track of request waits (wait, wait_all, ...)

_lock = threading.Lock()
_recorder: Recorder | None = None


def _now_us() -> float:
    return time.time_ns() / 1000.0


def _size(nbytes: Any) -> str:
    """``nbytes`` as a slice name shows it (8 B, 64 KiB, 1.5 MiB); "" if unknown."""
    if not isinstance(nbytes, int):
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _nbytes(value: Any) -> int | None:
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(value, (bytes, bytearray, memoryview)):
        return memoryview(value).nbytes
    return None


class Recorder:
    """Buffers one rank's events and appends them to its part file."""

    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.part = part_path(path, rank)
        self.events: list[dict[str, Any]] = []
        self.pending: dict[int, tuple[Any, str, float, int, dict[str, Any]]] = {}
        self.tracks: dict[int, str] = {}
        self.depth = 0  # calls in progress: only the outermost is recorded
        self.current: tuple[str, str, float, int, dict[str, Any]] | None = None  # that call
        self._file: IO[str] | None = None
        self.add({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                  "args": {"name": f"rank {rank}"}})
        self.add({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                  "args": {"sort_index": rank}})
        self.add({"name": "thread_name", "ph": "M", "pid": rank, "tid": WAIT_TRACK,
                  "args": {"name": "request waits"}})

    def add(self, event: dict[str, Any]) -> None:
        """Buffer one event; appends the buffer to the part file every FLUSH_EVERY events."""
        self.events.append(event)
        if len(self.events) >= FLUSH_EVERY:
            self.flush()

    def track(self, context: int, name: str) -> int:
        """The thread id of a communicator's track, naming it on first use."""
        if context not in self.tracks:
            self.tracks[context] = name
            for tid, label in ((context, name), (context + REQUEST_TRACK, f"{name} requests")):
                self.add({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                          "args": {"name": label}})
        return context

    def complete(self, name: str, cat: str, start: float, end: float, tid: int,
                 args: dict[str, Any]) -> None:
        """Record a complete event from ``start`` to ``end`` (µs)."""
        self.add({"name": name, "cat": cat, "ph": "X", "ts": start, "dur": max(end - start, 0.0),
                  "pid": self.rank, "tid": tid, "args": args})

    def watch(self, request: Any, name: str, start: float, tid: int,
              args: dict[str, Any]) -> None:
        """Remember a posted nonblocking request until it is seen complete."""
        self.pending[id(request)] = (request, name, start, tid, args)

    def sweep(self) -> None:
        """Close the spans of posted requests that have completed since the last sweep."""
        if not self.pending:
            return
        now = _now_us()
        for key, (req, name, start, tid, args) in list(self.pending.items()):
            try:
                done = bool(req.done)
            except Exception:  # a request in error counts as complete
                done = True
            if done:
                del self.pending[key]
                self.complete(name, "request", start, now, tid + REQUEST_TRACK, args)

    def flush(self) -> None:
        """Append buffered events to the part file (created on first flush)."""
        if not self.events:
            return
        if self._file is None:
            self._file = open(self.part, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        lines = [json.dumps(e, separators=(",", ":")) for e in self.events]
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        self.events.clear()

    def close(self, why: str = "") -> None:
        """Record the call in progress and pending requests as unfinished; flush and close.

        ``why`` (for example "killed by SIGTERM") is noted on the unfinished call.
        """
        if self.current is not None:
            method, cat, start, tid, info = self.current
            self.current = None
            self.complete(method, cat, start, _now_us(), tid,
                          {**info, "unfinished": why or True})
        self.sweep()
        for req, name, start, tid, args in self.pending.values():
            del req
            self.complete(name, "request", start, _now_us(), tid + REQUEST_TRACK,
                          {**args, "unfinished": True})
        self.pending.clear()
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def part_path(path: str, rank: int) -> str:
    """Where rank ``rank`` writes its events for the trace ``path``."""
    return f"{path}.rank{rank}"


def recorder() -> Recorder | None:
    """This process's recorder, or None when tracing is off."""
    return _recorder


def _arg_reader(fn: Callable[..., Any], name: str) -> Callable[[tuple[Any, ...],
                                                                dict[str, Any]], Any]:
    """A fast reader of parameter ``name`` from a call's (args, kwargs), self excluded."""
    params = list(inspect.signature(fn).parameters)[1:]
    if name not in params:
        return lambda args, kwargs: None
    index = params.index(name)

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if index < len(args):
            return args[index]
        return kwargs.get(name)
    return read


def _wrapper(mark: hooks.Mark, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The timed replacement of an observable method (see :mod:`ringworld.comm.hooks`)."""
    if mark.category == "wait":
        return _wrap_wait(fn)
    return _wrap(fn, method, mark)


def _wrap(fn: Callable[..., Any], method: str, mark: hooks.Mark) -> Callable[..., Any]:
    cat = mark.category
    peer_names = ("dest", "source", "root")
    readers = [(n, _arg_reader(fn, n)) for n in peer_names]
    tag_of = _arg_reader(fn, "tag")
    first = list(inspect.signature(fn).parameters)[1:2]
    buf_of = _arg_reader(fn, first[0]) if first else (lambda args, kwargs: None)
    recv_of = _arg_reader(fn, "recvbuf")
    nonblocking = mark.start
    # the buffer collectives name the algorithm that ran (object ones and the rest do not)
    names_algorithm = cat == "collective" and not method.endswith("_obj")

    @functools.wraps(fn)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = _recorder
        if rec is None or rec.depth:
            return fn(self, *args, **kwargs)
        rec.sweep()
        tid = rec.track(getattr(self, "context", 0), getattr(self, "name", "") or "comm")
        info: dict[str, Any] = {"comm": getattr(self, "name", "")}
        for key, read in readers:
            value = read(args, kwargs)
            if isinstance(value, int):
                info[key] = value
        tag = tag_of(args, kwargs)
        if isinstance(tag, int):
            info["tag"] = tag
        nbytes = _nbytes(buf_of(args, kwargs))
        if nbytes is None:
            nbytes = _nbytes(recv_of(args, kwargs))
        if nbytes is not None:
            info["bytes"] = nbytes
        start = _now_us()
        rec.depth += 1
        rec.current = (method, cat, start, tid, info)
        try:
            result = fn(self, *args, **kwargs)
        except BaseException as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"[:500]
            rec.complete(method, cat, start, _now_us(), tid, info)
            raise
        finally:
            rec.depth -= 1
            rec.current = None
        end = _now_us()
        shown = method
        if names_algorithm:
            algorithm = info["algorithm"] = getattr(self, "last_algorithm", "")
            # the timeline shows what ran without a click: "allreduce 8 B shm"
            shown = " ".join(x for x in (method, _size(info.get("bytes")), algorithm) if x)
            info["call"] = method
        if nonblocking:
            rec.complete(shown, "post", start, end, tid, info)
            if result is not None and hasattr(result, "done"):  # its span, named as blocking
                span = {**info, "call": method[1:]} if names_algorithm else info
                rec.watch(result, shown[1:], start, tid, span)
        else:
            rec.complete(shown, cat, start, end, tid, info)
        return result

    return traced


def _wrap_wait(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(self: Any, cond: Callable[[], bool], timeout: float | None,
               describe: Callable[[], str], *rest: Any, **kwargs: Any) -> None:
        rec = _recorder
        if rec is None or rec.depth or cond():
            fn(self, cond, timeout, describe, *rest, **kwargs)
            return
        start = _now_us()
        info: dict[str, Any] = {"for": describe()[:300]}
        try:
            fn(self, cond, timeout, describe, *rest, **kwargs)
        except BaseException as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            rec.complete("wait", "wait", start, _now_us(), WAIT_TRACK, info)
            rec.sweep()

    return traced


def enable(path: str, rank: int) -> Recorder:
    """Start recording this process's calls into ``path``'s part file for ``rank``.

    Idempotent per process (a second call returns the running recorder). Cost when on: a few
    µs per call; when never enabled: nothing.

    Raises:
        OSError: the part file cannot be created (checked at once).
    """
    global _recorder
    with _lock:
        if _recorder is not None:
            return _recorder
        # the communicator's classes mark their observable methods as they are defined
        import ringworld.collective.communicator  # noqa: F401

        rec = Recorder(os.path.abspath(path), rank)
        rec.flush()  # fail now, not at exit, if the file cannot be written
        hooks.observe(_wrapper)
        _recorder = rec
        _flush_on_sigterm()
        return rec


def _flush_on_sigterm() -> None:
    """Make a SIGTERM (how the launcher stops ranks) flush the trace, then die as before.

    Only where SIGTERM has its default action and only in the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, frame: object) -> None:
        rec = _recorder
        if rec is not None:
            with contextlib.suppress(Exception):
                rec.close(why="killed by SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def disable() -> str | None:
    """Stop recording; flush and close the part file. Returns its path, or None if off."""
    global _recorder
    with _lock:
        rec = _recorder
        _recorder = None
    if rec is None:
        return None
    rec.close()
    return rec.part
