"""Planner for approximate queries: bind proxy scores and true values, pick and run the
operator, report what it cost. Operators see only arrays and callbacks (vidql.queries)."""
from __future__ import annotations

import time
import zlib

import duckdb
import numpy as np
import pandas as pd

from .catalog import _quote
from .dialect import Query
from .errors import CatalogError, QueryError
from .framestat import FrameExpr, is_predicate, parse_frame_expr
from .labelcache import LabelCache
from .result import Report, Result

OPERATORS = {
    "aggregate": "aggregate with error bound (betting confidence sequence; control variates "
                 "with an index, uniform sampling without)",
    "aggregate_budget": "aggregate under a budget (ABae stratified sampling)",
    "limit": "LIMIT ranked by proxy (oracle scan in proxy order, GAP suppression)",
    "select_recall": "SUPG selection with a recall target",
    "select_precision": "SUPG selection with a precision target",
    "rare": "EZMODE rare-event search",
}


class Binding:
    """One approximate query bound to its video, population, oracle cache and index."""

    def __init__(self, db, q: Query):
        if q.video is None:
            raise QueryError("an approximate query reads exactly one video table in FROM", q.text, 0)
        catalog = db.catalog
        try:
            self.video = catalog.video_row(q.video)["name"]
        except CatalogError as exc:
            raise QueryError(str(exc), q.text, max(q.text.find(q.video), 0)) from None
        self.db = db
        self.q = q
        self.cache: LabelCache = catalog.label_cache(self.video, q.clauses.oracle)
        self.population = self._population(db, q)
        self.n = len(self.population)
        if self.n == 0:
            raise QueryError("the query's frame restriction keeps no frames", q.text, 0)
        self.index_name, self.index = db.indexes.for_video(self.video, q.clauses.index,
                                                           self.cache.oracle.identity)
        self.index_note = None
        if self.index is None:
            others = db.indexes.other_oracle_indexes(self.video, self.cache.oracle.identity)
            if others:
                self.index_note = (f"index {', '.join(others)} was built with another oracle, "
                                   f"so this query runs without one; USING ORACLE picks that oracle")
        self.before = self.cache.stats.snapshot()
        self.labelled_before = self.cache.labelled_frames

    def _population(self, db, q: Query) -> np.ndarray:
        sql = f"SELECT frame FROM main.{_quote(self.video)}"
        if q.restriction:
            sql += f" WHERE {q.restriction}"
        try:
            frames = db.catalog.con.execute(sql + " ORDER BY frame").fetchnumpy()["frame"]
        except duckdb.Error as exc:
            raise QueryError(f"cannot apply the frame restriction {q.restriction!r}: {exc}",
                             q.text, max(q.text.find(q.restriction or ""), 0)) from None
        return np.asarray(frames, dtype=np.int64)

    def proxy(self, expr: FrameExpr | None) -> np.ndarray | None:
        """Proxy scores of a frame statistic over the population (None without an index)."""
        if expr is None or self.index is None:
            return None
        return np.asarray(self.index.proxy(expr), dtype=np.float64)[self.population]

    def truths(self, *exprs: FrameExpr | str):
        """Callback: positions in the population -> tuple of true values, one array per
        statistic (through the label cache, one lookup for all)."""
        values = self.cache.true_values(*exprs)
        return self._ahead(lambda positions: values(self.frames(positions)))

    def truth(self, expr: FrameExpr | str):
        """Callback: positions in the population -> true values of one statistic."""
        values = self.truths(expr)
        return self._ahead(lambda positions: values(positions)[0])

    def frames(self, positions) -> np.ndarray:
        """Frame numbers of positions in the population."""
        return self.population[np.asarray(positions, dtype=np.int64)]

    def _ahead(self, fn):
        """`fn` with `ahead(positions, now)`: an operator names the positions it asks for now
        (the first `now`) and next, in order, so the oracle labels a whole batch of them at
        once (vidql.queries)."""
        batch = max(1, int(self.cache.oracle.batch_size))
        fn.ahead = lambda positions, now: self.cache.label_ahead(
            self.frames(positions[:now + 2 * batch]), now)
        return fn

    def timestamps(self, frames: np.ndarray) -> np.ndarray:
        ts = self.db.catalog.con.execute(f"SELECT ts FROM main.{_quote(self.video)} ORDER BY frame"
                                 ).fetchnumpy()["ts"]
        return np.asarray(ts)[frames]

    def report(self, operator: str, seed: int | None = None) -> Report:
        """A report naming this query's video, oracle and index (or why it has none)."""
        report = Report(operator=operator, video=self.video, oracle=self.cache.oracle.name,
                        index=self.index_name, seed=seed)
        if self.index_note:
            report.details["index_note"] = self.index_note
        return report

    def sampling_seed(self, seed: int) -> int:
        """The operators' seed: the user's SEED mixed with the index's representatives, so a
        rerun on the same index repeats exactly, while an index cracked with a sample's frames
        (proxies exact there) never draws that same sample again, which would void the bound."""
        if self.index is None:
            return seed
        reps = np.sort(np.asarray(self.index.rep_frames, dtype=np.int64))
        state = zlib.crc32(reps.tobytes())
        return int(np.random.SeedSequence([seed, state]).generate_state(1)[0] % (2**31))

    def finish(self, report: Report, crack: bool = True) -> Report:
        """Record labelling costs; with `crack`, frames the oracle labelled for this query
        join the index's representatives (cracking)."""
        report.add_stats(self.cache.stats.since(self.before))
        if crack and self.index is not None:
            new = np.setdiff1d(self.cache.labelled_frames, self.labelled_before)
            t0 = time.perf_counter()
            report.details["cracked_frames"] = self.db.indexes.crack(self.index_name, self.cache, new)
            report.seconds["cracking"] = time.perf_counter() - t0
        return report


