"""The algorithms reach the communicator only through the narrow surface of its Channel (and the
requests it returns): no private attribute of another object (``x._name``, or a ``getattr`` of
one), and no engine at all. Accesses on ``self`` / ``cls`` are the class's own state (or its
base's, as a subclass does). Reads the sources only."""

from __future__ import annotations

import ast
from pathlib import Path

ALGORITHMS = Path(__file__).resolve().parents[2] / "src" / "ringworld" / "algorithms"

#: the public API of named tuples (schedule steps are NamedTuples), spelt with an underscore
NAMEDTUPLE_API = {"_replace", "_asdict", "_make", "_fields", "_field_defaults"}
ATTR_FUNCTIONS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in NAMEDTUPLE_API)


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def violations(source: str) -> list[str]:
    """Each private access on another object, and each use of an engine, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if node.attr in ("engine", "_engine"):
                found.append(f"{node.lineno}: {ast.unparse(node)} (the engine)")
            elif _private(node.attr) and not _own(node.value):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ATTR_FUNCTIONS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own(node.args[0])):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names])
            found += [f"{node.lineno}: imports {n}" for n in names if n == "ringworld.comm.engine"]
    return sorted(found, key=lambda v: int(v.split(":")[0]))


def test_algorithms_use_only_public_surfaces() -> None:
    wrong = [f"{path.name}:{v}" for path in sorted(ALGORITHMS.glob("*.py"))
             for v in violations(path.read_text())]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_violation() -> None:
    """What the executor did before it had a Channel method for each is found; the class's own
    state, dunders and the named-tuple API are not."""
    src = ("def f(self, comm, r, s):\n"
           "    super().__init__(comm._engine)\n"
           "    e = self._engine\n"
           "    e.open_calls[comm.coll_context].add(1)\n"
           "    if r._error is not None:\n"
           "        raise r._error\n"
           "    w = self._comm._to_comm(1)\n"
           "    p = getattr(r, 'source', getattr(r, '_dest', -1))\n"
           "    from ringworld.comm.engine import Engine\n"
           "    ok = (self._tag, cls._x, r.__class__, s._replace(a=1), getattr(self, '_x'))\n")
    got = violations(src)
    assert [v.split(":")[0] for v in got] == ["2", "3", "5", "6", "7", "8", "9"], got
