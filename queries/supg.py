"""Selection with a precision guarantee (SUPG-style), with bounds that hold in finite
samples; recall targets are in queries/select_binomial.py.

The operator returns the frames above a proxy cutoff plus every sampled positive, minus
every sampled negative.

- Precision: stage 1 draws as above to estimate how many positives exist, which caps the
  candidate prefix at top-M; stage 2 labels frames of that prefix uniformly without
  replacement. For each of `cutoffs` candidate cutoffs, an exact hypergeometric lower
  bound (at delta / cutoffs, Bonferroni) on the positives among the prefix's unsampled
  frames bounds the precision of the set that would be returned; the largest cutoff whose
  bound reaches the target is kept.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from vidql.base.ranges import MIN_SUPG_BUDGET, PRECISION_TARGET

from .bounds import hypergeom_lower_count
from .limit import proxy_order
from .oracle_calls import DistinctOracle, as_flags
from .results import SelectionResult
from .validation import (check_confidence, check_fraction, check_int, check_scores,
                         make_rng)

MIN_BUDGET = MIN_SUPG_BUDGET


ROUNDING = 1e-9  # a probability proxy may leave [0, 1] by this much through float rounding


def sampling_distribution(proxy: np.ndarray, uniform_mix: float = 0.1) -> np.ndarray:
    """q proportional to sqrt(score) mixed with `uniform_mix` uniform, on a copy of the
    scores: a probability that rounding took just outside [0, 1] is clipped into it; other
    proxies outside [0, 1] are rank-normalised first."""
    scores = np.array(proxy, dtype=np.float64)
    if -ROUNDING <= scores.min() and scores.max() <= 1.0 + ROUNDING:
        scores = np.clip(scores, 0.0, 1.0)
    else:
        from scipy import stats  # 0.4-0.5 s to import: only the queries that need it load it

        scores = stats.rankdata(scores) / scores.size
    root = np.sqrt(scores)
    n = scores.size
    total = root.sum()
    shaped = root / total if total > 0 else np.full(n, 1.0 / n)
    return (1.0 - uniform_mix) * shaped + uniform_mix / n


def _draw_distinct(q: np.ndarray, distinct: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draws (with replacement) from q until `distinct` different frames appeared.
    Returns (all draws in order, distinct frames in order of first appearance). The
    stopping time depends on frame indices only, not on labels."""
    seen = np.zeros(q.size, dtype=bool)
    distinct = min(distinct, q.size)
    draws, new = [], []
    found = 0
    cdf = np.cumsum(q)
    cdf /= cdf[-1]
    while found < distinct:
        chunk = np.minimum(np.searchsorted(cdf, rng.random(max(4 * (distinct - found), 64)),
                                           side="right"), q.size - 1)
        first = np.zeros(chunk.size, dtype=bool)
        _, idx = np.unique(chunk, return_index=True)
        first[idx] = True
        fresh = first & ~seen[chunk]
        positions = np.flatnonzero(fresh)
        if positions.size > distinct - found:
            cut = positions[distinct - found - 1] + 1
            chunk, fresh = chunk[:cut], fresh[:cut]
        seen[chunk[fresh]] = True
        found += int(fresh.sum())
        draws.append(chunk)
        new.append(chunk[fresh])
    if not draws:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(draws), np.concatenate(new)


def _validate(proxy, target, confidence, budget, uniform_mix, seed):
    proxy = check_scores("proxy", proxy)
    target = PRECISION_TARGET.check("target", target)
    confidence = check_confidence(confidence)
    budget = check_int("budget", budget, MIN_BUDGET)
    uniform_mix = check_fraction("uniform_mix", uniform_mix)
    return proxy, target, confidence, budget, uniform_mix, make_rng(seed)


def _answer(n, top: np.ndarray, labelled: np.ndarray, labels: np.ndarray, calls: int,
            details: dict) -> SelectionResult:
    """top (frames) minus labelled negatives, plus labelled positives."""
    keep = np.zeros(n, dtype=bool)
    keep[top] = True
    keep[labelled[~labels]] = False
    keep[labelled[labels]] = True
    frames = np.flatnonzero(keep).astype(np.int64)
    verified = np.zeros(n, dtype=bool)
    verified[labelled] = True
    return SelectionResult(frames, calls, verified[frames], details)


def _exact(n, oracle, details):
    frames = np.arange(n, dtype=np.int64)
    labels = as_flags(oracle(frames), n)
    details.update(exact=True, guarantee_met=True,
                   note="budget covers every frame: the answer is exact")
    return _answer(n, np.zeros(0, dtype=np.int64), frames, labels, oracle.calls, details)


def _positives_high(positive: np.ndarray, draws: np.ndarray, q: np.ndarray) -> float:
    """A high estimate (mean + 2 standard errors) of the number of positives from the
    importance-weighted stage-1 draws."""
    contrib = positive[draws] / (positive.size * q[draws])
    return positive.size * (contrib.mean() + 2.0 * contrib.std() / math.sqrt(contrib.size))


