"""Selection with a precision guarantee (SUPG's target, labelled top first), with bounds
that hold in finite samples; recall targets are in queries/select_binomial.py.

Frames are ranked by proxy. A labelled positive is certainly right, so the budget B goes
first to the top of the ranking, where labels find the most positives:

- Stage 0 labels the top B/2 frames in proxy order. A probe labels a uniform quarter of
  the next B/2 ranks (frames that labelling the top B would label anyway).
- Plan: from the probe's precision (a cautious posterior quantile), the operator predicts
  how many frames below the labelled top (at most 4 per remaining label) a uniform sample
  of the remaining labels would certify. Unless that extension is predicted to cover 1.2
  times the frames left in the top B (plus the margin below), the rest labels the next
  frames in proxy order, so the labelled frames are exactly the top B. Otherwise stage 2
  labels a uniform sample without replacement of the unlabelled frames of that region.
- Answer: every labelled positive plus the unlabelled frames of the largest top m whose
  precision is certified. Labelled positives count exactly; the unlabelled positives of
  the top c, for `cutoffs` cutoffs c in the region, have an exact hypergeometric lower
  bound from stage 2's sample (at delta / cutoffs each, Bonferroni), which also bounds
  any top m >= c. Even with no sample, the top m may pass the labelled top by up to
  (1/target - 1) times the labelled positives in unlabelled frames: the verified
  positives carry them.

The region and the stage-2 size are fixed before stage 2 draws, which only stage 2's
bound uses, so precision >= target with probability >= confidence; with no region the
bound is deterministic and the answer holds every positive of the top B by proxy.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Callable

import numpy as np

from vidql.base.ranges import MIN_SUPG_BUDGET, PRECISION_TARGET

from .bounds import hypergeom_lower_count
from .limit import proxy_order
from .oracle_calls import DistinctOracle, as_flags
from .results import SelectionResult
from .validation import check_confidence, check_int, check_scores, make_rng

MIN_BUDGET = MIN_SUPG_BUDGET
TOP_SHARE = 0.5        # of the budget labelled in proxy order before anything is decided
PROBE_SHARE = 0.25     # of the rest of the top B: the uniform probe below the labelled top
PROBE_QUANTILE = 0.2   # the probe's precision is planned at this posterior quantile
WORTH = 1.2            # an extension must be predicted to cover this many times what it replaces
SPARSEST = 4           # stage 2 labels at least 1 in SPARSEST frames of its region


class _Ranked:
    """Labels by proxy rank: which ranks the oracle labelled, which were positive, and which
    are stage 2's sample."""

    def __init__(self, order: np.ndarray, oracle: DistinctOracle):
        self.order, self.oracle = order, oracle
        n = order.size
        self.known = np.zeros(n, dtype=bool)
        self.positive = np.zeros(n, dtype=bool)
        self.sampled = np.zeros(n, dtype=bool)

    def label(self, ranks: np.ndarray) -> int:
        """Labels the frames at `ranks`; the number of positives among them."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.size:
            self.positive[ranks] = as_flags(self.oracle(self.order[ranks]), ranks.size)
            self.known[ranks] = True
        return int(self.positive[ranks].sum())

    def label_next(self, count: int) -> None:
        """Labels the `count` highest-ranked unlabelled frames."""
        self.label(np.flatnonzero(~self.known)[:count])


def _validate(proxy, target, confidence, budget, seed):
    proxy = check_scores("proxy", proxy)
    target = PRECISION_TARGET.check("target", target)
    confidence = check_confidence(confidence)
    budget = check_int("budget", budget, MIN_BUDGET)
    return proxy, target, confidence, budget, make_rng(seed)


def _answer(ranked: _Ranked, m: int, details: dict) -> SelectionResult:
    """The unlabelled frames of the top m, plus every labelled positive."""
    keep = ranked.positive.copy()
    keep[:m] |= ~ranked.known[:m]
    frames = ranked.order[keep]
    sort = np.argsort(frames)
    return SelectionResult(frames[sort].astype(np.int64), ranked.oracle.calls,
                           ranked.known[keep][sort], details)


def _exact(n, oracle, details):
    labels = as_flags(oracle(np.arange(n, dtype=np.int64)), n)
    details.update(exact=True, guarantee_met=True,
                   note="budget covers every frame: the answer is exact")
    frames = np.flatnonzero(labels).astype(np.int64)
    return SelectionResult(frames, oracle.calls, np.ones(frames.size, dtype=bool), details)


def predicted_reach(kept: int, precision: float, samples: int, room: int, target: float,
                    z: float) -> int:
    """Planning estimate: the longest run of unlabelled frames (at most `room`) below a
    labelled top holding `kept` positives that `samples` uniform labels of the run would
    certify, were its precision `precision` (normal approximation of the hypergeometric
    bound at z standard errors; 0 when none)."""
    if room <= 0 or samples <= 0:
        return 0
    length = np.unique(np.geomspace(1, room, 200).astype(np.int64)).astype(np.float64)
    drawn = np.minimum(samples, length)
    unsampled = length - drawn
    spread = precision * (1.0 - precision) / drawn * (unsampled / length)
    low = unsampled * np.maximum(precision - z * np.sqrt(spread), 0.0)
    hits = precision * drawn
    ok = kept + hits + low >= target * (kept + hits + unsampled)
    return int(length[ok].max()) if ok.any() else 0


def _plan(ranked: _Ranked, top: int, rest: int, target: float, z: float,
          rng: np.random.Generator) -> int:
    """Labels the probe below the labelled top; the extension region's length for stage 2,
    or 0 when labelling the rest of the top B is predicted to return as much."""
    from scipy import stats  # 0.4-0.5 s to import: only the queries that need it load it

    probe = max(1, int(rest * PROBE_SHARE))
    hits = ranked.label(top + rng.permutation(rest)[:probe])
    kept = int(ranked.positive.sum())
    precision = float(stats.beta.ppf(PROBE_QUANTILE, hits + 1, probe - hits + 1))
    samples = rest - probe
    room = min(ranked.order.size - top, SPARSEST * samples)
    reach = predicted_reach(kept, precision, samples, room, target, z)
    margin = kept * (1.0 - target) / target
    return reach if reach >= WORTH * (rest + margin) else 0


def _sample_region(ranked: _Ranked, top: int, region: int, count: int,
                   rng: np.random.Generator) -> None:
    """Stage 2: `count` uniform labels without replacement among the region's unlabelled
    frames."""
    pool = top + np.flatnonzero(~ranked.known[top:top + region])
    draw = rng.permutation(pool)[:count]
    ranked.label(draw)
    ranked.sampled[draw] = True


def _region_bounds(ranked: _Ranked, top: int, region: int, delta: float,
                   cutoffs: int) -> list[tuple[int, int]]:
    """(c, lower bound on the unlabelled positives of the top c) at each cutoff c of the
    region, from stage 2's sample (the pool: frames unlabelled before stage 2)."""
    span = slice(top, top + region)
    pool = np.cumsum(~ranked.known[span] | ranked.sampled[span])
    drawn = np.cumsum(ranked.sampled[span])
    hits = np.cumsum(ranked.sampled[span] & ranked.positive[span])
    bounds = []
    for c in np.unique(np.linspace(top, top + region, cutoffs + 1)[1:].astype(np.int64)):
        i = c - top - 1
        low = hypergeom_lower_count(int(hits[i]), int(drawn[i]), int(pool[i]), delta / cutoffs)
        bounds.append((int(c), low - int(hits[i])))
    return bounds


