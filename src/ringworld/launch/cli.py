"""The ``ringworld`` command line.

Subcommands::

    ringworld run [-n N] [options] PROGRAM [ARGS...]   start N ranks of a program
    ringworld run [-n N] [options] -m MODULE [ARGS...]
    ringworld run [-n N] [options] -c CODE [ARGS...]
    ringworld run --mpi4py [-n N] ... PROGRAM          its mpi4py import gives ringworld.MPI
    ringworld bench ...                                 when ringworld.bench.cli is present
    ringworld trace merge PATH                          join a trace's per-rank parts

Other subcommands plug in as modules listed in :data:`SUBCOMMAND_MODULES`. Each provides
``add_parser(subparsers)``, which adds its parser to the ``argparse`` subparsers object and sets
``func`` with ``set_defaults(func=handler)``; ``handler(args: argparse.Namespace) -> int`` returns
the exit status. They are imported only when needed (not for ``ringworld run``, which must start
fast), and skipped if absent.

This module imports nothing heavy (no numpy): the launcher's start-up is part of every job's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import math
import os
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ringworld._argtypes import positive_int
from ringworld.config import TRANSPORTS
from ringworld.errors import StoreError
from ringworld.launch.hosts import iface_address, is_local, parse_hostfile, parse_hosts, place
from ringworld.launch.job import (
    JobStore,
    new_job_id,
    new_secret,
    rank_env,
    remove_shm_segments,
    with_mpi4py_shim,
)
from ringworld.launch.liveness import JobFailures
from ringworld.launch.procset import ProcessSet
from ringworld.launch.report import failure_report, job_exit_code, recovery_exit_code

#: Modules that add subcommands (see the module docstring for the protocol).
SUBCOMMAND_MODULES = ("ringworld.bench.cli", "ringworld.tuning.cli", "ringworld.tuning.topo_cli",
                      "ringworld.trace.cli", "ringworld.device.info_cli")

_DESCRIPTION = "Ringworld: MPI-style communication for Python processes."
_RUN_DESCRIPTION = """\
Start N ranks of a program, like mpiexec. Each rank gets the job environment
(RINGWORLD_RANK, RINGWORLD_SIZE, RINGWORLD_STORE, RINGWORLD_JOB_ID, RINGWORLD_SECRET_FD, ...) and
finds the others through an authenticated store served by this launcher; the job secret travels
through an inherited pipe, never argv or the environment.

PROGRAM is any executable, or a .py file (run with this Python). Like python itself, -m MODULE and
-c CODE run this Python with that module or code; everything after PROGRAM, MODULE or CODE is
passed to the ranks unchanged.

Output of every rank is forwarded line by line; stdin goes to rank 0 only (the others read
/dev/null). Python ranks run unbuffered (PYTHONUNBUFFERED=1) unless the environment says
otherwise. If a rank fails, the others are stopped (SIGTERM, then SIGKILL after --grace seconds)
and a report names the rank that failed first, how, and its last stderr lines. A rank that stops
responding (stopped, hung, cut off: found by the ranks' heartbeats within
RINGWORLD_LIVENESS_TIMEOUT seconds, or stopped by a signal) is named as the cause of the failures
that follow and killed; so is one left running once all the others have exited. Ctrl-C, SIGTERM
and SIGHUP are forwarded to every rank. Should the launcher be killed (SIGKILL), a guardian
process kills what the ranks started.

exit status: that of the first rank to fail (128+N if killed by signal N; for a rank that stopped
responding, that of the lowest rank that failed after it, else 1), 128+N if the launcher was
stopped by signal N (130 for Ctrl-C), 127/126 if PROGRAM cannot be found/executed, 0 otherwise.
With --enable-recovery: 0 if the survivors finished.
"""
_RUN_EPILOG = """\
examples:
  ringworld run -n 4 python examples/hello.py
  ringworld run -n 2 --transport tcp examples/p2p.py
  ringworld run -n 8 --tag-output -m mypackage.train --epochs 3
  ringworld run -n 2 -c "import ringworld; print(ringworld.init().rank)"
  ringworld run -n 4 --mpi4py python prog_written_for_mpi4py.py
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``-m MODULE [ARGS...]`` instead of argparse's ``-m ...`` for remainder options."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == argparse.REMAINDER and isinstance(action.metavar, str):
            return action.metavar
        return super()._format_args(action, default_metavar)


class _UsageError(Exception):
    """A command line that parsed but makes no sense."""


def _seconds(allow_zero: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "at least 0" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"{text} seconds must be {bound}")
        return value

    return parse


