"""Cross-memory attach (process_vm_readv/writev) on this process: exact bytes at every skew and
size around the staging threshold, and skewed copies made page-aligned for the kernel."""

from __future__ import annotations

import errno
import os
from typing import Any

import numpy as np
import pytest

from ringworld.transport import cma


def _at(nbytes: int, offset: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``nbytes`` of fresh memory starting ``offset`` bytes past a page boundary (any offset:
    a slice cut short would let the kernel copy run past the array and corrupt the heap)."""
    raw = np.zeros(nbytes + offset + cma.PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % cma.PAGE + offset
    view = raw[start : start + nbytes]
    assert view.size == nbytes
    return view


def _can_attach() -> bool:
    src, dst = _at(64, 0), _at(64, 0)
    src[:] = 7
    try:
        cma.read(os.getpid(), src.ctypes.data, dst.ctypes.data, 64)
    except OSError:
        return False
    return bool((dst == 7).all())


pytestmark = pytest.mark.skipif(not _can_attach(), reason="process_vm_readv is not permitted")

SIZES = [1, cma.STAGE_MIN - 1, cma.STAGE_MIN, cma.STAGE_PIECE + 4097, 5 * cma.STAGE_PIECE + 3]


@pytest.mark.parametrize("skew", [0, 1, 8, 16, 31, 32, 48, 4080])
@pytest.mark.parametrize("nbytes", SIZES)
def test_reads_and_writes_deliver_every_byte(nbytes: int, skew: int) -> None:
    src = _at(nbytes, 64)
    src[:] = (np.arange(nbytes) * 7 + 3) % 251
    dst = _at(nbytes + 1, 64 + skew)  # one guard byte past the end
    cma.read(os.getpid(), src.ctypes.data, dst.ctypes.data, nbytes)
    assert np.array_equal(dst[:nbytes], src) and dst[nbytes] == 0
    dst[:] = 0
    cma.write(os.getpid(), dst.ctypes.data, src.ctypes.data, nbytes)
    assert np.array_equal(dst[:nbytes], src) and dst[nbytes] == 0


@pytest.mark.parametrize("direction", ["read", "write"])
def test_a_skewed_copy_reaches_the_kernel_half_a_page_off_in_large_pieces(
        monkeypatch: pytest.MonkeyPatch, direction: str) -> None:
    calls: list[tuple[int, int, int]] = []
    real = cma._copy

    def spy(name: str, pid: int, remote: int, local: int, n: int) -> None:
        calls.append((remote, local, n))
        real(name, pid, remote, local, n)

    monkeypatch.setattr(cma, "_copy", spy)
    for nbytes, pieces in ((3 * cma.STAGE_PIECE + 12345, 3), (cma.STAGE_MIN + 5, 1),
                           (cma.STAGE_PIECE + 7, 1)):
        calls.clear()
        src = _at(nbytes, 0)
        src[:] = np.arange(nbytes) % 253
        dst = _at(nbytes, 16)  # 16 bytes ahead: two heap arrays allocated one after the other
        if direction == "read":
            assert cma.skewed(src.ctypes.data, dst.ctypes.data)
            cma.read(os.getpid(), src.ctypes.data, dst.ctypes.data, nbytes)
        else:
            cma.write(os.getpid(), dst.ctypes.data, src.ctypes.data, nbytes)
        assert np.array_equal(dst, src)
        assert sum(n for _, _, n in calls) == nbytes
        assert len(calls) == pieces
        for remote, local, _ in calls:
            # half a page from both the remote side and (so) the user's buffer here
            assert (remote - local) % cma.PAGE == cma.PAGE // 2
    # unskewed or small copies go straight through, in one call
    calls.clear()
    cma.read(os.getpid(), src.ctypes.data, _at(nbytes, 0).ctypes.data, nbytes)
    cma.read(os.getpid(), src.ctypes.data, _at(4096, 16).ctypes.data, 4096)
    assert [n for _, _, n in calls] == [nbytes, 4096]


def test_a_failed_copy_raises_with_its_errno() -> None:
    dst = _at(64, 0)
    with pytest.raises(OSError) as info:
        cma.read(os.getpid(), 8, dst.ctypes.data, 16)  # nothing is mapped there
    assert info.value.errno == errno.EFAULT and "process_vm_readv" in str(info.value)
    with pytest.raises(OSError) as info:  # (a numpy integer pid is passed as a C int too)
        cma.write(np.int64(os.getpid()), 8, dst.ctypes.data, 16)
    assert info.value.errno == errno.EFAULT