def _seed(q: Query) -> int:
    if q.clauses.seed is not None:
        return int(q.clauses.seed)
    return int(np.random.SeedSequence().entropy % (2**31))


def _predicate_expr(q: Query) -> FrameExpr | None:
    if q.predicate_expr is not None:
        return q.predicate_expr
    return parse_frame_expr(q.predicate) if q.predicate else None


def _confidence(q: Query) -> float:
    return q.confidence if q.confidence is not None else 0.95


def run_approximate(db, q: Query) -> Result:
    """Bind and run an approximate query; the relation has the columns of docs/sql.md."""
    binding = Binding(db, q)
    seed = _seed(q)
    report = binding.report(q.kind, seed)
    t0 = time.perf_counter()
    aggregate = q.kind in ("aggregate", "aggregate_budget")
    run = _run_aggregate if aggregate else _run_selection
    with binding.cache.progress_bar(f"{q.kind} on {binding.video}, calling the oracle",
                                    q.clauses.budget):
        frame = run(binding, q, binding.sampling_seed(seed), report)
    report.seconds["total"] = time.perf_counter() - t0
    # aggregates leave the index as it is, so a SEEDed aggregate repeats exactly
    binding.finish(report, crack=not aggregate)
    if "oracle_calls" in frame.columns:  # real calls; cached labels the operator used are hits
        frame["oracle_calls"] = report.oracle_calls
    report.simulated_cost_ms = binding.cache.oracle.simulated_cost_ms
    return Result.of(db.catalog.con, frame, report)


def _aggregate_frame(result, scale: float, confidence: float, groups=None) -> pd.DataFrame:
    rows = {"estimate": [result.estimate * scale], "ci_low": [result.ci_low * scale],
            "ci_high": [result.ci_high * scale], "confidence": [confidence],
            "oracle_calls": [int(result.oracle_calls)], "frames": [len(result.frames)]}
    df = pd.DataFrame(rows)
    if groups is not None:
        df.insert(0, "group", [groups])
    return df