class _VersionAction(argparse.Action):
    """Prints the installed version; looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("ringworld")
        except PackageNotFoundError:
            text = "unknown"
        print(f"ringworld {text}")
        parser.exit(0)


def _add_run_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="start N ranks of a program (like mpiexec)",
        description=_RUN_DESCRIPTION,
        epilog=_RUN_EPILOG,
        formatter_class=_HelpFormatter,
        usage="ringworld run [options] (PROGRAM | -m MODULE | -c CODE) [ARGS...]",
    )
    p.add_argument("-n", "--np", type=positive_int, default=1, metavar="N",
                   help="number of ranks (default: 1)")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix every forwarded stdout and stderr line with '[rank] '")
    p.add_argument("--transport", choices=TRANSPORTS, default=None,
                   help="transport between ranks: sets RINGWORLD_TRANSPORT "
                        "(default: inherited, else auto)")
    p.add_argument("--timeout", type=_seconds(False), default=None, metavar="SECONDS",
                   help="default timeout of blocking calls in the ranks: sets RINGWORLD_TIMEOUT")
    p.add_argument("--bind", default=None, metavar="ADDR",
                   help="address the job store (and TCP transport) listens on "
                        "(default: 127.0.0.1)")
    p.add_argument("--trace", action="store_true",
                   help="record every rank's calls into one Chrome/Perfetto trace "
                        "(default file: $RINGWORLD_TRACE, else ringworld-trace.json)")
    p.add_argument("--trace-file", default=None, metavar="FILE",
                   help="trace into FILE (implies --trace; open it in ui.perfetto.dev)")
    p.add_argument("--hosts", default=None, metavar="H1:N1,H2:N2",
                   help="run the ranks on these hosts, filled in order (N: slots per host)")
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="hosts, one per line: 'name slots=N' (or name:N)")
    p.add_argument("--rsh", default="ssh", metavar="COMMAND",
                   help="how to start a rank on another host: COMMAND HOST PROGRAM... "
                        "(default: ssh; e.g. 'ip netns exec')")
    p.add_argument("--iface", default=None, metavar="NAME",
                   help="network interface the ranks' TCP connections use "
                        "(like NCCL_SOCKET_IFNAME; sets RINGWORLD_IFACE)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="restart the whole job up to N times after a failure "
                        "(RINGWORLD_RESTART tells the ranks which attempt they are)")
    p.add_argument("--enable-recovery", action="store_true",
                   help="keep the other ranks running when one fails, for programs that "
                        "recover (comm.shrink()); the exit status says whether the survivors "
                        "finished")
    p.add_argument("--grace", type=_seconds(True), default=1.0, metavar="SECONDS",
                   help="when stopping ranks, wait this long after SIGTERM/SIGINT before "
                        "SIGKILL (default: 1)")
    p.add_argument("--mpi4py", action="store_true",
                   help="run a program written for mpi4py unchanged: its 'from mpi4py import "
                        "MPI' gives ringworld.MPI (a stand-in mpi4py package is put first on "
                        "the ranks' PYTHONPATH)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS...]",
                   help="run library module MODULE as a script (python -m MODULE)")
    g.add_argument("-c", dest="code", nargs=argparse.REMAINDER, metavar="CODE [ARGS...]",
                   help="run the Python statements CODE (python -c CODE)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]",
                   help="executable or .py file to run, with its arguments")
    p.set_defaults(func=run_command)


def build_parser(load_subcommands: bool = True) -> argparse.ArgumentParser:
    """The ``ringworld`` parser; ``load_subcommands`` also imports the optional subcommand modules.

    Raises:
        ImportError: a subcommand module exists but fails to import (a bug worth seeing).
    """
    parser = argparse.ArgumentParser(prog="ringworld", description=_DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    _add_run_parser(subparsers)
    if load_subcommands:
        for name in SUBCOMMAND_MODULES:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name is not None and (name + ".").startswith(exc.name + "."):
                    continue  # the module (or its package) is absent: no such subcommand
                raise
            module.add_parser(subparsers)
    return parser


def program_argv(args: argparse.Namespace) -> list[str]:
    """The command each rank runs, from the parsed ``run`` arguments.

    Raises:
        _UsageError: no program given, or ``-m``/``-c`` without its operand.
    """
    if args.module is not None:
        if not args.module:
            raise _UsageError("-m needs a MODULE")
        return [sys.executable, "-m", *args.module]
    if args.code is not None:
        if not args.code:
            raise _UsageError("-c needs CODE")
        return [sys.executable, "-c", *args.code]
    program = list(args.program)
    if program and program[0] == "--":
        program.pop(0)
    if not program:
        raise _UsageError("missing PROGRAM (or -m MODULE / -c CODE)")
    if program[0].endswith(".py"):
        return [sys.executable, *program]
    return program


def _secret_fd(secret: bytes) -> int:
    """A pipe's read end holding the hex secret and a newline (the write end is closed)."""
    r, w = os.pipe()
    try:
        os.write(w, secret.hex().encode() + b"\n")  # 65 bytes: never blocks
    finally:
        os.close(w)
    return r