def _certified_cutoff(grid: np.ndarray, counts, target: float,
                      delta: float) -> tuple[int, float]:
    """(the largest rank m in `grid` whose top-m frames have precision >= target at level
    1 - delta, its precision bound); (0, nan) when none. `counts` are cumulative over
    the ranks: stage-1 positives, stage-2 sampled, stage-2 positives, eligible frames."""
    first_pos_cum, sampled_cum, sampled_pos_cum, eligible_cum = counts
    for m in grid[::-1]:
        i = m - 1
        sampled, hits, pool = int(sampled_cum[i]), int(sampled_pos_cum[i]), int(eligible_cum[i])
        low = hypergeom_lower_count(hits, sampled, pool, delta)
        # returned frames of the top-m: stage-1 positives, sampled positives, unsampled
        size = first_pos_cum[i] + hits + (pool - sampled)
        precision_low = (first_pos_cum[i] + low) / size if size > 0 else 1.0
        if precision_low >= target:
            return int(m), float(precision_low)
    return 0, math.nan


def supg_precision(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                   target: float = 0.95, confidence: float = 0.95, budget: int = 1000, seed=0,
                   uniform_mix: float = 0.1, stage1_fraction: float = 0.5,
                   cutoffs: int = 50) -> SelectionResult:
    """Frames such that precision >= target with probability >= confidence.

    Spends at most min(budget, n) oracle calls. When no cutoff can be certified, the answer
    is only the sampled positives (all verified), and `details['note']` says so.
    """
    proxy, target, confidence, budget, uniform_mix, rng = _validate(
        proxy, target, confidence, budget, uniform_mix, seed)
    stage1_fraction = check_fraction("stage1_fraction", stage1_fraction, inclusive_high=False)
    cutoffs = check_int("cutoffs", cutoffs, 1)
    n = proxy.size
    delta = 1.0 - confidence
    oracle = DistinctOracle(predicate, n)
    details = {"target": target, "confidence": confidence, "kind": "precision", "exact": False}
    if budget >= n:
        return _exact(n, oracle, details)
    order = proxy_order(proxy, rng)
    q = sampling_distribution(proxy, uniform_mix)
    # stage 1: estimate the number of positives to cap the candidate prefix (not part of
    # the guarantee: a wrong cap only changes which cutoffs are tried)
    draws, first = _draw_distinct(q, max(1, int(budget * stage1_fraction)), rng)
    first_labels = as_flags(oracle(first), first.size)
    positive = np.zeros(n, dtype=bool)
    positive[first[first_labels]] = True
    positives_high = _positives_high(positive, draws, q)
    stage2_budget = budget - oracle.calls
    prefix = int(min(n, max(math.ceil(positives_high / target), stage2_budget)))
    labelled = np.zeros(n, dtype=bool)
    labelled[first] = True
    top = order[:prefix]
    eligible = top[~labelled[top]]
    second = rng.permutation(eligible)[:stage2_budget]
    second_labels = as_flags(oracle(second), second.size) if second.size else np.zeros(0, bool)
    in_second = np.zeros(n, dtype=bool)
    in_second[second] = True
    positive[second[second_labels]] = True
    # per rank within the prefix: cumulative counts
    by_rank = order[:prefix]
    eligible_cum = np.cumsum(~labelled[by_rank])
    sampled_cum = np.cumsum(in_second[by_rank])
    sampled_pos_cum = np.cumsum(in_second[by_rank] & positive[by_rank])
    first_pos_cum = np.cumsum(labelled[by_rank] & positive[by_rank])
    # cutoffs from the smallest prefix whose sample could certify the target at all
    need = math.ceil(math.log(delta / cutoffs) / math.log(target))
    rate = second.size / max(eligible.size, 1)
    smallest = int(np.searchsorted(eligible_cum * rate, need)) + 1
    grid = np.unique(np.linspace(min(smallest, prefix), prefix, cutoffs).astype(np.int64))
    chosen, bound = _certified_cutoff(grid, (first_pos_cum, sampled_cum, sampled_pos_cum,
                                             eligible_cum), target, delta / cutoffs)
    all_frames = np.concatenate([first, second])
    all_labels = np.concatenate([first_labels, second_labels])
    details.update(prefix=prefix, cutoff_rank=chosen, precision_bound=bound,
                   proxy_threshold=float(proxy[order[chosen - 1]]) if chosen else math.inf,
                   sampled_positives=int(all_labels.sum()), guarantee_met=True)
    if chosen == 0:
        details["note"] = ("budget too small to certify any cutoff at this confidence: "
                           "returned only the sampled positives")
    return _answer(n, order[:chosen], all_frames, all_labels, oracle.calls, details)
