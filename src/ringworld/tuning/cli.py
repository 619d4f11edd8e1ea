"""The ``ringworld tune`` subcommand: re-measure the cost model's constants here.

``ringworld tune`` runs :mod:`ringworld.tuning.measure` on two ranks per transport and prints the
constants next to the built-in defaults; ``--save FILE`` writes them as JSON, which jobs use when
``RINGWORLD_TUNING_FILE=FILE`` is set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

from ringworld.tuning.constants import DEFAULTS
from ringworld.tuning.cost import Constants


def measure(transport: str, timeout: float = 300.0) -> Constants:
    """Run the two-rank measurement job over ``transport`` and return its constants.

    Raises:
        RuntimeError: the job failed or printed no result.
    """
    argv = [sys.executable, "-m", "ringworld", "run", "-n", "2", "--transport", transport,
            sys.executable, "-m", "ringworld.tuning.measure"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RINGWORLD_TUNE "):
            values = json.loads(line.split(" ", 1)[1])
            return Constants(**{k: float(values[k]) for k in Constants._fields
                                if k in values})
    raise RuntimeError(f"the {transport} measurement failed (exit {proc.returncode}):\n"
                       f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def _row(name: str, c: Constants) -> str:
    return (f"  {name:<9} step {c.step * 1e6:7.1f} us  message {c.message * 1e6:6.1f} us  "
            f"bandwidth {c.bandwidth / 1e9:5.2f} GB/s  reduce {c.reduce_rate / 1e9:5.2f} GB/s  "
            f"copy {c.copy_rate / 1e9:5.2f} GB/s  sync {c.sync * 1e6:5.1f} us")


def run(args: argparse.Namespace) -> int:
    """Handle ``ringworld tune``."""
    kinds = ["shm", "tcp"] if args.transport == "both" else [args.transport]
    table: dict[str, dict[str, float]] = {}
    for kind in kinds:
        print(f"measuring {kind} ...", file=sys.stderr, flush=True)
        try:
            c = measure(kind)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"ringworld tune: {exc}", file=sys.stderr)
            return 1
        print(_row(kind, c))
        print(_row("default", DEFAULTS[kind]))
        table[kind] = {k: v for k, v in c._asdict().items() if v != float("inf")}
    if args.save:
        doc = {"constants": table, "measured": datetime.datetime.now(datetime.UTC).isoformat(),
               "host": platform.node(), "python": platform.python_version()}
        Path(args.save).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"saved to {args.save}; use it with RINGWORLD_TUNING_FILE={args.save}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tune`` on the top-level ``ringworld`` parser."""
    p = subparsers.add_parser("tune", help="measure the cost model's constants on this machine",
                              description=__doc__)
    p.add_argument("--transport", choices=("shm", "tcp", "both"), default="both")
    p.add_argument("--save", metavar="FILE", help="write the constants to FILE (JSON)")
    p.set_defaults(func=run)
