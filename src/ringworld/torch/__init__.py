"""A torch.distributed backend over Ringworld, for CPU tensors.

    import ringworld.torch                      # registers backend "ringworld" and ringworld://
    import torch.distributed as dist
    dist.init_process_group("ringworld", init_method="ringworld://")   # under `ringworld run`
    dist.all_reduce(t)                          # any collective, send/recv, DDP, new_group ...

Importing this module registers the backend with torch (no communication); ``import
ringworld`` alone never imports torch. ``init_method="ringworld://"`` takes rank and world size
from the Ringworld job. Every other init method works with or without ``ringworld run``
(``file://``, ``tcp://``, ``env://`` under torchrun, ``store=``, ``mp.spawn``): the ranks then
meet through the store torch hands the backend, as Gloo's do (see :mod:`ringworld.torch.backend`).

Raises:
    ImportError: PyTorch (with torch.distributed) is not installed.
"""

from __future__ import annotations

try:
    import torch
    import torch.distributed
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "ringworld.torch needs PyTorch: install it with `pip install 'ringworld[torch]'` "
        f"(or `pip install torch`); importing torch failed: {exc}"
    ) from exc
if not torch.distributed.is_available():  # pragma: no cover - torch built without it
    raise ImportError("ringworld.torch needs torch.distributed, which this torch build lacks")

from ringworld.torch.backend import SCHEME, create, register, rendezvous
from ringworld.torch.process_group import BACKEND_NAME, ProcessGroupRingworld
from ringworld.torch.work import Work

__all__ = ["BACKEND_NAME", "SCHEME", "ProcessGroupRingworld", "Work", "create", "register",
           "rendezvous"]

register()
