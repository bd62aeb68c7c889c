"""The layering of docs/architecture.md, checked on the source: every import between vidql's
modules (function-local ones included) points downwards, and no two files import each
other, directly or through a cycle."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"vidql": "vidql", "base": "vidql.base", "engine": "vidql.engine", "indexes": "vidql.indexes",
           "preprocess": "vidql.preprocess", "queries": "vidql.queries",
           "datasets": "vidql.datasets", "bench": "vidql.bench"}
BELOW_ENGINE = {"base", "queries", "preprocess", "indexes", "datasets"}
ENGINE_ROOMS = {"sql", "labels", "catalog"}

# layer of a module -> layers it may import (docs/architecture.md, "Layers"); the engine's
# rooms sql < labels < catalog sit below its query runners ("engine")
ALLOWED = {
    "base": set(),
    "queries": {"base"},
    "preprocess": {"base"},
    "datasets": {"base", "preprocess"},
    "indexes": {"base", "preprocess"},
    "sql": {"base"},
    "labels": {"base", "sql", "preprocess", "datasets"},
    "catalog": {"base", "sql", "labels", "preprocess", "datasets", "indexes"},
    "engine": BELOW_ENGINE | ENGINE_ROOMS,
    "bench": BELOW_ENGINE | ENGINE_ROOMS | {"engine", "front"},
    "front": BELOW_ENGINE | ENGINE_ROOMS | {"engine", "bench"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = FOLDERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}


def _layer(module: str) -> str:
    parts = module.split(".") + [""]
    if parts[1] == "engine" and parts[2] in ENGINE_ROOMS:
        return parts[2]
    if parts[1] in ALLOWED and parts[1] != "front":
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
    packages = {m for m, p in _modules().items() if p.stem == "__init__"}
    # a package's __init__ re-exports its modules; an edge into it stands for those modules
    graph = {m: {t for t in ts if not (m.startswith(t + ".") and t in packages)}
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
