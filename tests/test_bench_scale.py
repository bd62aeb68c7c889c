"""The `scale` bench scenario, run through the bench runner at a tiny N."""
from __future__ import annotations

import json

import pytest

from vidql.bench.registry import BenchContext
from vidql.bench.runner import run
from vidql.bench.scenarios_scale import (QUERY_FIGURES, QUERY_REPEATS, build_options, scale_sizes,
                                         with_clause)
from vidql.base.errors import ParameterError

N_FRAMES = 1000
# a tiny triplet index: ~40 s of CPU for the whole scenario (a pixel index is cheaper to
# build, but FIND RARE's logistic regression converges slowly on its embeddings)
TINY_INDEX = {"train": 20, "reps": 40, "triplets": 100}
KINDS = {"error_within": "ERROR WITHIN", "count_predicate": "COUNT(*)", "budget": "ORACLE BUDGET",
         "limit_gap": "GAP", "recall_target": "RECALL TARGET",
         "precision_target": "PRECISION TARGET", "find_rare": "FIND RARE"}  # the kinds of sql.md


@pytest.mark.slow
def test_scale_scenario_reports_every_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDQL_SCALE_SIZES", str(N_FRAMES))
    monkeypatch.setenv("VIDQL_SCALE_INDEX", json.dumps(TINY_INDEX))
    ctx = BenchContext(out_dir=tmp_path / "out", quick=True, cache_dir=tmp_path / "cache")
    run(["scale"], ctx)
    entry = json.loads((ctx.out_dir / "results.json").read_text())["scenarios"]["scale"]
    assert "error" not in entry, entry.get("traceback")
    figures = entry["figures"]
    assert figures["sizes"] == [N_FRAMES]
    assert figures["index_options"] == TINY_INDEX
    result = figures["runs"][str(N_FRAMES)]
    for step in ("load_video", "create_index"):
        assert {"seconds", "peak_rss_mb", "rss_before_mb"} <= set(result[step])
    assert {"oracle_calls", "disk_mb", "stage_seconds"} <= set(result["create_index"])
    assert result["create_index"]["disk_mb"] > 0
    assert set(result["queries"]) == set(KINDS)
    for kind, clause in KINDS.items():
        figures_of_kind = result["queries"][kind]
        assert set(QUERY_FIGURES) <= set(figures_of_kind), kind
        assert clause in figures_of_kind["sql"], kind
        assert figures_of_kind["same_answer"], kind  # the planner's operator on arrays agrees
        assert 0 <= figures_of_kind["fsync_seconds"] <= figures_of_kind["operator_seconds"], kind
        runs = figures_of_kind["label_path_overhead_runs"]
        assert len(runs) == QUERY_REPEATS and figures_of_kind["label_path_overhead"] == \
            sorted(runs)[(QUERY_REPEATS - 1) // 2], kind
    assert "peak_rss_mb" in result
    assert [p.endswith("scale.png") for p in entry["plots"]] == [True]
    assert (ctx.out_dir / "scale.png").stat().st_size > 0
    assert not list(ctx.out_dir.glob("scale-*.db")), "the bench databases are removed"


@pytest.mark.parametrize("variable, value", [("VIDQL_SCALE_SIZES", "10k"),
                                             ("VIDQL_SCALE_SIZES", "50"),
                                             ("VIDQL_SCALE_INDEX", "[1, 2]"),
                                             ("VIDQL_SCALE_LOAD", "{rendition: 64}")])
def test_bad_scale_settings_say_what_to_write(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ParameterError, match=variable):
        scale_sizes(quick=True) if variable == "VIDQL_SCALE_SIZES" else build_options()


def test_scale_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("VIDQL_SCALE_SIZES", "2000,5000")
    monkeypatch.setenv("VIDQL_SCALE_INDEX", '{"reps": 200, "embedder": "pixel"}')
    assert scale_sizes(quick=True) == (2000, 5000)
    assert build_options() == ({}, {"reps": 200, "embedder": "pixel"})
    assert with_clause(build_options()[1]) == " WITH (reps = 200, embedder = 'pixel')"


def test_array_path_is_the_planners_own_operator_call(traffic_db, small_traffic, monkeypatch):
    """The bench's operator on arrays is the planner's `run_operator` with true values from
    the label file, so it gives the SQL query's answer with the same seed."""
    import vidql
    from vidql.bench.scenarios_scale import measure_query
    from vidql.datasets import read_labels
    from vidql.engine import planner

    kinds = []
    run_operator = planner.run_operator
    monkeypatch.setattr(planner, "run_operator",
                        lambda b, q, *rest: kinds.append(q.kind) or run_operator(b, q, *rest))
    detections = read_labels(small_traffic[1])
    sqls = {"aggregate": "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 3",
            "aggregate_budget": "SELECT COUNT(*) FROM t WHERE contains('person') "
                                "ORACLE BUDGET 60 SEED 3",
            "limit": "SELECT frame FROM t WHERE objects('car') >= 3 LIMIT 2 GAP 5 SEED 3"}
    with vidql.connect(traffic_db, progress=False) as db:
        for kind, sql in sqls.items():
            kinds.clear()
            figures = measure_query(db, sql, detections)
            assert kinds == [kind] * 4, kinds  # on arrays (warm-up, hot, timed), then SQL
            assert figures["same_answer"], (sql, figures)
            assert 0 < figures["array_oracle_calls"] <= figures["labels_used"]
