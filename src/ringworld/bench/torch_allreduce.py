"""torch.distributed allreduce: the ringworld backend against Gloo, in the same ranks and run.

    ringworld run -n 2 python -m ringworld.bench.torch_allreduce [--sizes 1M,16M] [--iters 50]

The default group uses the ringworld backend (``init_method="ringworld://"``); a second group
over the same ranks uses Gloo (through the shared TCPStore). For each size both libraries
reduce the same float32 tensor, in alternating rounds so that both see the same machine state;
every result is checked (data: rank- and index-dependent small integers, exact in float32).
Rank 0 prints the median (and best) time per call, the bus bandwidth (2(p-1)/p x bytes /
time, as nccl-tests) and Gloo's time over Ringworld's; ``--json PATH`` saves the figures. On a
host whose cores are busy with other work the medians swing widely (ranks that spin-wait lose
their peers' time slices); the best times show what each library can do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"16M"`` -> 16 MiB in bytes (suffixes K, M, G: powers of 1024).

    Raises:
        ValueError: not a size.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in UNITS else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit():
        raise ValueError(f"size {text!r} must be a whole number with an optional K/M/G suffix")
    return int(number) * UNITS[unit]


def _time_calls(fn: Callable[[], Any], iters: int, barrier: Callable[[], Any]) -> list[float]:
    """Seconds per call of ``fn``, one sample per call, ranks lined up by ``barrier`` first."""
    barrier()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def run(sizes: list[int], iters: int, warmup: int, rounds: int) -> list[dict[str, Any]]:
    """Measure both backends at each size; return one row per size (on every rank)."""
    import torch
    import torch.distributed as dist

    import ringworld.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("ringworld", init_method="ringworld://")
    gloo = dist.new_group(backend="gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        base = (torch.arange(n, dtype=torch.float32) % 1000) + rank
        expected = (torch.arange(n, dtype=torch.float32) % 1000) * p + p * (p - 1) // 2
        t = base.clone()
        times: dict[str, list[float]] = {"ringworld": [], "gloo": []}
        groups = {"ringworld": None, "gloo": gloo}
        for name, group in groups.items():  # correctness first, on fresh data
            t.copy_(base)
            dist.all_reduce(t, group=group)
            if not torch.equal(t, expected):
                bad = int((t != expected).sum())
                raise AssertionError(f"{name} allreduce of {nbytes} B: {bad} wrong elements")
        for _ in range(rounds):
            for name, group in groups.items():
                def call(t: Any = t, group: Any = group) -> None:
                    dist.all_reduce(t, group=group)

                _time_calls(call, warmup, dist.barrier)
                times[name] += _time_calls(call, iters, dist.barrier)
        row: dict[str, Any] = {"bytes": nbytes, "np": p}
        for name, samples in times.items():
            med = statistics.median(samples)
            row[f"{name}_us"] = med * 1e6
            row[f"{name}_best_us"] = min(samples) * 1e6
            row[f"{name}_busbw_GBps"] = 2 * (p - 1) / p * nbytes / med / 1e9
        row["gloo_over_ringworld"] = row["gloo_us"] / row["ringworld_us"]
        row["gloo_over_ringworld_best"] = row["gloo_best_us"] / row["ringworld_best_us"]
        rows.append(row)
    dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run, print the table on rank 0."""
    ap = argparse.ArgumentParser(prog="torch_allreduce", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M", help="comma-separated sizes (default 1M,16M)")
    ap.add_argument("--iters", type=int, default=30, help="timed calls per round (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per round (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--json", default=None, help="save the rows to this file (rank 0)")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    import ringworld

    rank = ringworld.init().rank
    rows = run(sizes, args.iters, args.warmup, args.rounds)
    if rank == 0:
        print(f"# torch allreduce, float32, np={rows[0]['np'] if rows else '?'}; time per call: "
              "median (best), bus bandwidth of the median")
        print(f"{'bytes':>10} {'ringworld us':>18} {'GB/s':>6} {'gloo us':>18} {'GB/s':>6} "
              f"{'gloo/ringworld':>15}")
        for r in rows:
            rw = f"{r['ringworld_us']:.1f} ({r['ringworld_best_us']:.1f})"
            gl = f"{r['gloo_us']:.1f} ({r['gloo_best_us']:.1f})"
            ratio = f"{r['gloo_over_ringworld']:.2f} ({r['gloo_over_ringworld_best']:.2f})"
            print(f"{r['bytes']:>10} {rw:>18} {r['ringworld_busbw_GBps']:>6.2f} {gl:>18}"
                  f" {r['gloo_busbw_GBps']:>6.2f} {ratio:>15}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
