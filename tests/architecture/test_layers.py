"""The rules docs/architecture.md states, checked on the code: layers import only downward
(hence no import cycle between top-level packages), no module over 800 lines, no function
over 80. Reads the sources only."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ringworld"

#: lowest first; a package may import from its own layer and the ones below
LAYERS: list[set[str]] = [
    {"errors", "_lazy", "_sockutil", "_argtypes", "auth", "other_launchers", "config"},
    {"store"},
    {"transport"},
    {"comm"},
    {"algorithms"},
    # the device plane (NCCL) sits beside the host paths, below the tuning that chooses them;
    # its GPU listing reads the topology's nvidia-smi parser
    {"topology", "device"},
    {"tuning"},
    {"collective"},
    # adapters, tools and the process-wide entry points
    {"trace", "mpi", "backends", "torch", "testing", "runtime", "bench", "launch", "MPI",
     "__init__", "__main__"},
]
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported(tree: ast.AST) -> set[str]:
    """The top-level ringworld packages ``tree`` imports (anywhere: lazy imports count)."""
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ringworld":
                names = [f"ringworld.{a.name}" for a in node.names]
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n.split(".")[1] for n in names
                  if n.startswith("ringworld.") and len(n.split(".")) > 1}
    return found


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_layer() -> None:
    known = set().union(*LAYERS)
    assert {_package(p) for p in _sources()} <= known


def test_layers_import_only_downward() -> None:
    layer = {name: i for i, group in enumerate(LAYERS) for name in group}
    wrong = []
    for path in _sources():
        pkg = _package(path)
        for target in _imported(ast.parse(path.read_text())):
            if target != pkg and layer.get(target, -1) > layer[pkg]:
                wrong.append(f"{path.relative_to(SRC)} ({pkg}) imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_module_or_function_too_long() -> None:
    long = []
    for path in _sources():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(SRC)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}: {node.name} is {n} lines")
    assert not long, "\n".join(long)


def test_the_checks_see_a_violation() -> None:
    """The import reader finds lazy and aliased imports (a rule it cannot see would pass)."""
    tree = ast.parse("def f():\n    from ringworld.tuning import select\n"
                     "import ringworld.comm.engine as e\nfrom ringworld import collective\n")
    assert _imported(tree) == {"tuning", "comm", "collective"}
