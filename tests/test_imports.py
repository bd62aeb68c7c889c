"""Heavy libraries load only where they are used: `import vidql` and fully cached queries
leave torch, torchvision, faiss, sklearn, cv2 and matplotlib unloaded."""
from __future__ import annotations

import json
import subprocess
import sys

import vidql
from conftest import shared_path

HEAVY = ["torch", "torchvision", "faiss", "sklearn", "onnxruntime", "cv2", "matplotlib"]
CHECK = """
import json, sys
heavy = json.loads(sys.argv[1])
loaded = lambda: [m for m in heavy if m in sys.modules]
import vidql
print(json.dumps(loaded()))
with vidql.connect(sys.argv[2], progress=False) as db:
    for query in sys.argv[3:]:
        db.sql(query)
        print(json.dumps(loaded()))
"""


def _loaded(db_path, *queries, heavy=HEAVY) -> list[list[str]]:
    """`heavy` modules loaded in a fresh process after `import vidql` and after each query."""
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(heavy), str(db_path), *queries],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_cached_queries_load_no_heavy_library(traffic_db):
    exact = "SELECT sum(objects('car')) FROM t WHERE frame < 100"
    approximate = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1"
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql(exact)
        db.sql(approximate)
    assert _loaded(traffic_db, exact, approximate) == [[], [], []]


def test_cached_onnx_query_loads_no_torch(counter_clip, tmp_path):
    model = shared_path("models", "yolox_nano.onnx")
    query = "SELECT frame, objects('car') FROM clip WHERE frame < 4"
    with vidql.connect(tmp_path / "onnx.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS clip; CREATE ORACLE yolox FROM ONNX '{model}'; "
               f"SET ORACLE clip = yolox")
        assert db.sql(query).report.oracle_calls == 4
    # the model itself is checked when the oracle is built, so onnxruntime loads
    assert _loaded(tmp_path / "onnx.db", query) == [[], ["onnxruntime"]]


def test_queries_over_an_index_load_no_torch(traffic_db):
    """Reading an index's proxies (and cracking it with new labels) needs FAISS, not torch:
    only building, extending or encoding with an index loads torch."""
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t USING TASTI WITH (embedder = 'pixel', reps = 30, seed = 1)")
    aggregate = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1"
    limit = "SELECT frame FROM t WHERE objects('car') >= 3 LIMIT 2 SEED 1"
    loaded = _loaded(traffic_db, aggregate, limit)
    assert all("torch" not in step and "torchvision" not in step for step in loaded), loaded
    assert "faiss" in loaded[-1]


def test_scipy_stats_loads_only_for_the_selection_targets(traffic_db):
    """`scipy.stats` (0.4-0.5 s to import, paid by every `vidql sql` process) loads only for
    the selection targets (PRECISION TARGET's beta quantile, RECALL TARGET's binomial
    tests): aggregates, budgets (hypergeometric tails in numpy) and LIMIT answer without it."""
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t USING TASTI WITH (embedder = 'pixel', reps = 30, seed = 1)")
    queries = ["SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1",
               "SELECT COUNT(*) FROM t WHERE contains('bus') ORACLE BUDGET 40 SEED 1",
               "SELECT frame FROM t WHERE objects('car') >= 3 LIMIT 2 GAP 5 SEED 1",
               "SELECT frame FROM t WHERE objects('car') >= 2 PRECISION TARGET 90% "
               "ORACLE BUDGET 100 SEED 1",
               "SELECT frame FROM t WHERE objects('car') >= 2 RECALL TARGET 90% "
               "ORACLE BUDGET 100 SEED 1"]
    loaded = _loaded(traffic_db, *queries, heavy=["scipy.stats"])
    assert loaded == [[], [], [], [], ["scipy.stats"], ["scipy.stats"]], loaded
