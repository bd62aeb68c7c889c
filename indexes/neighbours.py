"""Exact k-NN of frames to representatives with FAISS (faiss-gpu when present), and the
merge that lets new representatives join without searching the old ones again."""
from __future__ import annotations

import faiss
import numpy as np


def _gpu_count() -> int:
    get = getattr(faiss, "get_num_gpus", None)
    return get() if get is not None and hasattr(faiss, "StandardGpuResources") else 0


def _flat_index(base: np.ndarray):
    index = faiss.IndexFlatL2(base.shape[1])
    if _gpu_count() > 0:
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    index.add(base)
    return index


def nearest(queries, base: np.ndarray, k: int, *, chunk: int = 65_536,
            progress=None) -> tuple[np.ndarray, np.ndarray]:
    """For each query row, its `k` nearest rows of `base`: (Euclidean distances float32 N×k,
    positions int32 N×k), closest first. `k` is capped at len(base). Queries are read in
    chunks, so `queries` may be a memory-mapped array or a RowFile (a chunk that is a
    multiple of FAISS's 4096-query blocks gives the same answers as one search)."""
    base = np.ascontiguousarray(base, dtype=np.float32)
    k = min(int(k), len(base))
    n = len(queries)
    dist = np.empty((n, k), dtype=np.float32)
    pos = np.empty((n, k), dtype=np.int32)
    index = _flat_index(base)
    for start in range(0, n, chunk):
        block = np.ascontiguousarray(queries[start:start + chunk], dtype=np.float32)
        d2, i = index.search(block, k)
        dist[start:start + len(block)] = np.sqrt(np.maximum(d2, 0.0))
        pos[start:start + len(block)] = i
        if progress is not None:
            progress.update(len(block))
    return dist, pos


def merge_nearest(dist_a: np.ndarray, pos_a: np.ndarray, dist_b: np.ndarray, pos_b: np.ndarray,
                  k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-`k` (smallest distance) of two neighbour lists over disjoint bases;
    positions must already be in one numbering. Closest first; ties keep list a first."""
    dist = np.concatenate([dist_a, dist_b], axis=1)
    pos = np.concatenate([pos_a, pos_b], axis=1)
    k = min(int(k), dist.shape[1])
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(dist, order, axis=1), np.take_along_axis(pos, order, axis=1)
