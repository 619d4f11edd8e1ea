"""DistributedDataParallel on the ringworld backend, checked against Gloo.

    ringworld run -n 2 python examples/torch_ddp.py [--steps 20] [--no-gloo]

Each rank trains the same small MLP (same seed) on its own shard of a synthetic regression
set; DDP averages the gradients with the ringworld backend's allreduce. Then the same training
runs again over a Gloo group of the same ranks, and rank 0 reports whether both reached the
same weights (bitwise at 2 ranks, where a sum of two floats has one rounding; at more ranks
Gloo adds in another order, so the last bits may differ).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ringworld.torch  # noqa: F401 - registers the "ringworld" backend


def dataset(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed synthetic regression set: y = sin(x W) + noise (the same on every rank)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    return x, torch.sin(x @ w) + 0.05 * torch.randn(n, 4, generator=g)


def train(group: dist.ProcessGroup | None,
          steps: int) -> tuple[list[torch.Tensor], float, float]:
    """Train from seed 0 with DDP over ``group``; return the weights, the last loss and the
    seconds the steps took (DDP's construction, which imports much of torch once, excluded)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = dataset()
    shard_x, shard_y = x[rank::size], y[rank::size]  # this rank's shard
    loss = torch.zeros(())
    t0 = time.perf_counter()
    for step in range(steps):
        batch = slice((step * 32) % len(shard_x), (step * 32) % len(shard_x) + 32)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(shard_x[batch]), shard_y[batch])
        loss.backward()  # DDP allreduces the gradient buckets here
        opt.step()
    took = time.perf_counter() - t0
    return [p.detach().clone() for p in model.parameters()], float(loss.detach()), took


def main() -> None:
    ap = argparse.ArgumentParser(description="DDP on the ringworld backend, checked against Gloo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-gloo", action="store_true", help="skip the Gloo comparison")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ringworld", init_method="ringworld://")
    rank, size = dist.get_rank(), dist.get_world_size()

    weights, loss, took = train(None, args.steps)
    if rank == 0:
        print(f"ringworld: {size} ranks, {args.steps} steps in {took:.2f} s, last loss {loss:.5f}")
    if not args.no_gloo:
        gloo = dist.new_group(backend="gloo")
        gloo_weights, gloo_loss, took = train(gloo, args.steps)
        same = all(torch.equal(a, b) for a, b in zip(weights, gloo_weights, strict=True))
        diff = max(float((a - b).abs().max()) for a, b in zip(weights, gloo_weights, strict=True))
        if rank == 0:
            print(f"gloo:      {size} ranks, {args.steps} steps in {took:.2f} s, "
                  f"last loss {gloo_loss:.5f}")
            print(f"weights identical: {same} (largest difference {diff:.3g})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
