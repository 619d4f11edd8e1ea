"""``python -m mpi4py [-rc name=value,...] (PYFILE | -m MOD | -c CMD | -) [ARGS...]``.

Runs a program as mpi4py's runner does, on Ringworld: ``-rc`` sets ``mpi4py.rc`` options first
(values ``true``/``false``/``none``/numbers are converted), and ``sys.argv`` is what the program
would see under plain ``python``. An uncaught exception prints its traceback and ends the rank
with status 1, which makes the launcher stop the job.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from typing import Any

from . import rc

_USAGE = (
    "usage: python -m mpi4py [-rc name=value,...] <pyfile> [arg] ...\n"
    "   or: python -m mpi4py [-rc name=value,...] -m <mod> [arg] ...\n"
    "   or: python -m mpi4py [-rc name=value,...] -c <cmd> [arg] ...\n"
    "   or: python -m mpi4py [-rc name=value,...] - [arg] ...\n"
)


def _value(text: str) -> Any:
    words: dict[str, Any] = {"true": True, "yes": True, "on": True, "false": False,
                             "no": False, "off": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _set_rc(spec: str) -> None:
    for item in filter(None, spec.split(",")):
        name, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"mpi4py: -rc expects name=value, got {item!r}\n{_USAGE}")
        try:
            setattr(rc, name.strip(), _value(text.strip()))
        except TypeError as exc:
            raise SystemExit(f"mpi4py: -rc: {exc}") from None


def main(argv: Sequence[str]) -> None:
    """Parse the runner's options, then run the program in ``__main__``.

    Raises:
        SystemExit: bad usage (status 1 with a message, 0 for ``-h``), or the program's exit.
    """
    args = list(argv)
    while args and args[0].startswith("-") and args[0] not in ("-", "-m", "-c"):
        option = args.pop(0)
        if option in ("-h", "--help"):
            sys.stdout.write(_USAGE)
            raise SystemExit(0)
        if option in ("-rc", "--rc") and args:
            _set_rc(args.pop(0))
        elif option.startswith("--rc="):
            _set_rc(option[len("--rc="):])
        else:
            raise SystemExit(f"mpi4py: unknown option {option!r}\n{_USAGE}")
    if not args:
        raise SystemExit(f"mpi4py: no program given\n{_USAGE}")
    first = args.pop(0)
    if first in ("-m", "-c") and not args:
        raise SystemExit(f"mpi4py: {first} needs an argument\n{_USAGE}")
    if first == "-m":
        module = args.pop(0)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif first == "-c":
        code = args.pop(0)
        sys.argv = ["-c", *args]
        sys.path.insert(0, "")
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    elif first == "-":
        sys.argv = ["-", *args]
        sys.path.insert(0, "")
        exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [first, *args]
        sys.path.insert(0, first.rpartition("/")[0] or ".")
        runpy.run_path(first, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
