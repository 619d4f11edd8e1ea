#!/usr/bin/env python3
"""Measure how fast the survivors of a job learn that a rank failed (issue 6's detection times).

For each failure mode, each place the survivors wait (a collective, or a receive from the failing
rank) and each transport, this runs a job of ``--ranks`` ranks under ``ringworld run`` in which
rank 1 fails while the others wait for it, and reports, per survivor, the seconds from the failure
(rank 1's clock just before it fails) to the exception the survivor raises (same host, same
clock). Modes:

  kill9    SIGKILL                       exit     sys.exit(3)
  abort    os.abort() (SIGABRT)          sigterm  SIGTERM (default action)
  leave    sys.exit(0): leaves without finishing (atexit finalize says goodbye)
  vanish   os._exit(0): leaves without finishing or saying goodbye
  stop     SIGSTOP, found by heartbeats with RINGWORLD_LIVENESS_TIMEOUT=2 (expected: ~2 s)
  timeout  rank 1 never joins; the others' call has timeout=3 (seconds measured from the call)

All modes but ``stop`` run under ``ringworld run --enable-recovery``, so the launcher does not stop
the survivors first; survivors sleep 1 s after catching so their own exit is not seen as a new
failure by the slower ones. ``tests/launch/test_failure_modes.py`` asserts the times with this
module.

Usage:
    python scripts/failure_times.py                       # every mode, both transports
    python scripts/failure_times.py --modes exit,abort --where receive --transport tcp
    python scripts/failure_times.py --repeat 3 --json times.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODES = ("kill9", "exit", "abort", "sigterm", "leave", "vanish", "stop", "timeout")
WHERES = ("collective", "receive")
TRANSPORTS = ("shm", "tcp")
VICTIM = 1
LIVENESS = 2.0  # RINGWORLD_LIVENESS_TIMEOUT of the "stop" mode
CALL_TIMEOUT = 3.0  # the survivors' timeout= in the "timeout" mode
STOP_EXIT = 5  # survivors' exit status in the "stop" mode (so the launcher ends the job)

#: The rank program: ``prog.py MODE WHERE``.
PROGRAM = textwrap.dedent(f"""
    import os, signal, sys, time
    import numpy as np
    import ringworld

    MODE, WHERE = sys.argv[1], sys.argv[2]
    comm = ringworld.init()
    print(f"pid {{comm.rank}} {{os.getpid()}}", flush=True)
    send, out = np.arange(4096, dtype=np.float64), np.empty(4096)
    comm.allreduce(send, out)  # everything set up (connections, shared windows)
    comm.barrier()
    if comm.rank == {VICTIM}:
        time.sleep(0.5)  # the others are waiting for this rank by now
        if MODE == "timeout":
            time.sleep({CALL_TIMEOUT} + 6)
            sys.exit(0)
        print(f"failing at {{time.time()!r}}", flush=True)
        if MODE == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        elif MODE == "exit":
            sys.exit(3)
        elif MODE == "abort":
            os.abort()
        elif MODE == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif MODE == "leave":
            sys.exit(0)
        elif MODE == "vanish":
            os._exit(0)
        elif MODE == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
        sys.exit(9)
    timeout = {CALL_TIMEOUT} if MODE == "timeout" else 30
    print(f"rank {{comm.rank}} waits at {{time.time()!r}}", flush=True)
    try:
        if WHERE == "collective":
            comm.allreduce(send, out, timeout=timeout)
        else:
            comm.recv(out, source={VICTIM}, tag=5, timeout=timeout)
    except ringworld.PeerFailure as exc:
        print(f"rank {{comm.rank}} raised PeerFailure at {{time.time()!r}} naming rank "
              f"{{exc.rank}}: {{exc}}".replace("\\n", " | "), flush=True)
    except ringworld.Timeout as exc:
        print(f"rank {{comm.rank}} raised Timeout at {{time.time()!r}} naming rank -1: "
              f"{{exc}}".replace("\\n", " | "), flush=True)
    else:
        print(f"rank {{comm.rank}} raised nothing at {{time.time()!r}}", flush=True)
    time.sleep(1.0)  # the slower survivors must not see this rank's exit as a new failure
    sys.exit({STOP_EXIT} if MODE == "stop" else 0)
