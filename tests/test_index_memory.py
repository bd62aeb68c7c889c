"""The index build streams: no array with a row per frame of pixels, thumbnails or
embeddings is held."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from vidql.base.detections import empty_detections
from vidql.indexes import TastiIndex, farthest_point_first, nearest, pixel_embeddings
from vidql.indexes.embedders import thumbnail_size
from vidql.indexes.rowfile import RowFile, row_blocks


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


def traced_bytes(fn):
    """(fn(), bytes it allocated and still holds, its peak)."""
    tracemalloc.start()
    try:
        out = fn()
        return (out, *tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()


def test_pixel_embedding_memory_does_not_grow_with_frames_and_equals_the_in_memory_pca():
    size, n = (64, 36), 16_000
    tw, th = thumbnail_size(size, 24)
    runs = {m: traced_bytes(lambda m=m: pixel_embeddings(NoiseFrames(m), size=size, dim=16,
                                                       fit_frames=500, chunk=500, progress=False))
            for m in (n // 2, n)}
    growth = runs[n][2] - runs[n // 2][2]  # peaks
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


def empty_labels(frames) -> pd.DataFrame:
    """An oracle that sees nothing in any frame."""
    return empty_detections()


def test_rowfile_writes_and_reads_rows_in_blocks_and_copies_as_npy(tmp_path):
    x = np.random.default_rng(0).normal(size=(1000, 7)).astype(np.float32)
    rows = RowFile(*x.shape)
    for start in range(0, 1000, 64):
        rows[np.arange(start, min(start + 64, 1000))] = x[start:start + 64]
    assert np.array_equal(rows[:], x) and np.array_equal(rows[5], x[5])
    assert np.array_equal(rows[[9, 3, 3, 999]], x[[9, 3, 3, 999]])
    assert np.array_equal(rows.array(), x) and isinstance(rows.array(), np.memmap)
    blocks = [(start, block.copy()) for start, block in row_blocks(rows, block_bytes=700)]
    assert len(blocks) == 40 and np.array_equal(np.concatenate([b for _, b in blocks]), x)
    with open(tmp_path / "x.npy", "wb") as fh:
        rows.copy_to(fh)
    assert np.array_equal(np.load(tmp_path / "x.npy"), x)
    with pytest.raises(IndexError):
        rows[[1, 3]] = x[:2]  # rows are written as a frame source gives them: consecutive


def test_fpf_and_knn_on_a_rowfile_equal_those_on_the_array():
    x = np.random.default_rng(1).normal(size=(5000, 16)).astype(np.float32)
    rows = RowFile(*x.shape)
    rows[:] = x
    assert np.array_equal(farthest_point_first(rows, 30, seed=2), farthest_point_first(x, 30, seed=2))
    initial = np.arange(0, 5000, 500)
    assert np.array_equal(farthest_point_first(rows, 30, initial=initial),
                          farthest_point_first(x, 30, initial=initial))
    got, want = nearest(rows, x[initial], 3, chunk=4096), nearest(x, x[initial], 3)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_built_index_maps_its_embeddings_instead_of_holding_them(tmp_path):
    """What a build keeps in memory grows per frame by its k nearest representatives (k = 5:
    40 bytes), not the embeddings (64 float32, 256 bytes): those were written to a file as
    they were made, and the index maps it until `save` copies it."""
    runs = {n: traced_bytes(lambda n=n: TastiIndex.build(NoiseFrames(n), empty_labels, reps=50,
                                                       embedder="pixel", progress=False))
            for n in (8000, 16_000)}
    per_frame = (runs[16_000][1] - runs[8000][1]) / 8000  # held
    assert per_frame < 100, per_frame
    index = runs[16_000][0]
    assert isinstance(index.embeddings, np.memmap) and index.embeddings.shape == (16_000, 64)
    index.save(tmp_path / "idx")
    assert np.array_equal(np.load(tmp_path / "idx" / "embeddings.npy"), index.embeddings)
    assert isinstance(index.embeddings, np.memmap)
    assert Path(index.embeddings.filename).resolve() == (tmp_path / "idx" / "embeddings.npy").resolve()
