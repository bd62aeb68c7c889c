"""The `collection` bench scenario (issue 11), run through the bench runner at its tiny size."""
from __future__ import annotations

import json

import numpy as np
import pytest

from vidql.bench.registry import BenchContext
from vidql.bench.runner import run
from vidql.bench.scenarios_collection import (SEED_BASE, STAT, TINY_CLIPS, TINY_FRAMES,
                                              appends_figures)
from vidql.datasets import ensure_traffic, read_labels
from vidql.engine.sql.framestat import evaluate


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run of the scenario without real data: its results entry and the cache."""
    tmp = tmp_path_factory.mktemp("bench")
    ctx = BenchContext(out_dir=tmp / "out", quick=True, tiny=True, cache_dir=tmp / "cache")
    run(["collection"], ctx)
    entry = json.loads((ctx.out_dir / "results.json").read_text())["scenarios"]["collection"]
    assert "error" not in entry, entry.get("traceback")
    return entry, ctx


def test_loads_and_appends_every_clip_and_measures_the_catalog(tiny_run):
    entry, ctx = tiny_run
    result = entry["figures"]["runs"][str(TINY_CLIPS)]
    load, append = result["load_video"], result["append"]
    assert load["clips"] == append["clips"] == TINY_CLIPS
    assert load["frames"] == TINY_CLIPS * TINY_FRAMES
    assert load["seconds_per_clip"] == pytest.approx(load["seconds"] / TINY_CLIPS)
    assert len(append["append_seconds"]) == len(append["append_cpu_seconds"]) == TINY_CLIPS - 1
    # (the first clip is loaded AS)
    for step in (load, append, result["create_index"]):
        assert step["catalog_bytes"] > 0 and step["peak_rss_mb"] > 0
    assert result["create_index"]["oracle_calls"] > 0
    assert not list(ctx.out_dir.glob("collection-*.db")), "the bench databases are removed"


def test_every_answer_is_judged_against_the_truth_of_its_clips(tiny_run):
    entry, ctx = tiny_run
    queries = entry["figures"]["runs"][str(TINY_CLIPS)]["queries"]
    cars = {}  # the exact per-clip means, from the generator's own label files
    for k in range(TINY_CLIPS):
        _, labels = ensure_traffic(ctx.cache_dir / "collection" / "traffic", TINY_FRAMES,
                                   seed=SEED_BASE + k, width=160, height=90)
        cars[f"cam{k:04d}"] = evaluate(STAT, read_labels(labels), np.arange(TINY_FRAMES))
    assert queries["*"]["exact"] == pytest.approx(np.concatenate(list(cars.values())).mean())
    assert queries["*"]["exact_frames"] == TINY_CLIPS * TINY_FRAMES
    per_clip = {k: q for k, q in queries.items() if k.startswith("cam")}
    assert set(per_clip) == set(cars)  # PER_CLIP >= TINY_CLIPS: every clip on its own
    for clip, q in per_clip.items():
        assert q["exact"] == pytest.approx(cars[clip].mean())
        assert q["exact_frames"] == TINY_FRAMES
        assert q["covered"] == (q["ci_low"] <= q["exact"] <= q["ci_high"])
    for q in [queries["*"], *per_clip.values()]:
        assert q["oracle_calls"] <= q["labelled_frames"] <= q["exact_frames"]
    grouped = queries["group_by"]  # refused until GROUP BY ... ERROR WITHIN lands
    assert "refused" in grouped or set(grouped["groups"]) == set(cars)
    steps = [row["step"] for row in entry["table"]]
    assert steps[:3] == ["LOAD VIDEO (one statement)", steps[1], "CREATE INDEX"]
    assert steps[1].startswith("INTO one at a time")


def test_append_figures_compare_the_first_and_last_tenth():
    wall = [1.0] * 10 + [2.0] * 80 + [3.0] * 10
    cpu = [0.5 + 0.01 * k for k in range(100)]  # grows by 1 s per 100 clips
    figures = appends_figures({"append_seconds": wall, "append_cpu_seconds": cpu})
    assert figures["first_mean_seconds"] == 1.0 and figures["last_mean_seconds"] == 3.0
    assert figures["last_over_first"] == 3.0 and figures["median_seconds"] == 2.0
    assert figures["cpu_first_median_seconds"] == pytest.approx(0.545)
    assert figures["cpu_last_median_seconds"] == pytest.approx(1.445)
    assert figures["cpu_slope_seconds_per_100_clips"] == pytest.approx(1.0)
    flat = appends_figures({"append_seconds": [2.0, 4.0], "append_cpu_seconds": [1.0, 1.0]})
    assert flat["last_over_first"] == 2.0 and flat["cpu_last_over_first"] == 1.0
    assert flat["cpu_slope_seconds_per_100_clips"] == pytest.approx(0.0, abs=1e-9)
