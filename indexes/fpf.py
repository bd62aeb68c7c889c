"""Farthest-point-first (FPF) selection and the random + FPF choice of representatives."""
from __future__ import annotations

import numpy as np

from .neighbours import nearest
from .rowfile import RowFile, row_blocks


def farthest_point_first(x, n: int, *, initial=None, seed: int = 0) -> np.ndarray:
    """Indices of `n` new rows of `x` (an array or a RowFile) picked greedily, each the
    farthest (Euclidean) from all rows picked so far and from `initial`; ties go to the
    lowest index.

    Without `initial`, the first pick is a seeded random row. Memory is O(N) beside `x`: a
    few distance vectors, updated with a matrix-vector product per step, which reads `x`
    a block at a time (a RowFile's rows never all in memory).
    """
    x = x if isinstance(x, RowFile) else np.asarray(x, dtype=np.float32)
    n_rows = len(x)
    initial = np.asarray([] if initial is None else initial, dtype=np.int64)
    n = min(int(n), n_rows - len(np.unique(initial)))
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    sq_norms = np.empty(n_rows, dtype=np.float64)
    for start, rows in row_blocks(x):
        np.einsum("ij,ij->i", rows, rows, dtype=np.float64, out=sq_norms[start:start + len(rows)])
    dots = np.empty(n_rows, dtype=np.float32)
    picks = np.empty(n, dtype=np.int64)
    if len(initial):
        min_dist, _ = nearest(x, x[initial], 1)
        min_dist = min_dist[:, 0].astype(np.float64) ** 2
        min_dist[initial] = -1.0
        start = 0
    else:
        picks[0] = np.random.default_rng(seed).integers(n_rows)
        min_dist = _sq_dist_to(x, sq_norms, picks[0], dots)
        min_dist[picks[0]] = -1.0
        start = 1
    for step in range(start, n):
        pick = int(np.argmax(min_dist))
        picks[step] = pick
        np.minimum(min_dist, _sq_dist_to(x, sq_norms, pick, dots), out=min_dist)
        min_dist[pick] = -1.0  # never picked twice, even among duplicates
    return picks


def _sq_dist_to(x, sq_norms: np.ndarray, i: int, dots: np.ndarray) -> np.ndarray:
    """Squared distances of every row of `x` to row `i` (`dots`: scratch, one per row)."""
    centre = np.array(x[i], dtype=np.float32)
    for start, rows in row_blocks(x):
        np.matmul(rows, centre, out=dots[start:start + len(rows)])
    d = sq_norms - 2.0 * dots.astype(np.float64) + sq_norms[i]
    return np.maximum(d, 0.0)


def random_representatives(n_frames: int, n_reps: int, *, already=None, seed: int = 0
                           ) -> np.ndarray:
    """The random quarter of `n_reps` representatives: sorted frames drawn uniformly from
    those not in `already` (frames labelled before, which count towards `n_reps`)."""
    already = np.unique(np.asarray([] if already is None else already, dtype=np.int64))
    n_random = min(int(n_reps) // 4, int(n_reps) - len(already), n_frames - len(already))
    if n_random <= 0:
        return np.empty(0, dtype=np.int64)
    pool = np.setdiff1d(np.arange(n_frames, dtype=np.int64), already, assume_unique=True)
    return np.sort(np.random.default_rng(seed).choice(pool, size=n_random, replace=False))
