"""Aggregates with an error bound (BlazeIt-style): sample frames without replacement until
a finite-sample confidence interval meets the error asked for.

`aggregate_error_bound` estimates the per-frame mean of a statistic (SUM and COUNT are
n * mean), by uniform sampling or with a proxy as control variate.
`aggregate_ratio_error_bound` estimates AVG(stat) over the frames where a predicate holds.

Two interval constructions, both valid wherever sampling stops:
- 'bernstein' (default): empirical Bernstein-Serfling intervals checked at geometric
  epochs ceil(beta**k) (beta 1.5), level delta_j = delta (p-1)/(p j^p) at the j-th check
  (EBStop).
- 'betting': a without-replacement betting confidence sequence (see `betting.py`), which
  needs no union over checks and pays far less for a wide value range; since checks cost
  no confidence, it checks every 10% more samples (beta 1.1), so it overshoots less.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from vidql.base.errors import ParameterError
from vidql.base.ranges import ABSOLUTE_ERROR, MIN_SAMPLES, RELATIVE_ERROR

from .betting import betting_interval, mean_increments, predictable_variance, ratio_increments
from .bounds import (SERFLING_KAPPA, RunningMoments, epoch_checkpoints, epoch_delta,
                     eb_serfling_halfwidth, serfling_rho)
from .oracle_calls import DistinctOracle, as_values, split_pair
from .results import AggregateResult
from .validation import (check_confidence, check_int, check_scores, check_value_range,
                         make_rng)

BOUNDS = ("bernstein", "betting")
# Without a declared value range, the range is read off the sample (no guarantee then);
# never stop before this many samples (for AVG ... WHERE: samples where the predicate holds).
MIN_SAMPLES_WITHOUT_RANGE = 30


class _Sampler:
    """Labels frames in one random order, in batches, keeping the values in that order;
    never more than `limit` frames (a callback labelling ahead is told no frame beyond)."""

    def __init__(self, n: int, true_values: Callable, rng: np.random.Generator, batch: int,
                 limit: int):
        self.n = n
        self.order = rng.permutation(n)
        self.limit = limit
        self.oracle = DistinctOracle(true_values, n)
        # a callback may label ahead: told the coming frames, it labels a batch at once
        self.ahead = getattr(true_values, "ahead", None)
        self.batch = batch
        self.taken = 0

    def advance(self, t: int):
        """Label frames until t are labelled; yields (frames, callback output) per batch."""
        while self.taken < t:
            chunk = self.order[self.taken:min(t, self.taken + self.batch)]
            if self.ahead is not None:
                self.ahead(self.order[self.taken:self.limit], chunk.size)
            self.taken += chunk.size
            yield chunk, self.oracle(chunk)

    @property
    def frames(self) -> np.ndarray:
        return np.sort(self.order[:self.taken])


def _check_common(n, error, relative, confidence, batch, max_samples, seed, value_range,
                  bound):
    n = check_int("n", n, 1)
    error = (RELATIVE_ERROR if relative else ABSOLUTE_ERROR).check(
        "relative error" if relative else "error", error)
    confidence = check_confidence(confidence)
    batch = check_int("batch", batch, 1)
    limit = n if max_samples is None else min(n, check_int("max_samples", max_samples,
                                                           MIN_SAMPLES))
    if bound not in BOUNDS:
        raise ParameterError(f"bound must be one of {BOUNDS}; got {bound!r}")
    return n, error, confidence, batch, limit, make_rng(seed), check_value_range(value_range)


def _stop(estimate: float, low: float, high: float, error: float, relative: bool) -> bool:
    """Whether [low, high] (containing the truth) guarantees the error asked for."""
    deviation = max(high - estimate, estimate - low)
    if not relative:
        return deviation <= error
    if low > 0 or high < 0:
        return deviation <= error * min(abs(low), abs(high))
    return False


def _check_inside(values: np.ndarray, value_range) -> None:
    if value_range is not None and values.size and (
            values.min() < value_range[0] or values.max() > value_range[1]):
        raise ParameterError(f"the oracle returned values in [{values.min()}, {values.max()}], "
                             f"outside the declared value_range {value_range}; widen it")


def _bets(d: np.ndarray, width: float, error: float, relative: bool,
          scale: np.ndarray | None = None, cap: int | None = None,
          delta: float | None = None) -> np.ndarray:
    """Predictable bets aimed at resolving the answer to within the error asked (an error
    wider than the value range resolves nothing more, so the aim is capped there). Under a
    cap of `cap` draws, never aimed finer than those draws can resolve at level `delta`: the
    plug-in sqrt(2 log(2/delta) var / cap). Bets aimed at an error far below it had almost
    no power: ERROR WITHIN 0.01 with 100 draws gave an interval ten times as wide as
    ERROR WITHIN 0.5 with the same 100."""
    var = np.maximum(predictable_variance(d, (width / 2.0) ** 2), 1e-12)
    if relative:
        prev = np.concatenate([[0.0], np.cumsum(d[:-1])]) / np.maximum(np.arange(d.size), 1)
        target = error * np.maximum(np.abs(prev), 1e-12)
    else:
        target = np.full(d.size, error)
    target = np.minimum(target, max(width, 1e-12))
    if scale is not None:
        target = target * scale
    if cap is not None:
        target = np.maximum(target, np.sqrt(2.0 * math.log(2.0 / delta) * var / cap))
    return target / var


def _growth(bound: str, beta: float | None) -> float:
    """How much the sample grows between checks: every check spends confidence with the
    Bernstein bound, none with betting."""
    if beta is None:
        return 1.5 if bound == "bernstein" else 1.1
    if beta <= 1.0:
        raise ParameterError(f"beta must be above 1, got {beta}")
    return beta


def _tolerance(error: float, relative: bool, estimate: float, low: float, high: float) -> float:
    """How precisely the edges of an interval within [low, high] are located: far below
    both the error asked for and the width of the range (an error of 1e6 on values in
    [0, 50] must still locate the edges inside [0, 50])."""
    asked = error * (max(abs(estimate), 1e-9) if relative else 1.0)
    floor = 1e-12 * max(1.0, abs(low), abs(high))
    return max(1e-4 * min(asked, high - low), floor)


def _initial_details(bound: str, value_range) -> dict:
    return {"bound": bound, "range_source": "value_range" if value_range else "sample",
            "checks": 0, "met": False}


def _bernstein_mean(estimate: float, cov: np.ndarray, c: float, proxy_stats, y_range,
                    t: int, n: int, delta: float) -> tuple[float, float, float]:
    """(low, high, range width) of the EB-Serfling interval around the (control-variate)
    estimate after t of n draws, clipped to `y_range`; `proxy_stats` = (mean, min, max)
    of the proxy, None without one."""
    width = y_range[1] - y_range[0]
    variance = cov[0, 0]
    if proxy_stats is not None:
        width += abs(c) * (proxy_stats[2] - proxy_stats[1])
        variance += 2 * c * cov[0, 1] + c * c * cov[1, 1]
    half = eb_serfling_halfwidth(math.sqrt(max(variance, 0.0)), t, n, width, delta)
    return max(estimate - half, y_range[0]), min(estimate + half, y_range[1]), width


def betting_mean_interval(y: np.ndarray, n: int, y_range, seen_proxy, proxy_stats,
                          estimate: float, asked: tuple[float, bool], delta: float,
                          cap: int | None = None, shrink: float = 0.0) -> tuple[float, float]:
    """The betting interval for the mean from the values `y` drawn so far (with the
    proxy of the same frames, or None); `asked` = (error, relative); `cap`: the most draws
    there will be, when fewer than n; `shrink` as in `mean_increments`."""
    error, relative = asked
    increments, d, feasible = mean_increments(y, n, y_range, seen_proxy, proxy_stats,
                                              shrink=shrink)
    bets = _bets(d, y_range[1] - y_range[0], error, relative, cap=cap, delta=delta)
    low, high = max(y_range[0], feasible[0]), min(y_range[1], feasible[1])
    return betting_interval(increments, bets, low, high, delta,
                            _tolerance(error, relative, estimate, low, high))


def betting_ratio_interval(data: np.ndarray, n: int, x_range, estimate: float,
                           asked: tuple[float, bool], delta: float,
                           cap: int | None = None) -> tuple[float, float]:
    """The betting interval for the ratio from the drawn columns (pred*stat, pred);
    `asked` = (error, relative); `cap` as in betting_mean_interval."""
    error, relative = asked
    a, b = data[:, 0], data[:, 1]
    prev_b = np.concatenate([[0.0], np.cumsum(b[:-1])])
    prev_a = np.concatenate([[0.0], np.cumsum(a[:-1])])
    ratio_prev = np.where(prev_b > 0, prev_a / np.maximum(prev_b, 1), 0.0)
    rate_prev = (prev_b + 0.5) / (np.arange(b.size) + 1.0)
    d = a - ratio_prev * b
    width = x_range[1] - x_range[0]
    # an error e on the ratio moves mean(pred*(stat - m)) by e * P(pred)
    scale = rate_prev * (np.maximum(np.abs(ratio_prev), 1e-12) if relative else 1.0)
    bets = _bets(d, width, error, False, scale, cap=cap, delta=delta)
    return betting_interval(ratio_increments(a, b, n, x_range), bets, *x_range,
                            delta, _tolerance(error, relative, estimate, *x_range))


def aggregate_error_bound(n: int, true_values: Callable[[np.ndarray], np.ndarray], *,
                          proxy: np.ndarray | None = None, error: float, relative: bool = False,
                          confidence: float = 0.95, seed=0, batch: int = 1024,
                          value_range: tuple[float, float] | None = None,
                          max_samples: int | None = None, bound: str = "betting",
                          beta: float | None = None, p: float = 1.1) -> AggregateResult:
    """Estimate the mean of `true_values` over frames 0..n-1 within `error`.

    `error` is absolute on the mean, or with `relative=True` a fraction of the answer.
    Frames are sampled without replacement and the interval is checked at sample sizes
    ceil(beta**k). With a proxy (float per frame), the control variate
    Z = Y + c (P - mean P) uses c = -Cov(Y,P)/Var(P) re-estimated from the sample; the
    range used for Z is width(Y) + |c| width(P), valid for every frame ('betting' uses
    only earlier draws for c, so its interval stays exact). `value_range` bounds Y;
    without it the range is read off the sample (a heuristic, noted in details).
    Stops at `max_samples` with `details['met'] = False` if the bound is not reached;
    labelling all n frames gives the exact answer.
    """
    n, error, confidence, batch, limit, rng, value_range = _check_common(
        n, error, relative, confidence, batch, max_samples, seed, value_range, bound)
    proxy_stats = None
    if proxy is not None:
        proxy = check_scores("proxy", proxy, n)
        proxy_stats = (float(proxy.mean()), float(proxy.min()), float(proxy.max()))
    delta = 1.0 - confidence
    sampler = _Sampler(n, true_values, rng, batch, limit)
    cap = limit if limit < n else None
    moments = RunningMoments(1 if proxy is None else 2)
    values: list[np.ndarray] = []
    seen_low, seen_high = math.inf, -math.inf
    method = "uniform" if proxy is None else "control_variate"
    error_kind = "relative" if relative else "absolute"
    details = _initial_details(bound, value_range)
    for j, t in enumerate(epoch_checkpoints(limit, _growth(bound, beta)), start=1):
        for chunk, out in sampler.advance(t):
            y = as_values(out, chunk.size)
            _check_inside(y, value_range)
            seen_low, seen_high = min(seen_low, y.min()), max(seen_high, y.max())
            moments.update(y[:, None] if proxy is None else np.column_stack([y, proxy[chunk]]))
            values.append(y)
        if t == n:
            exact = math.fsum(np.concatenate(values)) / n
            details.update(met=True, checks=j)
            return AggregateResult(exact, exact, exact, confidence, sampler.oracle.calls,
                                   sampler.frames, True, method, error_kind, details)
        cov = moments.cov()
        y_range = value_range if value_range else (seen_low, seen_high)
        c = 0.0
        if proxy is not None and cov[1, 1] > 0:
            c = -cov[0, 1] / cov[1, 1]
        estimate = moments.mean[0]
        if proxy is not None:
            estimate += c * (moments.mean[1] - proxy_stats[0])
        if bound == "bernstein":
            low, high, width = _bernstein_mean(estimate, cov, c, proxy_stats, y_range, t, n,
                                               epoch_delta(j, delta, p))
            details["range_width"] = float(width)
        else:
            seen_proxy = None if proxy is None else proxy[sampler.order[:t]]
            low, high = betting_mean_interval(np.concatenate(values), n, y_range, seen_proxy,
                                      proxy_stats, estimate, (error, relative), delta, cap)
        estimate = float(min(max(estimate, low), high))
        details.update(checks=j, c=float(c))
        if _stop(estimate, low, high, error, relative) and (
                value_range or t >= MIN_SAMPLES_WITHOUT_RANGE):
            details["met"] = True
            break
    return AggregateResult(estimate, float(low), float(high), confidence, sampler.oracle.calls,
                           sampler.frames, False, method, error_kind, details)


def _ratio_bernstein(mean_a, mean_b, cov, t, n, low_x, high_x, delta):
    """Hull of {m in [low_x, high_x] : |mean(a - m b)| <= EB-Serfling half-width of a - m b}.

    a = stat * pred, b = pred; at the true ratio the population mean of a - m b is 0, so
    the set covers it when that one bound holds. On each side of the point estimate the
    test function is concave, so bisection finds the hull exactly.
    """
    x = math.log(10.0 / delta)
    slope = math.sqrt(2.0 * max(serfling_rho(t, n), 0.0) * x / t)
    offset = SERFLING_KAPPA * (high_x - low_x) * x / t

    def slack(m: float) -> float:
        var = cov[0, 0] - 2 * m * cov[0, 1] + m * m * cov[1, 1]
        return abs(mean_a - m * mean_b) - (math.sqrt(max(var, 0.0)) * slope + offset)

    centre = mean_a / mean_b

    def edge(outer: float) -> float:
        if slack(outer) <= 0:
            return outer
        inside, outside = centre, outer
        for _ in range(60):
            mid = 0.5 * (inside + outside)
            if slack(mid) <= 0:
                inside = mid
            else:
                outside = mid
        return outside

    return edge(low_x), edge(high_x)


def aggregate_ratio_error_bound(n: int, true_values: Callable, *, error: float,
                                relative: bool = False, confidence: float = 0.95, seed=0,
                                batch: int = 1024,
                                value_range: tuple[float, float] | None = None,
                                max_samples: int | None = None, bound: str = "betting",
                                beta: float | None = None, p: float = 1.1) -> AggregateResult:
    """AVG(stat) over the frames where pred holds, within `error` (absolute or relative).

    `true_values(frames) -> (stat float64, pred bool)`. The interval is the set of ratios m
    for which the population mean of pred*(stat - m), which is 0 exactly at the true
    ratio, is not rejected ('bernstein': empirical Bernstein-Serfling at geometric epochs;
    'betting': the without-replacement betting sequence). `value_range` bounds stat on
    predicate frames (else read off the sample, a heuristic). The estimate is NaN if no
    sampled frame satisfies the predicate.
    """
    n, error, confidence, batch, limit, rng, value_range = _check_common(
        n, error, relative, confidence, batch, max_samples, seed, value_range, bound)
    delta = 1.0 - confidence
    sampler = _Sampler(n, true_values, rng, batch, limit)
    cap = limit if limit < n else None
    moments = RunningMoments(2)
    columns: list[np.ndarray] = []
    seen_low, seen_high = math.inf, -math.inf
    error_kind = "relative" if relative else "absolute"
    details = _initial_details(bound, value_range)
    estimate, low, high = math.nan, math.nan, math.nan
    for j, t in enumerate(epoch_checkpoints(limit, _growth(bound, beta)), start=1):
        for chunk, out in sampler.advance(t):
            stat, pred = split_pair(out, chunk.size)
            _check_inside(stat[pred], value_range)
            if pred.any():
                seen_low = min(seen_low, stat[pred].min())
                seen_high = max(seen_high, stat[pred].max())
            block = np.column_stack([np.where(pred, stat, 0.0), pred])
            moments.update(block)
            columns.append(block)
        mean_a, mean_b = moments.mean
        details["checks"] = j
        if t == n:
            exact = float(mean_a / mean_b) if mean_b > 0 else math.nan
            details.update(met=bool(mean_b > 0), positives=int(round(mean_b * n)))
            return AggregateResult(exact, exact, exact, confidence, sampler.oracle.calls,
                                   sampler.frames, True, "ratio", error_kind, details)
        if mean_b <= 0:
            continue
        x_range = value_range if value_range else (seen_low, seen_high)
        estimate = float(mean_a / mean_b)
        if bound == "bernstein":
            low, high = _ratio_bernstein(mean_a, mean_b, moments.cov(), t, n, *x_range,
                                         epoch_delta(j, delta, p))
        else:
            low, high = betting_ratio_interval(np.concatenate(columns), n, x_range, estimate,
                                       (error, relative), delta, cap)
        estimate = float(min(max(estimate, low), high))
        # without a value range, the range of stat is read off the predicate frames seen
        if _stop(estimate, low, high, error, relative) and (
                value_range or mean_b * t >= MIN_SAMPLES_WITHOUT_RANGE - 0.5):
            details["met"] = True
            break
    details["positives_sampled"] = positives = int(round(moments.mean[1] * moments.count))
    if not value_range and positives < MIN_SAMPLES_WITHOUT_RANGE:
        # a cap stopped the sample before the range read off its predicate frames can be
        # trusted (one or two positives give a point): no bound holds without a range
        low, high = -math.inf, math.inf
        details["unbounded"] = (f"{positives} sampled frames satisfy the predicate, fewer than "
                                f"the {MIN_SAMPLES_WITHOUT_RANGE} a range read off the sample needs")
    return AggregateResult(float(estimate), float(low), float(high), confidence,
                           sampler.oracle.calls, sampler.frames, False, "ratio", error_kind,
                           details)
