"""Buffers of other array libraries in the native API: any host DLPack object (torch CPU
tensors), any ``__array_interface__`` object, with no copy (results land in the caller's
memory); device memory, tensors that require grad and dtypes numpy lacks get clear errors, and
the communicator stays usable after them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ringworld
from ringworld.comm.foreign import DeviceBuffer
from ringworld.testing import run_threads


class DLPackOnly:
    """An array of "another library": DLPack only (no buffer protocol, no array interface)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class InterfaceOnly:
    """An array exposing only ``__array_interface__``."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.__array_interface__ = a.__array_interface__


class OnDevice(DLPackOnly):
    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 1)  # CUDA device 1


def data(rank: int, n: int, dtype: Any = np.float64, salt: int = 0) -> np.ndarray:
    return (np.arange(n) * 3 + rank * 100 + salt + 1).astype(dtype)


def _wrappers(comm: ringworld.Communicator) -> list[str]:
    p, r = comm.size, comm.rank
    errors: list[str] = []
    for wrap in (DLPackOnly, InterfaceOnly):
        for dtype in (np.float32, np.int64, np.complex128):
            out = np.zeros(5, dtype=dtype)
            comm.allreduce(wrap(data(r, 5, dtype)), wrap(out))
            if not np.array_equal(out, sum(data(i, 5, dtype) for i in range(p))):
                errors.append(f"{wrap.__name__} allreduce {dtype.__name__}: {out}")
        buf = data(r, 4) if r == 0 else np.zeros(4)
        comm.bcast(wrap(buf), 0)
        if not np.array_equal(buf, data(0, 4)):
            errors.append(f"{wrap.__name__} bcast: {buf}")
        got = np.zeros(3 * p)
        comm.allgather(wrap(data(r, 3)), wrap(got))
        if not np.array_equal(got, np.concatenate([data(i, 3) for i in range(p)])):
            errors.append(f"{wrap.__name__} allgather: {got}")
        if p > 1:
            back = np.zeros(6)
            if r == 0:
                comm.send(wrap(data(0, 6, salt=7)), 1, tag=3)
            elif r == 1:
                comm.recv(wrap(back), 0, tag=3)
                if not np.array_equal(back, data(0, 6, salt=7)):
                    errors.append(f"{wrap.__name__} send/recv: {back}")
    # device memory beside host memory in one call: a clear error on every rank alike (the
    # device plane's), and the communicator stays usable
    try:
        comm.allreduce(OnDevice(np.ones(3)), np.zeros(3))
        errors.append("a CUDA buffer beside a host one was accepted by allreduce")
    except TypeError as exc:
        if "recvbuf is in host memory" not in str(exc) or isinstance(exc, DeviceBuffer):
            errors.append(f"mixed buffers' error unclear: {exc!r}")
    try:  # the device plane reads the object's DLPack capsule: host memory, not CUDA's
        comm.send(OnDevice(np.ones(3)), (r + 1) % p, tag=9)
        errors.append("a buffer claiming CUDA memory was accepted by send")
    except TypeError as exc:
        if "capsule holds memory of device (1, 0)" not in str(exc):
            errors.append(f"device error of send unclear: {exc}")
    out = np.zeros(2)
    comm.allreduce(np.ones(2), out)
    if not np.array_equal(out, np.full(2, p)):
        errors.append(f"after the refusals: {out}")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_dlpack_and_array_interface_objects(size: int) -> None:
    results = run_threads(size, _wrappers, timeout=60)
    assert [e for errs in results for e in errs] == []


def _tensors(comm: ringworld.Communicator) -> list[str]:
    import torch

    p, r = comm.size, comm.rank
    errors: list[str] = []
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
        t = torch.arange(7, dtype=dtype) + r
        comm.allreduce(ringworld.IN_PLACE, t, ringworld.MAX)  # in place, into the tensor
        if not torch.equal(t, torch.arange(7, dtype=dtype) + (p - 1)):
            errors.append(f"allreduce in place {dtype}: {t}")
    t = torch.zeros(2, 3)
    comm.allreduce(torch.full((2, 3), float(r + 1)), t)  # 2-D tensors, out of place
    if not torch.equal(t, torch.full((2, 3), float(p * (p + 1) // 2))):
        errors.append(f"allreduce 2-D: {t}")
    b = torch.arange(5.0) if r == p - 1 else torch.zeros(5)
    comm.bcast(b, p - 1)
    if not torch.equal(b, torch.arange(5.0)):
        errors.append(f"bcast: {b}")
    g = torch.zeros(4 * p, dtype=torch.int64)
    comm.allgather(torch.arange(4) + 10 * r, g)
    if not torch.equal(g, torch.cat([torch.arange(4) + 10 * i for i in range(p)])):
        errors.append(f"allgather: {g}")
    rs = torch.zeros(3)
    comm.reduce_scatter_block(torch.arange(3.0 * p) + r, rs)
    if not torch.equal(rs, (torch.arange(3.0 * p) * p + sum(range(p)))[3 * r : 3 * r + 3]):
        errors.append(f"reduce_scatter_block: {rs}")
    if p > 1:
        if r == 0:
            comm.send(torch.arange(4, dtype=torch.int16), 1, tag=4)
        elif r == 1:
            into = torch.zeros(4, dtype=torch.int16)
            st = comm.recv(into, 0, tag=4)
            if not torch.equal(into, torch.arange(4, dtype=torch.int16)) or st.nbytes != 8:
                errors.append(f"send/recv: {into} {st}")
    # refusals, each clear and each leaving the communicator usable
    for bad, want in ((torch.ones(3, requires_grad=True), "detach"),
                      (torch.ones(3, dtype=torch.bfloat16), "int16")):
        try:
            comm.allreduce(bad, torch.zeros(3))
            errors.append(f"{bad.dtype} {bad.requires_grad} accepted")
        except TypeError as exc:
            if want not in str(exc):
                errors.append(f"refusal does not say {want!r}: {exc}")
    try:
        comm.allreduce(torch.ones(6)[::2], torch.zeros(3))
        errors.append("a strided tensor was accepted")
    except ValueError as exc:
        if "C-contiguous" not in str(exc):
            errors.append(f"strided refusal unclear: {exc}")
    t = torch.ones(2)
    comm.allreduce(ringworld.IN_PLACE, t)
    if not torch.equal(t, torch.full((2,), float(p))):
        errors.append(f"after the refusals: {t}")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_torch_cpu_tensors(size: int) -> None:
    pytest.importorskip("torch", reason="torch tensors need PyTorch (pip install torch)")
    results = run_threads(size, _tensors, timeout=120)
    assert [e for errs in results for e in errs] == []
