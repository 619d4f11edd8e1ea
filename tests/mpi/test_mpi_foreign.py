"""``ringworld.MPI`` takes host DLPack objects as buffers, as mpi4py 4 does: torch CPU tensors
in every buffer position (plain or in a ``[buf, datatype]`` spec), with no copy; device memory
is refused with an error naming the device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ringworld import MPI
from ringworld.testing import run_processes


class OnDevice:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def _tensors(_: object) -> int:
    import torch

    comm = MPI.COMM_WORLD
    p, r = comm.Get_size(), comm.Get_rank()
    checks = 0
    out = torch.zeros(4)
    comm.Allreduce(torch.arange(4.0) + r, out, MPI.SUM)
    assert torch.equal(out, torch.arange(4.0) * p + sum(range(p))), out
    checks += 1
    out64 = torch.zeros(3, dtype=torch.int64)
    comm.Allreduce([torch.arange(3) + r, MPI.INT64_T], [out64, MPI.INT64_T], MPI.MAX)
    assert torch.equal(out64, torch.arange(3) + p - 1), out64
    checks += 1
    t = torch.arange(5.0) + r
    comm.Allreduce(MPI.IN_PLACE, t, MPI.SUM)
    assert torch.equal(t, torch.arange(5.0) * p + sum(range(p))), t
    checks += 1
    b = torch.arange(6, dtype=torch.int32) if r == 0 else torch.zeros(6, dtype=torch.int32)
    comm.Bcast(b, root=0)
    assert torch.equal(b, torch.arange(6, dtype=torch.int32)), b
    checks += 1
    g = torch.zeros(2 * p)
    comm.Allgather(torch.full((2,), float(r)), g)
    assert torch.equal(g, torch.arange(p, dtype=torch.float32).repeat_interleave(2)), g
    checks += 1
    if p > 1:
        if r == 0:
            comm.Send(torch.arange(3, dtype=torch.float64), dest=1, tag=2)
        elif r == 1:
            into = torch.zeros(3, dtype=torch.float64)
            st = MPI.Status()
            comm.Recv(into, source=0, tag=2, status=st)
            assert torch.equal(into, torch.arange(3, dtype=torch.float64)), into
            assert st.Get_count(MPI.DOUBLE) == 3
        checks += 1
    with pytest.raises(TypeError, match="CUDA memory"):
        comm.Allreduce(OnDevice(np.ones(2)), np.zeros(2), MPI.SUM)
    checks += 1
    comm.Barrier()
    return checks


@pytest.mark.parametrize("size", [1, 2, 3])
def test_torch_tensors_through_ringworld_mpi(size: int) -> None:
    pytest.importorskip("torch", reason="torch tensors need PyTorch (pip install torch)")
    checks = run_processes(size, _tensors, timeout=90)
    assert len(set(checks)) == 1 and checks[0] >= 6