def _certified_size(ranked: _Ranked, bounds: list[tuple[int, int]],
                    target: float) -> tuple[int, float]:
    """(the largest m whose answer has precision >= target given the bounds, its
    precision bound). A bound at c holds for every top m >= c."""
    kept = int(ranked.positive.sum())
    unlabelled = np.cumsum(~ranked.known)
    best, best_bound, low = 0, 1.0, 0
    for c, low_c in bounds:
        low = max(low, low_c)
        room = math.floor((kept + low) / target - kept + 1e-9)
        m = int(np.searchsorted(unlabelled, room, side="right"))
        if m >= c and m > best:
            size = kept + int(unlabelled[m - 1]) if m else kept
            best, best_bound = m, (kept + low) / size if size else 1.0
    return best, best_bound


def supg_precision(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                   target: float = 0.95, confidence: float = 0.95, budget: int = 1000, seed=0,
                   cutoffs: int = 50) -> SelectionResult:
    """Frames such that precision >= target with probability >= confidence.

    Spends at most min(budget, n) oracle calls; `details` says how many top frames were
    labelled, the extension region sampled (0: none: the top `budget` frames by proxy were
    labelled and all their positives return) and the certified cutoff rank.
    """
    proxy, target, confidence, budget, rng = _validate(proxy, target, confidence, budget,
                                                       seed)
    cutoffs = check_int("cutoffs", cutoffs, 1)
    n = proxy.size
    delta = 1.0 - confidence
    oracle = DistinctOracle(predicate, n)
    details = {"target": target, "confidence": confidence, "kind": "precision", "exact": False}
    if budget >= n:
        return _exact(n, oracle, details)
    ranked = _Ranked(proxy_order(proxy, rng), oracle)
    top = max(1, int(budget * TOP_SHARE))
    ranked.label(np.arange(top))
    rest = budget - top
    z = NormalDist().inv_cdf(1.0 - delta / cutoffs)
    region = _plan(ranked, top, rest, target, z, rng) if rest > 1 else 0
    if region:
        _sample_region(ranked, top, region, budget - oracle.calls, rng)
    else:
        ranked.label_next(budget - oracle.calls)
    bounds = [(top, 0)] + (_region_bounds(ranked, top, region, delta, cutoffs) if region else [])
    m, bound = _certified_size(ranked, bounds, target)
    order = ranked.order
    details.update(top_labelled=top if region else budget, extension=region, cutoff_rank=m,
                   precision_bound=bound,
                   proxy_threshold=float(proxy[order[m - 1]]) if m else math.inf,
                   labelled_positives=int(ranked.positive.sum()), guarantee_met=True)
    if not region:
        details["note"] = (f"labelled the top {budget} frames by proxy (sampling below them "
                           f"was not predicted to return more); the answer is their positives "
                           f"and the next frames their margin certifies")
    return _answer(ranked, m, details)
