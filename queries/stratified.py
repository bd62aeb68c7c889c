"""Aggregates under an oracle budget by ABae's proxy-stratified two-stage sampling, with a
finite-sample confidence interval (queries/stratum_bounds.py). ORACLE BUDGET uses it for
GROUP BY over frame functions, where one sample serves every group; an ungrouped aggregate
gets a narrower interval from a uniform sample (queries/budget.py).

Frames are cut into K equal strata by proxy rank. Stage 1 spends half the budget evenly
across strata; stage 2 gives each stratum a share proportional to the standard deviation
of its contribution to the estimate (for AVG: of pred*(stat - avg), i.e. sqrt(p_k) sigma_k
when stratum means agree), with a floor so that no stratum starves. Each stratum is drawn
in one random order, so no frame is ever drawn twice and no stratum gives more than it has.
The interval bounds each stratum's predicate count and its mean statistic by betting
confidence sequences valid at the data-dependent stage-2 size, and combines them.
"""
from __future__ import annotations

import math
from typing import Callable, Hashable

import numpy as np

from vidql.base.errors import OracleError, ParameterError
from vidql.base.ranges import DEFAULT_STRATA

from .budget import AGGREGATES, NO_POSITIVE_NOTE
from .limit import proxy_order
from .oracle_calls import DistinctOracle, as_flags, as_values
from .results import AggregateResult
from .stratum_bounds import stratified_interval
from .validation import (check_confidence, check_fraction, check_int, check_scores,
                         check_value_range, make_rng)

MIN_BUDGET_PER_STRATUM = 2  # ORACLE BUDGET must be at least this times the strata (5): 10


def abae_budget(proxy: np.ndarray, true_values: Callable, *, budget: int,
                agg: str = "avg", confidence: float = 0.95,
                strata: int = DEFAULT_STRATA, seed=0,
                value_range: tuple[float, float] | None = None,
                pilot_fraction: float = 0.5,
                floor_fraction: float = 0.1) -> AggregateResult:
    """AVG / SUM / COUNT over the frames where a predicate holds, spending at most `budget`
    oracle calls on ABae's stratified sample (the bench's baseline for `aggregate_budget`).

    `true_values(frames) -> (stat float64, pred bool)`. AVG is the mean of stat over
    predicate frames, SUM their total, COUNT their number. The interval holds in finite
    samples when stat stays in `value_range`; without one, the range of stat over all
    sampled frames stands in (details['range_source'] says which). With no predicate frame
    sampled, AVG's estimate is NaN (NULL) and SUM/COUNT's is 0, with the interval the sample
    supports and details['note'] saying so.
    """
    return _two_stage(proxy, true_values, budget, agg, confidence, strata, seed, value_range,
                      pilot_fraction, floor_fraction, grouped=False)[None]


def aggregate_budget_grouped(proxy: np.ndarray, true_values: Callable, *, budget: int,
                             agg: str = "avg", confidence: float = 0.95,
                             strata: int = DEFAULT_STRATA, seed=0,
                             value_range: tuple[float, float] | None = None,
                             pilot_fraction: float = 0.5,
                             floor_fraction: float = 0.1) -> dict[Hashable, AggregateResult]:
    """GROUP BY a small categorical per-frame column, under one shared budget.

    `true_values(frames) -> (stat, pred, group)` where group holds one hashable value per
    frame. One two-stage sample serves every group; stage 2 averages the groups'
    normalised allocations so each group gets a fair share. Returns one result per group
    seen in the sample (all with the shared oracle_calls and frames); groups never sampled
    are absent. The confidence is split evenly across the groups seen (Bonferroni), so all
    groups' intervals hold at once.
    """
    return _two_stage(proxy, true_values, budget, agg, confidence, strata, seed, value_range,
                      pilot_fraction, floor_fraction, grouped=True)


