"""A minimal launcher for ``torch.distributed`` jobs: ``python gloo_launch.py -n N -- PROG ARGS``.

Starts N copies of ``PROG ARGS`` with the environment ``init_process_group("gloo")`` reads:
``MASTER_ADDR`` (127.0.0.1), ``MASTER_PORT`` (a free port), ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``, plus ``OMP_NUM_THREADS=1`` and
``GLOO_SOCKET_IFNAME=lo`` unless already set (as torchrun does for several local ranks). When a
rank fails the others are stopped; the exit status is that of the first rank to fail.

Standard library only: it runs under the peers' python, which need not have Ringworld.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

POLL_S = 0.02
GRACE_S = 2.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    """The environment of one rank."""
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               LOCAL_RANK=str(rank), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every rank still running, then SIGKILL after ``GRACE_S``."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(np: int, argv: list[str], port: int | None = None) -> int:
    """Run ``np`` ranks of ``argv``; returns 0 or the first failing rank's status."""
    port = free_port() if port is None else port
    procs = [subprocess.Popen(argv, env=rank_env(r, np, port)) for r in range(np)]
    status = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed:
                code = failed[0].returncode
                status = 128 - code if code < 0 else code
                print(f"gloo_launch: a rank exited with status {code}; stopping the others",
                      file=sys.stderr)
                break
            time.sleep(POLL_S)
    finally:
        _stop(procs)
    if status == 0:
        codes = [p.returncode for p in procs]
        bad = [c for c in codes if c != 0]
        if bad:
            status = 128 - bad[0] if bad[0] < 0 else bad[0]
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse ``-n N [--port P] -- PROG ARGS`` and launch."""
    p = argparse.ArgumentParser(prog="gloo_launch", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--np", type=int, required=True)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("program", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.np < 1 or not program:
        p.error("need -n >= 1 and a program")
    return launch(args.np, program, args.port)


if __name__ == "__main__":
    raise SystemExit(main())
