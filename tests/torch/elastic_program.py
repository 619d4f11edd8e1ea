"""A torchrun job (run by ``test_torch_spawn.py``): rank 1 of the first attempt is killed
after one all_reduce; torchrun restarts the workers, and the second attempt must meet through
the same (agent's) store and finish. Each rank of that attempt prints its result."""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

import ringworld.torch  # noqa: F401 (registers the backend)

rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("ringworld")  # env://, from torchrun's variables
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
if attempt == 0 and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t)
print(f"rank {rank} restart {attempt}: {t.tolist()}", flush=True)
dist.destroy_process_group()
