"""The index build streams: no array with a row per frame of pixels or thumbnails is held."""
from __future__ import annotations

import tracemalloc

import cv2
import numpy as np

from vidql.indexes import pixel_embeddings
from vidql.indexes.embedders import thumbnail_size


class NoiseFrames:
    """`n_frames` noise-like frames made on demand (nothing stored per frame)."""

    def __init__(self, n_frames: int, width: int = 64, height: int = 36):
        self.n_frames, self.width, self.height = n_frames, width, height

    def read(self, frames, size=None) -> np.ndarray:
        frames = np.asarray(frames, dtype=np.int64)[:, None]
        pixel = np.arange(self.height * self.width * 3, dtype=np.int64)[None]
        hashed = ((frames * 7919 + pixel * 104729) * 2654435761) >> 13  # a pixel hash
        return (hashed % 256).astype(np.uint8).reshape(-1, self.height, self.width, 3)

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None, size=None):
        stop = self.n_frames if stop is None else stop
        for s in range(start, stop, batch_size):
            idx = np.arange(s, min(s + batch_size, stop), dtype=np.int64)
            yield idx, self.read(idx)


def peak_bytes(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_pixel_embedding_memory_does_not_grow_with_frames_and_equals_the_in_memory_pca():
    size, n = (64, 36), 16_000
    tw, th = thumbnail_size(size, 24)
    runs = {m: peak_bytes(lambda m=m: pixel_embeddings(NoiseFrames(m), size=size, dim=16,
                                                       fit_frames=500, chunk=500, progress=False))
            for m in (n // 2, n)}
    growth = runs[n][1] - runs[n // 2][1]
    emb_growth = runs[n][0].nbytes - runs[n // 2][0].nbytes
    thumbnails_growth = (n // 2) * tw * th * 3  # 8 MB: what holding every thumbnail adds
    assert growth < emb_growth + thumbnails_growth / 4, (growth, emb_growth)

    emb, source = runs[n][0], NoiseFrames(n)

    def thumbs(frames):
        return np.stack([cv2.resize(f, (tw, th), interpolation=cv2.INTER_AREA)
                         for f in source.read(frames)]).reshape(len(frames), -1).astype(np.float32)

    sample = thumbs(np.sort(np.random.default_rng(0).choice(n, size=500, replace=False)))
    _, _, vt = np.linalg.svd(sample - sample.mean(axis=0), full_matrices=False)
    check = np.r_[0:1000, n - 1000:n]
    expected = (thumbs(check) - sample.mean(axis=0)) @ vt[:16].T
    assert np.allclose(np.abs(emb[check]), np.abs(expected), atol=1e-3 * np.abs(expected).max())
