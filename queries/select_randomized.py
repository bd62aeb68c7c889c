"""RECALL TARGET's default selector: the binomial fixed-sequence test of select_binomial.py
made randomized (exact size), with the labels that repeated draws left unspent used to drop
negatives from the answer.

Draws, ranks and positive draws are those of `recall_binomial` for the same seed. Given k
positive draws, the count X_m of them inside the top m is Bin(k, recall(top m)). With Y ~
Bin(k, target) and U ~ Uniform(0, 1) drawn after the labels, the randomized p-value
p_m = P(Y > X_m) + U P(Y = X_m) satisfies P(p_m <= delta) <= delta whenever recall(top m)
< target (it is exactly uniform at recall = target, and X_m is stochastically smaller below
it). p_m only grows as m falls (X_m falls, U is shared), so the fixed sequence m = N, N-1,
... rejects exactly the m above its first non-rejection, and the first true null is
rejected with probability <= delta: the cut has recall >= target with probability >=
1 - delta. With c the binomial rule's critical count (P(Y >= c) <= delta < P(Y >= c - 1)),
the cut is the (c-1)-th positive draw's rank + 1 when U <= rho = (delta - P(Y >= c)) /
P(Y = c - 1), else the c-th's: never larger than the binomial cut. Randomizing is allowed
only where the binomial rule certifies a cut (k >= ln(delta) / ln(target)); elsewhere the
test never rejects, which keeps it valid and keeps a coin from certifying a cut on a handful
of positive draws.

Repeated draws cost no call, so fewer than `budget` frames were labelled; the rest of the
budget labels the unlabelled frames of the certified top m from the lowest proxy up, and
the labelled negatives leave the answer. These labels come after the cut and only remove
negatives, so recall is untouched and the answer is a subset of `recall_binomial`'s.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .results import SelectionResult
from .select_binomial import RecallSample, critical_count


def randomized_count(k: int, target: float, delta: float, u: float) -> int | None:
    """How many positive draws the certified top m must hold: the binomial rule's critical
    count c, or c - 1 when u <= rho (None where the binomial rule certifies nothing)."""
    c = critical_count(k, target, delta)
    if c is None:
        return None
    from scipy import stats  # 0.4-0.5 s to import: only the queries that need it load it

    rho = (delta - stats.binom.sf(c - 1, k, target)) / stats.binom.pmf(c - 1, k, target)
    return c - 1 if u <= rho else c


def randomized_cut(positive_ranks: np.ndarray, target: float, delta: float, n: int,
                   u: float) -> int:
    """The certified top-m size from the positive draws' proxy ranks and the coin u."""
    count = randomized_count(positive_ranks.size, target, delta, u)
    if count is None:
        return n
    return 0 if count == 0 else int(np.sort(positive_ranks)[count - 1]) + 1


def recall_randomized(proxy: np.ndarray, predicate: Callable[[np.ndarray], np.ndarray], *,
                      target: float = 0.9, confidence: float = 0.95, budget: int = 1000,
                      seed=0) -> SelectionResult:
    """Frames such that recall >= target with probability >= confidence, from `budget`
    uniform draws and exactly `budget` oracle calls (fewer only when every frame is
    labelled or none is left to trim)."""
    sample = RecallSample.draw(proxy, predicate, target, confidence, budget, seed)
    if sample.exact is not None:
        return sample.exact
    draws = sample.draws
    u = float(sample.rng.random())
    m = randomized_cut(sample.positive_ranks, sample.target, 1.0 - sample.confidence, draws.n, u)
    sampled = draws.oracle.calls
    draws.trim(sample.order, m, int(budget) - sampled)
    details = sample.details("binomial, randomized") | {"trim_labels": draws.oracle.calls - sampled}
    return draws.answer(sample.order, m, details)
