"""Data-parallel training that loses a rank and carries on (run with --enable-recovery).

    ringworld run -n 4 --enable-recovery python examples/elastic_training.py --kill-rank 2

Every rank fits a linear model to its share of a synthetic dataset; gradients are averaged with
allreduce. At step ``--kill-step`` rank ``--kill-rank`` dies (SIGKILL, as an out-of-memory kill
would). The survivors get PeerFailure (or CommRevoked), revoke the communicator so that every
member stops waiting, shrink it to the live ranks, re-split the data among themselves and go
on from the weights they agree on. They reach the same fit as an undisturbed run.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

import ringworld

FEATURES = 16
SAMPLES = 4096


def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same synthetic regression problem on every rank: X, y and the true weights."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((SAMPLES, FEATURES))
    w_true = rng.standard_normal(FEATURES)
    y = x @ w_true + 0.01 * rng.standard_normal(SAMPLES)
    return x, y, w_true


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--kill-rank", type=int, default=-1, help="rank that dies (-1: none)")
    parser.add_argument("--kill-step", type=int, default=50)
    args = parser.parse_args()

    comm = ringworld.init()
    world_rank = comm.rank
    x, y, w_true = dataset()
    w = np.zeros(FEATURES)
    grad = np.empty(FEATURES)
    step = 0
    while step < args.steps:
        if world_rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        mine = slice(comm.rank, SAMPLES, comm.size)  # this rank's share of the data
        xs, ys = x[mine], y[mine]
        local = 2.0 * xs.T @ (xs @ w - ys) / SAMPLES  # this share's part of the mean gradient
        try:
            comm.allreduce(local, grad, timeout=60)
        except (ringworld.PeerFailure, ringworld.CommRevoked) as exc:
            start = time.monotonic()
            comm.revoke()            # wake every member still waiting on the old communicator
            comm = comm.shrink()     # the live ranks, renumbered 0..n-1
            # agree on the weights to go on from: rank 0's (identical on all anyway)
            comm.bcast(w, root=0)
            print(f"[world rank {world_rank}] step {step}: {type(exc).__name__}; now rank "
                  f"{comm.rank} of {comm.size} (recovered in {time.monotonic() - start:.2f} s)",
                  flush=True)
            continue  # redo this step with the new data split
        w -= args.lr * grad
        step += 1
    loss = float(np.mean((x @ w - y) ** 2))
    if comm.rank == 0:
        print(f"finished {step} steps on {comm.size} ranks: loss {loss:.6f}, "
              f"weight error {np.abs(w - w_true).max():.2e}", flush=True)


if __name__ == "__main__":
    main()