def _allocate(total: np.ndarray, weights: np.ndarray, caps: np.ndarray,
              floor_fraction: float) -> np.ndarray:
    """Integer allocations (rows of `weights`, shape (R, K)) summing to min(total, sum caps),
    proportional to weights with a `floor_fraction` share spread evenly, never above caps."""
    rows, k = weights.shape
    total = np.minimum(np.broadcast_to(np.asarray(total, dtype=np.float64), (rows,)), caps.sum())
    wsum = weights.sum(axis=1, keepdims=True)
    norm = np.where(wsum > 0, weights / np.where(wsum > 0, wsum, 1.0), 1.0 / k)
    share = floor_fraction / k + (1.0 - floor_fraction) * norm
    alloc = np.zeros((rows, k))
    open_ = np.ones((rows, k), dtype=bool) & (caps > 0)
    left = total.copy()
    for _ in range(k):  # water-filling: each pass caps at least one stratum or finishes
        s = np.where(open_, share, 0.0)
        ssum = s.sum(axis=1, keepdims=True)
        add = np.where(ssum > 0, left[:, None] * s / np.where(ssum > 0, ssum, 1.0), 0.0)
        alloc = np.minimum(alloc + add, caps)
        left = total - alloc.sum(axis=1)
        open_ = alloc < caps
        if np.all(left < 1e-9):
            break
    counts = np.floor(alloc + 1e-9)
    remainder = np.rint(total - counts.sum(axis=1)).astype(int)
    frac = np.where(counts < caps, alloc - counts, -1.0)
    order = np.argsort(-frac, axis=1, kind="stable")
    ranks = np.argsort(order, axis=1)
    counts += (ranks < remainder[:, None]) & (counts < caps)
    return counts.astype(np.int64)


def _stratum_spread(sa, sb, saa, count, sizes, agg):
    """Per-stratum standard deviation of each group's contribution, from sums over samples.

    sa, sb, saa: (R, K, G) sums of a = stat*pred*in_group, b = pred*in_group and a^2;
    count: (R, K) or (K,) sample counts. Returns (R, K, G).
    """
    n = np.maximum(np.broadcast_to(count, sa.shape[:2]), 1)[..., None]
    ea, eb, eaa = sa / n, sb / n, saa / n
    if agg == "count":
        var = eb - eb * eb
    elif agg == "sum":
        var = eaa - ea * ea
    else:
        w = sizes[None, :, None]
        num, den = (w * ea).sum(axis=1, keepdims=True), (w * eb).sum(axis=1, keepdims=True)
        mu = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        var = eaa - 2 * mu * ea + mu * mu * eb - (ea - mu * eb) ** 2
    return np.sqrt(np.maximum(var, 0.0))


def _stage2_weights(spread: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Average over groups of each group's normalised Neyman weights N_k * sd_k -> (R, K)."""
    w = sizes[None, :, None] * spread
    wsum = w.sum(axis=1, keepdims=True)
    has = wsum > 0
    norm = np.where(has, w / np.where(has, wsum, 1.0), 0.0)
    groups = has.sum(axis=2)  # (R, 1)
    return np.where(groups > 0, norm.sum(axis=2) / np.maximum(groups, 1), 0.0)


def _estimates(sa, sb, count, sizes, agg):
    """Estimates per group from per-stratum sums; (R, K, G) -> (R, G)."""
    n = np.maximum(np.broadcast_to(count, sa.shape[:2]), 1)[..., None]
    w = sizes[None, :, None]
    total_a = (w * sa / n).sum(axis=1)
    total_b = (w * sb / n).sum(axis=1)
    if agg == "sum":
        return total_a
    if agg == "count":
        return total_b
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total_b > 0, total_a / total_b, np.nan)


