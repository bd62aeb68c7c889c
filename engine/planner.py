"""Planner for approximate queries: bind proxy scores and true values, pick and run the
operator, report what it cost. Operators see only arrays and callbacks (vidql.queries)."""
from __future__ import annotations

import time
import zlib

import duckdb
import numpy as np
import pandas as pd

from vidql import queries
from vidql.engine.sql.dialect import Query
from vidql.base.errors import CatalogError, QueryError
from vidql.base.ranges import percent
from vidql.engine.exact import bind_query, kept_sql
from vidql.engine.sql.framestat import (FrameExpr, expr_type, frame_statistic, is_predicate, may_be_null,
                        parse_frame_expr)
from vidql.engine.labels.cache import LabelCache
from vidql.engine.result import Report, Result

OPERATORS = {
    "aggregate": "aggregate with error bound (betting confidence sequence; control variates "
                 "with an index, uniform sampling without)",
    "aggregate_budget": "aggregate under a budget (uniform sample, finite-sample interval; "
                        "ABae stratified sampling for GROUP BY over frame functions)",
    "limit": "LIMIT ranked by proxy (oracle scan in proxy order, GAP suppression)",
    "select_recall": "SUPG selection with a recall target",
    "select_precision": "SUPG selection with a precision target",
    "rare": "EZMODE rare-event search",
}
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")  # frame-function keys
# selections: answered with frame rows, each needs a WHERE over frame functions
SELECTION_KINDS = ("limit", "select_recall", "select_precision", "rare")


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
        bind_query(catalog, q.sql, [self.video], q.clauses.oracle)
        self.cache: LabelCache = catalog.label_cache(self.video, q.clauses.oracle)
        self.population, self.population_ts = self._population(db, q)
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
        _check_runnable(q, self.video, self.index is not None, self.index_note)
        if self.index is not None:  # its representatives' labels are in memory: count there
            self.cache.count_from(self.index.rep_frames, self.index.labels)
        self.before = self.cache.stats.snapshot()
        self.labelled_before = self.cache.labelled_frames

    def _population(self, db, q: Query) -> tuple[np.ndarray, np.ndarray | None]:
        """Global positions (engine/labels/clips.py) of the frames the query's restriction keeps
        (on clip, frame, ts, start_ts), ascending, and, for a query answered with frame
        rows, their `ts` (read in the same statement: a second one to look up the answer's
        rows cost 6 ms, however few, at 10k frames)."""
        rows = q.kind in SELECTION_KINDS
        try:
            got = db.catalog.con.execute(self.kept_sql("ts" if rows else None),
                                         [self.video]).fetchnumpy()
        except duckdb.Error as exc:
            raise QueryError(f"cannot apply the frame restriction {q.restriction!r}: {exc}",
                             q.text, max(q.text.find(q.restriction or ""), 0)) from None
        ts = np.asarray(got["k"], dtype=np.float64) if rows else None
        return np.asarray(got["position"], dtype=np.int64), ts

    def kept_sql(self, key: str | None = None) -> str:
        """`kept_sql` of the query's video and restriction."""
        return kept_sql(self.video, self.q.restriction, self.q.video_alias, key)

    def proxy(self, expr: FrameExpr | None) -> np.ndarray | None:
        """Proxy scores of a frame statistic over the population (None without an index)."""
        if expr is None or self.index is None:
            return None
        return np.asarray(self.index.proxy(frame_statistic(expr)),
                          dtype=np.float64)[self.population]

    def truths(self, *exprs: FrameExpr | str):
        """Callback: positions in the population -> tuple of true values, one array per
        statistic (through the label cache, one lookup for all)."""
        values = self.cache.true_values(*exprs)

        def fn(positions):
            return values(self.frames(positions))
        return self._ahead(fn)

    def truth(self, expr: FrameExpr | str):
        """Callback: positions in the population -> true values of one statistic."""
        values = self.truths(expr)
        return _labels_ahead_as(lambda positions: values(positions)[0], values)

    def frames(self, positions) -> np.ndarray:
        """Frame numbers of positions in the population."""
        return self.population[np.asarray(positions, dtype=np.int64)]

    def _ahead(self, fn):
        """`fn` with `ahead(positions, now)`: an operator names the positions it asks for now
        (the first `now`) and next, in order, so the oracle labels a whole batch of them at
        once (vidql.queries), and the frames it will ask for later are kept as their GOPs
        are decoded (`LabelCache.plan_draws`); `plan(positions)` does the second alone."""
        batch = max(1, int(self.cache.oracle.batch_size))

        def plan(positions):
            done = self.cache.stats.oracle_calls - self.before.oracle_calls
            self.cache.plan_draws(self.frames(positions), done)
            return done

        def ahead(positions, now):
            done = plan(positions)
            self.cache.label_ahead(self.frames(positions[:now + 2 * batch]), now, done)
        fn.ahead, fn.plan = ahead, plan
        return fn

    def frame_rows(self, positions: np.ndarray, verified: np.ndarray) -> pd.DataFrame:
        """Result rows (clip, frame, ts, verified) of positions in the population."""
        positions = np.asarray(positions, dtype=np.int64)
        clip_map = self.cache.clip_map
        ordinal, frame = clip_map.split(self.population[positions])
        return pd.DataFrame({"clip": pd.Series(np.asarray(clip_map.names, dtype=object)[ordinal],
                                               dtype="str"),  # VARCHAR even with no rows
                             "frame": frame, "ts": self.population_ts[positions],
                             "verified": np.asarray(verified, dtype=bool)})

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
        join the index's representatives (cracking: their labels are read now, the index
        grows on the index store's cracking thread while the answer is returned)."""
        report.add_stats(self.cache.stats.since(self.before))
        if crack and self.index is not None:
            new = np.setdiff1d(self.cache.labelled_frames, self.labelled_before)
            t0 = time.perf_counter()
            report.details["cracked_frames"] = self.db.indexes.crack(self.index_name, self.cache, new)
            report.seconds["cracking"] = time.perf_counter() - t0
        return report


