"""`vidql demo`: a synthetic traffic video, exact queries, an index, and every kind of
approximate query next to its exact answer and the oracle calls each took."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

import vidql
from vidql.datasets import ensure_traffic
from vidql.display import print_result
from vidql.engine.sql.sqlnames import sql_name
from vidql.showcase import run_showcase, showcase_queries

DEMO_SEED = 1  # its first bus episode falls inside the default 4000 frames

def run_demo(db_path: str | None, cache_dir: Path, n_frames: int = 4000) -> int:
    t_start = time.perf_counter()
    print(f"generating a {n_frames}-frame synthetic traffic video (cached in {cache_dir}) ...")
    video, labels = ensure_traffic(cache_dir, n_frames, seed=DEMO_SEED)
    with vidql.connect(db_path) as db:
        if "traffic" in db.catalog.video_names():
            db.drop_video("traffic")
        statements = [f"LOAD VIDEO '{video}' AS traffic"]
        for name, options in (("truth", " WITH (cost_ms = 40)"), ("reference", "")):
            if name not in db.catalog.oracle_names():
                statements.append(f"CREATE ORACLE {sql_name(name)} FROM LABELS '{labels}'{options}")
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

        print("\n== Building a TASTI index")
        index_sql = (f"CREATE INDEX traffic_idx ON traffic USING TASTI WITH "
                     f"(train = {max(60, n_frames // 50)}, reps = {max(90, n_frames // 25)}, k = 5, triplets = 2000)")
        print(f"> {index_sql}")
        print_result(db.sql(index_sql))

        print("\n== Approximate queries next to their exact answers")
        queries = showcase_queries("traffic", "car", "bus", n_frames, many=10)

        def show(q, rows, report):
            print(f"\n> {q.approximate}")
            print(rows.head(8).to_string(index=False))
            print(report.summary())

        rows = run_showcase(db, queries, exact_oracle="reference", show=show)
        print(f"\n== Summary: labels each query used (new oracle calls + labels cached by earlier "
              f"queries) vs the {n_frames} frames exact execution labels")
        table = pd.DataFrame(rows)[["query", "answer", "exact", "labels_used", "new_oracle_calls",
                                    "explain_estimate", "seconds"]]
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        total = int(np.sum([r["new_oracle_calls"] for r in rows]))
        index_calls = int(db.indexes.get("traffic_idx").stats.get("oracle_calls", 0))
        print(f"\n{index_calls} oracle calls built the index and {total} answered "
              f"{len(rows)} approximate queries; exact execution labels all {n_frames} frames. "
              f"Demo took {time.perf_counter() - t_start:.0f} s")
    return 0
