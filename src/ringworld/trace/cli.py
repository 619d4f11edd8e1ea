"""``ringworld trace merge PATH``: join a trace's per-rank parts into one file.

``ringworld run --trace`` merges by itself at the end of the job, and ranks started by another
launcher (torchrun, srun, mpiexec, ``mp.spawn``) merge at their end too, the last rank to leave
writing the file. This command is for parts left by a job that did not get there (killed), or
kept on purpose. ``python -m ringworld.trace.cli merge PATH`` does the same.
"""

from __future__ import annotations

import argparse
import sys

from ringworld.trace.merge import merge, parts


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``trace`` (with ``merge``) on the top-level ``ringworld`` parser."""
    p = subparsers.add_parser("trace", help="work with call traces",
                              description="Work with the traces `ringworld run --trace` and "
                                          "RINGWORLD_TRACE record.")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    m = sub.add_parser("merge", help="join a trace's per-rank parts (PATH.rank<N>) into PATH",
                       description="Join the per-rank parts PATH.rank0, PATH.rank1, ... into "
                                   "one Chrome/Perfetto trace file PATH (open it in "
                                   "ui.perfetto.dev).")
    m.add_argument("path", metavar="PATH", help="the trace file the parts belong to")
    m.add_argument("--keep-parts", action="store_true", help="leave the part files in place")
    m.set_defaults(func=_merge)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def _merge(args: argparse.Namespace) -> int:
    found = parts(args.path)
    if not found:
        print(f"ringworld trace merge: no parts {args.path}.rank<N> to merge", file=sys.stderr)
        return 1
    try:
        ranks, events = merge(args.path, remove_parts=not args.keep_parts)
    except OSError as exc:
        print(f"ringworld trace merge: cannot write {args.path}: {exc}", file=sys.stderr)
        return 1
    print(f"merged {ranks} ranks ({events} events) into {args.path}; open it in "
          "https://ui.perfetto.dev")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ringworld.trace.cli merge PATH`` (the same arguments as ``trace``)."""
    parser = argparse.ArgumentParser(prog="ringworld")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["trace", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
