"""The rank starter on another host: ``python -m ringworld.launch.remote`` (run through --rsh).

The launcher starts it with the remote shell (``ssh HOST ...``, ``ip netns exec NS ...``) and
writes one JSON line to its stdin: the program's argv, working directory, environment
additions and the job secret. The secret therefore never appears in any argv or environment; it
reaches the rank through an inherited pipe (``RINGWORLD_SECRET_FD``) as locally. Then the
starter replaces itself with the program (same process: signals and exit status pass through).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MAX_SPEC = 1 << 20  # bytes of the spec line read at most


def _read_spec() -> dict[str, Any]:
    line = sys.stdin.buffer.readline(MAX_SPEC)
    if not line.endswith(b"\n"):
        raise SystemExit("ringworld remote: no start line on stdin (run by `ringworld run`)")
    spec = json.loads(line)
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list):
        raise SystemExit("ringworld remote: malformed start line")
    return spec


def main() -> None:
    """Read the start line, set up the environment and the secret pipe, exec the program."""
    spec = _read_spec()
    argv = [str(a) for a in spec["argv"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    env.update({str(k): str(v) for k, v in dict(spec.get("env", {})).items()})
    secret = bytes.fromhex(str(spec.get("secret", "")))
    r, w = os.pipe()
    os.write(w, secret.hex().encode() + b"\n")
    os.close(w)
    os.set_inheritable(r, True)
    env["RINGWORLD_SECRET_FD"] = str(r)
    env.pop("RINGWORLD_SECRET", None)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # remote ranks get no stdin (the start line is consumed)
    os.close(devnull)
    cwd = spec.get("cwd")
    if isinstance(cwd, str):
        try:
            os.chdir(cwd)
        except OSError as exc:
            print(f"ringworld remote: cannot enter {cwd}: {exc.strerror}", file=sys.stderr)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"ringworld remote: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(127 if isinstance(exc, FileNotFoundError) else 126) from None


if __name__ == "__main__":
    main()