def _spawn_error_status(exc: OSError) -> int:
    """The shell's convention: 127 not found, 126 found but not executable, else 1."""
    if isinstance(exc, FileNotFoundError):
        return 127
    if isinstance(exc, PermissionError | IsADirectoryError) or exc.errno == errno.ENOEXEC:
        return 126
    return 1


def run_command(args: argparse.Namespace) -> int:
    """Run a job as described by the parsed ``run`` arguments; return the launcher's exit status.

    With ``--max-restarts N`` a failed job (not one the user interrupted) is started again, from
    scratch with a new job id and secret, up to N times.

    Raises:
        _UsageError: the arguments do not name a program.
    """
    argv = program_argv(args)
    if args.max_restarts < 0:
        raise _UsageError(f"--max-restarts {args.max_restarts} must be at least 0")
    base = dict(os.environ)
    base.setdefault("PYTHONUNBUFFERED", "1")
    if args.bind is not None:
        base["RINGWORLD_BIND"] = args.bind
    if args.mpi4py:
        base = with_mpi4py_shim(base)
    trace = _trace_path(args, base)
    attempt = 0
    while True:
        base["RINGWORLD_RESTART"] = str(attempt)
        code, interrupted = _run_job(args, argv, base)
        if code == 0 or interrupted or attempt >= args.max_restarts:
            break
        attempt += 1
        print(f"ringworld: restarting the job (restart {attempt} of {args.max_restarts})",
              file=sys.stderr, flush=True)
    if trace is not None:
        _write_trace(trace)
    return code


def _run_job(args: argparse.Namespace, argv: list[str], base: dict[str, str]
             ) -> tuple[int, bool]:
    """Run the job once; return (exit status, whether the launcher was interrupted)."""
    size: int = args.np
    placement = _placement(args, size)
    remote = placement is not None and any(not is_local(h) for h in placement)
    bind: str = args.bind or "127.0.0.1"
    if remote and args.bind is None:
        if args.iface is None:
            raise _UsageError("ranks on other hosts need an address they can reach this "
                              "launcher at: give --bind ADDR or --iface NAME")
        try:
            bind = iface_address(args.iface)
        except ValueError as exc:
            raise _UsageError(f"--iface: {exc}") from None
    job_id = new_job_id()
    secret = new_secret()
    with contextlib.ExitStack() as stack:  # unwinds: ranks killed, shm cleaned, store closed
        try:
            store = stack.enter_context(JobStore(secret, bind))
        except (OSError, StoreError) as exc:
            print(f"ringworld: cannot serve the job store on {bind}: {exc}", file=sys.stderr)
            return 1, False
        stack.callback(remove_shm_segments, job_id)
        failures = stack.enter_context(JobFailures(store.address, secret))
        ps = stack.enter_context(ProcessSet(
            tag_output=args.tag_output, grace=args.grace, keep_going=args.enable_recovery,
            on_dump=lambda: _dump_job(store.address, secret, size),
            on_failure=failures.tell, find_unresponsive=failures.unresponsive))
        torch_env = _torch_env(base, bind, size)
        for rank in range(size):
            if ps.interrupted_by is not None:
                break
            env = rank_env(base, rank=rank, size=size, store=store.address, job_id=job_id,
                           transport=args.transport, timeout=args.timeout)
            env.update(torch_env, RANK=str(rank), LOCAL_RANK=str(rank))
            if args.iface is not None:
                env["RINGWORLD_IFACE"] = args.iface
            if placement is not None:
                host = placement[rank]
                env["RINGWORLD_HOST"] = host
                env.pop("RINGWORLD_BIND", None)  # each rank listens on its own host's address
                local_ranks = [r for r, h in enumerate(placement) if h == host]
                env.update(LOCAL_RANK=str(local_ranks.index(rank)),
                           LOCAL_WORLD_SIZE=str(len(local_ranks)))
                if not is_local(host):
                    spawned = _spawn_remote(ps, rank, host, argv, env, base, secret, args.rsh)
                    if spawned is not None:
                        return spawned, False
                    continue
            fd = _secret_fd(secret)
            env["RINGWORLD_SECRET_FD"] = str(fd)
            try:
                ps.spawn(rank, argv, env, pass_fds=(fd,), inherit_stdin=rank == 0)
            except OSError as exc:
                print(f"ringworld: cannot run {argv[0]!r}: {exc.strerror or exc}",
                      file=sys.stderr)
                return _spawn_error_status(exc), False
            finally:
                os.close(fd)
        result = ps.wait()
    report = failure_report(result, job_id, size, recovery=args.enable_recovery)
    if report:
        sys.stderr.write(report)
        sys.stderr.flush()
    if args.enable_recovery:
        return recovery_exit_code(result), result.interrupted_by is not None
    return job_exit_code(result), result.interrupted_by is not None


