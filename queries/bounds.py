"""Finite-sample confidence bounds and float64 running moments.

- Empirical Bernstein-Serfling (Bardenet & Maillard 2015, Thm 3) for means of samples
  drawn WITHOUT replacement, used with geometric epochs (Mnih et al. 2008) so that the
  bound holds at whichever epoch sampling stops.
- An exact hypergeometric lower bound on the number of positives in a finite population.
"""
from __future__ import annotations

import math

import numpy as np

SERFLING_KAPPA = 7.0 / 3.0 + 3.0 / math.sqrt(2.0)


class RunningMoments:
    """Means and co-moments of d columns, merged batch by batch in float64 (Chan et al.)."""

    def __init__(self, d: int):
        self.count = 0
        self.mean = np.zeros(d)
        self.comoment = np.zeros((d, d))

    def update(self, batch: np.ndarray) -> None:
        x = np.asarray(batch, dtype=np.float64)
        m = x.shape[0]
        if m == 0:
            return
        batch_mean = x.mean(axis=0)
        centred = x - batch_mean
        batch_comoment = centred.T @ centred
        total = self.count + m
        delta = batch_mean - self.mean
        self.comoment += batch_comoment + np.outer(delta, delta) * (self.count * m / total)
        self.mean += delta * (m / total)
        self.count = total

    def cov(self) -> np.ndarray:
        """Biased (1/n) covariance matrix."""
        return self.comoment / max(self.count, 1)


def serfling_rho(t: int, n: int) -> float:
    """Finite-population factor of the Bernstein-Serfling bound for t of n sampled."""
    if t <= n / 2:
        return 1.0 - (t - 1) / n
    return (1.0 - t / n) * (1.0 + 1.0 / t)


def eb_serfling_halfwidth(std: float, t: int, n: int, width: float, delta: float) -> float:
    """Two-sided half-width at level delta for a without-replacement sample mean.

    `std` is the biased sample standard deviation of the t values and `width` a bound on
    the range of the population values (max - min). Each side of Bardenet & Maillard's
    Thm 3 fails with probability 5*delta', so delta' = delta / 10.
    """
    x = math.log(10.0 / delta)
    rho = max(serfling_rho(t, n), 0.0)
    return std * math.sqrt(2.0 * rho * x / t) + SERFLING_KAPPA * width * x / t


def epoch_checkpoints(limit: int, beta: float = 1.5) -> list[int]:
    """Distinct sample sizes ceil(beta**k) (from 2) up to and including `limit`."""
    points: list[int] = []
    k = 1
    while True:
        t = max(math.ceil(beta ** k), (points[-1] + 1) if points else 2)
        if t >= limit:
            points.append(limit)
            return points
        points.append(t)
        k += 1


def epoch_delta(j: int, delta: float, p: float = 1.1) -> float:
    """Share of delta for the j-th check (j >= 1); the shares sum to at most delta."""
    return delta * (p - 1.0) / (p * j ** p)


def hypergeom_sf(successes: int, population: int, positives: int, sample: int) -> float:
    """P(X >= successes) for X the positives in a uniform without-replacement sample of
    `sample` items from `population` holding `positives` (summed in log space; no scipy,
    whose import costs 0.4-0.5 s)."""
    low = max(successes, sample - (population - positives), 0)
    high = min(positives, sample)
    if low > high:
        return 0.0
    k = np.arange(low, high + 1)
    log_pmf = (_log_choose(positives, k) + _log_choose(population - positives, sample - k)
               - _log_choose(population, np.array(sample)))
    return float(min(1.0, np.exp(log_pmf).sum()))


def _log_choose(n: int, k: np.ndarray) -> np.ndarray:
    return _log_factorial(n) - _log_factorial(k) - _log_factorial(n - k)


_LGAMMA = np.vectorize(math.lgamma, otypes=[np.float64])


def _log_factorial(x) -> np.ndarray:
    return _LGAMMA(np.asarray(x, dtype=np.float64) + 1.0)


def hypergeom_lower_count(successes: int, sample: int, population: int, delta: float) -> int:
    """Smallest number K of positives in a population of `population` items that is not
    rejected at level delta after a uniform without-replacement sample of `sample` items
    showed `successes` positives (exact one-sided bound: P(K_true >= result) >= 1-delta)."""
    if sample == 0 or successes == 0:
        return successes
    low, high = successes, population - (sample - successes)
    # P(X >= successes | K) increases with K; find the smallest K where it exceeds delta.
    if hypergeom_sf(successes, population, low, sample) > delta:
        return low
    while high - low > 1:
        mid = (low + high) // 2
        if hypergeom_sf(successes, population, mid, sample) > delta:
            high = mid
        else:
            low = mid
    return high
