"""Run registered scenarios and write `results.json` and `report.md` into an output folder."""
from __future__ import annotations

import importlib
import json
import platform
import time
import traceback
from pathlib import Path

from vidql.base.errors import ParameterError

from .registry import SCENARIOS, BenchContext, ScenarioResult

SCENARIO_MODULES = ("scenarios_core", "scenarios_decode", "scenarios_index", "scenarios_queries",
                    "scenarios_e2e", "scenarios_oracle", "scenarios_scale", "scenarios_scaleout",
                    "scenarios_collection", "scenarios_real", "scenarios_rendition")


def load_scenarios() -> dict:
    """Import every scenario module that exists; return the registry."""
    for module in SCENARIO_MODULES:
        try:
            importlib.import_module(f"vidql.bench.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"vidql.bench.{module}":
                raise
    return SCENARIOS


def markdown_table(rows: list[dict]) -> str:
    """Rows with identical keys as a Markdown table (floats to 4 significant digits)."""
    if not rows:
        return ""
    keys = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def run(names: list[str], ctx: BenchContext) -> dict:
    """Run scenarios by name (all when empty); a failing scenario is reported, not fatal."""
    registry = load_scenarios()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ParameterError(f"unknown scenario(s) {', '.join(unknown)}; "
                             f"available: {', '.join(sorted(registry))}")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    report = {"machine": {"python": platform.python_version(), "platform": platform.platform()},
              "quick": ctx.quick, "tiny": ctx.tiny, "seed": ctx.seed, "scenarios": {}}
    md = [f"# vidql bench ({'quick' if ctx.quick else 'full'}, seed {ctx.seed})", ""]
    for name in names or sorted(registry):
        description, fn = registry[name]
        print(f"== {name}: {description}", flush=True)
        t0 = time.perf_counter()
        try:
            result: ScenarioResult = fn(ctx)
            entry = {"figures": result.figures, "table": result.table, "plots": result.plots,
                     "notes": result.notes}
        except Exception as exc:  # one broken scenario must not hide the others' figures
            entry = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            result = None
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        report["scenarios"][name] = entry
        md += [f"## {name}", "", description, ""]
        if result is None:
            md += [f"**failed**: {entry['error']}", ""]
        else:
            md += [markdown_table(result.table), ""]
            md += [f"- {n}" for n in result.notes]
            md += [f"![{Path(p).name}]({Path(p).name})" for p in result.plots]
            md.append("")
        print(markdown_table(result.table) if result else f"failed: {entry['error']}", flush=True)
        with open(ctx.out_dir / "results.json", "w") as fh:
            json.dump(report, fh, indent=2, default=str)
    (ctx.out_dir / "report.md").write_text("\n".join(md))
    return report
