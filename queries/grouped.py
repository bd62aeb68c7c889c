"""Aggregates per group when each frame's group is known without the oracle (a clip, a
time bucket): one independent run of the ungrouped operator per group, at a split
confidence, so that every group's interval holds at once.

Confidence split (Sidak): group g's operator draws only from group g's frames, in an order
from its own random stream, and stops (or spends its budget share) by its own draws only;
its budget share comes from the group sizes and the proxy, never from a label. The groups'
coverage events are therefore independent, and each at conf**(1/G) gives all G together
exactly conf (a little narrower than Bonferroni's 1 - (1-conf)/G, which it always beats).

Budget split (ORACLE BUDGET): each group first gets MIN_GROUP_BUDGET labels (all its frames
if fewer), then the rest goes a floor share evenly and the remainder by a
Neyman-like weight from the proxy's spread within the group, sd_g for AVG (minimises the
sum of the groups' variances, sd_g^2 / m_g) and N_g sd_g for SUM and COUNT (a group's total
scales with its size); with no proxy spread (no index), evenly for AVG and by size for SUM
and COUNT. No group gets more than its frames.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from vidql.base.errors import ParameterError
from vidql.base.ranges import DEFAULT_STRATA, MIN_SAMPLES, percent

from .aggregate import aggregate_error_bound, aggregate_ratio_error_bound
from .results import AggregateResult, GroupedResult
from .budget import AGGREGATES, MIN_BUDGET, aggregate_budget
from .validation import check_confidence, check_fraction, check_int, check_scores, make_rng

MIN_GROUP_BUDGET = 2 * DEFAULT_STRATA  # labels each group gets first, as an ungrouped ORACLE BUDGET


def split_confidence(confidence: float, groups: int) -> float:
    """Each of `groups` independent intervals' confidence so that all hold together with
    probability `confidence` (Sidak: confidence ** (1 / groups))."""
    confidence = check_confidence(confidence)
    return float(confidence ** (1.0 / check_int("groups", groups, 1)))


def group_positions(groups) -> tuple[list, list[np.ndarray]]:
    """(sorted distinct group labels, positions of each group in ascending order)."""
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.size == 0:
        raise ParameterError(f"groups must be a non-empty 1-D array with one label per "
                             f"frame; got shape {groups.shape}")
    keys, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse.ravel(), minlength=keys.size))[:-1]
    return [k.item() if hasattr(k, "item") else k for k in keys], np.split(order, bounds)


def restrict(true_values: Callable, positions: np.ndarray) -> Callable:
    """`true_values` seen through one group: local indices 0..len(positions)-1 map to
    `positions`; a callback that labels ahead keeps doing so, in global positions."""
    def local(frames):
        return true_values(positions[np.asarray(frames, dtype=np.int64)])

    ahead = getattr(true_values, "ahead", None)
    if ahead is not None:
        local.ahead = lambda order, now: ahead(positions[np.asarray(order, dtype=np.int64)], now)
    return local


def grouped_error_bound(groups, true_values: Callable, *, proxy: np.ndarray | None = None,
                        ratio: bool = False, error: float, relative: bool = False,
                        confidence: float = 0.95, seed=0, max_samples: int | None = None,
                        **options) -> GroupedResult:
    """ERROR WITHIN per group: `aggregate_error_bound` (the mean of `true_values`, with the
    proxy as control variate) or, with `ratio`, `aggregate_ratio_error_bound` (AVG(stat)
    over predicate frames; `true_values -> (stat, pred)`, no proxy), run on each group's
    frames at the split confidence. `groups` holds one label per frame; `max_samples` caps
    the oracle calls of all groups together, split by group size (at least MIN_SAMPLES
    each). `options` go to the operator (value_range, bound, batch, beta, p)."""
    keys, members = group_positions(groups)
    n = sum(m.size for m in members)
    if proxy is not None:
        proxy = check_scores("proxy", proxy, n)
    each = split_confidence(confidence, len(keys))
    caps = _sample_caps(max_samples, members)
    results = []
    for positions, cap, rng in zip(members, caps, make_rng(seed).spawn(len(keys)), strict=True):
        fn = restrict(true_values, positions)
        common = dict(error=error, relative=relative, confidence=each, seed=rng,
                      max_samples=cap, **options)
        if ratio:
            result = aggregate_ratio_error_bound(positions.size, fn, **common)
        else:
            result = aggregate_error_bound(positions.size, fn, **common,
                                           proxy=None if proxy is None else proxy[positions])
        results.append(_globalised(result, positions))
    split = _confidence_text(len(keys), each, confidence)
    if max_samples is not None:
        split += f"; the cap of {max_samples} oracle calls split by group size"
    return GroupedResult(keys, results, confidence, each, caps, split)


def grouped_budget(groups, proxy: np.ndarray, true_values: Callable, *, budget: int,
                   agg: str = "avg", confidence: float = 0.95, seed=0,
                   floor_fraction: float = 0.1, **options) -> GroupedResult:
    """ORACLE BUDGET per group: `aggregate_budget` (`true_values -> (stat, pred)`) on each
    group's frames with its share of `budget` (see `split_budget`) at the split
    confidence. `options` go to the operator (where, value_range)."""
    keys, members = group_positions(groups)
    proxy = check_scores("proxy", proxy, sum(m.size for m in members))
    if agg not in AGGREGATES:
        raise ParameterError(f"agg must be one of {AGGREGATES}; got {agg!r}")
    shares = split_budget(budget, members, proxy, agg, floor_fraction)
    each = split_confidence(confidence, len(keys))
    results = []
    for positions, share, rng in zip(members, shares, make_rng(seed).spawn(len(keys)),
                                     strict=True):
        result = aggregate_budget(proxy[positions], restrict(true_values, positions),
                                  budget=max(int(share), MIN_BUDGET), agg=agg, confidence=each,
                                  seed=rng,
                                  **options)
        results.append(_globalised(result, positions))
    weight = "sd_g" if agg == "avg" else "N_g * sd_g"
    split = (f"{_confidence_text(len(keys), each, confidence)}; budget {budget} split "
             f"{shares} (at least {MIN_GROUP_BUDGET} each, then {floor_fraction:.0%} evenly "
             f"and the rest by the proxy's spread, {weight})")
    return GroupedResult(keys, results, confidence, each, shares, split)


def split_budget(budget: int, members: list[np.ndarray], proxy: np.ndarray, agg: str,
                 floor_fraction: float = 0.1) -> list[int]:
    """Each group's share of `budget` (module docstring), from sizes and proxy only."""
    sizes = np.array([m.size for m in members], dtype=np.int64)
    least = np.minimum(sizes, MIN_GROUP_BUDGET)
    if not isinstance(budget, (int, np.integer)) or budget < least.sum():
        raise ParameterError(f"ORACLE BUDGET {budget} is too small for {sizes.size} groups: "
                             f"each needs {MIN_GROUP_BUDGET} labels (or all its frames), "
                             f"{int(least.sum())} in all; raise the budget or use fewer groups")
    floor_fraction = check_fraction("floor_fraction", floor_fraction)
    spread = np.array([proxy[m].std() for m in members])
    weight = spread if agg == "avg" else sizes * spread
    if not np.any(weight > 0):
        weight = np.ones(sizes.size) if agg == "avg" else sizes.astype(np.float64)
    share = floor_fraction / sizes.size + (1.0 - floor_fraction) * weight / weight.sum()
    return (least + _capped(budget - int(least.sum()), share, sizes - least)).tolist()


