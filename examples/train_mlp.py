"""Data-parallel training of a small MLP with numpy, gradients averaged with allreduce.

    python examples/train_mlp.py                           # one process: the reference
    ringworld run -n 2 python examples/train_mlp.py        # two ranks, same result, faster

The dataset is synthetic and made here, deterministically from ``--seed``: Gaussian inputs
labelled by a fixed random "teacher" network. Every rank builds the same data, model and
per-epoch shuffle; each global batch of ``--batch`` samples is split between the ranks, each
computes the gradient and loss sums of its share, one allreduce adds them (all parameters and
the loss travel as one flat vector), and every rank divides by the global batch size and takes
the same SGD step. So the ranks follow the single-process run step by step: the losses agree
to rounding (the sums are only added in another order). Rank 0 prints the loss per epoch, the
final loss and the wall time.

Each rank uses one BLAS thread (set below before numpy loads, unless the environment says
otherwise), so the speed-up at n ranks is measured against one core doing all the work.
"""

from __future__ import annotations

import argparse
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import numpy as np  # noqa: E402

import ringworld  # noqa: E402

Array = np.ndarray


def make_dataset(samples: int, features: int, classes: int, seed: int) -> tuple[Array, Array]:
    """Inputs ~ N(0, 1) and the labels a fixed random teacher network gives them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features))
    w1 = rng.standard_normal((features, 64)) / np.sqrt(features)
    w2 = rng.standard_normal((64, classes)) / 8.0
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    return x, y


class MLP:
    """features -> hidden (ReLU) -> classes (softmax), its parameters views of one flat vector."""

    def __init__(self, features: int, hidden: int, classes: int, seed: int) -> None:
        shapes = [(features, hidden), (hidden,), (hidden, classes), (classes,)]
        sizes = [int(np.prod(s)) for s in shapes]
        self.flat = np.zeros(sum(sizes))
        self.grad_flat = np.zeros(self.flat.size + 1)  # the gradient sum, then the loss sum
        offsets = np.cumsum([0, *sizes])
        self.params = [self.flat[a:b].reshape(s) for a, b, s in
                       zip(offsets[:-1], offsets[1:], shapes, strict=True)]
        self.grads = [self.grad_flat[a:b].reshape(s) for a, b, s in
                      zip(offsets[:-1], offsets[1:], shapes, strict=True)]
        rng = np.random.default_rng(seed + 1)
        self.params[0][...] = rng.standard_normal((features, hidden)) * np.sqrt(2.0 / features)
        self.params[2][...] = rng.standard_normal((hidden, classes)) * np.sqrt(1.0 / hidden)

    def loss_and_grad_sums(self, x: Array, y: Array) -> None:
        """Put the samples' gradient sum and cross-entropy loss sum into ``grad_flat``."""
        w1, b1, w2, b2 = self.params
        h = np.maximum(x @ w1 + b1, 0.0)
        logits = h @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        self.grad_flat[-1] = -np.log(p[rows, y]).sum()
        p[rows, y] -= 1.0  # d(loss)/d(logits), per sample
        g1, gb1, g2, gb2 = self.grads
        np.matmul(h.T, p, out=g2)
        p.sum(axis=0, out=gb2)
        dh = p @ w2.T
        dh *= h > 0
        np.matmul(x.T, dh, out=g1)
        dh.sum(axis=0, out=gb1)


def share(n: int, size: int, rank: int) -> slice:
    """This rank's part of ``n`` items split as evenly as possible (the first ranks get more)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def train(args: argparse.Namespace) -> None:
    comm = ringworld.init()
    x, y = make_dataset(args.samples, args.features, args.classes, args.seed)
    model = MLP(args.features, args.hidden, args.classes, args.seed)
    summed = np.empty_like(model.grad_flat)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"{comm.size} rank(s); {args.samples} samples x {args.features} features, "
        f"hidden {args.hidden}, {args.classes} classes, global batch {args.batch}, "
        f"{model.flat.size} parameters")
    comm.barrier()
    start = time.perf_counter()
    final = float("nan")
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng([args.seed, epoch]).permutation(args.samples)
        epoch_loss = 0.0
        for first in range(0, args.samples, args.batch):
            batch = order[first:first + args.batch]
            mine = batch[share(len(batch), comm.size, comm.rank)]
            model.loss_and_grad_sums(x[mine], y[mine])
            comm.allreduce(model.grad_flat, summed, ringworld.SUM)  # one message per step
            model.flat -= (args.lr / len(batch)) * summed[:-1]
            epoch_loss += float(summed[-1])
        final = epoch_loss / args.samples
        say(f"epoch {epoch:3d}  loss {final:.12f}")
    elapsed = time.perf_counter() - start
    say(f"final loss {final:.12f}")
    say(f"wall time {elapsed:.3f} s on {comm.size} rank(s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1024, help="global batch size")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
