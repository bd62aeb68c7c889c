"""The planner's choice between sampling and the exact scan. An approximate aggregate whose
sampling EXPLAIN prices above the exact scan of the same frames (long GOPs decoded again in
rounds, where the query cannot keep their frames for later rounds, can cost more than one
pass over the video) runs the scan instead; its answer is
then exact, and its report says why. `SET SAMPLING = 'always'` keeps sampling."""
from __future__ import annotations

import pandas as pd

from vidql.engine.explain import estimate_approximate
from vidql.engine.planner import Binding
from vidql.engine.pricing import known_ms
from vidql.engine.result import Result
from vidql.engine.sql.dialect import Query


def scan_is_cheaper(db, q: Query) -> str | None:
    """Why `q` should be answered by the exact scan, or None to sample: only an ungrouped
    aggregate whose oracle reads pixels (else decoding costs nothing and sampling is always
    cheaper) and has been timed (so that pricing labels no frame)."""
    if db.sampling == "always" or q.kind not in ("aggregate", "aggregate_budget") or q.group_by:
        return None
    b = Binding(db, q)  # refuses what the query refuses, as the query would
    if not b.cache.oracle.needs_pixels or known_ms(db.catalog, b.cache.oracle) is None:
        return None
    _, plan, scan = estimate_approximate(db, q, b)
    if plan.seconds is None or scan.seconds is None or scan.seconds >= plan.seconds:
        return None
    return (f"the exact scan ({scan.calls} labels, about {scan.seconds:.1f} s) was priced below "
            f"sampling ({plan.calls} labels decoded in rounds, about {plan.seconds:.1f} s), so "
            "the answer is exact; SET SAMPLING = 'always' samples anyway")


def as_aggregate(db, exact: Result, q: Query, why: str) -> Result:
    """The exact scan's one value in the columns of an approximate aggregate (estimate,
    ci_low, ci_high, confidence, oracle_calls, labels_used, population_frames), with `why` in
    its report."""
    value = exact.fetchone()[0]
    value = None if value is None else float(value)
    report = exact.report
    row = {"estimate": [value], "ci_low": [value], "ci_high": [value], "confidence": [1.0],
           "oracle_calls": [report.oracle_calls],
           "labels_used": [report.oracle_calls + report.cache_hits],
           "population_frames": [Binding(db, q).n]}
    report.operator = f"exact scan instead of {q.kind.replace('_', ' ')}"
    report.guarantee = "exact"
    report.details["note"] = "; ".join(filter(None, [report.details.get("note"), why]))
    frame = pd.DataFrame(row).astype({"estimate": "Float64", "ci_low": "Float64", "ci_high": "Float64"})
    return Result.of(db.catalog.con, frame, report)