def _capped(total: int, share: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Whole numbers summing to min(total, sum caps), proportional to `share`, within caps:
    water-filling, then the largest remainders."""
    total = min(total, int(caps.sum()))
    alloc = np.zeros(share.size)
    open_ = caps > 0
    while open_.any() and total - alloc.sum() > 1e-9:
        left = total - alloc.sum()
        alloc = np.minimum(alloc + left * np.where(open_, share, 0.0) / share[open_].sum(), caps)
        open_ = alloc < caps
    counts = np.floor(alloc + 1e-9).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.argsort(-(np.where(counts < caps, alloc - counts, -1.0)), kind="stable")
    counts[order[:rest]] += 1
    return counts


def _sample_caps(max_samples: int | None, members: list[np.ndarray]) -> list[int | None]:
    """Per-group caps on oracle calls: `max_samples` split by group size, at least
    MIN_SAMPLES each (None: no cap, or one covering the group)."""
    if max_samples is None:
        return [None] * len(members)
    sizes = np.array([m.size for m in members], dtype=np.int64)
    least = np.minimum(sizes, MIN_SAMPLES)
    if not isinstance(max_samples, (int, np.integer)) or max_samples < least.sum():
        raise ParameterError(f"max_samples (ORACLE BUDGET with ERROR WITHIN) {max_samples} is "
                             f"too small for {sizes.size} groups: at least {MIN_SAMPLES} each, "
                             f"{int(least.sum())} in all; raise it or use fewer groups")
    caps = least + _capped(max_samples - int(least.sum()), sizes / sizes.sum(), sizes - least)
    return [None if cap >= size else int(cap) for cap, size in zip(caps, sizes, strict=True)]


def _confidence_text(groups: int, each: float, confidence: float) -> str:
    if groups == 1:
        return f"one group, at {percent(confidence)}"
    return (f"Sidak: each of {groups} groups at {percent(each)} so all hold at "
            f"{percent(confidence)}")


def _globalised(result: AggregateResult, positions: np.ndarray) -> AggregateResult:
    """A group's result with its labelled frames as positions in the whole population."""
    result.frames = positions[np.asarray(result.frames, dtype=np.int64)]
    return result