class _Labels:
    """Oracle answers as (stat, pred, group code) with group values mapped to codes."""

    def __init__(self, fn: Callable, n: int, grouped: bool):
        self.oracle = DistinctOracle(fn, n)
        self.grouped = grouped
        self.codes: dict = {}

    def __call__(self, frames: np.ndarray):
        out = self.oracle(frames)
        m = frames.size
        size = 3 if self.grouped else 2
        if not isinstance(out, tuple) or len(out) != size:
            raise OracleError("true_values must return "
                              + ("(stat, pred, group)" if self.grouped else "(stat, pred)"))
        stat = as_values(out[0], m, "true_values stat")
        pred = as_flags(out[1], m, "true_values pred")
        if not self.grouped:
            return stat, pred, np.zeros(m, dtype=np.int64)
        groups = list(np.asarray(out[2], dtype=object).reshape(-1))
        if len(groups) != m:
            raise OracleError(f"true_values returned {len(groups)} group values for {m} frames")
        code = np.array([self.codes.setdefault(g, len(self.codes)) for g in groups],
                        dtype=np.int64)
        return stat, pred, code


def _label_strata(labels: _Labels, parts: list[np.ndarray]) -> list[tuple]:
    """(stat, pred, code) of each stratum's frames `parts`, asked for in one call, strata in
    order: the oracle labels them in full batches (and a video's frames are decoded in one
    pass) instead of a short call per stratum."""
    out = labels(np.concatenate(parts))
    cuts = np.cumsum([len(part) for part in parts])[:-1]
    return list(zip(*(np.split(x, cuts) for x in out), strict=True))


def _group_columns(stat, pred, code, groups: int):
    """(m, G) arrays a = stat*pred*in_group and b = pred*in_group."""
    member = (code[:, None] == np.arange(groups)[None, :]) & pred[:, None]
    return np.where(member, stat[:, None], 0.0), member.astype(np.float64)