def _check_runnable(q: Query, video: str, has_index: bool, index_note: str | None) -> None:
    """Refuse a query its operator cannot run, before any oracle call; queries and
    EXPLAIN share this check, so every plan EXPLAIN shows also runs. A query that needs an
    index gets `index_note` (why the video's index does not serve it) as its hint."""
    group_at = q.text.upper().find("GROUP BY")
    if q.kind in ("aggregate", "aggregate_budget") and q.aggregate is None:
        raise QueryError("ERROR WITHIN and ORACLE BUDGET need an AVG, SUM or COUNT", q.text, 0)
    if q.kind == "aggregate" and q.group_by and not column_groups(q):
        raise QueryError("GROUP BY over frame functions with ERROR WITHIN is not supported "
                         "(each frame's group needs the oracle): use ORACLE BUDGET n, or "
                         "GROUP BY the video table's columns, e.g. floor(ts / 60)",
                         q.text, max(group_at, 0))
    if q.kind in SELECTION_KINDS and (
            predicate_expr(q) is None):
        raise QueryError("this query needs a WHERE clause over frame functions, e.g. "
                         "WHERE contains('bus')", q.text, 0)
    if not has_index and q.kind in ("select_recall", "select_precision"):
        raise QueryError(f"{q.kind.replace('select_', '').upper()} TARGET needs an index for "
                         f"proxy scores: CREATE INDEX ... ON {video} USING TASTI", q.text, 0,
                         hint=index_note)
    if not has_index and q.kind == "rare":
        raise QueryError(f"FIND RARE needs an index for frame embeddings: CREATE INDEX ... "
                         f"ON {video} USING TASTI", q.text, 0, hint=index_note)


def _seed(q: Query) -> int:
    if q.clauses.seed is not None:
        return int(q.clauses.seed)
    return int(np.random.SeedSequence().entropy % (2**31))


