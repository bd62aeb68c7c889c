"""EXPLAIN: a query's plan and its estimated oracle calls and seconds, without calling the
oracle. ERROR WITHIN and LIMIT are estimated by a dry run of the operator itself on stand-in
values (StandIn); budgeted kinds by their budget less what is labelled already, an ORACLE
BUDGET aggregate with a forecast from the same stand-ins of the interval its budget buys
and the labels one half as wide needs. Seconds are the oracle's plus decoding's: each
labelling call decodes its frames' GOPs from their keyframes (engine/pricing.py), so a dry
run's rounds are priced one by one, except ERROR WITHIN's, whose later rounds find their
frames kept from the GOPs decoded before (engine/labels/decoded.py: `decode_planned`)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vidql import queries
from vidql.engine.sql.dialect import Query
from vidql.engine.exact import bind_query, label_bounds, label_reads, needed_frames
from vidql.engine.sql.framestat import FrameExpr, frame_statistic, is_predicate
from vidql.engine.planner import (OPERATORS, Binding, budget_result, cap_ran_out, column_groups,
                                  count_star, error_bound, group_codes, grouped_error_bound,
                                  predicate_expr, query_confidence)
from vidql.engine.pricing import (TIMING_FRAMES, Price, decode_planned,
                                  decode_seconds, oracle_ms, price, uniform_draw)
from vidql.engine.result import Report, Result
from vidql.queries import selection_forecast


def explain(db, q: Query) -> Result:
    """The plan, its estimated oracle calls and seconds (the oracle's and decoding's), and
    the exact scan's beside it, without calling the oracle (but to time one never timed)."""
    if q.kind == "exact":
        report = Report(operator="exact")
        plan = scan = _estimate_exact(db, q, report)
    else:
        report, plan, scan = estimate_approximate(db, q)
    report.estimated_calls = plan.calls
    report.estimated_seconds = plan.seconds
    row = {"operator": report.operator, "video": report.video, "oracle": report.oracle,
           "index": report.index, "estimated_oracle_calls": report.estimated_calls,
           "estimated_seconds": plan.seconds, "estimated_decode_seconds": plan.decode_seconds,
           "exact_scan_oracle_calls": scan.calls, "exact_scan_seconds": scan.seconds,
           "note": "; ".join(filter(None, [report.details.get("estimate"),
                                           report.details.get("seconds"),
                                           report.details.get("index_note")]))}
    return Result.of(db.catalog.con, pd.DataFrame([row]), report)


def estimate_approximate(db, q: Query, b: Binding | None = None) -> tuple[Report, Price, Price]:
    """(the plan's report, its price, the exact scan's price) of an approximate query (bound
    by `b`, else bound here)."""
    b = b or Binding(db, q)
    report = b.report(OPERATORS[q.kind])
    ms, how = oracle_ms(db.catalog, b.cache, uniform_draw(b.population, b.cache.labelled_frames,
                                                          TIMING_FRAMES))
    calls, batches = _estimate_approximate(b, q, report)
    if batches is None:  # a budgeted kind: its draws priced as one uniform sample
        batches = [uniform_draw(b.population, b.cache.labelled_frames, calls)]
    fresh = b.population[~np.isin(b.population, b.cache.labelled_frames)]
    if q.kind == "aggregate":  # ERROR WITHIN plans its draws: GOPs decoded once
        decoding = decode_planned(db.catalog, b.video, b.cache, batches,
                                  _planned_draws(batches, fresh, q.clauses.budget))
    elif q.kind == "limit" and len(batches) > 1:  # so does LIMIT after its first batch
        decoding = decode_planned(db.catalog, b.video, b.cache, batches,
                                  _ranked_draws(batches, _ranked(b, q, fresh)))
    else:  # each labelling call decodes its frames' GOPs again
        decoding = decode_seconds(db.catalog, b.video, b.cache, batches)
    plan = Price(int(calls), None if ms is None else calls * ms / 1000, decoding.seconds,
                 decoding.frames, decoding.writing)
    report.simulated_cost_ms = b.cache.oracle.simulated_cost_ms
    if how:
        report.details["seconds"] = how
    _note_writing(plan, report)
    return report, plan, price(db.catalog, b.video, b.cache, fresh, ms)


def _note_writing(plan: Price, report: Report) -> None:
    """Say in the report that the plan's seconds include writing 'auto' oracle renditions."""
    if plan.writing_seconds:
        note = (f"includes writing the oracle rendition first (about {plan.writing_seconds:.1f}"
                " s, once: later queries read it)")
        report.details["seconds"] = "; ".join(filter(None, [report.details.get("seconds"), note]))


