"""Single-copy reads from and writes to another process's memory (Linux cross-memory attach).

``process_vm_readv`` copies bytes straight from a peer's address space into ours, and
``process_vm_writev`` from ours into a peer's: one copy where a shared-memory hand-off takes two
(into the shared segment, then out of it). They need permission to ptrace the peer (same user,
and Yama's ptrace_scope not forbidding siblings); callers probe once and fall back to copying
through shared memory if it fails. Called through ctypes (which releases the GIL): no compiler
step.

The kernel's copy is slow when the destination runs 1-31 bytes ahead of the source modulo a
page: 3.7x here (8 MiB: 5.7 ms against 1.5 ms; AMD EPYC). Two numpy arrays allocated one after
the other from the heap sit exactly 16 bytes (a malloc header) past a multiple of their size
apart, so a rank reading a peer's send buffer into its own receive buffer hits this in the most
common pattern. Such copies of at least :data:`STAGE_MIN` bytes go through a private buffer
placed half a page from the remote side's page offset, in pieces of 1-2 MiB, and a user-space
copy: neither copy is then skewed. 8 MiB takes 2.1-2.4 ms; 512 KiB 99 us against 384, 128 KiB
22 us against 94, 16 KiB 11 us against 18 (unskewed: 73, 26 and 9 us).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from typing import Any

from ringworld.errors import TransportError

PAGE = 4096
#: a destination this many bytes or fewer ahead of the source (mod PAGE, excluding 0) is slow
SLOW_SKEW = 31
#: copies at least this large and skewed go through the staging buffer
STAGE_MIN = 16 << 10
#: ... in pieces of 1-2x this (one piece below twice this)
STAGE_PIECE = 1 << 20


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_calls: dict[str, Any] = {}
_stage: ctypes.Array[ctypes.c_char] | None = None
_stage_lock = threading.Lock()


#: the calls' iovec counts and flags, typed once: the functions are called without argtypes
#: (whose conversions took 0.75 us of a 2.3 us 64-byte read), so every argument is passed
#: as its C type (the pid as an int, the iovecs by reference)
_ONE, _NO_FLAGS = ctypes.c_ulong(1), ctypes.c_ulong(0)


def _load(name: str) -> Any:
    fn = _calls.get(name)
    if fn is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, name)
        fn.restype = ctypes.c_ssize_t
        _calls[name] = fn
    return fn


def read(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``remote_addr`` in process ``pid`` to ``local_addr`` here.

    Raises:
        OSError: the read is not permitted, the peer is gone, or the range is unmapped.
    """
    if nbytes >= STAGE_MIN and skewed(remote_addr, local_addr):
        _staged("process_vm_readv", pid, remote_addr, local_addr, nbytes)
    else:
        _copy("process_vm_readv", pid, remote_addr, local_addr, nbytes)


def write(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``local_addr`` here to ``remote_addr`` in process ``pid``.

    Raises:
        OSError: the write is not permitted, the peer is gone, or the range is unmapped.
    """
    if nbytes >= STAGE_MIN and skewed(local_addr, remote_addr):
        _staged("process_vm_writev", pid, remote_addr, local_addr, nbytes)
    else:
        _copy("process_vm_writev", pid, remote_addr, local_addr, nbytes)


def copier(pid: int, writes: bool, what: str) -> Callable[[int, int, int], None]:
    """:func:`write` (``writes``) or :func:`read` with process ``pid``, as a function of
    (remote_addr, local_addr, nbytes) that raises TransportError naming ``what`` (the peer's
    memory, for messages) where they raise OSError."""
    copy, verb = (write, "writing") if writes else (read, "reading")

    def copy_with(remote_addr: int, local_addr: int, nbytes: int) -> None:
        try:
            copy(pid, remote_addr, local_addr, nbytes)
        except OSError as exc:
            raise TransportError(f"{verb} {what} failed: {exc}") from exc

    return copy_with


def skewed(src: int, dst: int) -> bool:
    """Whether a kernel copy from ``src`` to ``dst`` runs at the slow skew (see the module)."""
    return 0 < (dst - src) % PAGE <= SLOW_SKEW


def _staged(name: str, pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """:func:`_copy` through the staging buffer, placed half a page from the remote side's page
    offset (so that neither the kernel's copy nor the user-space one is skewed), in pieces of
    STAGE_PIECE to 2 * STAGE_PIECE bytes (one piece if smaller)."""
    global _stage
    pieces = max(1, nbytes // STAGE_PIECE)
    size = -(-nbytes // pieces)
    with _stage_lock:
        if _stage is None:
            _stage = ctypes.create_string_buffer(2 * STAGE_PIECE + PAGE)
        base = ctypes.addressof(_stage)
        for k in range(0, nbytes, size):
            m = min(size, nbytes - k)
            stage = base + (remote_addr + k + PAGE // 2 - base) % PAGE
            if name == "process_vm_readv":
                _copy(name, pid, remote_addr + k, stage, m)
                ctypes.memmove(local_addr + k, stage, m)
            else:
                ctypes.memmove(stage, local_addr + k, m)
                _copy(name, pid, remote_addr + k, stage, m)


def _copy(name: str, pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    fn = _calls.get(name) or _load(name)
    byref = ctypes.byref
    done = 0
    while done < nbytes:
        local = _IoVec(local_addr + done, nbytes - done)
        remote = _IoVec(remote_addr + done, nbytes - done)
        n = fn(int(pid), byref(local), _ONE, byref(remote), _ONE, _NO_FLAGS)
        if n <= 0:
            err = ctypes.get_errno() if n < 0 else 0
            raise OSError(err, f"{name} with pid {pid}: "
                               f"{os.strerror(err) if err else 'nothing read'}")
        done += n
