"""Oracle callbacks wrapped so that each frame is labelled at most once and every call is
counted; outputs are checked for the expected shape."""
from __future__ import annotations

from typing import Callable

import numpy as np

from vidql.base.errors import OracleError


class DistinctOracle:
    """Calls `fn(frames)` on frames never passed before; `calls` counts distinct frames.

    Passing a frame twice is a bug in the operator, so it raises AssertionError-style
    RuntimeError rather than paying the oracle again.
    """

    def __init__(self, fn: Callable, n: int):
        self._fn = fn
        self._seen = np.zeros(n, dtype=bool)
        self.calls = 0

    @property
    def labelled(self) -> np.ndarray:
        """Boolean mask of frames already labelled."""
        return self._seen

    def __call__(self, frames: np.ndarray):
        frames = np.asarray(frames, dtype=np.int64)
        if frames.ndim != 1:
            raise RuntimeError("internal: frames must be 1-D")
        if frames.size and (frames.min() < 0 or frames.max() >= self._seen.size):
            raise RuntimeError("internal: frame index out of range")
        if self._seen[frames].any() or np.unique(frames).size != frames.size:
            raise RuntimeError("internal: a frame was about to be labelled twice")
        self._seen[frames] = True
        self.calls += int(frames.size)
        return self._fn(frames)


def as_values(out, m: int, what: str = "true_values") -> np.ndarray:
    """The oracle's per-frame numbers as float64 of length m, finite."""
    arr = np.asarray(out, dtype=np.float64)
    if arr.shape != (m,):
        raise OracleError(f"{what} returned shape {arr.shape} for {m} frames; expected ({m},)")
    if not np.all(np.isfinite(arr)):
        raise OracleError(f"{what} returned NaN or infinite values")
    return arr


def as_flags(out, m: int, what: str = "predicate") -> np.ndarray:
    """The oracle's per-frame truth values as a bool array of length m."""
    arr = np.asarray(out)
    if arr.shape != (m,):
        raise OracleError(f"{what} returned shape {arr.shape} for {m} frames; expected ({m},)")
    if arr.dtype != bool:
        if not np.all(np.isin(arr, (0, 1))):
            raise OracleError(f"{what} must return booleans (or 0/1)")
        arr = arr.astype(bool)
    return arr


def split_pair(out, m: int, what: str = "true_values") -> tuple[np.ndarray, np.ndarray]:
    """A callback result `(stat, pred)` as (float64, bool) arrays of length m."""
    if not isinstance(out, tuple) or len(out) != 2:
        raise OracleError(f"{what} must return a pair (stat, pred)")
    return as_values(out[0], m, what + " stat"), as_flags(out[1], m, what + " pred")
