"""``ringworld bench <collective>``: an nccl-tests-style size sweep, optionally against peers.

Runs ``sweep_rank.py`` under ``ringworld run``; with ``--against mpi4py`` the same program under
MPICH's ``mpiexec``, with ``--against gloo`` under torch.distributed (gloo) started by
``gloo_launch.py``. Jobs run one after another, never concurrently. Per size the table shows the
time per iteration (max over ranks of the mean), algbw = bytes / time, busbw = algbw times the
nccl-tests factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall, gather, scatter
(n-1)/n; others 1), elements found wrong against a numpy reference, the algorithm Ringworld
chose, and for each peer its time and peer time / Ringworld time (above 1: Ringworld faster).
For allgather, reduce_scatter, alltoall, gather and scatter the size is the whole buffer; the
v-variants (allgatherv, gatherv, scatterv, alltoallv) run with equal counts, sized as their
equal-block collectives.
``--api mpi`` times Ringworld through ``ringworld.MPI`` (the mpi4py peer's very calls, under
``ringworld run``: the layer ported mpi4py programs use) instead of the native API.

On a shared machine one job's timings can be off by 2x from the next one's. ``--rounds N`` runs
every library N times, alternating (Ringworld, peers, Ringworld, peers, ...), and reports per size
the median time of each library, the ratio of the medians and, beside it, the range of the N
ratios measured round by round (each from jobs run one right after the other).

A peer that cannot be found is reported as skipped, not an error. Exit status 1 when a run
failed or any element was wrong, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringworld.bench import load, runners
from ringworld.bench.pingpong import parse_size, parse_sizes
from ringworld.bench.report import fmt_size, render_table
from ringworld.bench.sweep_rank import (
    COLLECTIVES,
    PROGRESS,
    REDUCING,
    REGISTRY_NAME,
    bus_factor,
)

PEERS = ("mpi4py", "gloo", "nccl")


@dataclass(slots=True)
class SweepRun:
    """One library's sweep: its rows, or why it failed or was skipped."""

    label: str  # rw-shm, rw-tcp, mpich, openmpi, mpi4py, gloo
    backend: str
    library: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None

    @property
    def wrong(self) -> int:
        """Elements found wrong over every row."""
        return sum(int(r["wrong"]) for r in self.rows)

    @property
    def checked(self) -> int:
        """Elements checked over every row."""
        return sum(int(r["checked"]) for r in self.rows)

    @property
    def failed(self) -> bool:
        """Ran and failed, or produced wrong results (a skipped peer has not failed)."""
        return self.skipped is None and (self.error is not None or self.wrong > 0)

    def to_json(self) -> dict[str, Any]:
        """The run as JSON."""
        return {"label": self.label, "backend": self.backend, "library": self.library,
                "ok": not self.failed and self.skipped is None, "error": self.error,
                "skipped": self.skipped, "unsupported": self.unsupported, "rows": self.rows}


def peer_label(backend: str, library: str) -> str:
    """``mpich``, ``openmpi`` or the backend name."""
    lib = library.lower()
    if backend == "mpi4py":
        if "mpich" in lib:
            return "mpich"
        if "open mpi" in lib:
            return "openmpi"
    return backend


# --------------------------------------------------------------------------------------------
# Running


def _progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def _echo_progress(label: str) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        at = line.find(PROGRESS)
        if at >= 0:
            _progress(f"{label}: {line[at + len(PROGRESS):].strip()}")

    return on_line


