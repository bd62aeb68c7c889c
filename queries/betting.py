"""Confidence sequences by betting for sampling WITHOUT replacement
(Waudby-Smith & Ramdas, 2020 and 2023), with predictable control variates.

For a hypothesised answer m, each labelled frame i gives an increment v_i(m) whose
conditional mean is 0 when m is the truth (the remaining population's mean is known
given m and the frames already drawn). Two capital processes bet on v > 0 and v < 0 with
predictable bets truncated so that no factor can go negative; by Ville's inequality the
truth is rejected (capital >= 2/delta on either side, at any time) with probability at
most delta. Both capitals are monotone in m, so the confidence set is an interval found by
bisection; it is valid at any data-dependent stopping time, without a union over epochs.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

MAX_BET = 0.9  # fraction of the largest bet that keeps every factor positive


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    out[0] = 0.0
    np.cumsum(x[:-1], out=out[1:])
    return out


def predictable_variance(d: np.ndarray, prior_var: float) -> np.ndarray:
    """Variance estimate of d from draws before each step (prior weight one draw)."""
    t = d.size
    count = np.arange(t, dtype=np.float64)  # draws before step i
    prev_sum = _exclusive_cumsum(d)
    prev_mean = np.where(count > 0, prev_sum / np.maximum(count, 1), 0.0)
    # squared deviation of each draw from the mean of the draws before it
    sq = (d - prev_mean) ** 2
    sq[0] = 0.0
    return (prior_var + _exclusive_cumsum(sq)) / (count + 1)


def _log_capital_max(bets: np.ndarray, increments: np.ndarray) -> float:
    return float(np.max(np.cumsum(np.log1p(bets * increments))))


def betting_interval(increments: Callable[[float], tuple[np.ndarray, np.ndarray, np.ndarray]],
                     bets: np.ndarray, low: float, high: float, delta: float,
                     tol: float) -> tuple[float, float]:
    """Interval of m in [low, high] that neither capital process rejects at level delta.

    `increments(m) -> (v, down, up)`: v_i(m) and the largest possible excursions below and
    above 0 (down_i, up_i >= 0). Requires v nonincreasing in m and the capped bets below to
    keep that monotonicity (true for the increments built in this package). Edges are
    located to within `tol`, rounded outwards.
    """
    threshold = math.log(2.0 / delta)

    def upper_capital(m: float) -> float:  # bets that the truth is above m
        v, down, _ = increments(m)
        lam = np.minimum(bets, MAX_BET / np.maximum(down, 1e-300))
        return _log_capital_max(lam, v)

    def lower_capital(m: float) -> float:  # bets that the truth is below m
        v, _, up = increments(m)
        lam = np.minimum(bets, MAX_BET / np.maximum(up, 1e-300))
        return _log_capital_max(lam, -v)

    def edge(capital: Callable[[float], float], rejected_end: float, kept_end: float) -> float:
        if capital(rejected_end) < threshold:
            return rejected_end
        if capital(kept_end) >= threshold:  # everything rejected: degenerate, keep a point
            return kept_end
        bad, good = rejected_end, kept_end
        while abs(good - bad) > tol:
            mid = 0.5 * (bad + good)
            if capital(mid) >= threshold:
                bad = mid
            else:
                good = mid
        return good

    lo = edge(upper_capital, low, high)
    hi = edge(lower_capital, high, low)
    if hi < lo:  # both sides reject a middle point only when the data contradict the range
        lo = hi = 0.5 * (lo + hi)
    return lo, hi


def mean_increments(y: np.ndarray, n: int, value_range: tuple[float, float],
                    proxy_sample: np.ndarray | None = None,
                    proxy_stats: tuple[float, float, float] | None = None,
                    warmup: int = 10, shrink: float = 0.0):
    """Increments for the population mean of y (sampled in this order without replacement),
    with an optional proxy as control variate whose coefficient uses only earlier draws
    (after `warmup` draws; times i / (i + shrink) at draw i).

    Returns (increments(m), d, feasible (low, high)); d are the control-variate values
    Y_i + c_i (P_i - mean of the proxy over frames not yet drawn).
    """
    t = y.size
    lo_y, hi_y = value_range
    i = np.arange(t, dtype=np.float64)  # draws before step
    remaining = n - i
    prev_y = _exclusive_cumsum(y)
    if proxy_sample is None:
        d = y.copy()
        shift_down = np.zeros(t)
        shift_up = np.zeros(t)
    else:
        p_mean, p_min, p_max = proxy_stats
        p = proxy_sample
        prev_p = _exclusive_cumsum(p)
        rem_p = (n * p_mean - prev_p) / remaining
        cnt = np.maximum(i, 1)
        my, mp = prev_y / cnt, prev_p / cnt
        cov = _exclusive_cumsum(y * p) / cnt - my * mp
        var = _exclusive_cumsum(p * p) / cnt - mp * mp
        c = np.where((i >= warmup) & (var > 1e-12), -cov / np.maximum(var, 1e-12), 0.0)
        c *= i / np.maximum(i + shrink, 1.0)  # `shrink` > 0: towards 0 while draws are few
        d = y + c * (p - rem_p)
        a = c * (p_min - rem_p)
        b = c * (p_max - rem_p)
        shift_down = -np.minimum(a, b)  # how far the control term can push below 0
        shift_up = np.maximum(a, b)

    def increments(m: float):
        rem_mean = (n * m - prev_y) / remaining
        v = d - rem_mean
        down = np.maximum(rem_mean - lo_y, 0.0) + shift_down
        up = np.maximum(hi_y - rem_mean, 0.0) + shift_up
        return v, down, up

    total = float(y.sum())
    feasible = ((total + lo_y * (n - t)) / n, (total + hi_y * (n - t)) / n)
    return increments, d, feasible


def ratio_increments(a: np.ndarray, b: np.ndarray, n: int, value_range: tuple[float, float]):
    """Increments for the ratio sum(a)/sum(b) over the population, a = stat*pred, b = pred,
    stat in value_range on predicate frames: v_i(m) = D_i(m) - mean of D(m) over the frames
    not yet drawn, with D(m) = a - m b whose population mean is 0 at the truth."""
    lo, hi = value_range
    remaining = n - np.arange(a.size, dtype=np.float64)
    prev_a, prev_b = _exclusive_cumsum(a), _exclusive_cumsum(b)

    def increments(m: float):
        rem_mean = -(prev_a - m * prev_b) / remaining
        v = (a - m * b) - rem_mean
        down = np.maximum(rem_mean - min(0.0, lo - m), 0.0)
        up = np.maximum(max(0.0, hi - m) - rem_mean, 0.0)
        return v, down, up

    return increments
