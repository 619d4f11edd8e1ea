"""The GPU plane's check on a machine with a GPU: every case in a subprocess with a timeout,
the results as JSON (``$OUT/gpu_check.json``, else ./gpu_check.json), a summary on stdout.

Run from the repository root, with nccl4py importable (the device machine's image has torch
with CUDA, CuPy, cuda-bindings and nvidia-nccl-cu13, but not nccl4py: carry its wheel, see
below). Under five minutes on one H200::

    PYTHONPATH=src python3 scripts/gpu_check.py

For the device tool: in the repository root here, once, ``echo /.whl/ >> .git/info/exclude``
and ``python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
--implementation cp --platform manylinux_2_28_x86_64 -d .whl nccl4py==0.6.0``; then a run with
carry ``[".whl"]`` and the command ``python3 -m pip install -q --no-index --no-deps --target
/tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 python3
scripts/gpu_check.py``.

Cases: ``info`` (``ringworld info --json``); ``single`` (one rank: every collective on torch
CUDA tensors against the values computed on the host); ``pair`` (two ranks on GPU 0 with
``NCCL_MULTI_RANK_GPU_ENABLE=1``: the same, plus CuPy on a non-default stream; before NCCL 2.30
the expected result is a clean refusal naming the duplicate GPU); ``p2p`` (device sendrecv in a
ring, a truncated message, two received in the reverse of the order sent); ``init_all`` (the
seed's single-process example); ``kill`` (a peer SIGKILLed while the other waits in an
allreduce: PeerFailure naming it, within about 2 s); ``timeout`` (``timeout=1`` with a late
peer: Timeout in about 1 s); ``mismatch`` (different counts: MismatchError on both, then the
communicator works); ``torch`` (the ringworld backend beside nccl: values and DDP losses);
``bench`` (``ringworld bench allreduce --device cuda --against nccl`` at np=2).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RANKS = ROOT / "scripts" / "gpu_ranks.py"
PY = sys.executable


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; its RESULT lines parsed, its output's tail, its status and time."""
    full = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True,
                           timeout=timeout, check=False)
        out, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        code = "timeout"
    results = []
    for line in out.splitlines():
        if "RESULT " in line:
            with contextlib.suppress(json.JSONDecodeError):
                results.append(json.loads(line.split("RESULT ", 1)[1]))
    if not results and out.lstrip().startswith("{"):  # a command that prints one JSON document
        with contextlib.suppress(json.JSONDecodeError):
            results.append(json.loads(out[out.index("{"):out.rindex("}") + 1]))
    return {"cmd": " ".join(cmd[1:]), "status": code,
            "seconds": round(time.monotonic() - t0, 2), "results": results,
            "tail": out[-3000:]}


def ranks(case: str, n: int, timeout: float, extra: list[str] | None = None,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    return run([PY, "-m", "ringworld", "run", "-n", str(n), *(extra or []), PY, str(RANKS),
                case], timeout, env)


def main() -> int:
    multi = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "RINGWORLD_TIMEOUT": "60"}
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    cases = {
        "info": lambda: run([PY, "-m", "ringworld", "info", "--json"], 60),
        "single": lambda: ranks("collectives", 1, 120),
        "pair": lambda: ranks("collectives", 2, 150, env=multi),
        "cupy_stream": lambda: ranks("cupy_stream", 2, 60, env=multi),
        "p2p": lambda: ranks("p2p", 2, 60, ["--enable-recovery"], multi),
        "init_all": lambda: run([PY, "examples/nccl_single_process.py", "1048576"], 60),
        "kill": lambda: ranks("kill", 2, 60, ["--enable-recovery"],
                              {**multi, "RINGWORLD_LIVENESS_TIMEOUT": "1"}),
        "timeout": lambda: ranks("timeout", 2, 60, ["--enable-recovery"], multi),
        "mismatch": lambda: ranks("mismatch", 2, 60, env=multi),
        "torch": lambda: ranks("torch", 2, 120, env=multi),
        "bench": lambda: run([PY, "-m", "ringworld", "bench", "allreduce", "-n", "2",
                              "--device", "cuda", "--against", "nccl", "--sizes",
                              "8,64K,1M,16M,64M", "--time-per-size", "0.2", "--rounds", "2",
                              "--timeout", "100"], 170, multi),
    }
    only = set(sys.argv[1:])
    for name, case in cases.items():
        if only and name not in only:
            continue
        print(f"== {name}", flush=True)
        report[name] = case()
        r = report[name]
        print(f"   status {r['status']} in {r['seconds']} s; results: "
              f"{json.dumps(r['results'])[:1500]}", flush=True)
        if r["status"] != 0:
            print("   tail: " + r["tail"][-1500:].replace("\n", "\n         "), flush=True)
    out = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
