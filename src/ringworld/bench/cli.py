"""The ``ringworld bench`` subcommand; the launcher's CLI calls :func:`add_parser`."""

from __future__ import annotations

import argparse
import sys

from ringworld.bench import pingpong, sweep


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bench`` and its benchmarks on the top-level ``ringworld`` parser."""
    p = subparsers.add_parser("bench", help="run a benchmark",
                              description="Benchmarks of Ringworld, optionally against peers.")
    benches = p.add_subparsers(dest="bench", metavar="BENCHMARK")
    pingpong.add_parser(benches)
    sweep.add_parsers(benches)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def main(argv: list[str] | None = None) -> int:
    """``python -m ringworld.bench.cli ...`` without the launcher (same arguments as ``bench``)."""
    parser = argparse.ArgumentParser(prog="ringworld")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