def _placement(args: argparse.Namespace, size: int) -> list[str] | None:
    """The host of each rank from --hosts/--hostfile, or None (all on this host).

    Raises:
        _UsageError: both given, or a malformed list/file, or too few slots.
    """
    if args.hosts is not None and args.hostfile is not None:
        raise _UsageError("give --hosts or --hostfile, not both")
    try:
        if args.hosts is not None:
            return place(parse_hosts(args.hosts), size)
        if args.hostfile is not None:
            return place(parse_hostfile(args.hostfile), size)
    except (OSError, ValueError) as exc:
        raise _UsageError(str(exc)) from None
    return None


#: Variables a remote rank gets from the launcher (the rest of its environment is the remote
#: shell's): the job contract, torchrun's, Python's and any RINGWORLD_* setting.
_REMOTE_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED")


def _spawn_remote(ps: ProcessSet, rank: int, host: str, argv: list[str], env: dict[str, str],
                  base: dict[str, str], secret: bytes, rsh: str) -> int | None:
    """Start ``rank`` on ``host`` through the remote shell; the secret travels on its stdin.

    Returns None when started, else the launcher's exit status (the remote shell is missing).
    """
    sent = {k: v for k, v in env.items()
            if k.startswith("RINGWORLD_") or k in _REMOTE_VARS}
    sent.pop("RINGWORLD_SECRET_FD", None)
    spec = {"argv": argv, "cwd": os.getcwd(), "env": sent, "secret": secret.hex()}
    command = [*shlex.split(rsh), host, sys.executable, "-m", "ringworld.launch.remote"]
    try:
        shell_env = {k: v for k, v in base.items() if not k.startswith("RINGWORLD_")}
        ps.spawn(rank, command, shell_env, stdin_data=json.dumps(spec).encode() + b"\n")
    except OSError as exc:
        print(f"ringworld: cannot run the remote shell {command[0]!r} for host {host}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return _spawn_error_status(exc)
    return None


def _torch_env(base: dict[str, str], bind: str, size: int) -> dict[str, str]:
    """The variables torchrun sets, so ``init_process_group()`` (env://) works unchanged in
    the ranks; MASTER_ADDR/MASTER_PORT are kept if already set. RANK/LOCAL_RANK are per rank.
    """
    env = {"WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size)}
    if "MASTER_ADDR" not in base or "MASTER_PORT" not in base:
        host = "127.0.0.1" if bind in ("", "0.0.0.0") else bind
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))  # a free port now; rank 0's torch store takes it moments later
            env["MASTER_ADDR"], env["MASTER_PORT"] = host, str(s.getsockname()[1])
    return env


def _dump_job(address: str, secret: bytes, size: int) -> None:
    """Print what every rank is doing, from the states their heartbeats publish (SIGUSR1)."""
    from ringworld.store.records import read_states

    host, _, port = address.rpartition(":")
    try:
        lines = read_states(host, int(port), secret, size)
    except (OSError, StoreError) as exc:
        lines = [f"  (cannot read the ranks' states: {exc})"]
    print("ringworld: what every rank is doing (as of its last heartbeat):", file=sys.stderr)
    print("\n".join(lines), file=sys.stderr, flush=True)


def _trace_path(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """The trace file of this job (absolute, set in ``env`` for the ranks), or None.

    Parts left by an earlier job with the same file are removed so they are not merged.
    """
    path = args.trace_file or env.get("RINGWORLD_TRACE") or None
    if path is None and args.trace:
        path = "ringworld-trace.json"
    if path is None:
        return None
    from ringworld.trace.merge import parts

    path = os.path.abspath(path)
    env["RINGWORLD_TRACE"] = path
    for stale in parts(path):
        with contextlib.suppress(OSError):
            os.unlink(stale)
    return path


def _write_trace(path: str) -> None:
    """Merge the ranks' parts into ``path`` and say where it is (or why it is not)."""
    from ringworld.trace.merge import merge

    try:
        ranks, events = merge(path)
    except (OSError, ValueError) as exc:
        print(f"ringworld: no trace written to {path}: {exc}", file=sys.stderr)
        return
    print(f"ringworld: trace of {ranks} ranks ({events} events) written to {path}; "
          "open it in https://ui.perfetto.dev", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ringworld`` and ``python -m ringworld``; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `run` must start fast: other subcommands are loaded only when they may be wanted.
    parser = build_parser(load_subcommands=not args_list or args_list[0] != "run")
    try:
        args = parser.parse_args(args_list)
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        try:
            return func(args)
        except _UsageError as exc:
            print(f"ringworld {args.command}: error: {exc}", file=sys.stderr)
            print(f"try 'ringworld {args.command} --help'", file=sys.stderr)
            return 2
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        return 130
