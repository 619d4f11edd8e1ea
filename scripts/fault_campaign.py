"""Fault-injection campaign: collectives in a loop with data unique per rank, element and
iteration, one fault per job, every outcome checked.

    python scripts/fault_campaign.py --trials 200 --out campaign.json

Each trial is one ``ringworld run --enable-recovery`` job (so survivors must find the fault
themselves; the launcher does not stop them) of ``np`` ranks over one transport, running one
collective ``iters`` times; at iteration ``at`` rank ``k`` injects the fault:

- ``kill9``: SIGKILL itself (an out-of-memory kill)
- ``stop``: SIGSTOP itself (a hung process; liveness timeout 2 s)
- ``raise_op``: its user-defined reduction op raises (reductions only)
- ``leave``: its program raises between calls and ends (the others are mid-call)
- ``mismatch``: it calls another collective (or other counts) than the others
- ``late``: it sleeps 3 s while the others wait with ``timeout=1``

A trial passes when no rank ever returns a wrong result, every rank either finishes or raises
a Ringworld error (or the injected one), and the job ends within its deadline (no hang).
Results: one JSON line per trial, and a summary. Not a test: it takes minutes and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

RANK_PROGRAM = r'''
import os, signal, sys, time
import numpy as np
import ringworld

coll, fault, k, at, iters, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6])
comm = ringworld.init()
r, p = comm.rank, comm.size
me = r == k

def add(a, b):
    if fault == "raise_op" and me and state["i"] == at:
        raise ValueError("injected: the op fails on this rank")
    return a + b

state = {"i": -1}
op = ringworld.Op.create(add, commutative=True, name="add") if fault == "raise_op" \
    else ringworld.SUM
timeout = 1.0 if fault == "late" else None

def data(who, i, size):
    return (np.arange(size, dtype=np.float64) * 3 + who * 1000003 + i * 7).astype(np.float64)

def one(i):
    """Run iteration i of the collective; return None or a description of a wrong result."""
    if coll == "allreduce":
        out = np.full(n, -1.0)
        comm.allreduce(data(r, i, n), out, op, timeout=timeout)
        want = sum(data(j, i, n) for j in range(p))
    elif coll == "reduce":
        out = np.full(n, -1.0)
        comm.reduce(data(r, i, n), out if r == 0 else None, op, root=0, timeout=timeout)
        want = sum(data(j, i, n) for j in range(p)) if r == 0 else None
    elif coll == "scan":
        out = np.full(n, -1.0)
        comm.scan(data(r, i, n), out, op, timeout=timeout)
        want = sum(data(j, i, n) for j in range(r + 1))
    elif coll == "bcast":
        out = data(0, i, n) if r == 0 else np.full(n, -1.0)
        comm.bcast(out, root=0, timeout=timeout)
        want = data(0, i, n)
    elif coll == "allgather":
        out = np.full(n * p, -1.0)
        comm.allgather(data(r, i, n), out, timeout=timeout)
        want = np.concatenate([data(j, i, n) for j in range(p)])
    elif coll == "gather":
        out = np.full(n * p, -1.0)
        comm.gather(data(r, i, n), out if r == 0 else None, root=0, timeout=timeout)
        want = np.concatenate([data(j, i, n) for j in range(p)]) if r == 0 else None
    elif coll == "scatter":
        out = np.full(n, -1.0)
        src = np.concatenate([data(j, i, n) for j in range(p)]) if r == 0 else None
        comm.scatter(src, out, root=0, timeout=timeout)
        want = data(r, i, n)
    elif coll == "reduce_scatter_block":
        out = np.full(n, -1.0)
        comm.reduce_scatter_block(np.concatenate([data(r * p + b, i, n) for b in range(p)]),
                                  out, op, timeout=timeout)
        want = sum(data(j * p + r, i, n) for j in range(p))
    elif coll == "alltoall":
        out = np.full(n * p, -1.0)
        comm.alltoall(np.concatenate([data(r * p + b, i, n) for b in range(p)]), out,
                      timeout=timeout)
        want = np.concatenate([data(j * p + r, i, n) for j in range(p)])
    elif coll == "barrier":
        comm.barrier(timeout=timeout)
        return None
    else:
        raise AssertionError(coll)
    if want is not None and not np.array_equal(out, want):
        return f"{int(np.count_nonzero(out != want))} of {out.size} elements wrong"
    return None

def other(i):
    """What the faulty rank calls instead (a disagreement)."""
    if coll == "bcast":
        comm.allreduce(np.zeros(n), np.empty(n), timeout=timeout)
    else:
        comm.bcast(np.zeros(n + 1), root=0, timeout=timeout)

try:
    for i in range(iters):
        state["i"] = i
        if me and i == at:
            if fault == "kill9":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault == "leave":
                raise SystemExit(7)
            elif fault == "late":
                time.sleep(3.0)
            elif fault == "mismatch":
                other(i)
                continue
        bad = one(i)
        if bad:
            print(f"RESULT rank {r} WRONG at {i}: {bad}", flush=True)
            raise SystemExit(9)
    print(f"RESULT rank {r} ok", flush=True)
except (ringworld.RingworldError, ValueError, TypeError) as exc:
    print(f"RESULT rank {r} error {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    raise SystemExit(3) from None
'''

COLLECTIVES = ("allreduce", "reduce", "scan", "bcast", "allgather", "gather", "scatter",
               "reduce_scatter_block", "alltoall", "barrier")
REDUCING = ("allreduce", "reduce", "scan", "reduce_scatter_block")
FAULTS = ("kill9", "stop", "raise_op", "leave", "mismatch", "late")


def trial(prog: Path, np_: int, transport: str, coll: str, fault: str, k: int, at: int,
          n: int, deadline: float) -> dict[str, object]:
    env = {**os.environ, "RINGWORLD_LIVENESS_TIMEOUT": "2"}
    args = [sys.executable, "-m", "ringworld", "run", "-n", str(np_), "--transport", transport,
            "--enable-recovery", sys.executable, str(prog), coll, fault, str(k), str(at), "6",
            str(n)]
    start = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=deadline, env=env,
                           stdin=subprocess.DEVNULL, check=False)
        out, hung, code = r.stdout, False, r.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        hung, code = True, None
    seconds = time.monotonic() - start
    results = {int(line.split()[2]): " ".join(line.split()[3:])
               for line in out.splitlines() if line.startswith("RESULT rank ")}
    wrong = [rk for rk, res in results.items() if res.startswith("WRONG")]
    # every rank but the faulty one (killed, stopped, left) must say how it ended
    silent = [rk for rk in range(np_) if rk not in results and rk != k]
    return {"np": np_, "transport": transport, "collective": coll, "fault": fault,
            "rank": k, "at": at, "count": n, "seconds": round(seconds, 2), "hung": hung,
            "exit": code, "wrong": wrong, "silent": silent,
            "outcomes": {str(rk): res[:160] for rk, res in sorted(results.items())},
            "ok": not hung and not wrong and not silent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=45.0)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "rank.py"
        prog.write_text(textwrap.dedent(RANK_PROGRAM))
        sink = sys.stdout if args.out == "-" else open(args.out, "w")  # noqa: SIM115
        rows = []
        try:
            for t in range(args.trials):
                fault = FAULTS[t % len(FAULTS)]
                coll = rng.choice(REDUCING if fault == "raise_op" else COLLECTIVES)
                np_ = rng.choice((2, 3, 4, 5, 8))
                row = trial(prog, np_, rng.choice(("shm", "tcp")), coll, fault,
                            rng.randrange(np_), rng.randrange(1, 5),
                            rng.choice((1, 7, 1000, 70_001)), args.deadline)
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
        finally:
            if sink is not sys.stdout:
                sink.close()
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} trials: {len(rows) - len(bad)} passed, {len(bad)} failed "
          f"({sum(bool(r['hung']) for r in rows)} hung, "
          f"{sum(bool(r['wrong']) for r in rows)} with wrong results, "
          f"{sum(bool(r['silent']) for r in rows)} with a silent survivor)", file=sys.stderr)


if __name__ == "__main__":
    main()
