"""Single-copy reads from and writes to another process's memory (Linux cross-memory attach).

``process_vm_readv`` copies bytes straight from a peer's address space into ours, and
``process_vm_writev`` from ours into a peer's: one copy where a shared-memory hand-off takes two
(into the shared segment, then out of it). They need permission to ptrace the peer (same user,
and Yama's ptrace_scope not forbidding siblings); callers probe once and fall back to copying
through shared memory if it fails. Called through ctypes (which releases the GIL): no compiler
step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_calls: dict[str, Any] = {}


def _load(name: str) -> Any:
    fn = _calls.get(name)
    if fn is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, name)
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
        _calls[name] = fn
    return fn


def read(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``remote_addr`` in process ``pid`` to ``local_addr`` here.

    Raises:
        OSError: the read is not permitted, the peer is gone, or the range is unmapped.
    """
    _copy("process_vm_readv", pid, remote_addr, local_addr, nbytes)


def write(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``local_addr`` here to ``remote_addr`` in process ``pid``.

    Raises:
        OSError: the write is not permitted, the peer is gone, or the range is unmapped.
    """
    _copy("process_vm_writev", pid, remote_addr, local_addr, nbytes)


def _copy(name: str, pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    fn = _load(name)
    local = _IoVec(local_addr, nbytes)
    remote = _IoVec(remote_addr, nbytes)
    done = 0
    while done < nbytes:
        if done:
            local = _IoVec(local_addr + done, nbytes - done)
            remote = _IoVec(remote_addr + done, nbytes - done)
        n = fn(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            err = ctypes.get_errno() if n < 0 else 0
            raise OSError(err, f"{name} with pid {pid}: "
                               f"{os.strerror(err) if err else 'nothing read'}")
        done += n