def _rare_rounds(b: Binding, q: Query, calls: int) -> list[np.ndarray]:
    """FIND RARE's labelling calls as EXPLAIN prices them: rounds of RARE_BATCH frames in
    the predicate proxy's order (its first round's; later rounds' classifier and the
    flood-fill around positives keep to such frames and their neighbours, whose GOPs a
    uniform sample of as many frames would not share)."""
    fresh = _ranked(b, q, b.population[~np.isin(b.population, b.cache.labelled_frames)])[:calls]
    return [fresh[i:i + queries.RARE_BATCH] for i in range(0, fresh.size, queries.RARE_BATCH)]


def _ranked(b: Binding, q: Query, frames: np.ndarray) -> np.ndarray:
    """`frames` (global positions in the population) in the order of the query predicate's
    proxy, highest first (as they are without an index)."""
    proxy = b.proxy(predicate_expr(q))
    if proxy is None:
        return frames
    score = proxy[np.searchsorted(b.population, frames)]
    return frames[np.argsort(-score, kind="stable")]


def _ranked_draws(rounds: list[np.ndarray], ranked: np.ndarray) -> np.ndarray:
    """LIMIT's draw order as the engine is told it: the dry run's batches, then the other
    frames not labelled yet along the ranking."""
    drawn = np.concatenate(rounds) if rounds else ranked[:0]
    return np.concatenate([drawn, ranked[~np.isin(ranked, drawn)]])


def _planned_draws(rounds: list[np.ndarray], fresh: np.ndarray, cap: int | None) -> np.ndarray:
    """ERROR WITHIN's draw order as the engine is told it: the dry run's draws, then the
    other frames not labelled yet in a random order (the rest of its permutation), up to
    its cap."""
    drawn = np.concatenate(rounds) if rounds else fresh[:0]
    rest = np.random.default_rng(0).permutation(fresh[~np.isin(fresh, drawn)])
    return np.concatenate([drawn, rest])[:cap]


def estimated_calls(q: Query, b: Binding) -> int:
    """EXPLAIN's estimate of the oracle calls of approximate query `q` (bound by `b`),
    without pricing them: nothing is labelled, not even to time a new oracle."""
    return int(_estimate_approximate(b, q, b.report(OPERATORS[q.kind]))[0])


def _estimate_selection(proxy: np.ndarray, q: Query, report: Report) -> int:
    """RECALL/PRECISION TARGET: with the proxy taken as calibrated, the set the budget would
    certify (size, precision, recall) and the budgets for a set within 2x and 5x of the
    estimated positives; returns the oracle calls it expects to spend."""
    c = q.clauses
    target = c.recall_target if q.kind == "select_recall" else c.precision_target
    kind = "recall" if q.kind == "select_recall" else "precision"
    forecast = selection_forecast(proxy, kind, target, query_confidence(q), c.budget,
                                  adaptive=c.budget_up_to)
    report.details.update(forecast)
    text = (f"proxy taken as calibrated: about {forecast['positives']:.0f} positives; at "
            f"{forecast['budget']} labels the certified set has about "
            f"{forecast['set_size']:.0f} frames (precision {forecast['precision']:.2f}, recall "
            f"{forecast['recall']:.2f}); budget for a set within 2x of the positives: "
            f"{_budget_text(forecast['budget_for_2x'], len(proxy))}, within 5x: "
            f"{_budget_text(forecast['budget_for_5x'], len(proxy))}")
    if forecast.get("note"):
        text += "; " + forecast["note"]
        report.details["note"] = forecast["note"]
    report.details["estimate"] = text
    return int(forecast["budget"])


def _budget_text(budget: int | None, n: int) -> str:
    return str(budget) if budget is not None else f"none below {n} (labelling every frame is exact)"


def _estimate_exact(db, q: Query, report: Report) -> Price:
    """The frames in range not yet labelled, priced: the oracle's time and decoding them."""
    names = {v.lower(): v for v in db.catalog.video_names()}
    videos = [names[t.split(".")[0].lower()] for t in q.tables if t.split(".")[0].lower() in names]
    functions = bind_query(db.catalog, q.sql, list(dict.fromkeys(videos)), q.clauses.oracle).functions
    read = label_reads(list(names.values()), q.tables, bool(functions))
    bounds = label_bounds(q, list(names.values()))
    total = Price(0, 0.0, 0.0, 0)
    for video in read:
        cache = db.catalog.label_cache(video, q.clauses.oracle)
        report.video, report.oracle = video, cache.oracle.name
        wanted = needed_frames(db.catalog.con, video, cache.clip_map, bounds.get(video))
        fresh = wanted[~np.isin(wanted, cache.labelled_frames)]
        ms, how = oracle_ms(db.catalog, cache, fresh[:TIMING_FRAMES])
        if how:
            report.details["seconds"] = how
        fresh = wanted[~np.isin(wanted, cache.labelled_frames)]
        total = total.plus(price(db.catalog, video, cache, fresh, ms))
    _note_writing(total, report)
    report.details["estimate"] = "frames in range not yet in the label cache"
    return total