def predicate_expr(q: Query) -> FrameExpr | None:
    if q.predicate_expr is not None:
        return q.predicate_expr
    return parse_frame_expr(q.predicate) if q.predicate else None


def query_confidence(q: Query) -> float:
    return q.confidence if q.confidence is not None else 0.95


def run_approximate(db, q: Query) -> Result:
    """Bind and run an approximate query; the relation has the columns of docs/sql.md. The
    binding is its own: an estimate's dry run reads cached labels, which a binding made
    before it would count in the query's report."""
    binding = Binding(db, q)
    seed = _seed(q)
    report = binding.report(q.kind, seed)
    sampling_seed = binding.sampling_seed(seed)  # binding's work: the operator's time starts after
    t0 = time.perf_counter()
    aggregate = q.kind in ("aggregate", "aggregate_budget")
    with binding.cache.labelling(f"{q.kind} on {binding.video}, calling the oracle",
                                    q.clauses.budget):
        frame = run_operator(binding, q, sampling_seed, report)
    report.seconds["total"] = time.perf_counter() - t0
    # aggregates leave the index as it is, so a SEEDed aggregate repeats exactly
    binding.finish(report, crack=not aggregate)
    # real calls; cached labels the operator used are hits (groups by column count their own)
    if "oracle_calls" in frame.columns and not column_groups(q):
        frame["oracle_calls"] = report.oracle_calls
    report.simulated_cost_ms = binding.cache.oracle.simulated_cost_ms
    return Result.of(db.catalog.con, frame, report)


