"""Finite-sample confidence intervals for stratified budgeted aggregates.

Each stratum is sampled as a prefix of one random order of its frames (without
replacement), and the prefix length may depend on earlier draws (ABae's stage 2 sizes
come from the pilot). Per stratum, two anytime-valid betting confidence sequences
(Waudby-Smith & Ramdas; queries/betting.py) bound
- the number of predicate frames B_k (mean of pred over the stratum), and
- the mean of the statistic over those frames, mu_k = sum(stat*pred) / B_k.
A union bound gives every statement level delta / (number of statements), so with
probability >= 1 - delta all of them hold at once; the answer (COUNT = sum B_k,
SUM = sum B_k mu_k, AVG = sum B_k mu_k / sum B_k) is then inside the range that interval
arithmetic gives over that box. Strata where no positive was sampled still count: their B_k
may be as large as the draws allow, with mu_k anywhere in the value range.
"""
from __future__ import annotations

import math

import numpy as np

from .betting import betting_interval, mean_increments, predictable_variance, ratio_increments

EDGE_TOLERANCE = 1e-5  # edges located to this fraction of the searched range


def _plugin_bets(d: np.ndarray, prior_var: float, delta: float, horizon: int) -> np.ndarray:
    """Predictable bets sqrt(2 log(2/delta) / (var * horizon)) with a deterministic horizon,
    so a bet never depends on the data-dependent number of draws."""
    var = np.maximum(predictable_variance(d, prior_var), 1e-12)
    return np.sqrt(2.0 * math.log(2.0 / delta) / (var * max(horizon, 1)))


def count_bounds(b: np.ndarray, size: int, delta: float, horizon: int) -> tuple[float, float]:
    """Interval for the number of predicate frames in a stratum of `size` frames, from its
    draws `b` (0/1, in draw order), valid at level delta whatever the number of draws."""
    seen, drawn = float(b.sum()), b.size
    if drawn >= size:
        return seen, seen
    if drawn == 0:
        return 0.0, float(size)
    increments, _, feasible = mean_increments(b.astype(np.float64), size, (0.0, 1.0))
    low, high = betting_interval(increments, _plugin_bets(b, 0.25, delta, horizon),
                                 feasible[0], feasible[1], delta, EDGE_TOLERANCE)
    # the count is an integer, at least the positives seen, at most all but the negatives seen
    low = max(seen, math.ceil(low * size - 1e-6))
    high = min(size - (drawn - seen), math.floor(high * size + 1e-6))
    return float(low), float(max(high, low))


def mean_bounds(a: np.ndarray, b: np.ndarray, size: int, value_range: tuple[float, float],
                delta: float, horizon: int) -> tuple[float, float]:
    """Interval for the mean of the statistic over a stratum's predicate frames, from its
    draws a = stat*pred, b = pred; `value_range` bounds the statistic."""
    lo, hi = value_range
    if not b.any():
        return lo, hi
    if b.size >= size or hi <= lo:
        exact = float(a.sum() / b.sum())
        return (exact, exact) if b.size >= size else (lo, hi)
    prev_b = np.concatenate([[0.0], np.cumsum(b[:-1])])
    prev_a = np.concatenate([[0.0], np.cumsum(a[:-1])])
    guess = np.where(prev_b > 0, prev_a / np.maximum(prev_b, 1.0), 0.5 * (lo + hi))
    bets = _plugin_bets(a - guess * b, ((hi - lo) / 2.0) ** 2, delta, horizon)
    return betting_interval(ratio_increments(a, b, size, (lo, hi)), bets, lo, hi, delta,
                            EDGE_TOLERANCE * (hi - lo))


def _ratio_edge(counts_low, counts_high, means, maximise: bool) -> float:
    """max (or min) over B_k in [low_k, high_k] of sum B_k m_k / sum B_k: the optimum puts
    the strata with the largest (smallest) m_k at their high counts, the rest at their low
    ones, so trying every split point in sorted order finds it."""
    order = np.argsort(-means if maximise else means, kind="stable")
    m, lo, hi = means[order], counts_low[order], counts_high[order]
    best = math.nan
    for j in range(m.size + 1):
        counts = np.concatenate([hi[:j], lo[j:]])
        total = counts.sum()
        if total <= 0:
            continue
        value = float(counts @ m / total)
        if math.isnan(best) or (value > best if maximise else value < best):
            best = value
    return best


def combine(agg: str, counts: np.ndarray, means: np.ndarray) -> tuple[float, float]:
    """The answer's range over the box of per-stratum intervals; counts and means are (K, 2)
    arrays of (low, high). NaN edges when the box allows no predicate frame at all (AVG)."""
    if agg == "count":
        return float(counts[:, 0].sum()), float(counts[:, 1].sum())
    if agg == "sum":
        corners = counts[:, [0, 0, 1, 1]] * means[:, [0, 1, 0, 1]]
        return float(corners.min(axis=1).sum()), float(corners.max(axis=1).sum())
    return (_ratio_edge(counts[:, 0], counts[:, 1], means[:, 0], False),
            _ratio_edge(counts[:, 0], counts[:, 1], means[:, 1], True))


def stratified_interval(a_by_stratum: list[np.ndarray], b_by_stratum: list[np.ndarray],
                        sizes: np.ndarray, horizons: np.ndarray, agg: str,
                        value_range: tuple[float, float], delta: float) -> tuple[float, float]:
    """Interval at level delta for one aggregate from each stratum's draws (in draw order)."""
    k = len(sizes)
    statements = k if agg == "count" else 2 * k
    each = delta / statements
    counts = np.array([count_bounds(b, int(s), each, int(h))
                       for b, s, h in zip(b_by_stratum, sizes, horizons, strict=True)])
    if agg == "count":
        return combine(agg, counts, np.zeros((k, 2)))
    means = np.array([mean_bounds(a, b, int(s), value_range, each, int(h))
                      for a, b, s, h in zip(a_by_stratum, b_by_stratum, sizes, horizons, strict=True)])
    return combine(agg, counts, means)
