"""The seed's single-process NCCL example in Python: one process drives every GPU it sees.

``ringworld.init_all()`` makes one NCCL communicator per device (NCCL's ncclCommInitAll); each
device's all-reduce of doubles is issued on that device's stream inside one group call, and the
results are checked on every device. Needs a GPU, NCCL (``pip install 'ringworld[nccl-cu12]'``)
and CuPy or torch for the buffers::

    python examples/nccl_single_process.py [COUNT]
"""

from __future__ import annotations

import sys

import ringworld


def main(count: int) -> None:
    try:
        import cupy as xp
    except ImportError:  # torch works the same way (CUDA tensors)
        _main_torch(count)
        return
    n = xp.cuda.runtime.getDeviceCount()
    comms = ringworld.init_all(n)
    send, recv, streams = [], [], []
    for i in range(n):  # allocate data and populate the send buffers on each GPU's stream
        with xp.cuda.Device(i):
            streams.append(xp.cuda.Stream(non_blocking=True))
            with streams[i]:
                send.append(xp.arange(count, dtype=xp.float64) + i)
                recv.append(xp.zeros(count, dtype=xp.float64))
    reqs = []
    with ringworld.device_group():  # one all-reduce per device, enqueued together
        for i in range(n):
            with ringworld.device_stream(streams[i]):
                reqs.append(comms[i].allreduce(send[i], recv[i], ringworld.SUM))
    expected = n * xp.arange(count, dtype=xp.float64) + n * (n - 1) / 2
    for i in range(n):
        reqs[i].wait(timeout=60)
        with xp.cuda.Device(i):
            assert bool(xp.all(recv[i] == expected)), f"GPU {i}: wrong sum"
        comms[i].destroy()
    print(f"all-reduce of {count} doubles over {n} GPU(s) in one process: correct")


def _main_torch(count: int) -> None:
    import torch as t

    n = t.cuda.device_count()
    comms = ringworld.init_all(n)
    send = [t.arange(count, dtype=t.float64, device=f"cuda:{i}") + i for i in range(n)]
    recv = [t.zeros(count, dtype=t.float64, device=f"cuda:{i}") for i in range(n)]
    with ringworld.device_group():
        reqs = [comms[i].allreduce(send[i], recv[i]) for i in range(n)]
    expected = n * t.arange(count, dtype=t.float64) + n * (n - 1) / 2
    for i in range(n):
        reqs[i].wait(timeout=60)
        assert t.equal(recv[i].cpu(), expected), f"GPU {i}: wrong sum"
        comms[i].destroy()
    print(f"all-reduce of {count} doubles over {n} GPU(s) in one process: correct")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20)