def _two_stage(proxy, true_values, budget, agg, confidence, strata, seed, value_range,
               pilot_fraction, floor_fraction, grouped):
    proxy = check_scores("proxy", proxy)
    n = proxy.size
    if agg not in AGGREGATES:
        raise ParameterError(f"agg must be one of {AGGREGATES}; got {agg!r}")
    confidence = check_confidence(confidence)
    strata = check_int("strata", strata, 1)
    if strata > n:
        raise ParameterError(f"strata ({strata}) cannot exceed the number of frames ({n})")
    budget = check_int("budget", budget, MIN_BUDGET_PER_STRATUM * strata)
    value_range = check_value_range(value_range)
    pilot_fraction = check_fraction("pilot_fraction", pilot_fraction, inclusive_high=False)
    floor_fraction = check_fraction("floor_fraction", floor_fraction)
    rng = make_rng(seed)
    labels = _Labels(true_values, n, grouped)

    if budget >= n:
        return _exact(labels, n, agg, confidence, strata)

    order = proxy_order(-proxy, rng)  # increasing proxy, ties in random order
    members = [rng.permutation(s) for s in np.array_split(order, strata)]
    sizes = np.array([m.size for m in members], dtype=np.float64)
    caps = sizes.astype(np.int64)
    n1 = _allocate(int(budget * pilot_fraction), np.ones((1, strata)), caps, 1.0)[0]
    ahead = getattr(true_values, "ahead", None)
    if ahead is not None:  # the frames stage 2 may draw: told first, nothing labelled now
        ahead(np.concatenate([m[k:k + budget - n1.sum()] for m, k in zip(members, n1, strict=True)]), 0)
    pilot = _label_strata(labels, [m[:k] for m, k in zip(members, n1, strict=True)])
    g1 = len(labels.codes) if grouped else 1
    sums = [_sums(*_group_columns(*lab, g1)) for lab in pilot]
    sa, sb, saa = (np.stack([s[i] for s in sums])[None] for i in range(3))
    spread = _stratum_spread(sa, sb, saa, n1, sizes, agg)
    n2 = _allocate(budget - n1.sum(), _stage2_weights(spread, sizes), caps - n1,
                   floor_fraction)[0]
    second = _label_strata(labels, [m[k1:k1 + k2] for m, k1, k2 in zip(members, n1, n2,
                                                                         strict=True)])
    groups = len(labels.codes) if grouped else 1
    pooled, seen_stats = [], []
    for first, extra in zip(pilot, second, strict=True):
        stat, pred, code = (np.concatenate([x, y]) for x, y in zip(first, extra, strict=True))
        pooled.append(_group_columns(stat, pred, code, groups))
        seen_stats.append(stat)
    count = n1 + n2
    sa = np.stack([a.sum(0) for a, _ in pooled])[None]
    sb = np.stack([b.sum(0) for _, b in pooled])[None]
    estimate = _estimates(sa, sb, count, sizes, agg)[0]
    # stage-1 sizes are fixed in advance: a deterministic horizon for the bets
    horizons = np.maximum(n1, np.minimum(caps, budget // strata))
    x_range = value_range or _sample_range(seen_stats)
    low, high = _intervals(pooled, sizes, horizons, agg, x_range, 1.0 - confidence)
    frames = np.sort(np.concatenate([m[:k1 + k2] for m, k1, k2 in zip(members, n1, n2, strict=True)]))
    details = {"strata": strata, "stratum_sizes": caps.tolist(), "pilot": n1.tolist(),
               "stage2": n2.tolist(), "interval": "finite-sample (betting, union over strata)",
               "value_range": list(x_range),
               "range_source": "value_range" if value_range else "sample"}
    if grouped:
        details["confidence_split"] = f"{1 - confidence:g} split evenly over {groups} groups"
    return _package(labels, grouped, estimate, low, high, frames, False, agg, confidence,
                    details, sb[0].sum(0))


def _exact(labels: _Labels, n: int, agg: str, confidence: float, strata: int):
    """The exact answer from labelling every frame (a budget of n or more)."""
    frames = np.arange(n, dtype=np.int64)
    stat, pred, code = labels(frames)
    groups = len(labels.codes) if labels.grouped else 1
    a, b = _group_columns(stat, pred, code, groups)
    est = _estimates(a.sum(0)[None, None], b.sum(0)[None, None], np.array([[1]]),
                     np.array([1.0]), agg)[0]
    return _package(labels, labels.grouped, est, est, est, frames, True, agg, confidence,
                    {"strata": strata}, b.sum(0))


def _sums(a, b):
    return a.sum(0), b.sum(0), (a * a).sum(0)


def _sample_range(labels_seen: list[np.ndarray]) -> tuple[float, float]:
    """The statistic's range over every sampled frame (predicate or not)."""
    stats = np.concatenate(labels_seen)
    return (float(stats.min()), float(stats.max())) if stats.size else (0.0, 0.0)


def _intervals(pooled, sizes, horizons, agg, value_range, delta):
    """Per group: the finite-sample interval (queries/stratum_bounds.py), at level
    delta / groups so that all groups hold at once."""
    groups = pooled[0][0].shape[1]
    out = np.array([stratified_interval([a[:, g] for a, _ in pooled],
                                        [b[:, g] for _, b in pooled], sizes, horizons, agg,
                                        value_range, delta / groups)
                    for g in range(groups)])
    return out[:, 0], out[:, 1]


def _package(labels, grouped, estimate, low, high, frames, exact, agg, confidence, details,
             positives):
    """One AggregateResult per group (key None when not grouped); `positives` counts each
    group's sampled predicate frames."""
    calls = labels.oracle.calls
    keys = list(labels.codes) if grouped else [None]
    results = {}
    for j, key in enumerate(keys):
        info = dict(details, agg=agg, positives_sampled=int(positives[j]))
        if grouped:
            info["group"] = key
        value = float(estimate[j])
        if positives[j] == 0:
            value = math.nan if agg == "avg" else value
            if not exact:
                info["note"] = NO_POSITIVE_NOTE
        elif not math.isnan(low[j]):
            value = min(max(value, float(low[j])), float(high[j]))
        results[key] = AggregateResult(value, float(low[j]), float(high[j]),
                                       confidence, calls, frames, exact, "abae", None, info)
    return results
