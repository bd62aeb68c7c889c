"""The layering of ARCHITECTURE.md, checked on the source: every import between vidql's
modules (function-local ones included) points downwards, and no two files import each
other, directly or through a cycle."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"vidql": "vidql", "engine": "vidql.engine", "indexes": "vidql.indexes",
           "preprocess": "vidql.preprocess", "queries": "vidql.queries",
           "datasets": "vidql.datasets", "bench": "vidql.bench"}

# layer of a module -> layers it may import (ARCHITECTURE.md, "Layers")
ALLOWED = {
    "errors": set(),
    "queries": {"errors"},
    "preprocess": {"errors"},
    "datasets": {"errors", "preprocess"},
    "indexes": {"errors", "preprocess"},
    "engine": {"errors", "queries", "preprocess", "indexes", "datasets"},
    "bench": {"errors", "queries", "preprocess", "indexes", "datasets", "engine", "front"},
    "front": {"errors", "queries", "preprocess", "indexes", "datasets", "engine", "bench"},
}



def _module_name(path: Path) -> str:
    package = FOLDERS[path.parent.name]
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in (ROOT / folder).glob("*.py")}


def _layer(module: str) -> str:
    if module in ("vidql.errors", "vidql.ranges", "vidql.files", "vidql.detections"):
        return "errors"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED and parts[1] not in ("errors", "front"):
        return parts[1]
    return "front"


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """vidql modules that `module` imports anywhere in its file."""
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = targets or [base]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != module:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_imports_point_downwards():
    wrong = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})"
             for m, targets in _graph().items() for t in sorted(targets)
             if _layer(t) != _layer(m) and _layer(t) not in ALLOWED[_layer(m)]]
    assert not wrong, "imports that break the layering:\n" + "\n".join(wrong)


def test_no_import_cycles_between_files():
    graph = _graph()
    # a package's __init__ re-exports its modules; an edge into it stands for those modules
    graph = {m: {t for t in ts if not (m.startswith(t + ".") and t in FOLDERS.values())}
             for m, ts in graph.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("package, heavy", [
    ("vidql.queries", ["duckdb", "pandas", "torch", "faiss", "sklearn"]),
    ("vidql.preprocess", ["duckdb", "torch", "faiss"]),
    ("vidql", ["duckdb", "torch", "faiss", "sklearn", "onnxruntime"]),
])
def test_light_packages_import_light(package, heavy):
    code = (f"import sys, {package}; "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import {package} loaded {out.stdout.strip()}"
