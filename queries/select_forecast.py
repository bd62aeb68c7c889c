"""What a RECALL/PRECISION TARGET would return, forecast from the proxy alone (EXPLAIN).

The proxy is taken as calibrated: frame i is positive with probability clip(proxy_i, 0, 1).
Recall targets use the binomial rule's expected cut (queries/select_binomial.py): RECALL
TARGET's default (queries/select_randomized.py) returns a subset of that rule's set, so the
forecast is on the large side; precision
targets dry-run the operator on labels drawn from the proxy (no oracle call).
"""
from __future__ import annotations

import numpy as np

from .select_binomial import (FEW_DRAWS, TOO_SMALL_NOTE, adaptive_schedule, budget_for_size,
                              min_positive_draws, predicted_recall_cut)
from .supg import MIN_BUDGET, supg_precision

DRY_RUNS = 3  # simulated precision runs per budget (median taken)


def _precision_dry_run(proxy, target, confidence, budget) -> tuple[float, float, float]:
    """Median (set size, precision, recall) of the precision operator on simulated labels."""
    p = np.clip(proxy, 0.0, 1.0)
    runs = []
    for seed in range(DRY_RUNS):
        labels = np.random.default_rng(seed).random(p.size) < p
        res = supg_precision(proxy, labels.__getitem__, target=target, confidence=confidence,
                             budget=budget, seed=seed)
        hits = labels[res.frames].sum()
        runs.append((res.frames.size, hits / max(res.frames.size, 1),
                     hits / max(labels.sum(), 1)))
    return tuple(float(v) for v in np.median(np.array(runs), axis=0))


def _precision_budget_for(proxy, target, confidence, size: float, limit: int) -> int | None:
    """Smallest budget (doubling grid) whose forecast set has at least `size` frames."""
    budget = MIN_BUDGET
    while budget <= limit:
        if _precision_dry_run(proxy, target, confidence, budget)[0] >= size:
            return budget
        budget *= 2
    return None


def selection_forecast(proxy: np.ndarray, kind: str, target: float, confidence: float,
                       budget: int, adaptive: bool = False) -> dict:
    """Forecast of a selection: positives, budget spent, set size, precision, recall, the
    budgets for a set within 2x and 5x of the positives, and a note when the budget is too
    small to certify anything useful."""
    proxy = np.asarray(proxy, dtype=np.float64)
    n = proxy.size
    positives = float(np.clip(proxy, 0.0, 1.0).sum())
    out = {"positives": positives, "budget": int(min(budget, n))}
    if kind == "recall":
        spent, conf = budget, confidence
        if adaptive:
            schedule = adaptive_schedule(budget)
            conf = 1.0 - (1.0 - confidence) / len(schedule)
            for spent in schedule:
                if predicted_recall_cut(proxy, target, conf, spent)[0] <= 2 * positives:
                    break
        size, precision, recall = predicted_recall_cut(proxy, target, conf, spent)
        out.update(budget=int(min(spent, n)), set_size=size, precision=precision, recall=recall,
                   budget_for_2x=budget_for_size(proxy, target, confidence, 2 * positives, n),
                   budget_for_5x=budget_for_size(proxy, target, confidence, 5 * positives, n))
        if size >= n:
            expected = out["budget"] * positives / max(n, 1)
            need = min_positive_draws(target, confidence)
            out["note"] = (TOO_SMALL_NOTE + " (about " + FEW_DRAWS.format(k=round(expected),
                                                                         need=need) + ")"
                           if target < 1.0 else
                           "a 100% recall target returns every frame but sampled negatives")
        return out
    size, precision, recall = _precision_dry_run(proxy, target, confidence, budget)
    out.update(set_size=size, precision=precision, recall=recall,
               budget_for_2x=_precision_budget_for(proxy, target, confidence, positives / 2, n),
               budget_for_5x=_precision_budget_for(proxy, target, confidence, positives / 5, n))
    if size == 0:
        out["note"] = ("no positive expected among the frames this budget labels (the top ones by "
                       "proxy) nor a certified cutoff: the set is likely empty")
    return out