def _estimate_approximate(b: Binding, q: Query, report: Report
                          ) -> tuple[int, list[np.ndarray] | None]:
    """(oracle calls the query will make, the frames each of its labelling calls labels,
    where a dry run knows them): the budget for budgeted kinds; for ERROR WITHIN and LIMIT,
    a dry run of the operator itself on stand-in values (no oracle call)."""
    c = q.clauses
    if q.kind in ("select_recall", "select_precision"):  # frames already labelled are free
        calls = _estimate_selection(b.proxy(predicate_expr(q)), q, report)
        return round(min(calls, b.n) * (1.0 - StandIn.cached_share(b))), None
    if q.aggregate is not None and count_star(q):
        report.details["estimate"] = "COUNT(*) of the video table needs no oracle"
        return 0, None
    if q.kind in ("aggregate_budget", "rare"):
        report.details["estimate"] = ("the ORACLE BUDGET (or every frame, if fewer), less the "
                                      "share of frames already labelled")
        if q.kind == "aggregate_budget" and not q.group_by:
            _advise_budget(b, q, report)
        calls = round(min(int(c.budget), b.n) * (1.0 - StandIn.cached_share(b)))
        return calls, _rare_rounds(b, q, calls) if q.kind == "rare" else None
    stand_in = StandIn.build(b)
    if stand_in is None:
        report.details["estimate"] = (
            f"at most: no index and {b.cache.labelled_frames.size} labelled frames cached "
            f"(fewer than {MIN_PILOT}) give no basis for an estimate, so this is the most "
            "the query can call (every frame, or the ORACLE BUDGET)")
        return min(c.budget or b.n, b.n), None
    report.details["estimate"] = stand_in.note
    # with SEED, the dry run draws the frames the query will draw
    seed = 0 if c.seed is None else b.sampling_seed(int(c.seed))
    if q.kind == "limit":
        pred = predicate_expr(q)
        flags = stand_in(pred)
        ranking = b.proxy(pred)
        queries.limit_query(np.zeros(b.n) if ranking is None else ranking,
                            lambda positions: flags(positions)[0] > 0, k=q.limit,
                            gap=c.gap or 0, seed=seed, max_calls=c.budget,
                            batch=b.cache.oracle.batch_size)
        return stand_in.new_frames()
    if column_groups(q):
        results = grouped_error_bound(b, q, seed, Report(operator="estimate"),
                                      group_codes(b, q)[0], truths=stand_in).results
    else:
        results = [error_bound(b, q, seed, Report(operator="estimate"), truths=stand_in)]
    if any(cap_ran_out(r) for r in results):
        report.details["estimate"] += (f"; the dry run spent the ORACLE BUDGET of {c.budget} "
                                       "before the interval was within the error asked: "
                                       "expect a wider interval")
        if not q.group_by and not c.error_relative:
            report.details["estimate"] += (
                f" (forecast: ERROR WITHIN {c.error:g} needs "
                f"{_labels_for_error(b, q, c.error, seed)})")
    return stand_in.new_frames()


def _advise_budget(b: Binding, q: Query, report: Report) -> None:
    """Add to an ORACLE BUDGET aggregate's estimate (no GROUP BY) the interval the budget
    buys and the labels an interval half as wide needs (ERROR WITHIN, which stops once
    there): dry runs of both operators on stand-in values, so a forecast, as good as they."""
    stand_in = StandIn.build(b)
    if stand_in is None:
        return
    seed = 0 if q.clauses.seed is None else b.sampling_seed(int(q.clauses.seed))
    got = budget_result(b, q, seed, Report(operator="estimate"), truths=stand_in)
    half = (got.ci_high - got.ci_low) / 2
    if not np.isfinite(half):
        return
    total = q.aggregate.func != "avg"  # COUNT and SUM: ERROR WITHIN is per frame
    wanted = float(f"{half / 2:.1g}") if half > 0 else 0.0
    text = f"forecast from {stand_in.note}: the ORACLE BUDGET buys about ±{half:.3g}"
    if wanted > 0:
        error = wanted / b.n if total else wanted
        text += (f"; ±{wanted:g} needs {_labels_for_error(b, q, error, seed)} "
                 f"(ERROR WITHIN {error:.3g})")
    report.details["estimate"] += "; " + text