def run_sweep(run: SweepRun, argv_for: Callable[[list[str]], list[str]],
              rank_args: Sequence[str], timeout: float) -> SweepRun:
    """Run one library's job (``argv_for(program)`` builds its command) and read rank 0's JSON."""
    with tempfile.TemporaryDirectory(prefix="rw-sweep-") as tmp:
        out = Path(tmp) / "result.json"
        program = [str(runners.SWEEP_PROGRAM), "--backend", run.backend, *rank_args,
                   "--out", str(out)]
        outcome = runners.run_job(argv_for(program), timeout, on_line=_echo_progress(run.label))
        data: dict[str, Any] = {}
        if out.is_file() and out.stat().st_size:
            data = json.loads(out.read_text())
    run.library = str(data.get("library", run.backend))
    run.rows = list(data.get("rows", []))
    run.unsupported = dict(data.get("unsupported", {}))
    if outcome.returncode != 0 or outcome.timed_out or not data.get("complete"):
        lines = outcome.output.splitlines()
        outcome.output = "\n".join(line for line in lines if PROGRESS not in line)
        run.error = outcome.describe()
    if not run.backend.startswith("ringworld"):
        run.label = peer_label(run.backend, run.library)
    state = "FAILED" if run.failed else "ok"
    _progress(f"{run.label}: {state} ({run.library})")
    return run


