"""Distances that see object counts (TASTI's key functions, learnt linearly): beside a
frame's embedding, the per-class counts that a ridge regression fitted on the labelled
frames reads off it, so that frames with like counts lie close."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .rowfile import RowFile, row_blocks

COUNT_WEIGHT = 0.5  # the counts' part of a distance: ratio of its spread to the embedding's
MIN_LABELLED = 10  # fewer labelled frames: no counts are read


def class_counts(labels: pd.DataFrame, frames: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """len(frames) × classes matrix of each frame's detections per class (classes: those
    in `labels`, sorted) and the class names."""
    table = pd.crosstab(labels["frame"], labels["label"]) if len(labels) else pd.DataFrame()
    table = table.reindex(index=frames, fill_value=0)
    return table.to_numpy(np.float64), [str(c) for c in table.columns]


def count_space(rep_embeddings: np.ndarray, counts: np.ndarray,
                weight: float = COUNT_WEIGHT) -> np.ndarray | None:
    """The d × (d + classes) matrix that maps an embedding x to [x, weight · (s_x / s_c) · x W]:
    W the ridge regression (penalty by leave-one-out error) of `counts` on
    `rep_embeddings` (its intercept dropped: distances ignore shifts), s_x and s_c the root
    mean square spread of the representatives' embeddings and read counts. None with fewer
    than MIN_LABELLED representatives or counts alike on all of them."""
    from sklearn.linear_model import RidgeCV

    x = np.asarray(rep_embeddings, dtype=np.float64)
    if len(x) < MIN_LABELLED or not counts.shape[1] or not np.ptp(counts, axis=0).any():
        return None
    coef = RidgeCV(alphas=np.logspace(-2, 4, 13)).fit(x, counts).coef_.reshape(counts.shape[1], -1).T
    spread = np.sqrt(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean())
    read = x @ coef
    read_spread = np.sqrt(((read - read.mean(axis=0)) ** 2).sum(axis=1).mean())
    if read_spread == 0:
        return None
    return np.hstack([np.eye(x.shape[1]), weight * spread / read_spread * coef]).astype(np.float32)


def map_rows(rows: np.ndarray | RowFile, matrix: np.ndarray) -> np.ndarray | RowFile:
    """`rows` @ `matrix`, a block at a time, into a RowFile when `rows` is one."""
    out = (RowFile(len(rows), matrix.shape[1]) if isinstance(rows, RowFile)
           else np.empty((len(rows), matrix.shape[1]), np.float32))
    for start, block in row_blocks(rows):
        out[start:start + len(block)] = block @ matrix
    return out
