"""Selection with a recall target by exact binomial testing (Learn-then-Test, fixed
sequence), its adaptive-budget variant, and SUPG's normal-approximation mode.

Frames are ranked by decreasing proxy (random tie-break) and the oracle labels frames
drawn uniformly WITH replacement (a repeated draw costs no call but counts as a draw).
Given k positive draws, they are i.i.d. uniform over the positives, so the number of them
inside the top m is Bin(k, recall(top m)). With the positive draws at ranks
r(1) <= ... <= r(k), let c be the smallest count with P(Bin(k, target) >= c) <= delta;
testing "recall(top m) < target" for m = N, N-1, ... and stopping at the first
non-rejection rejects exactly the m > r(c), and the first true null is rejected with
probability <= delta, so the cut m = r(c) + 1 has recall >= target with probability
>= 1 - delta. The answer is the top m plus the sampled positives, minus the sampled
negatives (neither lowers recall). Fewer than ln(delta) / ln(target) positive draws
certify nothing: the answer is then every frame except the sampled negatives.
RECALL TARGET's default (select_randomized.py) randomizes this test and uses the labels
that repeated draws leave unspent.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .limit import proxy_order
from .oracle_calls import DistinctOracle, as_flags
from .results import SelectionResult
from .supg import MIN_BUDGET
from .validation import check_confidence, check_fraction, check_int, check_scores, make_rng

ADAPTIVE_LOOKS = 4      # looks of the adaptive budget: cap/8, cap/4, cap/2, cap (delta / 4 each)
ADAPTIVE_SLACK = 2.0    # stop once the set is within this factor of the estimated positives
TOO_SMALL_NOTE = ("budget too small to certify a smaller set at this confidence: returned "
                  "every frame except sampled negatives")
FEW_DRAWS = "{k} positive draws, at least {need} needed"
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


def min_positive_draws(target: float, confidence: float) -> int:
    """Positive draws below which no cut can be certified: target**k > 1 - confidence
    (sys.maxsize for a 100% target, which only every frame but the sampled negatives meets)."""
    if target >= 1.0:
        return sys.maxsize
    return math.ceil(math.log(1.0 - confidence) / math.log(target))


def critical_count(k: int, target: float, delta: float) -> int | None:
    """Smallest c in 1..k with P(Bin(k, target) >= c) <= delta (None if there is none)."""
    if k == 0:
        return None
    from scipy import stats  # 0.4-0.5 s to import: only the queries that need it load it

    tail = stats.binom.sf(np.arange(k), k, target)  # P(X >= c) for c = 1..k
    passing = np.flatnonzero(tail <= delta)
    return int(passing[0]) + 1 if passing.size else None


def binomial_cut(positive_ranks: np.ndarray, target: float, delta: float, n: int) -> int:
    """The certified top-m size from the proxy ranks of the positive draws (n if none)."""
    c = critical_count(positive_ranks.size, target, delta)
    return n if c is None else int(np.sort(positive_ranks)[c - 1]) + 1


def rank_by_proxy(proxy: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Frames by decreasing proxy (random tie-break) and each frame's rank in that order."""
    order = proxy_order(proxy, rng)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return order, rank


def check_recall_args(proxy, target, confidence, budget, seed):
    """The recall selectors' arguments checked, and the seed's generator."""
    proxy = check_scores("proxy", proxy)
    # a 100% target is allowed: every frame but the sampled negatives is its answer
    target = check_fraction("target", target, inclusive_high=True)
    confidence = check_confidence(confidence)
    budget = check_int("budget", budget, MIN_BUDGET)
    return proxy, target, confidence, budget, make_rng(seed)