def _rank_args(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    out = ["--collective", args.collective, "--sizes", ",".join(map(str, sizes)),
           "--iters", str(args.iters), "--time-per-size", str(args.time_per_size),
           "--timeout", str(args.timeout), "--device", args.device]
    if not args.check:
        out.append("--no-check")
    return out


def run_all(args: argparse.Namespace, sizes: list[int]) -> list[SweepRun]:
    """Ringworld, then each requested peer (or its reason for being skipped)."""
    base = _rank_args(args, sizes)
    runs: list[SweepRun] = []
    mine = [*base, *(["--algorithm", args.algorithm] if args.algorithm else [])]
    where = "cuda" if args.device == "cuda" else args.transport
    _progress(f"ringworld over {'NCCL (CUDA buffers)' if where == 'cuda' else where} ...")
    mpi = args.api == "mpi"
    runs.append(run_sweep(
        SweepRun(f"rwMPI-{where}" if mpi else f"rw-{where}",
                 "ringworld-mpi" if mpi else "ringworld"),
        lambda prog: runners.ringworld_run_argv(args.np, args.transport, prog),
        mine, args.timeout))
    for peer in dict.fromkeys(args.against):
        run = SweepRun(peer, peer)
        launcher: runners.MpiPeer | runners.TorchPeer
        try:
            if (peer == "nccl") != (args.device == "cuda"):
                raise ValueError(f"{peer} runs on {'CUDA' if peer == 'nccl' else 'host'} "
                                 f"buffers, and this sweep's are on {args.device}")
            if peer == "mpi4py":
                launcher = runners.find_mpi_peer(args.mpi_python)
                _progress(f"mpi4py under {launcher.mpiexec} ...")
            else:
                launcher = runners.find_torch_peer([args.torch_python, args.mpi_python])
                _progress(f"{peer} with {launcher.python} ...")
        except ValueError as exc:
            run.skipped = str(exc)
            _progress(f"{peer}: skipped: {exc}")
            runs.append(run)
            continue
        runs.append(run_sweep(run, functools.partial(launcher.argv, args.np), base,
                              args.timeout))
    return runs


def merge_rounds(rounds: Sequence[Sequence[SweepRun]]) -> list[SweepRun]:
    """One run per library from several rounds of :func:`run_all` (same libraries each round).

    Per size: the median time (algbw and busbw recomputed from it), wrong and checked elements
    summed, iterations summed; peers' rows gain ``ratio_range``, the lowest and highest ratio
    (peer time / Ringworld time) of the rounds in which both ran that size. A library's error is
    its first round's error, if any.
    """
    if len(rounds) == 1:
        return list(rounds[0])
    merged: list[SweepRun] = []
    mine_by_round = [{int(r["size"]): r for r in rnd[0].rows} for rnd in rounds]
    for i, first in enumerate(rounds[0]):
        runs = [rnd[i] for rnd in rounds]
        out = SweepRun(first.label, first.backend, first.library,
                       unsupported=dict(first.unsupported), skipped=first.skipped)
        out.error = next((r.error for r in runs if r.error is not None), None)
        out.label = next((r.label for r in runs if r.rows), first.label)
        sizes = sorted({int(row["size"]) for r in runs for row in r.rows})
        for size in sizes:
            rows = [row for r in runs for row in r.rows if int(row["size"]) == size]
            row = dict(sorted(rows, key=lambda x: float(x["time_us"]))[(len(rows) - 1) // 2])
            t = statistics.median(float(x["time_us"]) for x in rows)
            scale = float(row["time_us"]) / t if t > 0 else 1.0
            row.update(time_us=t, algbw_GBps=float(row["algbw_GBps"]) * scale,
                       busbw_GBps=float(row["busbw_GBps"]) * scale, rounds=len(rows),
                       iters=sum(int(x["iters"]) for x in rows),
                       wrong=sum(int(x["wrong"]) for x in rows),
                       checked=sum(int(x["checked"]) for x in rows))
            if i > 0:
                ratios = [float(x["time_us"]) / float(m[size]["time_us"])
                          for x, m in zip((next((q for q in r.rows if int(q["size"]) == size),
                                                None) for r in runs), mine_by_round, strict=True)
                          if x is not None and size in m and float(m[size]["time_us"]) > 0]
                if ratios:
                    row["ratio_range"] = [min(ratios), max(ratios)]
            out.rows.append(row)
        merged.append(out)
    return merged


# --------------------------------------------------------------------------------------------
# Reporting


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:.0f}"
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _ratio(peer_us: float, mine_us: float) -> str:
    if mine_us <= 0:
        return "-"
    ratio = peer_us / mine_us
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.3f}x"


def render(runs: Sequence[SweepRun], collective: str, np: int) -> str:
    """The size table, then verification, skipped peers and failures."""
    mine, peers = runs[0], [r for r in runs[1:] if r.rows]
    if collective == "barrier":
        what = "barrier"
    else:
        data = "float32 sum" if collective in REDUCING else "float32"
        what = (f"{collective}, {data}; GB/s = 1e9 bytes/s; "
                f"busbw = algbw x {bus_factor(collective, np):.3g}")
    rounds = max((int(r.get("rounds", 1)) for run in runs for r in run.rows), default=1)
    head = [f"{what}; np={np}; time = max over ranks of the mean per iteration (us); "
            "ratio = peer time / ringworld time (above 1: ringworld faster)", "runs:"]
    if rounds > 1:
        head.insert(1, f"median of {rounds} alternating rounds; in brackets the lowest and "
                       "highest ratio of a single round")
    head += [f"  {r.label:8} {r.library}" for r in runs if not r.skipped]
    parts = ["\n".join(head)]
    headers = ["size", "count", "iters", f"{mine.label} us", "algbw", "busbw", "#wrong",
               "algorithm"]
    for p in peers:
        headers += [f"{p.label} us", "busbw", f"{p.label}/rw"]
    by_size = [{int(r["size"]): r for r in run.rows} for run in [mine, *peers]]
    sizes = sorted({s for table in by_size for s in table})
    rows = []
    for size in sizes:
        row = by_size[0].get(size)
        cells = [fmt_size(size)]
        if row is None:
            cells += ["-"] * 7
        else:
            cells += [str(row["count"]), str(row["iters"]), _num(row["time_us"]),
                      _num(row["algbw_GBps"]), _num(row["busbw_GBps"]), str(row["wrong"]),
                      "/".join(row.get("algorithms") or [row["algorithm"]])]
        for table in by_size[1:]:
            other = table.get(size)
            if other is None:
                cells += ["-", "-", "-"]
                continue
            ratio = _ratio(other["time_us"], row["time_us"] if row else 0.0)
            if "ratio_range" in other:
                lo, hi = other["ratio_range"]
                ratio += f" ({lo:.2f}-{hi:.2f})"
            cells += [_num(other["time_us"]), _num(other["busbw_GBps"]), ratio]
        rows.append(cells)
    if rows:
        parts.append(render_table(headers, rows))
    verify = ["verification (against a numpy reference):"]
    for r in runs:
        if r.skipped:
            continue
        if not r.rows:
            if not r.unsupported:
                verify.append(f"  {r.label:8} no results")
        elif r.checked == 0:
            verify.append(f"  {r.label:8} not checked")
        else:
            state = "ok" if r.wrong == 0 else "WRONG"
            verify.append(f"  {r.label:8} {state}: {r.wrong} wrong of {r.checked} elements")
        verify += [f"  {r.label:8} {c}: not supported ({why})" for c, why in r.unsupported.items()]
    parts.append("\n".join(verify))
    parts += [f"skipped {r.label}: {r.skipped}" for r in runs if r.skipped]
    parts += [f"FAILED {r.label}: {r.error}" for r in runs if r.error and not r.skipped]
    return "\n\n".join(parts)



def plot(runs: Sequence[SweepRun], collective: str, np: int, path: Path) -> None:
    """busbw against size for every library, on one log-log chart written to ``path``.

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
    """
    matplotlib: Any = importlib.import_module("matplotlib")  # optional: no stubs required
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    fig, ax = plt.subplots(figsize=(8, 5))
    bw = "time_us" if collective == "barrier" else "busbw_GBps"
    for run in runs:
        rows = [r for r in run.rows if r[bw] > 0]
        if rows:
            ax.plot([r["size"] for r in rows], [r[bw] for r in rows], marker="o",
                    label=f"{run.label} ({run.library})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("time per iteration (us)" if bw == "time_us" else "busbw (GB/s)")
    ax.set_title(f"{collective}, np={np}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Command line


def _algorithms(collective: str) -> list[str] | None:
    """Ringworld's algorithm names for ``collective`` (of every kind: the timed calls are
    blocking, so ``shm`` can run), or None when the registry is absent."""
    try:
        from ringworld.algorithms.registry import ALGORITHMS
    except ImportError:
        return None
    return sorted(ALGORITHMS.get(REGISTRY_NAME.get(collective, collective), {}))


def default_sizes(lo: int, hi: int, factor: int) -> list[int]:
    """``lo``, ``lo*factor``, ... up to ``hi`` (nccl-tests' -b/-e/-f).

    Raises:
        ValueError: ``lo`` is 0 or above ``hi``, or ``factor`` below 2.
    """
    if lo < 1 or lo > hi or factor < 2:
        raise ValueError("need 1 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    return sizes


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register one ``ringworld bench <collective>`` per collective."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--np", type=int, default=2, help="ranks (default 2)")
    common.add_argument("--sizes", type=parse_sizes, default=None,
                        help="comma-separated sizes in bytes, e.g. 1K,1M,16M,64M")
    common.add_argument("-b", "--min-bytes", type=parse_size, default=4,
                        help="without --sizes: smallest size (default 4)")
    common.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20,
                        help="without --sizes: largest size (default 64MiB)")
    common.add_argument("-f", "--step-factor", type=int, default=4,
                        help="without --sizes: multiply the size by this (default 4)")
    common.add_argument("--iters", type=int, default=0,
                        help="timed iterations per size (default: about --time-per-size)")
    common.add_argument("--time-per-size", type=float, default=0.3, metavar="SECONDS",
                        help="timed seconds per size when --iters is not given (default 0.3)")
    common.add_argument("--algorithm", default=None,
                        help="Ringworld algorithm (default: automatic choice)")
    common.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    common.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="verify every size against a numpy reference (default on)")
    common.add_argument("--against", action="append", choices=PEERS, default=[],
                        help="also run a peer: mpi4py (under mpiexec), gloo or nccl (torch's "
                             "ProcessGroupNCCL, with --device cuda)")
    common.add_argument("--api", choices=("native", "mpi"), default="native",
                        help="Ringworld's calls: the native API (default) or the same calls as "
                             "the mpi4py peer's, through ringworld.MPI")
    common.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="buffers on the host (default) or on each rank's GPU (torch CUDA "
                             "tensors: Ringworld's NCCL plane)")
    common.add_argument("--mpi-python", default=os.environ.get("RINGWORLD_MPI_PYTHON"),
                        help="python (or venv) with mpi4py and mpich; default "
                             "$RINGWORLD_MPI_PYTHON, else the current python")
    common.add_argument("--torch-python", default=os.environ.get("RINGWORLD_TORCH_PYTHON"),
                        help="python (or venv) with torch; default $RINGWORLD_TORCH_PYTHON, "
                             "else --mpi-python, else the current python")
    common.add_argument("--rounds", type=int, default=1,
                        help="run every library this many times, alternating, and report "
                             "medians (default 1)")
    common.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per job before killing it (default 900)")
    common.add_argument("--load", type=int, default=0, metavar="N",
                        help="run beside N busy processes the benchmark starts and stops "
                             "(the table says which; default 0: quiet)")
    common.add_argument("--json", type=Path, default=None, help="write raw results here")
    common.add_argument("--plot", type=Path, default=None,
                        help="draw busbw against size to this image (needs matplotlib)")
    for name in COLLECTIVES:
        p = subparsers.add_parser(
            name, parents=[common], help=f"{name} size sweep (nccl-tests style)",
            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=run, collective=name)


