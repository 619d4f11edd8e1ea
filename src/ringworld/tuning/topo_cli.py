"""``ringworld topo``, ``ringworld plan`` and ``ringworld calibrate``.

``ringworld topo [--dump FILE] [--json] [--sysfs DIR]``: discover this machine and print it
(``--dump`` writes the topology JSON, loadable by ``--topology FILE``); on a GPU host also each
GPU's name and memory, each pair's link (NVML through nvidia-ml-py, else ``nvidia-smi topo -m``)
and the NCCL library (``--json``: under ``gpu_info``).

``ringworld plan --topology NAME|FILE --collective C --size S [--ranks N] [--root R] [--json]
[--plot out.png]``: every candidate schedule with its predicted time, algorithm and bus
bandwidth, the chosen one and why; ``--json`` adds each candidate's transfers
(source, destination, bytes, start, end).

``ringworld plan --explain --collective C --size S [--ranks N] [--transport shm|tcp]
[--algorithm A]``: the decision a job's call of C moving S bytes on N ranks of one host takes,
as ``Communicator.plan`` returns it live: the algorithm, its kind, why, and every candidate's
predicted cost (honouring RINGWORLD_ALGORITHMS, RINGWORLD_TUNER and RINGWORLD_TUNING_FILE).

``ringworld calibrate [--fit] [--save FILE] [--compare] [--constants FILE] [--np N]
[--sizes ...] [--compare-sizes ...] [--collectives ...] [--jobs N]``: measure this machine's
constants (``--save`` writes them for ``--constants`` and ``RINGWORLD_TUNING_FILE``); with
``--fit`` also time the real collectives at ``--sizes`` and fit the constants to them; with
``--compare``, run the real collectives in other jobs than those fitted to and print predicted
vs measured times. Each time is the median over ``--jobs`` jobs; with both ``--fit`` and
``--compare`` the fitted and the held-out jobs alternate, so both see the same drift in the
machine's load.

Exit status 0 on success, 1 when a measurement fails, 2 for bad arguments or topologies.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING

from ringworld._argtypes import parse_size, parse_sizes, positive_int
from ringworld.algorithms.registry import COLLECTIVES
from ringworld.errors import ConfigError
from ringworld.topology.model import TopologyError, dump, to_json
from ringworld.topology.presets import PATTERNS, PRESETS
from ringworld.tuning.cost import Constants

if TYPE_CHECKING:
    from ringworld.tuning.calibrate import Comparison

# what calibrate times by default: the collectives ``ringworld bench`` reports
DEFAULT_COLLECTIVES = "allreduce,bcast,allgather,reduce_scatter_block,alltoall"


def _ms(t: float) -> str:
    return f"{t * 1e3:10.3f} ms" if math.isfinite(t) else "         -   "


def run_topo(args: argparse.Namespace) -> int:
    """Handle ``ringworld topo``."""
    from ringworld.device import gpus
    from ringworld.topology.discover import discover, run_nvidia_smi

    smi: list[str | None] = []  # discover's `nvidia-smi topo -m`, for the GPU links

    def nvidia_smi() -> str | None:
        smi.append(run_nvidia_smi())
        return smi[-1]

    found = discover(args.sysfs, nvidia_smi=nvidia_smi)
    smi_text = smi[0] if smi else None
    if args.dump:
        dump(found.topology, args.dump)
    if args.json:
        listed, reason = gpus.list_gpus()
        links, why_links = gpus.gpu_links(smi_text) if len(listed) > 1 else ([], "")
        print(json.dumps({"topology": to_json(found.topology), "cores": found.cores,
                          "numa_nodes": found.numa_nodes, "gpus": found.gpus,
                          "notes": found.notes,
                          "gpu_info": {"gpus": listed, "reason": reason, "links": links,
                                       "links_reason": why_links}}, indent=1))
        return 0
    print(found.topology.summary())
    print(f"  {found.cores} cores on {found.numa_nodes} NUMA node(s), {found.gpus} GPU(s)")
    for note in found.notes:
        print(f"  note: {note}")
    for line in gpus.topo_lines(smi_text):
        print(line)
    if args.dump:
        print(f"  written to {args.dump}")
    return 0


def run_explain(args: argparse.Namespace) -> int:
    """Handle ``ringworld plan --explain``: the library's own decision for one call."""
    from ringworld import config
    from ringworld.algorithms.shm_collectives import MAX_RANKS
    from ringworld.tuning.select import job_selector

    try:
        cfg = config.from_env(detect_launcher=False)
        ranks = args.ranks or 2
        if ranks < 1:
            raise ValueError(f"--ranks {ranks} must be at least 1")
        selector = job_selector(cfg.tuning_file, cfg.algorithms, cfg.tuner)
        transport = args.transport if ranks > 1 else "self"
        plan = selector.plan(args.collective, ranks, args.size, transport, args.algorithm,
                             shm=transport == "shm" and ranks <= MAX_RANKS)
    except (ConfigError, ValueError) as exc:
        print(f"ringworld plan: {exc}", file=sys.stderr)
        return 2
    print(f"{args.collective} of {args.size} bytes on {ranks} ranks of one host over "
          f"{transport}, blocking")
    print(plan)
    return 0


