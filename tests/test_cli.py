"""The command line: sql, load, shell (driven through stdin), bench listing, errors."""
from __future__ import annotations

import ast
import inspect
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vidql
from vidql.bench.runner import SCENARIO_MODULES, load_scenarios
from vidql.cli import main
from vidql.shell import Shell


def test_load_and_sql_commands(counter_clip, tmp_path, capsys):
    db = str(tmp_path / "cli.db")
    assert main(["load", str(counter_clip), "--name", "clip", "--db", db]) == 0
    assert "loaded clip: 120 frames" in capsys.readouterr().out
    assert main(["sql", "SELECT count(*) AS n FROM clip", "--db", db]) == 0
    assert "120" in capsys.readouterr().out
    assert main(["sql", "SELECT AVG(objects('car')) FROM clip ERROR WITHIN 0 ", "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "position" in err


def test_shell_runs_statements_and_survives_errors(counter_clip, tmp_path):
    script = (f"LOAD VIDEO '{counter_clip}'\n AS clip;\n"
              "SELECT count(*) AS n FROM clip;\n"
              "SELECT * FROM nowhere;\n"
              ".help\n"
              "SHOW VIDEOS;\n")
    out = io.StringIO()
    Shell(str(tmp_path / "s.db"), stdin=io.StringIO(script), stdout=out).run()
    text = out.getvalue()
    assert "120" in text and "error:" in text and "nowhere" in text
    assert "Statements end with ';'" in text
    assert text.count("clip") >= 2


def test_console_script_lists_scenarios():
    out = subprocess.run([sys.executable, "-m", "vidql", "bench", "--list"],
                         capture_output=True, text=True, check=True).stdout
    assert "decode-only" in out and "oracle" in out


def test_sql_prints_the_guarantee_and_oracle_calls(traffic_db, capsys):
    query = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 10% CONFIDENCE 95% SEED 3"
    assert main(["sql", query, "--db", str(traffic_db)]) == 0
    out = capsys.readouterr().out
    assert "guarantee: AVG within ±10% (relative error) at 95% confidence" in out
    assert "operator: aggregate" in out and "(relative) " not in out
    calls = int(re.search(r"oracle calls: (\d+)", out).group(1))
    with vidql.connect(traffic_db, progress=False) as db:  # a fresh database: every call new
        assert calls == db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] > 0
    simulated = re.search(r"oracle ([\d.]+)s simulated \(40 ms a call", out)
    assert simulated and float(simulated.group(1)) == pytest.approx(calls * 0.04, abs=0.01)
    total = main(["sql", "SELECT SUM(objects('car')) FROM t ERROR WITHIN 0.5 SEED 3; "
                         "SELECT count(*) AS n FROM t", "--db", str(traffic_db)])
    out = capsys.readouterr().out
    assert total == 0 and "guarantee: exact" in out and "cache hits: 0" in out  # the last one
    assert main(["sql", "SELECT SUM(objects('car')) FROM t ERROR WITHIN 0.5 SEED 3",
                 "--db", str(traffic_db)]) == 0
    assert ("guarantee: SUM within ±0.5 per frame, ±150 in total (absolute error) at 95% "
            "confidence") in capsys.readouterr().out


SLOW_SCENARIOS = {"index", "scale", "scale-out"}  # a minute or more even when tiny (index
# builds; scale-out starts a Ray cluster)
PLOTS = {"agg": ["agg"], "agg-budget": ["agg-budget", "agg-budget-coverage"],
         "limit": ["limit"], "select": ["select", "select-set-size"], "rare": ["rare"],
         "real": ["real"], "index": ["index_quality"], "scale": ["scale"],
         "collection": ["collection"]}  # what each scenario draws (bench/plots.py) unless skipped
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_SCENARIOS else [])
    for name in sorted(load_scenarios())])
def test_bench_tiny_runs_every_scenario(scenario, tmp_path):
    """`vidql bench --quick --tiny NAME`, for every registered scenario: it runs and reports."""
    out = tmp_path / "bench"
    assert main(["bench", scenario, "--quick", "--tiny", "--no-shared", "--out", str(out),
                 "--cache", str(tmp_path / "cache")]) == 0
    entry = json.loads((out / "results.json").read_text())["scenarios"][scenario]
    assert "error" not in entry, entry.get("traceback")
    assert entry["table"] or "skipped" in entry["figures"]  # some need ../shared
    report = (out / "report.md").read_text()
    assert f"## {scenario}" in report
    plots = [Path(p) for p in entry["plots"]]
    assert all(p.read_bytes()[:8] == PNG and f"]({p.name})" in report for p in plots)
    if "skipped" not in entry["figures"]:
        assert [p.stem for p in plots] == PLOTS.get(scenario, [])


def test_bench_tiny_run_takes_the_quick_code_path():
    """Scenarios read `tiny` only through `BenchContext.size` (smaller data, same branches),
    so the tiny runs above reach every line a `--quick` run reaches: an import or a branch
    only `--quick` took (`vidql bench --quick limit` once failed on an ImportError) can't
    hide from the test suite."""
    load_scenarios()
    branches = []
    for name in SCENARIO_MODULES:
        module = sys.modules[f"vidql.bench.{name}"]
        tree = ast.parse(inspect.getsource(module))
        branches += [f"{name}.py:{node.lineno}" for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and node.attr == "tiny"]
    assert not branches, f"scenarios branch on ctx.tiny (use ctx.size): {branches}"


@pytest.mark.slow
def test_demo_command_runs_every_query_kind(tmp_path, capsys):
    """`vidql demo --frames 600`: exact queries, an index, every showcase query and the summary."""
    from vidql.showcase import showcase_queries

    assert main(["demo", "--frames", "600", "--db", str(tmp_path / "demo.db"),
                 "--cache", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "== Building a TASTI index" in out and "== Summary" in out
    for query in showcase_queries("traffic", "car", "bus", 600, many=10):
        assert f"> {query.approximate}" in out
    calls = re.search(r"(\d+) oracle calls built the index and (\d+) answered", out)
    assert calls and 0 < int(calls.group(1)) < 600


def test_perfdoc_writes_the_page_from_bench_results(tmp_path):
    """`vidql perfdoc DIR --out FILE`: each scenario's table, notes and plots from results.json,
    a later run's scenario replacing an earlier one's; a folder without results is refused."""
    def bench_run(folder, answer):
        folder.mkdir()
        (folder / "limit.png").write_bytes(b"\x89PNG\r\n")
        entry = {"figures": {}, "table": [{"data": "traffic", "ratio": answer}],
                 "plots": [str(folder / "limit.png")], "notes": ["proxy order vs random"], "seconds": 1.5}
        (folder / "results.json").write_text(json.dumps(
            {"machine": {"python": "3.11", "platform": "x"}, "quick": True, "seed": 0,
             "scenarios": {"limit": entry, "agg": {"error": "ValueError: boom", "seconds": 0.1}}}))
        return folder

    first, second = bench_run(tmp_path / "a", 1.0), bench_run(tmp_path / "b", 22.5)
    page = tmp_path / "docs" / "performance.md"
    assert main(["perfdoc", str(first), str(second / "results.json"), "--out", str(page)]) == 0
    text = page.read_text()
    assert "| traffic | 22.5 |" in text and "| traffic | 1 |" not in text
    assert "- proxy order vs random" in text and "**failed**: ValueError: boom" in text
    assert "![limit](img/bench/limit.png)" in text and (tmp_path / "docs/img/bench/limit.png").exists()
    assert main(["perfdoc", str(tmp_path / "docs"), "--out", str(page)]) == 2
