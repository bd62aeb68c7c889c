"""The showcase: one query of each approximate kind, its exact twin, and how to score the
approximate answer against the exact one. Used by `vidql demo` and the `e2e` benchmark."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from vidql.engine.sql.sqlnames import sql_name


@dataclass(frozen=True)
class ShowcaseQuery:
    kind: str
    approximate: str
    exact: str


def showcase_queries(table: str, count_label: str, rare_label: str, n_frames: int, *,
                     many: int = 5, seed: int = 1) -> list[ShowcaseQuery]:
    """Queries over `table`: counts of `count_label` (≥ `many` is the LIMIT predicate) and
    frames containing `rare_label`; budgets scale with the video's length."""
    count = f"objects('{count_label}')"
    rare = f"contains('{rare_label}')"
    budget = max(100, n_frames // 10)
    tail = f"SEED {seed}"
    source = sql_name(table)
    return [
        ShowcaseQuery("aggregate, error bound",
                      f"SELECT AVG({count}) FROM {source} ERROR WITHIN 10% CONFIDENCE 95% {tail}",
                      f"SELECT AVG({count}) FROM {source}"),
        ShowcaseQuery("count with predicate, relative error",
                      f"SELECT COUNT(*) FROM {source} WHERE {count} >= {many} "
                      f"ERROR WITHIN 10% CONFIDENCE 95% {tail}",
                      f"SELECT COUNT(*) FROM {source} WHERE {count} >= {many}"),
        ShowcaseQuery("aggregate under a budget",
                      f"SELECT AVG({count}) FROM {source} WHERE {rare} ORACLE BUDGET {budget} {tail}",
                      f"SELECT AVG({count}) FROM {source} WHERE {rare}"),
        ShowcaseQuery("LIMIT ranked by proxy",
                      f"SELECT frame FROM {source} WHERE {count} >= {many} LIMIT 5 "
                      f"GAP {max(1, n_frames // 40)} {tail}",
                      f"SELECT frame FROM {source} WHERE {count} >= {many}"),
        ShowcaseQuery("selection, recall target",
                      f"SELECT frame FROM {source} WHERE {rare} RECALL TARGET 90% CONFIDENCE 95% "
                      f"ORACLE BUDGET {budget} {tail}",
                      f"SELECT frame FROM {source} WHERE {rare}"),
        ShowcaseQuery("selection, precision target",
                      f"SELECT frame FROM {source} WHERE {rare} PRECISION TARGET 90% CONFIDENCE 95% "
                      f"ORACLE BUDGET {budget} {tail}",
                      f"SELECT frame FROM {source} WHERE {rare}"),
        ShowcaseQuery("rare events",
                      f"SELECT frame FROM {source} WHERE {rare} FIND RARE "
                      f"ORACLE BUDGET {max(50, n_frames // 20)} {tail}",
                      f"SELECT frame FROM {source} WHERE {rare}"),
    ]


def score(approx: pd.DataFrame, exact: pd.DataFrame) -> dict:
    """How the approximate answer compares with the exact one."""
    if "estimate" in approx.columns:
        r = approx.iloc[0]
        truth = float(exact.iloc[0, 0]) if len(exact) and pd.notna(exact.iloc[0, 0]) else float("nan")
        rel = abs(r["estimate"] - truth) / abs(truth) if truth else float("nan")
        return {"answer": f"{r['estimate']:.4g} [{r['ci_low']:.4g}, {r['ci_high']:.4g}]",
                "exact": f"{truth:.4g}", "relative_error": rel,
                "covered": bool(r["ci_low"] <= truth <= r["ci_high"])}
    frames, truth = set(approx["frame"]), set(exact["frame"])
    hits = len(frames & truth)
    return {"answer": f"{len(frames)} frames", "exact": f"{len(truth)} frames",
            "recall": hits / len(truth) if truth else float("nan"),
            "precision": hits / len(frames) if frames else float("nan")}


def run_showcase(db, queries: list[ShowcaseQuery], exact_oracle: str, show=None) -> list[dict]:
    """Run each approximate query, then its exact twin with `exact_oracle` (its own cache);
    `show(query, rows, report)` sees each approximate result."""
    rows = []
    for q in queries:
        plan = db.sql("EXPLAIN " + q.approximate).df().iloc[0]
        t0 = time.perf_counter()
        result = db.sql(q.approximate)
        seconds = time.perf_counter() - t0
        approx, report = result.df(), result.report
        if show is not None:
            show(q, approx, report)
        exact = db.sql(f"{q.exact} USING ORACLE {sql_name(exact_oracle)}").df()
        rows.append({"query": q.kind, **score(approx, exact),
                     "labels_used": report.oracle_calls + report.cache_hits,
                     "new_oracle_calls": report.oracle_calls,
                     "explain_estimate": int(plan["estimated_oracle_calls"]),
                     "seconds": seconds, "oracle_seconds": report.oracle_seconds})
    return rows
