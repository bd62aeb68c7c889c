"""`vidql demo`: a synthetic traffic video, exact queries, an index, and every kind of
approximate query next to its exact answer and the oracle calls each took."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import vidql
from vidql.cli import print_result

DEMO_SEED = 1  # its first bus episode falls inside the default 4000 frames

APPROXIMATE = [
    ("aggregate, error bound",
     "SELECT AVG(objects('car')) FROM traffic ERROR WITHIN 0.3 CONFIDENCE 95% SEED 1",
     "SELECT AVG(objects('car')) FROM traffic"),
    ("count with predicate, relative error",
     "SELECT COUNT(*) FROM traffic WHERE objects('car') >= 5 ERROR WITHIN 10% CONFIDENCE 95% SEED 1",
     "SELECT COUNT(*) FROM traffic WHERE objects('car') >= 5"),
    ("aggregate under a budget (rare predicate)",
     "SELECT AVG(objects('car')) FROM traffic WHERE contains('bus') ORACLE BUDGET 300 SEED 1",
     "SELECT AVG(objects('car')) FROM traffic WHERE contains('bus')"),
    ("LIMIT ranked by proxy",
     "SELECT frame FROM traffic WHERE objects('car') >= 10 LIMIT 5 GAP 100 SEED 1",
     "SELECT count(*) FROM traffic WHERE objects('car') >= 10"),
    ("selection, recall target",
     "SELECT frame FROM traffic WHERE contains('bus') RECALL TARGET 90% CONFIDENCE 95% "
     "ORACLE BUDGET 400 SEED 1",
     "SELECT frame FROM traffic WHERE contains('bus')"),
    ("selection, precision target",
     "SELECT frame FROM traffic WHERE contains('bus') PRECISION TARGET 90% CONFIDENCE 95% "
     "ORACLE BUDGET 400 SEED 1",
     "SELECT frame FROM traffic WHERE contains('bus')"),
    ("rare events",
     "SELECT frame FROM traffic WHERE contains('bus') FIND RARE ORACLE BUDGET 200 SEED 1",
     "SELECT frame FROM traffic WHERE contains('bus')"),
]


def _answer(kind: str, approx, exact) -> tuple[str, str]:
    """One-line approximate and exact answers of a showcase query."""
    if "estimate" in approx.columns:
        r = approx.iloc[0]
        return (f"{r['estimate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                f"{float(exact.iloc[0, 0]):.3f}")
    frames = set(approx["frame"])
    if kind.startswith("LIMIT"):
        return f"{len(frames)} frames, all verified: {bool(approx['verified'].all())}", \
            f"{int(exact.iloc[0, 0])} matching frames"
    truth = set(exact["frame"])
    hits = len(frames & truth)
    recall = hits / max(len(truth), 1)
    precision = hits / max(len(frames), 1)
    return (f"{len(frames)} frames, recall {recall:.2f}, precision {precision:.2f}",
            f"{len(truth)} frames")


def run_demo(db_path: str | None, cache_dir: Path, n_frames: int = 4000) -> int:
    from vidql.datasets import ensure_traffic

    t_start = time.perf_counter()
    print(f"generating a {n_frames}-frame synthetic traffic video (cached in {cache_dir}) ...")
    video, labels = ensure_traffic(cache_dir, n_frames, seed=DEMO_SEED)
    with vidql.connect(db_path) as db:
        if "traffic" in db.catalog.video_names():
            db.drop_video("traffic")
        statements = [f"LOAD VIDEO '{video}' AS traffic"]
        for name, options in (("truth", " WITH (cost_ms = 40)"), ("reference", "")):
            if name not in db.catalog.oracle_names():
                statements.append(f"CREATE ORACLE {name} FROM LABELS '{labels}'{options}")
        setup = "; ".join(statements + ["SET ORACLE traffic = truth"])
        print(f"\n> {setup}")
        db.sql(setup)
        print("\nThe oracle 'truth' answers from the generator's exact boxes at a stated 40 ms a "
              "frame; 'reference' is the same labels in a separate cache, for exact answers.")

        print("\n== Exact queries (every needed frame through the oracle)")
        for query in ("SELECT frame, objects('car') AS cars, contains('bus') AS bus FROM traffic "
                      "WHERE frame < 600 ORDER BY cars DESC LIMIT 5 USING ORACLE reference",
                      "SELECT count(*) AS frames, avg(objects('car')) AS cars, "
                      "sum(CAST(contains('bus') AS INT)) AS bus_frames FROM traffic "
                      "USING ORACLE reference"):
            print(f"\n> {query}")
            print_result(db.sql(query))
            print(db.last_report.summary())

        print("\n== Building a TASTI index")
        index_sql = (f"CREATE INDEX traffic_idx ON traffic USING TASTI WITH "
                     f"(train = {max(60, n_frames // 50)}, reps = {max(90, n_frames // 25)}, k = 5, triplets = 2000)")
        print(f"> {index_sql}")
        print_result(db.sql(index_sql))

        print("\n== Approximate queries next to their exact answers")
        rows = []
        for kind, query, exact_query in APPROXIMATE:
            print(f"\n> {query}")
            plan = db.sql("EXPLAIN " + query).df().iloc[0]
            t0 = time.perf_counter()
            approx = db.sql(query).df()
            seconds = time.perf_counter() - t0
            report = db.last_report
            print(approx.head(8).to_string(index=False))
            print(report.summary())
            exact = db.sql(exact_query + " USING ORACLE reference").df()
            exact_calls = db.labels("traffic", "reference").n_frames
            got, truth = _answer(kind, approx, exact)
            rows.append({"query": kind, "approximate": got, "exact": truth,
                         "labels used": report.oracle_calls + report.cache_hits,
                         "new oracle calls": report.oracle_calls,
                         "EXPLAIN estimate": plan["estimated_oracle_calls"],
                         "exact labels": exact_calls, "seconds": round(seconds, 2)})
        print("\n== Summary: labels each query used (new oracle calls + labels cached by earlier "
              "queries) vs the frames exact execution labels")
        import pandas as pd

        print(pd.DataFrame(rows).to_string(index=False))
        total = int(np.sum([r["new oracle calls"] for r in rows]))
        index_calls = int(db.indexes.get("traffic_idx").stats.get("oracle_calls", 0))
        print(f"\n{index_calls} oracle calls built the index and {total} answered "
              f"{len(rows)} approximate queries; exact execution labels all {n_frames} frames. "
              f"Demo took {time.perf_counter() - t_start:.0f} s")
    return 0