def _meta(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    import numpy

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "numpy": numpy.__version__, "argv": sys.argv, "collective": args.collective,
        "np": args.np, "sizes": sizes, "transport": args.transport,
        "algorithm": args.algorithm, "check": args.check, "iters": args.iters,
        "device": args.device,
        "time_per_size": args.time_per_size, "rounds": args.rounds, "load": args.load,
    }


def _validate(args: argparse.Namespace) -> list[int]:
    """The sizes to sweep.

    Raises:
        ValueError: an argument is out of range, or --plot without matplotlib.
    """
    if args.np < 1 or args.iters < 0 or args.time_per_size <= 0 or args.timeout <= 0:
        raise ValueError("-n must be >= 1, --iters >= 0, --time-per-size and --timeout > 0")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.api == "mpi" and (args.device == "cuda" or args.algorithm is not None):
        raise ValueError("--api mpi times ringworld.MPI's host calls: no --device cuda or "
                         "--algorithm with it")
    if args.algorithm is not None:
        known = _algorithms(args.collective)
        if known is not None and args.algorithm not in known:
            raise ValueError(f"--algorithm {args.algorithm!r}: {args.collective} has "
                             f"{', '.join(known) or 'no algorithms'}")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install matplotlib")
    if args.sizes is not None:
        if not args.sizes:
            raise ValueError("--sizes is empty")
        return list(args.sizes)
    return default_sizes(args.min_bytes, args.max_bytes, args.step_factor)