class RecallDraws:
    """Draws with replacement, labelled once per distinct frame, in draw order."""

    def __init__(self, n: int, predicate: Callable, rng: np.random.Generator):
        self.n, self.rng = n, rng
        self.oracle = DistinctOracle(predicate, n)
        self.frames = np.zeros(0, dtype=np.int64)
        self.positive = np.zeros(n, dtype=bool)

    def extend(self, total: int, q: np.ndarray | None = None) -> None:
        """Draw (uniformly, or from q) until `total` draws were made, labelling the new
        distinct frames."""
        size = total - self.frames.size
        new = self.rng.integers(0, self.n, size) if q is None else \
            self.rng.choice(self.n, size=size, p=q)
        self.frames = np.concatenate([self.frames, new])
        fresh = np.unique(new[~self.oracle.labelled[new]])
        if fresh.size:
            self.positive[fresh[as_flags(self.oracle(fresh), fresh.size)]] = True

    def trim(self, order: np.ndarray, m: int, labels: int) -> None:
        """Label up to `labels` unlabelled frames of the top m, lowest proxy first: the
        answer drops those that are negative (the proxy makes them the likeliest ones)."""
        unlabelled = order[:m][~self.oracle.labelled[order[:m]]]
        frames = unlabelled[::-1][:max(labels, 0)]
        if frames.size:
            self.positive[frames[as_flags(self.oracle(frames), frames.size)]] = True

    def label_all(self) -> SelectionResult:
        """Every frame labelled: the exact answer (used when the budget covers them all)."""
        frames = np.arange(self.n, dtype=np.int64)
        self.positive = as_flags(self.oracle(frames), self.n)
        details = {"exact": True, "guarantee_met": True, "labels_used": self.oracle.calls,
                   "note": "budget covers every frame: the answer is exact"}
        positives = np.flatnonzero(self.positive).astype(np.int64)
        return SelectionResult(positives, self.oracle.calls, np.ones(positives.size, bool),
                               details)

    def answer(self, order: np.ndarray, m: int, details: dict) -> SelectionResult:
        """Top m by proxy, plus sampled positives, minus sampled negatives."""
        labelled = self.oracle.labelled
        keep = np.zeros(self.n, dtype=bool)
        keep[order[:m]] = True
        keep[labelled & ~self.positive] = False
        keep[self.positive] = True
        frames = np.flatnonzero(keep).astype(np.int64)
        details.update(cutoff_rank=int(m), draws=int(self.frames.size),
                       sampled_positives=int(self.positive.sum()), labels_used=self.oracle.calls)
        if m >= self.n:
            details["note"] = TOO_SMALL_NOTE
            if "positive_draws" in details and details["target"] < 1.0:
                need = min_positive_draws(details["target"], details["confidence"])
                details["note"] += " (" + FEW_DRAWS.format(k=details["positive_draws"],
                                                           need=need) + ")"
        return SelectionResult(frames, self.oracle.calls, labelled[frames], details)


@dataclass
class RecallSample:
    """`budget` uniform draws for a recall selection, labelled: the draws, the frames by
    decreasing proxy (`order`), the proxy ranks of the positive draws, the checked target
    and confidence, and the generator; `exact` instead when the budget covers every frame."""

    draws: RecallDraws
    order: np.ndarray
    positive_ranks: np.ndarray
    target: float
    confidence: float
    rng: np.random.Generator
    exact: SelectionResult | None = None

    @classmethod
    def draw(cls, proxy, predicate, target, confidence, budget, seed) -> "RecallSample":
        proxy, target, confidence, budget, rng = check_recall_args(proxy, target, confidence,
                                                                   budget, seed)
        draws = RecallDraws(proxy.size, predicate, rng)
        if budget >= proxy.size:
            return cls(draws, proxy[:0], proxy[:0], target, confidence, rng, draws.label_all())
        order, rank = rank_by_proxy(proxy, rng)
        draws.extend(budget)
        hits = draws.positive[draws.frames]
        return cls(draws, order, rank[draws.frames[hits]], target, confidence, rng)

    def details(self, method: str) -> dict:
        return {"target": self.target, "confidence": self.confidence, "kind": "recall",
                "method": method, "positive_draws": int(self.positive_ranks.size),
                "guarantee_met": True}


def recall_binomial(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                    target: float = 0.9, confidence: float = 0.95, budget: int = 1000,
                    seed=0) -> SelectionResult:
    """Frames such that recall >= target with probability >= confidence, from `budget`
    uniform draws (at most `budget` oracle calls: repeated draws are free)."""
    sample = RecallSample.draw(proxy, predicate, target, confidence, budget, seed)
    if sample.exact is not None:
        return sample.exact
    m = binomial_cut(sample.positive_ranks, sample.target, 1.0 - sample.confidence,
                     sample.draws.n)
    return sample.draws.answer(sample.order, m, sample.details("binomial"))


def adaptive_schedule(max_budget: int) -> list[int]:
    """Draw counts at which the adaptive mode looks: max_budget / 2**j, fixed in advance."""
    looks = [max(MIN_BUDGET, max_budget >> j) for j in range(ADAPTIVE_LOOKS)][::-1]
    return sorted(set(looks))