""")

_RAISED = re.compile(r"^rank (\d+) raised (\w+) at ([\d.]+) naming rank (-?\d+): (.*)$", re.M)


@dataclass
class Outcome:
    """One job: when rank 1 failed and what every survivor raised, when."""

    mode: str
    where: str
    transport: str
    ranks: int
    returncode: int
    seconds: dict[int, float] = field(default_factory=dict)  # survivor -> detection time
    raised: dict[int, str] = field(default_factory=dict)  # survivor -> exception class
    named: dict[int, int] = field(default_factory=dict)  # survivor -> failed rank it named
    texts: dict[int, str] = field(default_factory=dict)  # survivor -> exception text
    stdout: str = ""
    stderr: str = ""

    @property
    def survivors(self) -> list[int]:
        return [r for r in range(self.ranks) if r != VICTIM]

    @property
    def worst(self) -> float:
        """The slowest survivor's time (inf if one raised nothing)."""
        if sorted(self.seconds) != self.survivors:
            return float("inf")
        return max(self.seconds.values())

    def describe(self) -> str:
        return (f"{self.mode} in a {self.where} over {self.transport}: rc {self.returncode}, "
                f"{self.raised}, {self.seconds}\n--- stdout\n{self.stdout}\n--- stderr\n"
                f"{self.stderr[-4000:]}")


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def run_case(mode: str, where: str, transport: str, ranks: int = 4,
             timeout: float = 90.0) -> Outcome:
    """Run one job (rank 1 fails with ``mode`` while the others wait in ``where``).

    Every process is killed before this returns, whatever happened.
    """
    if mode not in MODES or where not in WHERES or transport not in TRANSPORTS:
        raise ValueError(f"unknown case {mode!r}, {where!r}, {transport!r}")
    env = dict(os.environ)
    if mode == "stop":
        env["RINGWORLD_LIVENESS_TIMEOUT"] = str(LIVENESS)
    recovery = [] if mode == "stop" else ["--enable-recovery"]
    with tempfile.TemporaryDirectory(prefix="ringworld-failure-times-") as tmp:
        prog = Path(tmp, "prog.py")
        prog.write_text(PROGRAM)
        cmd = [sys.executable, "-m", "ringworld", "run", "-n", str(ranks), *recovery,
               "--transport", transport, str(prog), mode, where]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n[failure_times: the job ran past {timeout} s and was killed]"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    pids = [int(p) for p in re.findall(r"^pid \d+ (\d+)$", out, re.M)]
    _kill(pids)  # a stopped or stray rank must not outlive the measurement
    res = Outcome(mode, where, transport, ranks, proc.returncode, stdout=out, stderr=err)
    if mode == "timeout":
        starts = {int(r): float(t) for r, t in re.findall(r"^rank (\d+) waits at ([\d.]+)$",
                                                           out, re.M)}
    else:
        failed = re.search(r"^failing at ([\d.]+)$", out, re.M)
        if failed is None:
            return res
        starts = {r: float(failed.group(1)) for r in range(ranks)}
    for rank_s, cls, when, named, text in _RAISED.findall(out):
        rank = int(rank_s)
        if rank in starts:
            res.seconds[rank] = round(float(when) - starts[rank], 3)
        res.raised[rank] = cls
        res.named[rank] = int(named)
        res.texts[rank] = text
    return res


def expected_exception(mode: str) -> str:
    return "Timeout" if mode == "timeout" else "PeerFailure"


def limit(mode: str) -> float:
    """Issue 6's bound on the slowest survivor: 2 s for a rank that dies or leaves, the liveness
    timeout + 2 s for a stopped one, the call's timeout + 1 s for a timeout."""
    return {"stop": LIVENESS + 2.0, "timeout": CALL_TIMEOUT + 1.0}.get(mode, 2.0)


def meets(o: Outcome) -> bool:
    """Every survivor raised the expected exception, naming rank 1, within :func:`limit`."""
    named_ok = o.mode == "timeout" or set(o.named.values()) == {VICTIM}
    return (o.worst < limit(o.mode) and named_ok
            and set(o.raised.values()) == {expected_exception(o.mode)})


def table(rows: Sequence[Outcome]) -> str:
    """A Markdown table: one line per case, survivors' times from fastest to slowest."""
    lines = ["| failure | survivors wait in | transport | raised | naming | survivors' seconds "
             "| worst | bound | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for o in rows:
        kinds = ", ".join(sorted(set(o.raised.values()))) or "nothing"
        named = ", ".join(str(r) for r in sorted(set(o.named.values())) if r >= 0) or "-"
        times = " ".join(f"{s:.2f}" for s in sorted(o.seconds.values()))
        lines.append(f"| {o.mode} | {o.where} | {o.transport} | {kinds} | {named} | {times} | "
                     f"{o.worst:.2f} | {limit(o.mode):.0f} | {'yes' if meets(o) else 'NO'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, from {', '.join(MODES)}")
    ap.add_argument("--where", default="both", choices=[*WHERES, "both"])
    ap.add_argument("--transport", default="both", choices=[*TRANSPORTS, "both"])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="runs per case")
    ap.add_argument("--json", help="also write every outcome to this file")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or args.ranks < 3 or args.repeat < 1:
        ap.error(f"unknown modes {bad}" if bad else "--ranks must be >= 3, --repeat >= 1")
    wheres = WHERES if args.where == "both" else (args.where,)
    transports = TRANSPORTS if args.transport == "both" else (args.transport,)
    rows: list[Outcome] = []
    ok = True
    for mode in modes:
        for where in wheres:
            for transport in transports:
                for _ in range(args.repeat):
                    start = time.monotonic()
                    o = run_case(mode, where, transport, args.ranks)
                    rows.append(o)
                    good = meets(o)
                    ok = ok and good
                    print(f"{mode:8} {where:10} {transport}: worst {o.worst:.2f} s "
                          f"({time.monotonic() - start:.1f} s)" + ("" if good else "  FAILED"),
                          file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in rows], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