def run_operator(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    """Run the operator the planner picks for `q` with the operators' `seed` on `b`'s proxy
    and true values (`b.truths`: the label cache, or arrays where a caller replaces it, as
    the scale bench does); the relation of docs/sql.md, its guarantee in `report`."""
    aggregate = q.kind in ("aggregate", "aggregate_budget")
    return (_run_aggregate if aggregate else _run_selection)(b, q, seed, report)


def _aggregate_frame(result, scale: float, confidence: float, population: int, groups=None,
                     column: str = "group", calls: int | None = None) -> pd.DataFrame:
    """One aggregate row: the estimate and interval (times `scale`), the new oracle calls,
    the labels the estimate used (new or cached) and the `population`'s size in frames."""
    rows = {"estimate": [result.estimate * scale], "ci_low": [result.ci_low * scale],
            "ci_high": [result.ci_high * scale], "confidence": [confidence],
            "oracle_calls": [int(result.oracle_calls if calls is None else calls)],
            "labels_used": [len(result.frames)], "population_frames": [int(population)]}
    df = pd.DataFrame(rows)
    if groups is not None:
        df.insert(0, column, [groups])
    return df


def group_column(q: Query) -> str:
    """The result's group column: named as the SELECT names the GROUP BY expression (its
    alias, else its text), or the expression's text when the SELECT omits it."""
    wanted = "".join(q.group_by.split()).lower()
    for column in q.columns:
        if "".join(column.text.split()).lower() == wanted:
            return column.alias or column.text
    return q.group_by


def _error_bound_targets(q: Query):
    """(stat, pred, target) of an ERROR WITHIN aggregate. AVG(x) WHERE p is a ratio of
    stat over pred (target None); otherwise target is the per-frame statistic whose mean is
    estimated (None for COUNT(*) without a frame predicate, which needs no oracle)."""
    agg = q.aggregate
    pred = predicate_expr(q)
    arg = agg.expr
    if arg is not None and may_be_null(arg):  # AVG and COUNT skip its NULLs, SUM adds 0
        if not arg.is_frame_statistic:
            raise QueryError(f"{agg.func.upper()}({arg.text}) reads the video table's own "
                             "columns only: it needs no oracle; run it without the vidql "
                             "clauses", q.text, max(q.text.find(arg.text), 0))
        if agg.func != "sum":
            present = f"(({arg.text}) IS NOT NULL)"
            pred = parse_frame_expr(present if pred is None else f"({pred.text}) AND {present}")
        arg = parse_frame_expr(f"coalesce(({arg.text}), 0)")
    stat = arg if arg is not None and agg.func != "count" else None
    if agg.func == "avg" and pred is not None:
        return stat, pred, None
    target = stat if agg.func != "count" else pred
    if target is not None and agg.func == "sum" and pred is not None:
        # SUM(x) WHERE p: per-frame x * p
        target = parse_frame_expr(f"CAST(({target.text}) AS DOUBLE) * "
                                  f"CAST(coalesce(({pred.text}), false) AS DOUBLE)")
    return stat, pred, target


def count_star(q: Query) -> bool:
    """COUNT(*) (or COUNT(x) of an x never NULL) without a frame predicate or frame-function
    GROUP BY: the size of the video table (or of each group), no oracle needed."""
    agg = q.aggregate
    return (agg.func == "count" and predicate_expr(q) is None
            and (agg.expr is None or not may_be_null(agg.expr))
            and (not q.group_by or column_groups(q)))


def error_bound(b: Binding, q: Query, seed: int, report: Report, truths=None):
    """Run the ERROR WITHIN operator; `truths` (default: the oracle through the label
    cache) maps statistics to a callback positions -> values, as Binding.truths does."""
    ratio, fn, proxy, common = _error_bound_operands(b, q, seed, report, truths)
    if ratio:
        return queries.aggregate_ratio_error_bound(b.n, fn, **common)
    return queries.aggregate_error_bound(b.n, fn, proxy=proxy, **common)


def _error_bound_operands(b: Binding, q: Query, seed: int, report: Report, truths):
    """(ratio form?, true-value callback, proxy or None, operator keywords) of an ERROR
    WITHIN aggregate."""
    c = q.clauses
    truths = truths or b.truths
    stat, pred, target = _error_bound_targets(q)
    # the betting confidence sequence holds in finite samples and keeps control variates'
    # gain (an empirical Bernstein bound is dominated by its range term here)
    common = dict(error=c.error, relative=c.error_relative, confidence=query_confidence(q),
                  seed=seed, max_samples=c.budget, bound="betting")
    if target is None:
        common["value_range"] = _value_range(stat, report)
        return True, _pair(b, stat, pred, truths=truths), None, common
    values = truths(target)
    first = _labels_ahead_as(lambda positions: values(positions)[0], values)
    common["value_range"] = _value_range(target, report)
    return False, first, b.proxy(target), common


def column_groups(q: Query) -> bool:
    """GROUP BY over the video table's own columns (no frame function): each frame's group
    is known without the oracle, so every group gets its own run (queries/grouped.py)."""
    return bool(q.group_by) and not _group_expr(q).is_frame_statistic


def _group_expr(q: Query) -> FrameExpr:
    return q.group_expr or parse_frame_expr(q.group_by)


def group_keys(b: Binding, q: Query) -> np.ndarray:
    """Each population frame's GROUP BY key, in population order: one DuckDB statement over
    the video table's rows with the query's restriction, in global-position order."""
    try:
        keys = b.db.catalog.con.execute(b.kept_sql(q.group_by), [b.video]).df()["k"]
    except duckdb.Error as exc:
        raise QueryError(f"cannot compute the GROUP BY key {q.group_by!r} from the video "
                         f"table's columns: {exc}", q.text,
                         max(q.text.find(q.group_by), 0)) from None
    if len(keys) != b.n:
        raise RuntimeError(f"internal: {len(keys)} GROUP BY keys for {b.n} frames")
    return keys.to_numpy()


def group_codes(b: Binding, q: Query) -> tuple[np.ndarray, pd.Index]:
    """(group number per population position, the groups' keys in sorted order, NULL last)."""
    return pd.factorize(pd.Series(group_keys(b, q)), sort=True, use_na_sentinel=False)


def grouped_error_bound(b: Binding, q: Query, seed: int, report: Report, codes: np.ndarray,
                        truths=None):
    """ERROR WITHIN per group (`codes`: a group number per population position), every
    group within its error bound at once; `truths` as in error_bound."""
    ratio, fn, proxy, common = _error_bound_operands(b, q, seed, report, truths)
    return queries.grouped_error_bound(codes, fn, proxy=proxy, ratio=ratio, **common)


def _run_column_groups(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    """GROUP BY the video table's columns: one row per group (NULL keys form one group)."""
    agg, conf = q.aggregate, query_confidence(q)
    codes, keys = group_codes(b, q)
    sizes = np.bincount(codes, minlength=len(keys))
    if count_star(q):
        _counted(report, "each group's frames")
        return pd.DataFrame({group_column(q): keys, "estimate": sizes.astype(float),
                             "ci_low": sizes.astype(float), "ci_high": sizes.astype(float),
                             "confidence": 1.0, "oracle_calls": 0, "labels_used": 0,
                             "population_frames": sizes})
    notes = []
    if q.kind == "aggregate":
        grouped = grouped_error_bound(b, q, seed, report, codes)
        scales = sizes if agg.func != "avg" else np.ones(len(keys))
        report.operator = f"aggregate per group ({grouped.results[0].method})"
        report.guarantee = f"{agg.func.upper()} within {_error_text(q)} in every group"
        shortfalls = [(k, _shortfall(r, f"ORACLE BUDGET's share of {cap}", _error_text(q)))
                      for k, r, cap in zip(keys, grouped.results, grouped.budgets, strict=True)]
        notes = [f"group {k}: {text}" for k, text in shortfalls if text]
        if any(cap_ran_out(r) for r in grouped.results):
            report.guarantee += " (not reached in every group: the cap ran out)"
    else:
        stat, pred, _ = _error_bound_targets(q)
        proxy = _budget_proxy(b, stat, pred, report)
        grouped = queries.grouped_budget(codes, proxy, _pair(b, stat, pred),
                                         budget=q.clauses.budget, agg=agg.func,
                                         confidence=conf, seed=seed, where=pred is not None,
                                         value_range=_value_range(stat, report))
        scales = np.ones(len(keys))
        report.operator = "aggregate under budget per group (uniform sample)"
        report.guarantee = f"{agg.func.upper()} with ≤ {q.clauses.budget} oracle calls in all"
    together = "its one group" if len(keys) == 1 else f"all {len(keys)} groups at once"
    report.guarantee += (f", {percent(conf)} finite-sample intervals holding for {together} "
                         f"({grouped.split})")
    report.details["groups"] = {"count": len(keys), "confidence_each": grouped.group_confidence,
                                "budgets": grouped.budgets}
    new = np.setdiff1d(b.cache.labelled_frames, b.labelled_before)
    calls = np.bincount(codes[np.isin(b.population, new)], minlength=len(keys))
    frame = pd.concat([_aggregate_frame(r, float(s), conf, size, k, group_column(q), int(n))
                       for k, r, s, size, n in zip(keys, grouped.results, scales, sizes, calls,
                                                   strict=True)],
                      ignore_index=True)
    _add_notes(report, notes + [f"group {k}: {r.details['note']}" for k, r in
                                zip(keys, grouped.results, strict=True) if "note" in r.details])
    return frame.astype({"estimate": "Float64", "ci_low": "Float64", "ci_high": "Float64"})


def _error_text(q: Query, n: int | None = None) -> str:
    """The ERROR WITHIN bound in words; a total's bound scales with the frames: `n` of
    them, or N in each group when None."""
    c = q.clauses
    if c.error_relative:
        return f"±{percent(c.error)} (relative error)"
    if q.aggregate.func == "avg":
        return f"±{c.error:g} (absolute error)"
    if n is None:
        return f"±{c.error:g} per frame, ±{c.error:g}·N in total for a group of N frames"
    return f"±{c.error:g} per frame, ±{c.error * n:g} in total (absolute error)"


def _run_aggregate(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    agg = q.aggregate
    conf = query_confidence(q)
    stat, pred, _ = _error_bound_targets(q)
    if column_groups(q):
        return _run_column_groups(b, q, seed, report)
    if count_star(q):
        _counted(report, "the video table")
        return pd.DataFrame({"estimate": [float(b.n)], "ci_low": [float(b.n)],
                             "ci_high": [float(b.n)], "confidence": [1.0], "oracle_calls": [0],
                             "labels_used": [0], "population_frames": [b.n]})
    if q.kind == "aggregate_budget":
        return _run_budget(b, q, seed, report, stat, pred, conf)
    c = q.clauses
    result = error_bound(b, q, seed, report)
    scale = 1.0 if agg.func == "avg" else float(b.n)
    report.operator = f"aggregate ({result.method})"
    bound = _error_text(q, b.n)
    report.guarantee = f"{agg.func.upper()} within {bound} at {percent(conf)} confidence"
    if cap_ran_out(result):
        report.guarantee = (f"{agg.func.upper()} with ≤ {c.budget} oracle calls, {percent(conf)} "
                            f"finite-sample interval (within {bound}: not reached)")
    _add_notes(report, [text for text in [_shortfall(result, f"ORACLE BUDGET of {c.budget}",
                                                     bound)] if text])
    # an estimate or edge the sample cannot support is NULL, never NaN
    return _aggregate_frame(result, scale, conf, b.n).astype(
        {"estimate": "Float64", "ci_low": "Float64", "ci_high": "Float64"})


def _counted(report: Report, what: str) -> None:
    """Report a COUNT(*) answered from the video table (`count_star`): exact, no oracle, no
    seed."""
    report.operator, report.seed = "COUNT(*) of the frames (no oracle call)", None
    report.guarantee = f"exact (COUNT(*) of {what})"


def cap_ran_out(result) -> bool:
    """Whether an ERROR WITHIN result stopped at its oracle-call cap short of its bound."""
    return not result.details["met"] and not result.exact


def _shortfall(result, cap: str, bound: str) -> str | None:
    """What an ERROR WITHIN result did not deliver, in words (None: its bound holds). It
    stops short only at its oracle-call cap (`cap` names it), or, having labelled every
    frame, for an AVG whose predicate no frame satisfies."""
    if result.details["met"]:
        return None
    if result.exact:
        return "no frame satisfies the predicate: the AVG is NULL, as the exact query's is"
    if np.isnan(result.estimate):
        return (f"the {cap} oracle calls ran out with no sampled frame satisfying the "
                "predicate: the estimate is NULL; raise the ORACLE BUDGET")
    if "unbounded" in result.details:
        return (f"the {cap} oracle calls ran out with {result.details['unbounded']}: the "
                "interval is unbounded; raise the ORACLE BUDGET")
    return (f"the {cap} oracle calls ran out before the interval was within {bound}: it "
            f"holds at {percent(result.confidence)} but is wider than asked")


def _value_range(expr: FrameExpr | None, report: Report) -> tuple[float, float] | None:
    """[0, 1] for predicates (a sound range); counts have no a-priori bound, so the operator
    reads their range off the sample, and the report says so."""
    if expr is None or is_predicate(expr):
        return (0.0, 1.0)
    report.details["value_range"] = ("read off the sample: counts have no a-priori bound, so "
                                     "the interval assumes unseen frames stay in that range")
    return None


def _pair(b: Binding, stat: FrameExpr | None, pred: FrameExpr | None, *extra: FrameExpr,
          truths=None):
    """Callback positions -> (statistic values, predicate booleans, *values of `extra`),
    all from one label-cache lookup (or from `truths`, as in error_bound)."""
    exprs = [e for e in (stat, pred) if e is not None] + list(extra)
    truths = (truths or b.truths)(*exprs) if exprs else None  # no statistic: no label needed

    def values(positions):
        positions = np.asarray(positions, dtype=np.int64)
        got = list(truths(positions)) if truths else []
        s = got.pop(0) if stat is not None else np.ones(len(positions))
        p = got.pop(0) > 0 if pred is not None else np.ones(len(positions), dtype=bool)
        return (s, p, *got)

    return _labels_ahead_as(values, truths)


def _labels_ahead_as(fn, source):
    """`fn` labels ahead and plans draws exactly when `source` does (the label cache's
    callbacks do; EXPLAIN's stand-in values must not), so operators can name the frames
    they will ask for next."""
    fn.ahead, fn.plan = getattr(source, "ahead", None), getattr(source, "plan", None)
    return fn


def _run_budget(b: Binding, q: Query, seed: int, report: Report, stat, pred, conf) -> pd.DataFrame:
    agg = q.aggregate
    budget = q.clauses.budget
    group = _group_expr(q) if q.group_by else None
    if group is not None and may_be_null(group):
        raise QueryError(f"GROUP BY {q.group_by} may be NULL on some frames, and a group key "
                         "of frame functions needs a value on every frame", q.text,
                         max(q.text.rfind(q.group_by), 0),
                         hint=f"give those frames a group: GROUP BY coalesce({q.group_by}, -1)")
    notes = []
    report.guarantee = (f"{agg.func.upper()} with ≤ {budget} oracle calls, {percent(conf)} "
                        f"finite-sample interval")
    if group is not None:
        results = queries.aggregate_budget_grouped(_budget_proxy(b, stat, pred, report, group),
                                                   _pair(b, stat, pred, group),
                                                   **_budget_keywords(q, seed, report, stat))
        report.operator = "aggregate under budget, grouped (ABae)"
        report.guarantee += f", all {len(results)} groups at once"
        kind = expr_type(group)
        key = bool if kind == "BOOLEAN" else int if kind in INTEGER_TYPES else float
        ordered = sorted((key(g), r) for g, r in results.items())
        frame = pd.concat([_aggregate_frame(r, 1.0, conf, b.n, g, group_column(q))
                           for g, r in ordered], ignore_index=True)
        notes += [f"group {g}: {r.details['note']}" for g, r in ordered if "note" in r.details]
        notes.append("the groups are the key values found in the sampled frames: a value "
                     "on no sampled frame has no row")
    else:
        result = budget_result(b, q, seed, report)
        report.operator = f"aggregate under budget ({result.method})"
        frame = _aggregate_frame(result, 1.0, conf, b.n)
        notes += [result.details["note"]] if "note" in result.details else []
    _add_notes(report, notes)
    # an estimate or edge the sample cannot support is NULL, never NaN
    return frame.astype({"estimate": "Float64", "ci_low": "Float64", "ci_high": "Float64"})


def budget_result(b: Binding, q: Query, seed: int, report: Report, truths=None):
    """Run the ORACLE BUDGET operator of an aggregate without GROUP BY; `truths` as in
    error_bound."""
    stat, pred, _ = _error_bound_targets(q)
    return queries.aggregate_budget(_budget_proxy(b, stat, pred, report),
                                    _pair(b, stat, pred, truths=truths), where=pred is not None,
                                    **_budget_keywords(q, seed, report, stat))


def _budget_keywords(q: Query, seed: int, report: Report, stat) -> dict:
    """The ORACLE BUDGET operators' keywords besides the proxy and the true values."""
    return dict(budget=q.clauses.budget, agg=q.aggregate.func, confidence=query_confidence(q),
                seed=seed, value_range=_value_range(stat, report))


def _add_notes(report: Report, notes: list[str]) -> None:
    """Append notes to the report's note."""
    notes = [report.details["note"], *notes] if "note" in report.details else notes
    if notes:
        report.details["note"] = "; ".join(notes)


def _budget_proxy(b: Binding, stat, pred, report: Report, group=None) -> np.ndarray:
    """The budget operators' proxy: the predicate's, else the statistic's, else the
    frame-function GROUP BY key's (COUNT(*) per group); zeros without an index, noted."""
    expr = next((e for e in (pred, stat, group) if e is not None), None)
    proxy = b.proxy(expr)
    if proxy is None:  # no index: no control variate, and ABae's strata are random
        report.details["note"] = "no index: no proxy to help the sample (control variate, strata)"
        return np.zeros(b.n)
    return proxy


def run_recall(proxy, is_true, c, conf: float, seed: int):
    """RECALL TARGET: randomized exact binomial test with the unspent labels trimming the
    answer (default), adaptive with UP TO, or SUPG's normal approximation with APPROXIMATE.
    Returns (result, how the guarantee holds)."""
    common = dict(target=c.recall_target, confidence=conf, seed=seed)
    if c.approximate:
        return (queries.recall_normal(proxy, is_true, budget=c.budget, **common),
                "APPROXIMATE: normal approximation, not finite-sample")
    if c.budget_up_to:
        result = queries.recall_adaptive(proxy, is_true, max_budget=c.budget, **common)
        return result, (f"finite-sample, adaptive: {result.details['labels_used']} labels "
                        f"of up to {c.budget}")
    return queries.recall_randomized(proxy, is_true, budget=c.budget, **common), "finite-sample"


def _run_selection(b: Binding, q: Query, seed: int, report: Report) -> pd.DataFrame:
    pred = predicate_expr(q)
    truth = b.truth(pred)
    is_true = _labels_ahead_as(lambda positions: truth(positions) > 0, truth)
    proxy = b.proxy(pred)
    c = q.clauses
    if q.kind == "limit":
        ranking = proxy if proxy is not None else np.zeros(b.n)
        # batches never exceed the hits still needed, so at most LIMIT - 1 extra calls
        result = queries.limit_query(
            ranking, is_true, k=q.limit, gap=c.gap or 0, seed=seed, max_calls=c.budget,
            batch=b.cache.oracle.batch_size,
            coordinates=b.cache.clip_map.gap_coordinates(b.population, c.gap or 0))
        report.guarantee = f"up to {q.limit} oracle-confirmed frames, ≥ {c.gap or 0} frames apart"
    elif q.kind in ("select_recall", "select_precision"):
        conf = query_confidence(q)
        if q.kind == "select_recall":
            result, mode = run_recall(proxy, is_true, c, conf, seed)
            report.guarantee = (f"recall ≥ {percent(c.recall_target)} with probability {percent(conf)}"
                                f" ({mode})")
        else:
            result = queries.supg_precision(proxy, is_true, target=c.precision_target,
                                            confidence=conf, budget=c.budget, seed=seed)
            report.guarantee = f"precision ≥ {percent(c.precision_target)} with probability {percent(conf)}"
    elif q.kind == "rare":
        embeddings = np.asarray(b.index.embeddings)[b.population]
        result = queries.find_rare(embeddings, is_true, budget=c.budget, seed=seed, proxy=proxy)
        report.guarantee = f"as many distinct positives as {c.budget} oracle calls find (no recall guarantee)"
    else:
        raise QueryError(f"unsupported query kind {q.kind}", q.text, 0)
    report.operator = {"limit": "LIMIT (proxy-ranked scan)" if proxy is not None
                       else "LIMIT (random-order scan: no index)",
                       "select_recall": f"recall target ({result.details.get('method')})",
                       "select_precision": "SUPG precision", "rare": "EZMODE"}[q.kind]
    report.details.update(getattr(result, "details", {}) or {})
    positions = np.asarray(result.frames, dtype=np.int64)
    # EZMODE returns only oracle-confirmed positives; selections say which they confirmed
    verified = getattr(result, "verified", np.ones(len(positions), dtype=bool))
    return b.frame_rows(positions, verified)
