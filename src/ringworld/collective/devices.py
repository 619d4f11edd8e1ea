"""One process driving several GPUs: NCCL's ``ncclCommInitAll``, and group calls.

:func:`init_all` makes one NCCL communicator per device of this process, of ranks 0..n-1 (rank
i on ``devices[i]``), with no other process and no host communicator. A collective over them is
one call per communicator inside :func:`device_group`: the calls are checked (the table of
:mod:`ringworld.collective.device_calls`), collected, compared when the block ends (ranks that
disagree raise :class:`MismatchError` before anything is enqueued, instead of a hung kernel),
then enqueued in one NCCL group call, each with its own device current. Each call returns a
:class:`LocalRequest`; ``wait()`` waits for that device's work (a CUDA event), with a timeout
that aborts the communicators.

A communicator of one device may also be called outside a group. Cost per call: the checks, and
at the block's end one NCCL group call and one event record per call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ringworld.collective import calls
from ringworld.collective import device_calls as dc
from ringworld.collective.markers import IN_PLACE
from ringworld.comm import ops
from ringworld.device import cuda, nccl
from ringworld.device.plane import Prepared
from ringworld.errors import MismatchError, Timeout

_local = threading.local()


class LocalRequest:
    """A call of a :func:`init_all` communicator; done once its device's work has finished."""

    def __init__(self, comm: LocalComm) -> None:
        self._comm = comm
        self._event: cuda.Event | None = None  # recorded when the group's calls are enqueued

    def test(self) -> bool:
        """Whether the call's work has finished (False before its group is enqueued)."""
        return self._event is not None and self._event.done()

    @property
    def done(self) -> bool:
        return self.test()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the call's work has finished.

        Raises:
            CommError: its group has not ended yet (the call is not enqueued).
            Timeout: not done within ``timeout``: every communicator of the set is aborted.
        """
        if self._event is None:
            raise MismatchError(f"{self._comm.name}: wait() inside its device_group() block: "
                                "the calls are enqueued when the block ends")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-5
        while not self._event.done():
            if deadline is not None and time.monotonic() > deadline:
                self._comm.abort_all()
                raise Timeout(f"{self._comm.name}: device work not complete after {timeout:g} "
                              "s; the communicators of the set are aborted")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


class LocalComm:
    """One device's NCCL communicator of a set made by :func:`init_all`."""

    def __init__(self, handle: Any, rank: int, size: int, device: int,
                 siblings: list[LocalComm]) -> None:
        self._handle = handle
        self.rank, self.size, self.device = rank, size, device
        self.name = f"device set rank {rank} (GPU {device})"
        self._siblings = siblings

    def _root(self, root: int) -> int:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank of 0..{self.size - 1}, got {root!r}")
        return root

    def _call(self, prepare: Any, *args: Any) -> LocalRequest:
        if self._handle is None:
            raise MismatchError(f"{self.name} is destroyed or aborted")
        call: Prepared = dc.TABLE[prepare](self, *args)
        if call.device != self.device:
            raise TypeError(f"{call.what}: the buffers are on GPU {call.device}, and {self.name} "
                            f"drives GPU {self.device}")
        req = LocalRequest(self)
        pending: list[tuple[LocalComm, Prepared, LocalRequest]] | None = getattr(
            _local, "group", None)
        if pending is not None:
            pending.append((self, call, req))
        elif self.size == 1:
            _launch([(self, call, req)])
        else:
            raise TypeError(f"{call.what} on {self.name}: a process driving {self.size} GPUs "
                            "calls each communicator inside `with ringworld.device_group():` "
                            "(outside one, the first call would wait for the others forever)")
        return req

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> LocalRequest:
        """NCCL allreduce (``IN_PLACE`` as sendbuf: in recvbuf)."""
        return self._call(calls.allreduce, sendbuf, recvbuf, op)

    def bcast(self, buf: Any, root: int = 0) -> LocalRequest:
        return self._call(calls.bcast, buf, root)

    def reduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM,
               root: int = 0) -> LocalRequest:
        return self._call(calls.reduce, sendbuf, recvbuf, op, root)

    def allgather(self, sendbuf: Any, recvbuf: Any) -> LocalRequest:
        return self._call(calls.allgather, sendbuf, recvbuf, None, None)

    def reduce_scatter_block(self, sendbuf: Any, recvbuf: Any,
                             op: Any = ops.SUM) -> LocalRequest:
        return self._call(calls.reduce_scatter, sendbuf, recvbuf, None, op)

    def alltoall(self, sendbuf: Any, recvbuf: Any) -> LocalRequest:
        return self._call(calls.alltoall, sendbuf, recvbuf)

    def abort_all(self) -> None:
        """Abort every communicator of the set (their queued work ends)."""
        b = nccl.load()
        for c in self._siblings:
            handle, c._handle = c._handle, None
            if handle is not None:
                with contextlib.suppress(Exception):
                    b.comm_abort(handle)

    def destroy(self) -> None:
        """Free this communicator (after its work: NCCL's ncclCommDestroy)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            nccl.check(f"destroying {self.name}", nccl.load().comm_destroy, handle)


def init_all(devices: int | Sequence[int] | None = None) -> list[LocalComm]:
    """One NCCL communicator per device, all driven by this process (``ncclCommInitAll``).

    ``devices``: the device indices (rank i on ``devices[i]``), a count n (devices 0..n-1),
    or None (every visible device).

    Raises:
        DeviceUnavailable: no driver, device or NCCL here. DeviceError: NCCL refused (a device
        listed twice, say). ValueError: a device index out of range.
    """
    count = cuda.device_count()
    if devices is None:
        devlist = list(range(count))
    elif isinstance(devices, int):
        devlist = list(range(devices))
    else:
        devlist = [int(d) for d in devices]
    bad = [d for d in devlist if not 0 <= d < count]
    if bad:
        raise ValueError(f"devices {bad} out of range: this process sees {count} GPU(s)")
    if not devlist:
        return []
    b = nccl.load()
    handles = nccl.check("ncclCommInitAll", b.comm_init_all, len(devlist), devlist)
    siblings: list[LocalComm] = []
    siblings.extend(LocalComm(h, i, len(devlist), d, siblings)
                    for i, (h, d) in enumerate(zip(handles, devlist, strict=True)))
    return siblings


@contextlib.contextmanager
def device_group() -> Iterator[None]:
    """Collect the :func:`init_all` communicators' calls of the block; at its end, compare
    them (every communicator of a set must make the same calls in the same order) and enqueue
    them in one NCCL group call.

    Raises:
        MismatchError: the communicators' calls differ (nothing is enqueued).
    """
    if getattr(_local, "group", None) is not None:
        yield  # nested: the outer block enqueues
        return
    pending: list[tuple[LocalComm, Prepared, LocalRequest]] = []
    _local.group = pending
    try:
        yield
    finally:
        _local.group = None
    _compare(pending)
    _launch(pending)


def _compare(pending: list[tuple[LocalComm, Prepared, LocalRequest]]) -> None:
    by_set: dict[int, dict[int, list[str]]] = {}
    for comm, call, _ in pending:
        by_set.setdefault(id(comm._siblings), {}).setdefault(comm.rank, []).append(call.record)
    for comm, _call, _ in pending:
        ranks = by_set[id(comm._siblings)]
        if len(ranks) != comm.size:
            missing = sorted(set(range(comm.size)) - set(ranks))
            raise MismatchError(f"device_group: ranks {missing} of the set made no call "
                                "(each communicator of a set takes part in every call)")
        first = ranks[0]
        for rank, records in ranks.items():
            if records != first:
                raise MismatchError(f"device_group: rank {rank} called {records} but rank 0 "
                                    f"called {first}; nothing was enqueued")


def _launch(pending: list[tuple[LocalComm, Prepared, LocalRequest]]) -> None:
    if not pending:
        return
    b = nccl.load()
    nccl.check("ncclGroupStart", b.group_start)
    try:
        for comm, call, _ in pending:
            with cuda.on(comm.device):
                call.enqueue(comm._handle, call.stream)
    finally:
        nccl.check("ncclGroupEnd", b.group_end)
    for comm, call, req in pending:
        with cuda.on(comm.device):
            event = cuda.Event()
            event.record(call.stream)
        req._event = event


__all__ = ["IN_PLACE", "LocalComm", "LocalRequest", "device_group", "init_all"]
