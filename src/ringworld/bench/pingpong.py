"""``ringworld bench pingpong``: point-to-point figures, optionally side by side with peers.

For each transport it launches ``pingpong_rank.py`` under ``ringworld run -n 2``; with
``--against mpi4py`` the same program runs under MPICH's ``mpiexec``, with ``--against socket``
over a plain Python TCP stream. Runs go one after another (never concurrently), then the tables
are printed; ``--json`` keeps every sample. Exit status 1 when a run failed or any payload
arrived wrong.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from ringworld._argtypes import parse_size, parse_sizes
from ringworld.bench import load, runners
from ringworld.bench.pingpong_rank import parse_kernels
from ringworld.bench.report import display_name, fmt_size, render
from ringworld.bench.runners import RunResult

# the size parsers live in _argtypes (shared with topology); re-exported for bench.sweep
__all__ = ["DEFAULT_SIZES", "add_parser", "parse_size", "parse_sizes", "run"]

DEFAULT_SIZES = [0, 8, 64, *(4**k for k in range(4, 14))]  # 0 B, 8 B, 64 B, 256 B .. 64 MiB


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pingpong`` under ``ringworld bench``."""
    p = subparsers.add_parser(
        "pingpong", help="point-to-point latency, bandwidth, objects, start-up",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--np", type=int, default=2,
                   help="ranks (ranks 0 and 1 measure, others idle; default 2)")
    p.add_argument("--transport", choices=("shm", "tcp", "both"), default="both")
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument("--sizes", type=parse_sizes, default=None,
                       help="comma-separated message sizes, e.g. 0,8,64,1KiB,16MiB")
    sizes.add_argument("--max-size", type=parse_size, default=None,
                       help="largest of the default sizes 0, 8, 64, 256, ... 64MiB")
    p.add_argument("--iters", type=int, default=1000,
                   help="ping-pong iterations per repeat at small sizes (scaled down for large "
                        "ones; streaming uses a tenth of it)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is shown")
    p.add_argument("--kernels", type=parse_kernels, default=["latency", "stream", "object"],
                   help="any of latency,stream,object")
    p.add_argument("--api", choices=("native", "mpi"), default="native",
                   help="Ringworld's calls: the native API (default) or the mpi4py peer's "
                        "calls through ringworld.MPI")
    p.add_argument("--against", action="append", choices=("mpi4py", "socket"), default=[],
                   help="also run a peer: mpi4py (under mpiexec) or a plain Python socket stream")
    p.add_argument("--mpi-python", default=os.environ.get("RINGWORLD_MPI_PYTHON"),
                   help="python (or venv) with mpi4py and mpich; default $RINGWORLD_MPI_PYTHON, "
                        "else the current python")
    p.add_argument("--startup-runs", type=int, default=5,
                   help="start-up timings per launcher (median shown; 0 skips start-up)")
    p.add_argument("--startup-np", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job before killing it")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="run beside N busy processes the benchmark starts and stops (the "
                        "tables say which; default 0: quiet)")
    p.add_argument("--json", type=Path, default=None, help="write raw results to this file")
    p.set_defaults(func=run)


def _rank_args(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    return [
        "--sizes", ",".join(map(str, sizes)), "--iters", str(args.iters),
        "--repeats", str(args.repeats), "--kernels", ",".join(args.kernels),
    ]


def _progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def _finish(result: RunResult) -> RunResult:
    state = "ok" if result.ok else "FAILED"
    _progress(f"{display_name(result)}: {state} ({result.library})")
    return result


def _meta(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    import numpy

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "argv": sys.argv,
        "np": args.np,
        "sizes": sizes,
        "load": args.load,
        "iters": args.iters,
        "repeats": args.repeats,
        "loadavg_before": _load(),
    }


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _warn_if_busy() -> None:
    load, cpus = _load(), os.cpu_count() or 1
    if load is not None and load > 0.5 * cpus:
        _progress(f"warning: load average {load:.2f} on {cpus} CPUs: other processes will "
                  "distort the figures (compare only within one run)")


def run(args: argparse.Namespace) -> int:
    """Handler of ``ringworld bench pingpong``."""
    if (args.np < 2 or args.iters < 1 or args.repeats < 1 or args.startup_np < 1
            or args.load < 0):
        print("bench pingpong: -n must be >= 2, --iters/--repeats/--startup-np >= 1, "
              "--load >= 0", file=sys.stderr)
        return 2
    if args.sizes is not None:
        sizes = args.sizes
    else:
        limit = args.max_size if args.max_size is not None else DEFAULT_SIZES[-1]
        sizes = [s for s in DEFAULT_SIZES if s <= limit]
    peer = None
    if "mpi4py" in args.against:
        try:
            peer = runners.find_mpi_peer(args.mpi_python)
        except ValueError as exc:
            print(f"bench pingpong: --against mpi4py: {exc}", file=sys.stderr)
            return 2
    transports = ["shm", "tcp"] if args.transport == "both" else [args.transport]
    rank_args = _rank_args(args, sizes)
    _progress(f"sizes {', '.join(fmt_size(s) for s in sizes)}; np={args.np}")
    if not args.load:
        _warn_if_busy()
    meta = _meta(args, sizes)
    with load.busy(args.load):
        results = _measure_all(args, transports, rank_args, peer)
    print(render(results, args.np, args.startup_np))
    print(load.describe(args.load))
    _write_json(args, meta, results)
    failed = any(not r.ok or (r.startup and "error" in r.startup) for r in results)
    return 1 if failed else 0


def _measure_all(args: argparse.Namespace, transports: list[str], rank_args: list[str],
                 peer: Any) -> list[RunResult]:
    """Every run the arguments ask for: Ringworld per transport, then the peers."""
    results: list[RunResult] = []
    for transport in transports:
        _progress(f"ringworld over {transport} ...")
        res = runners.measure_ringworld(args.np, transport, rank_args, args.timeout, args.api)
        if args.startup_runs:
            argv = runners.ringworld_run_argv(
                args.startup_np, transport, [str(runners.BARRIER_PROGRAM), "ringworld"])
            res.startup = runners.measure_startup(argv, args.startup_runs, args.timeout)
        results.append(_finish(res))
    if peer is not None:
        _progress(f"mpi4py under {peer.mpiexec} ...")
        res = runners.measure_mpi4py(peer, args.np, rank_args, args.timeout)
        if args.startup_runs:
            argv = peer.argv(args.startup_np, [str(runners.BARRIER_PROGRAM), "mpi4py"])
            res.startup = runners.measure_startup(argv, args.startup_runs, args.timeout)
        results.append(_finish(res))
    if "socket" in args.against:
        _progress("plain socket stream ...")
        results.append(_finish(runners.measure_socket(rank_args, args.timeout)))
    return results


def _write_json(args: argparse.Namespace, meta: dict[str, Any],
                results: list[RunResult]) -> None:
    if args.json is not None:
        doc = {
            "meta": meta,
            "runs": {
                r.label: {
                    "name": display_name(r), "backend": r.backend, "transport": r.transport,
                    "ok": r.ok, "error": r.error, "startup": r.startup, **r.data,
                }
                for r in results
            },
        }
        args.json.write_text(json.dumps(doc, indent=1))
        _progress(f"raw results in {args.json}")
