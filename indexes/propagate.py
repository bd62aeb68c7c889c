"""Score propagation: each frame's proxy is an inverse-distance mix of its nearest
representatives' true values; frames the oracle labelled keep their exact values."""
from __future__ import annotations

import numpy as np

DEFAULT_EPS = 1e-6


def propagate(rep_values: np.ndarray, positions: np.ndarray, distances: np.ndarray, *,
              exact_frames=None, eps: float = DEFAULT_EPS, chunk: int = 1 << 20) -> np.ndarray:
    """Proxy score per frame (float64, never NaN).

    `rep_values[j]` is representative j's true value; row i of `positions`/`distances`
    (N×k) lists frame i's nearest representatives. Weights are 1/(d + eps), so k=1 and
    zero distances are fine. `exact_frames[j]`, when given, is representative j's frame
    index, and that frame gets `rep_values[j]` exactly.
    """
    rep_values = np.asarray(rep_values, dtype=np.float64)
    n = len(positions)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        w = 1.0 / (np.maximum(distances[start:stop], 0.0).astype(np.float64) + eps)
        out[start:stop] = np.einsum("ij,ij->i", w, rep_values[positions[start:stop]])
        out[start:stop] /= w.sum(axis=1)
    if exact_frames is not None:
        out[np.asarray(exact_frames, dtype=np.int64)] = rep_values
    return out