def recall_adaptive(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                    target: float = 0.9, confidence: float = 0.95, max_budget: int = 5000,
                    seed=0) -> SelectionResult:
    """As recall_binomial, drawing in rounds on a fixed schedule of looks (each tested at
    delta / looks, so the guarantee holds at whichever look stops): stop once the certified
    set is within ADAPTIVE_SLACK x the estimated number of positives or the cap is spent."""
    proxy, target, confidence, max_budget, rng = check_recall_args(proxy, target, confidence,
                                                       max_budget, seed)
    n = proxy.size
    draws = RecallDraws(n, predicate, rng)
    if max_budget >= n:
        return draws.label_all()
    order, rank = rank_by_proxy(proxy, rng)
    schedule = adaptive_schedule(max_budget)
    delta = (1.0 - confidence) / len(schedule)
    for total in schedule:
        draws.extend(total)
        hits = draws.positive[draws.frames]
        m = binomial_cut(rank[draws.frames[hits]], target, delta, n)
        estimated = n * hits.mean()
        if m <= ADAPTIVE_SLACK * estimated:
            break
    details = {"target": target, "confidence": confidence, "kind": "recall",
               "method": "binomial, adaptive", "looks": schedule.index(total) + 1,
               "schedule": schedule,
               "estimated_positives": float(estimated), "positive_draws": int(hits.sum()),
               "guarantee_met": True}
    return draws.answer(order, m, details)


def recall_normal(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                  target: float = 0.9, confidence: float = 0.95, budget: int = 1000, seed=0,
                  uniform_mix: float = 0.1) -> SelectionResult:
    """SUPG's importance-sampled recall selector with normal-approximation bounds
    (APPROXIMATE: the guarantee holds only asymptotically).

    Draws `budget` frames from q (sqrt proxy mixed with uniform), weights m = 1/(N q);
    finds the cut m0 whose weighted recall estimate reaches the target, raises the target
    to UB(kept) / (UB(kept) + LB(missed)) with z = Phi^-1(1 - delta/2), and cuts where the
    estimate reaches that stricter target."""
    proxy, target, confidence, budget, rng = check_recall_args(proxy, target, confidence,
                                                               budget, seed)
    uniform_mix = check_fraction("uniform_mix", uniform_mix)
    n = proxy.size
    draws = RecallDraws(n, predicate, rng)
    if budget >= n:
        return draws.label_all()
    order, rank = rank_by_proxy(proxy, rng)
    q = sampling_distribution(proxy, uniform_mix)
    draws.extend(budget, q)
    weight = draws.positive[draws.frames] / (n * q[draws.frames])
    details = {"target": target, "confidence": confidence, "kind": "recall",
               "method": "normal approximation (SUPG), not finite-sample",
               "guarantee_met": False}
    if not weight.any():
        return draws.answer(order, n, details)
    draw_rank = rank[draws.frames]
    m0 = _weighted_cut(draw_rank, weight, target, n)
    from scipy import stats  # 0.4-0.5 s to import: only the queries that need it load it

    z = stats.norm.ppf(1.0 - (1.0 - confidence) / 2.0)
    kept = np.where(draw_rank < m0, weight, 0.0)
    missed = weight - kept
    upper_kept = kept.mean() + z * kept.std() / math.sqrt(budget)
    lower_missed = max(missed.mean() - z * missed.std() / math.sqrt(budget), 0.0)
    stricter = min(1.0, upper_kept / (upper_kept + lower_missed))
    details["adjusted_target"] = float(stricter)
    return draws.answer(order, _weighted_cut(draw_rank, weight, stricter, n), details)


def _weighted_cut(draw_rank: np.ndarray, weight: np.ndarray, target: float, n: int) -> int:
    """Smallest top-m whose weighted share of the sampled positives reaches target."""
    by_rank = np.argsort(draw_rank, kind="stable")
    share = np.cumsum(weight[by_rank]) / weight.sum()
    j = int(np.searchsorted(share, target - 1e-12))
    return n if j >= share.size else int(draw_rank[by_rank][j]) + 1


def predicted_recall_cut(proxy: np.ndarray, target: float, confidence: float,
                         budget: int) -> tuple[float, float, float]:
    """With the proxy taken as the probability of each frame being positive: the expected
    certified set size, its precision and its recall at this budget (no oracle call)."""
    p = np.clip(np.sort(np.asarray(proxy, dtype=np.float64))[::-1], 0.0, 1.0)
    n, total = p.size, p.sum()
    if total <= 0:
        return float(n), 0.0, 1.0
    k = int(round(budget * total / n))
    c = critical_count(k, target, 1.0 - confidence)
    if c is None:
        return float(n), total / n, 1.0
    recall_curve = np.cumsum(p) / total
    quantile = (c - 1.0 / 3.0) / (k + 1.0 / 3.0)  # median of the c-th of k uniform order stats
    m = min(int(np.searchsorted(recall_curve, quantile)) + 1, n)
    return float(m), float(recall_curve[m - 1] * total / m), float(recall_curve[m - 1])


def budget_for_size(proxy: np.ndarray, target: float, confidence: float, size: float,
                    limit: int) -> int | None:
    """Smallest budget (on a doubling grid up to `limit`) whose predicted certified set has
    at most `size` frames, or None."""
    budget = MIN_BUDGET
    while budget <= limit:
        if predicted_recall_cut(proxy, target, confidence, budget)[0] <= size:
            return budget
        budget *= 2
    return None