def _run_aggregate(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    from vidql import queries

    agg = q.aggregate
    if agg is None:
        raise QueryError("ERROR WITHIN and ORACLE BUDGET need an AVG, SUM or COUNT", q.text, 0)
    conf = _confidence(q)
    pred = _predicate_expr(q)
    stat = agg.expr if agg.expr is not None and agg.func != "count" else None
    if q.kind == "aggregate_budget":
        return _run_budget(b, q, seed, report, stat, pred, conf)
    if q.group_by:
        raise QueryError("GROUP BY with ERROR WITHIN is not supported; use ORACLE BUDGET n "
                         "for grouped approximate aggregates", q.text, q.text.upper().find("GROUP BY"))
    c = q.clauses
    # the betting confidence sequence holds in finite samples and keeps control variates'
    # gain (an empirical Bernstein bound is dominated by its range term here)
    common = dict(error=c.error, relative=c.error_relative, confidence=conf, seed=seed,
                  max_samples=c.budget, bound="betting")
    if agg.func == "avg" and pred is not None:
        result = queries.aggregate_ratio_error_bound(b.n, _pair(b, stat, pred),
                                                     value_range=_value_range(stat, report),
                                                     **common)
        scale = 1.0
    else:
        target = stat if agg.func != "count" else pred
        if target is None:  # COUNT(*) without a frame predicate: no oracle needed
            report.guarantee = "exact (COUNT(*) of the video table)"
            return pd.DataFrame({"estimate": [float(b.n)], "ci_low": [float(b.n)],
                                 "ci_high": [float(b.n)], "confidence": [1.0], "oracle_calls": [0],
                                 "frames": [0]})
        if agg.func == "sum" and pred is not None:  # SUM(x) WHERE p: per-frame x * p
            target = parse_frame_expr(f"CAST(({target.text}) AS DOUBLE) * "
                                      f"CAST(({pred.text}) AS DOUBLE)")
        values, proxy = b.truth(target), b.proxy(target)
        result = queries.aggregate_error_bound(b.n, values, proxy=proxy,
                                               value_range=_value_range(target, report), **common)
        scale = 1.0 if agg.func == "avg" else float(b.n)
    report.operator = f"aggregate ({result.method})"
    if c.error_relative:
        bound = f"±{c.error * 100:g}% (relative error)"
    elif agg.func == "avg":
        bound = f"±{c.error:g} (absolute error)"
    else:  # the bound holds for the per-frame mean; the total scales it by the frame count
        bound = f"±{c.error:g} per frame, ±{c.error * b.n:g} in total (absolute error)"
    report.guarantee = f"{agg.func.upper()} within {bound} at {conf:.0%} confidence"
    return _aggregate_frame(result, scale, conf)


def _value_range(expr: FrameExpr | None, report: Report) -> tuple[float, float] | None:
    """[0, 1] for predicates (a sound range); counts have no a-priori bound, so the operator
    reads their range off the sample, and the report says so."""
    if expr is None or is_predicate(expr):
        return (0.0, 1.0)
    report.details["value_range"] = ("read off the sample: counts have no a-priori bound, so "
                                     "the interval assumes unseen frames stay in that range")
    return None


def _pair(b: Binding, stat: FrameExpr | None, pred: FrameExpr | None, *extra: FrameExpr):
    """Callback positions -> (statistic values, predicate booleans, *values of `extra`),
    all from one label-cache lookup."""
    exprs = [e for e in (stat, pred) if e is not None] + list(extra)
    truths = b.truths(*exprs) if exprs else None  # no statistic: no label needed

    def values(positions):
        positions = np.asarray(positions, dtype=np.int64)
        got = list(truths(positions)) if truths else []
        s = got.pop(0) if stat is not None else np.ones(len(positions))
        p = got.pop(0) > 0 if pred is not None else np.ones(len(positions), dtype=bool)
        return (s, p, *got)

    return b._ahead(values) if truths else values


def _run_budget(b: Binding, q: Query, seed: int, report: Report, stat, pred, conf) -> pd.DataFrame:
    from vidql import queries

    agg = q.aggregate
    budget = q.clauses.budget
    proxy = b.proxy(pred) if pred is not None else b.proxy(stat)
    if proxy is None:
        proxy = np.zeros(b.n)  # no index: strata are random, ABae degrades to uniform sampling
        report.details["note"] = "no index: stratification by proxy unavailable"
    report.guarantee = f"{agg.func.upper()} with ≤ {budget} oracle calls, {conf:.0%} bootstrap interval"
    if q.group_by:
        group = q.group_expr or parse_frame_expr(q.group_by)
        results = queries.aggregate_budget_grouped(
            proxy, _pair(b, stat, pred, group), budget=budget, agg=agg.func,
            confidence=conf, seed=seed)
        report.operator = "aggregate under budget, grouped (ABae)"
        frames = [_aggregate_frame(r, 1.0, conf, g) for g, r in sorted(results.items())]
        return pd.concat(frames, ignore_index=True)
    result = queries.aggregate_budget(proxy, _pair(b, stat, pred), budget=budget, agg=agg.func,
                                      confidence=conf, seed=seed)
    report.operator = f"aggregate under budget ({result.method})"
    return _aggregate_frame(result, 1.0, conf)


def _run_selection(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    from vidql import queries

    pred = _predicate_expr(q)
    if pred is None:
        raise QueryError("this query needs a WHERE clause over frame functions, e.g. "
                         "WHERE contains('bus')", q.text, 0)
    truth = b.truth(pred)
    is_true = lambda positions: truth(positions) > 0
    proxy = b.proxy(pred)
    c = q.clauses
    if q.kind == "limit":
        ranking = proxy if proxy is not None else np.zeros(b.n)
        # batches never exceed the hits still needed, so at most LIMIT - 1 extra calls
        result = queries.limit_query(ranking, is_true, k=q.limit, gap=c.gap or 0, seed=seed,
                                     max_calls=c.budget, batch=b.cache.oracle.batch_size)
        report.guarantee = f"up to {q.limit} oracle-confirmed frames, ≥ {c.gap or 0} frames apart"
    elif q.kind in ("select_recall", "select_precision"):
        if proxy is None:
            raise QueryError(f"{q.kind.replace('select_', '').upper()} TARGET needs an index for "
                             f"proxy scores: CREATE INDEX ... ON {b.video} USING TASTI", q.text, 0)
        conf = _confidence(q)
        if q.kind == "select_recall":
            # half the samples uniform: certifying recall needs the low-proxy region sampled
            result = queries.supg_recall(proxy, is_true, target=c.recall_target, uniform_mix=0.5,
                                         confidence=conf, budget=c.budget, seed=seed)
            report.guarantee = f"recall ≥ {c.recall_target:.0%} with probability {conf:.0%}"
        else:
            result = queries.supg_precision(proxy, is_true, target=c.precision_target,
                                            confidence=conf, budget=c.budget, seed=seed)
            report.guarantee = f"precision ≥ {c.precision_target:.0%} with probability {conf:.0%}"
    elif q.kind == "rare":
        if b.index is None:
            raise QueryError(f"FIND RARE needs an index for frame embeddings: CREATE INDEX ... "
                             f"ON {b.video} USING TASTI", q.text, 0)
        embeddings = np.asarray(b.index.embeddings)[b.population]
        result = queries.find_rare(embeddings, is_true, budget=c.budget, seed=seed, proxy=proxy)
        report.guarantee = f"as many distinct positives as {c.budget} oracle calls find (no recall guarantee)"
    else:
        raise QueryError(f"unsupported query kind {q.kind}", q.text, 0)
    report.operator = {"limit": "LIMIT (proxy-ranked scan)", "select_recall": "SUPG recall",
                       "select_precision": "SUPG precision", "rare": "EZMODE"}[q.kind]
    report.details.update(getattr(result, "details", {}) or {})
    positions = np.asarray(result.frames, dtype=np.int64)
    frames = b.population[positions]
    # EZMODE returns only oracle-confirmed positives; selections say which they confirmed
    verified = getattr(result, "verified", np.ones(len(positions), dtype=bool))
    return pd.DataFrame({"frame": frames, "ts": b.timestamps(frames),
                         "verified": np.asarray(verified, dtype=bool)})


# ---- EXPLAIN ------------------------------------------------------------------------------

def explain(db, q: Query) -> Result:
    """The plan and its estimated oracle calls and seconds, without calling the oracle."""
    if q.kind == "exact":
        report = Report(operator="exact")
        calls = _estimate_exact(db, q, report)
    else:
        b = Binding(db, q)
        report = b.report(OPERATORS[q.kind])
        calls = _estimate_approximate(b, q, report)
        oracle = b.cache.oracle
        report.simulated_cost_ms = oracle.simulated_cost_ms
        ms = oracle.simulated_cost_ms if oracle.simulated_cost_ms is not None else \
            db.catalog.measured_ms_per_frame(oracle.identity)
        report.estimated_seconds = None if ms is None else calls * ms / 1000
        if oracle.simulated_cost_ms is not None:
            report.details["seconds"] = "seconds simulated from the oracle's cost_ms"
    report.estimated_calls = int(calls)
    row = {"operator": report.operator, "video": report.video, "oracle": report.oracle,
           "index": report.index, "estimated_oracle_calls": report.estimated_calls,
           "estimated_seconds": report.estimated_seconds,
           "note": "; ".join(filter(None, [report.details.get("estimate"),
                                           report.details.get("seconds"),
                                           report.details.get("index_note")]))}
    return Result.of(db.catalog.con, pd.DataFrame([row]), report)


def _estimate_exact(db, q: Query, report: Report) -> int:
    total = 0
    names = {v.lower(): v for v in db.catalog.video_names()}
    for table in q.tables:
        video = names.get(table.split(".")[0].lower())
        if video is None:
            continue
        cache = db.catalog.label_cache(video, q.clauses.oracle)
        lo, hi = q.frame_range or (0, None)
        hi = cache.n_frames - 1 if hi is None else min(hi, cache.n_frames - 1)
        wanted = np.arange(lo, hi + 1)
        total += int((~np.isin(wanted, cache.labelled_frames)).sum())
        report.video, report.oracle = video, cache.oracle.name
    report.details["estimate"] = "frames in range not yet in the label cache"
    return total


def _estimate_approximate(b: Binding, q: Query, report: Report) -> int:
    c = q.clauses
    if q.kind in ("aggregate_budget", "select_recall", "select_precision", "rare"):
        report.details["estimate"] = "the ORACLE BUDGET"
        return int(c.budget)
    pred = _predicate_expr(q)
    if q.kind == "limit":
        proxy = b.proxy(pred)
        if proxy is None:
            report.details["estimate"] = "no index: a random-order scan, up to every frame"
            return b.n
        order = np.argsort(-proxy, kind="stable")
        hits, taken = 0, []
        for pos, p in enumerate(proxy[order]):
            if p >= 0.5 and all(abs(order[pos] - t) > (c.gap or 0) for t in taken):
                taken.append(order[pos])
                hits += 1
                if hits == q.limit:
                    report.details["estimate"] = "scan depth until the proxy shows LIMIT hits"
                    return min(pos + 1, c.budget or b.n)
        return min(b.n, c.budget or b.n)
    # aggregate: a dry run of the operator's stopping rule (betting bound, uniform sampling)
    # with the proxy standing in for the truth; no oracle call
    from vidql import queries

    agg = q.aggregate
    target = agg.expr if agg is not None and agg.expr is not None and agg.func != "count" else pred
    proxy = b.proxy(target)
    if proxy is None:
        stand_in, value_range = (np.arange(b.n) % 2).astype(np.float64), (0.0, 1.0)
        report.details["estimate"] = "no index: assumes values in [0, 1] with the widest spread"
    else:
        value_range = _value_range(target, report)
        stand_in = proxy if value_range is None else np.clip(proxy, *value_range)
        report.details["estimate"] = ("the stopping rule run on the proxy in place of the truth "
                                      "(uniform sampling; control variates usually need fewer)")
    if c.error_relative and not stand_in.any():
        return b.n  # a relative error of a zero answer: every frame
    result = queries.aggregate_error_bound(
        b.n, lambda positions: stand_in[positions], error=c.error, relative=c.error_relative,
        confidence=_confidence(q), seed=0, max_samples=c.budget, bound="betting",
        value_range=value_range)
    return int(result.oracle_calls)