def _labels_for_error(b: Binding, q: Query, error: float, seed: int) -> str:
    """The labels (cached or not) a dry run of ERROR WITHIN `error` (absolute, per frame
    for COUNT and SUM), without a cap, draws before its interval is that narrow, in words."""
    clauses = dataclasses.replace(q.clauses, error=error, error_relative=False, budget=None)
    stand_in = StandIn.build(b)
    error_bound(b, dataclasses.replace(q, kind="aggregate", clauses=clauses), seed,
                Report(operator="estimate"), truths=stand_in)
    labels = int(stand_in.asked.sum())
    return f"about {labels} labels" if labels < b.n else f"every frame ({b.n} labels)"


MIN_PILOT = 20  # labelled frames an estimate without an index needs


class StandIn:
    """Values standing in for the truth of frame statistics over a query's population,
    from what is known without an oracle call: with an index, its proxy plus errors
    resampled from the proxy's leave-one-out errors at its representatives; without, the
    values of frames already labelled, resampled. Called like Binding.truths."""

    def __init__(self, b: Binding, make, note: str):
        self.b, self.make, self.note = b, make, note
        self.cached = np.isin(b.population, b.cache.labelled_frames)
        self.asked = np.zeros(b.n, dtype=bool)  # positions a dry run labelled
        self.calls: list[np.ndarray] = []  # frames each of its lookups labelled anew

    @staticmethod
    def cached_share(b: Binding) -> float:
        """The share of the population the oracle has labelled already."""
        return float(np.isin(b.population, b.cache.labelled_frames).mean())

    @classmethod
    def build(cls, b: Binding) -> "StandIn | None":
        rng = np.random.default_rng(0)
        if b.index is not None:
            reps = len(b.index.rep_frames)
            pick = rng.integers(reps, size=b.n)
            note = ("a dry run of the operator on stand-in values: the index's proxy plus "
                    f"errors resampled from its leave-one-out errors at {reps} representatives "
                    "(assumes the proxy errs there as elsewhere)")
            return cls(b, lambda expr: _proxy_plus_error(b, expr, pick), note)
        known = np.flatnonzero(np.isin(b.population, b.cache.labelled_frames))
        if known.size < MIN_PILOT:
            return None
        pick = known[rng.integers(known.size, size=b.n)]
        note = (f"a dry run of the operator on stand-in values resampled from the {known.size} "
                "frames of the population already labelled (assumes they are typical)")
        return cls(b, lambda expr: b.truth(expr)(pick), note)

    def __call__(self, *exprs: FrameExpr):
        values = [np.asarray(self.make(e), dtype=np.float64) for e in exprs]

        def lookup(positions):
            positions = np.asarray(positions, dtype=np.int64)
            new = positions[~self.asked[positions] & ~self.cached[positions]]
            if new.size:  # the query labels (and decodes) these in one call
                self.calls.append(self.b.population[np.unique(new)])
            self.asked[positions] = True
            return tuple(v[positions] for v in values)

        return lookup

    def new_frames(self) -> tuple[int, list[np.ndarray]]:
        """(oracle calls of the dry run, the frames each of its labelling calls labelled)."""
        return int((self.asked & ~self.cached).sum()), self.calls


def _proxy_plus_error(b: Binding, expr: FrameExpr, pick: np.ndarray) -> np.ndarray:
    """The index's proxy for `expr` over the population plus leave-one-out errors of the
    representatives (`pick` chooses one per frame), kept within the values seen. A
    predicate's stand-in is a 0/1 draw with the proxy as its probability: rounding the
    proxy would make it agree with itself and the dry run stop far too early."""
    index = b.index
    if is_predicate(expr):
        chance = np.clip(b.proxy(expr), 0.0, 1.0)
        return (np.random.default_rng(1).random(chance.size) < chance).astype(np.float64)
    truth = np.asarray(index.rep_values(frame_statistic(expr)), dtype=np.float64)
    rows = index.positions[index.rep_frames]
    weights = 1.0 / (np.maximum(index.distances[index.rep_frames], 0.0) + index.eps)
    weights[rows == np.arange(len(truth))[:, None]] = 0.0  # leave each representative out
    total = weights.sum(axis=1)
    left_out = (weights * truth[rows]).sum(axis=1) / np.where(total > 0, total, 1.0)
    errors = np.where(total > 0, truth - left_out, 0.0)
    return np.clip(b.proxy(expr) + errors[pick], truth.min(), truth.max())
