"""Argument checks shared by the operators; each failure is a ParameterError that says
which value is wrong and what range is allowed."""
from __future__ import annotations

import math

import numpy as np

from vidql.base.errors import ParameterError
from vidql.base.ranges import CONFIDENCE, SEED


def check_confidence(confidence: float) -> float:
    """Confidence must lie strictly between 0 and 1 (a percentage is given as 0.95)."""
    if confidence not in CONFIDENCE:
        raise ParameterError(f"confidence must be in (0, 1), e.g. 0.95 for 95%; got {confidence!r}")
    return float(confidence)


def check_int(name: str, value: int, minimum: int) -> int:
    """An integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def check_fraction(name: str, value: float, *, inclusive_high: bool = True) -> float:
    """A number in (0, 1] (or (0, 1) when inclusive_high is False)."""
    high_ok = value <= 1.0 if inclusive_high else value < 1.0
    if not isinstance(value, (int, float, np.floating)) or not (0.0 < value and high_ok):
        bracket = "]" if inclusive_high else ")"
        raise ParameterError(f"{name} must be in (0, 1{bracket}; got {value!r}")
    return float(value)


def check_scores(name: str, scores, n: int | None = None) -> np.ndarray:
    """A 1-D array of finite scores (float64 copy), optionally of length n."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ParameterError(f"{name} must be a non-empty 1-D array of per-frame scores; "
                             f"got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ParameterError(f"{name} has {arr.size} scores but there are {n} frames")
    if not np.all(np.isfinite(arr)):
        raise ParameterError(f"{name} contains NaN or infinite scores; fix the index or "
                             "fill missing scores before querying")
    return arr.copy()


def check_value_range(value_range) -> tuple[float, float] | None:
    """None, or (low, high) with finite low <= high."""
    if value_range is None:
        return None
    try:
        low, high = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ParameterError(
            f"value_range must be a pair (low, high); got {value_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ParameterError(f"value_range must be finite with low <= high; got {value_range!r}")
    return low, high


def make_rng(seed) -> np.random.Generator:
    """A Generator from an int seed or an existing Generator (used as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if not isinstance(seed, (int, np.integer)) or seed not in SEED:
        raise ParameterError(
            f"seed must be a non-negative integer or numpy Generator; got {seed!r}")
    return np.random.default_rng(int(seed))