def run_plan(args: argparse.Namespace) -> int:
    """Handle ``ringworld plan``."""
    if args.explain:
        return run_explain(args)
    if not args.topology:
        print("ringworld plan: --topology is required (or --explain)", file=sys.stderr)
        return 2
    from ringworld.topology import planner
    from ringworld.topology.presets import resolve
    from ringworld.tuning.calibrate import params

    try:
        topo = resolve(args.topology)
        if args.constants:
            topo = topo.with_params("core", params(args.constants))
        pl = planner.plan(topo, args.collective, args.size, args.root, ranks=args.ranks,
                          record=bool(args.json or args.plot))
    except (TopologyError, ConfigError, ValueError) as exc:
        print(f"ringworld plan: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        from ringworld.tuning.plot import PlotUnavailable, plot_plan

        try:
            plot_plan(pl, args.plot)
        except PlotUnavailable as exc:
            print(f"ringworld plan: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(pl.to_json()))
        return 0
    print(f"{args.collective} of {args.size} bytes on {pl.net.p} ranks of {topo.name} "
          f"(root {args.root})")
    print(f"  {'candidate':<20}{'algorithm':<26}{'predicted':>13}{'busbw GB/s':>12}  steps")
    for c in pl.candidates:
        mark = "*" if c is pl.chosen else " "
        if c.result is None:
            print(f"{mark} {c.name:<20}{c.algorithm[:25]:<26}  failed: {c.error}")
            continue
        print(f"{mark} {c.name:<20}{c.algorithm[:25]:<26}{_ms(c.time)}"
              f"{pl.busbw(c) / 1e9:12.2f}  {c.steps_hint}")
    for s in pl.skipped:
        print(f"  skipped {s}")
    print()
    for line in pl.explain():
        print(line)
    for c in pl.candidates[:1]:
        print(f"  {c.name}: {c.description}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _constants_line(c: Constants) -> str:
    line = (f"  step {c.step * 1e6:.1f} us  message {c.message * 1e6:.1f} us  bandwidth "
            f"{c.bandwidth / 1e9:.2f} GB/s  reduce {c.reduce_rate / 1e9:.2f} GB/s  copy "
            f"{c.copy_rate / 1e9:.2f} GB/s")
    if c.read_rate > 0:  # the constants a fit adds (unset in measured ones)
        line += f"  read {c.read_rate / 1e9:.2f} GB/s"
    if c.rendezvous > 0:
        line += f"  rendezvous {c.rendezvous * 1e6:.1f} us"
    if c.call > 0:
        line += f"  call {c.call * 1e6:.1f} us"
    if c.cache_bytes > 0:
        line += f"  cache {c.cache_bytes / 2**20:.3g} MiB x{c.cache_speedup:.2f}"
    if c.bus_rate > 0:
        line += f"  bus {c.bus_rate / 1e9:.1f} GB/s"
    return line


def run_calibrate(args: argparse.Namespace) -> int:
    """Handle ``ringworld calibrate``."""
    from ringworld.topology.measure_rank import ALGORITHMS
    from ringworld.tuning import calibrate

    collectives = args.collectives.split(",")
    unknown = [c for c in collectives if c not in ALGORITHMS]
    if unknown:
        print(f"ringworld calibrate: --collectives: unknown {', '.join(unknown)} (known: "
              f"{', '.join(ALGORITHMS)})", file=sys.stderr)
        return 2
    try:
        c, held_out = _calibrated_constants(args, collectives)
    except (RuntimeError, ConfigError) as exc:
        print(f"ringworld calibrate: {exc}", file=sys.stderr)
        return 1
    if args.save and c is not None:
        calibrate.save(args.save, {args.transport: c})
        print(f"saved to {args.save} (use --constants {args.save}, or "
              f"RINGWORLD_TUNING_FILE={args.save} for the tuner)")
    if not args.compare:
        return 0
    try:
        if held_out is not None and c is not None:
            print("comparing with the held-out jobs (not the ones fitted to):")
            rows = calibrate.compare_rows(held_out, args.np, c)
        else:
            print(f"comparing with {args.jobs} new job(s) ...", file=sys.stderr, flush=True)
            rows = calibrate.compare(args.np, args.compare_sizes or args.sizes, collectives,
                                     args.constants, args.transport, constants=c,
                                     jobs=args.jobs)
    except (RuntimeError, ConfigError) as exc:
        print(f"ringworld calibrate: {exc}", file=sys.stderr)
        return 1
    _print_comparison(rows, args.jobs)
    return _write_comparison(rows, args)


def _calibrated_constants(
    args: argparse.Namespace, collectives: list[str],
) -> tuple[Constants | None, list[dict[str, float]] | None]:
    """The constants ``calibrate`` reports: loaded (``--fit --constants``) or measured, then
    fitted with ``--fit``; and, with ``--fit --compare``, the held-out jobs measured alongside.

    Raises:
        RuntimeError, ConfigError: a measurement failed.
    """
    from ringworld.tuning import calibrate
    from ringworld.tuning import constants as tuning_constants

    c = None
    held_out: list[dict[str, float]] | None = None  # with --fit --compare: measured alongside
    if args.fit and args.constants:
        c = tuning_constants.load(args.constants).get(args.transport)
    if c is None and (args.fit or not args.compare or args.save):
        print(f"measuring {args.transport} ...", file=sys.stderr, flush=True)
        c = calibrate.calibrate(args.transport)
        print(_constants_line(c))
    if args.fit:
        assert c is not None
        print(f"timing {', '.join(collectives)} at {len(args.sizes)} sizes on {args.np} "
              f"ranks to fit against, in {args.jobs} job(s)"
              + (", alternating with as many held-out jobs to compare against"
                 if args.compare else "") + " ...", file=sys.stderr, flush=True)
        if args.compare:
            measured, held_out = calibrate.measure_held_out(
                args.np, args.sizes, args.compare_sizes or args.sizes, collectives,
                args.transport, jobs=args.jobs)
        else:
            measured = calibrate.measure_collectives(args.np, args.sizes, collectives,
                                                     args.transport, jobs=args.jobs)
        fitted = calibrate.fit(measured, c, args.np)
        c = fitted.constants
        print(f"fitted to {len(measured)} measured calls: rms log error "
              f"{fitted.rms_before:.2f} -> {fitted.rms_after:.2f}, worst |predicted/measured"
              f" - 1| {fitted.worst_before:.0%} -> {fitted.worst_after:.0%}")
        print(_constants_line(c))
    return c, held_out


def _print_comparison(rows: list[Comparison], jobs: int) -> None:
    """Print predicted against measured times, row by row, then how many came within 25%."""
    w = max([len("collective"), *(len(r.collective) for r in rows)]) + 1
    print(f"{'collective':<{w}}{'algorithm':<20}{'bytes':>10}{'predicted':>14}{'measured':>14}"
          f"{'pred/meas':>10}{'job spread':>12}")
    for r in rows:
        print(f"{r.collective:<{w}}{r.algorithm:<20}{r.nbytes:>10}{_ms(r.predicted)}"
              f"{_ms(r.measured)}{r.ratio:10.2f}{r.spread:11.2f}x")
    near = sum(1 for r in rows if abs(r.ratio - 1) <= 0.25)
    print(f"{near} of {len(rows)} predictions within 25% of the measured median of "
          f"{jobs} job(s)")
    by_algo: dict[str, list[int]] = {}
    for r in rows:
        got = by_algo.setdefault(r.algorithm, [0, 0])
        got[0] += abs(r.ratio - 1) <= 0.25
        got[1] += 1
    print("  by algorithm: " + ", ".join(f"{a} {k} of {n}" for a, (k, n) in by_algo.items())
          + (" (shm: what blocking calls on one host run)" if "shm" in by_algo else ""))


def _write_comparison(rows: list[Comparison], args: argparse.Namespace) -> int:
    """Write the comparison's ``--plot`` and ``--json`` files; return the exit status."""
    if args.plot:
        from ringworld.tuning.plot import PlotUnavailable, plot_comparison

        try:
            plot_comparison(rows, args.plot)
        except PlotUnavailable as exc:
            print(f"ringworld calibrate: {exc}", file=sys.stderr)
            return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"collective": r.collective, "algorithm": r.algorithm,
                        "bytes": r.nbytes, "ranks": r.ranks, "predicted_s": r.predicted,
                        "measured_s": r.measured, "ratio": r.ratio,
                        "job_spread": r.spread} for r in rows], f,
                      indent=1)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``topo``, ``plan`` and ``calibrate`` on the top-level parser."""
    t = subparsers.add_parser("topo", help="discover and print this machine's topology",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--dump", metavar="FILE", help="write the topology as JSON to FILE")
    t.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    t.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    t.set_defaults(func=run_topo)
    p = subparsers.add_parser(
        "plan", help="plan a collective on a topology: candidates, predicted times, choice",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="topologies: " + ", ".join([*PRESETS, *PATTERNS]) + ", or a JSON file")
    p.add_argument("--topology", metavar="NAME|FILE", help="plan on this topology")
    p.add_argument("--explain", action="store_true",
                   help="print the decision a job's call takes instead (the selector's)")
    p.add_argument("--transport", choices=("shm", "tcp"), default="shm",
                   help="with --explain: how the ranks are connected (default shm)")
    p.add_argument("--algorithm", default=None, help="with --explain: as algorithm= asks")
    p.add_argument("--collective", default="allreduce", choices=COLLECTIVES,
                   help="--topology plans allreduce, bcast, allgather and reduce")
    p.add_argument("--size", type=parse_size, default=parse_size("256MiB"),
                   help="bytes (allgather: the whole gathered buffer); default 256MiB")
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks (default: one per GPU, else per core, of the topology)")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--constants", metavar="FILE",
                   help="calibration file for CPU-core ranks (ringworld calibrate --save)")
    p.add_argument("--json", action="store_true", help="print JSON with every transfer")
    p.add_argument("--plot", metavar="PNG", help="draw the topology and the chosen plan "
                   "(needs matplotlib)")
    p.set_defaults(func=run_plan)
    c = subparsers.add_parser(
        "calibrate", help="measure this machine's constants; compare predictions with runs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--save", metavar="FILE", help="write the measured constants to FILE")
    c.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    c.add_argument("--fit", action="store_true",
                   help="also time real collectives and fit the constants to them (the "
                        "simulator's predictions then match this machine's collectives)")
    c.add_argument("--compare", action="store_true",
                   help="run the collectives for real and print predicted vs measured")
    c.add_argument("--constants", metavar="FILE",
                   help="with --compare and no --save: constants to predict with")
    c.add_argument("-n", "--np", type=int, default=2, help="ranks for --compare (default 2)")
    c.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1MiB,4MiB,16MiB,64MiB"),
                   help="sizes to time (and fit at); default 1MiB,4MiB,16MiB,64MiB: the "
                        "benchmark's from 1 MiB, and 4 MiB, where the cache runs out")
    c.add_argument("--compare-sizes", type=parse_sizes, default=None,
                   help="sizes for --compare (default: --sizes)")
    c.add_argument("--collectives", default=DEFAULT_COLLECTIVES,
                   help=f"comma-separated (default {DEFAULT_COLLECTIVES})")
    c.add_argument("--jobs", type=positive_int, default=5,
                   help="measurement jobs, one after another; each call's time is the median "
                        "over them (one job's times on a shared machine can be 1.5x the "
                        "next one's; default 5)")
    c.add_argument("--json", metavar="FILE", help="with --compare: write the rows as JSON")
    c.add_argument("--plot", metavar="PNG", help="with --compare: chart predicted against "
                   "measured (needs matplotlib)")
    c.set_defaults(func=run_calibrate)