def run(args: argparse.Namespace) -> int:
    """Handler of ``ringworld bench <collective>``."""
    try:
        sizes = _validate(args)
        if args.load < 0:
            raise ValueError(f"--load {args.load} must be >= 0")
    except ValueError as exc:
        print(f"bench {args.collective}: {exc}", file=sys.stderr)
        return 2
    if args.collective != "barrier":
        _progress(f"{args.collective}: sizes {', '.join(fmt_size(s) for s in sizes)}; "
                  f"np={args.np}")
    meta = _meta(args, sizes)
    rounds = []
    with load.busy(args.load):
        for k in range(args.rounds):
            if args.rounds > 1:
                _progress(f"round {k + 1} of {args.rounds}")
            rounds.append(run_all(args, sizes))
    runs = merge_rounds(rounds)
    print(render(runs, args.collective, args.np))
    print(load.describe(args.load))
    if args.json is not None:
        doc = {"meta": meta, "runs": {r.label: r.to_json() for r in runs}}
        args.json.write_text(json.dumps(doc, indent=1))
        _progress(f"raw results in {args.json}")
    if args.plot is not None:
        plot(runs, args.collective, args.np, args.plot)
        _progress(f"chart in {args.plot}")
    return 1 if any(r.failed for r in runs) else 0
