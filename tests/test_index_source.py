"""An in-memory frame source with exact labels (coloured boxes driving across lanes), used
by the index tests, and a counting oracle that fails when asked twice for a frame."""
from __future__ import annotations

import cv2
import numpy as np
import pandas as pd

COLOURS = {"car": (220, 40, 40), "truck": (40, 200, 60), "bus": (240, 220, 30),
           "person": (40, 80, 230)}
SIZES = {"car": (6, 4), "truck": (9, 5), "bus": (14, 6), "person": (2, 4)}  # (w, h) px


class ToyTraffic:
    """`n_frames` frames of `width`×`height` RGB: a grey road, vehicles driving along four
    lanes, people on a pavement. `labels` holds one exact box per visible object."""

    def __init__(self, n_frames: int = 2000, width: int = 64, height: int = 36, seed: int = 0,
                 rates: dict | None = None):
        rng = np.random.default_rng(seed)
        rates = rates or {"car": 0.012, "truck": 0.003, "bus": 0.0006, "person": 0.01}
        self.n_frames, self.width, self.height = n_frames, width, height
        lanes = [7, 13, 19, 25]
        tracks = []  # (label, birth, y, speed)
        for label, rate in rates.items():
            births = np.flatnonzero(rng.random(n_frames + 200) < rate * (4 if label != "person"
                                                                         else 1)) - 200
            for b in births:
                y = 31 if label == "person" else rng.choice(lanes)
                speed = rng.uniform(0.3, 0.6) if label == "person" else rng.uniform(0.8, 2.0)
                speed *= 1 if label == "person" or y in lanes[:2] else -1
                tracks.append((label, b, y, speed))
        frames = np.empty((n_frames, height, width, 3), dtype=np.uint8)
        rows = []
        noise = rng.integers(-6, 7, size=(height, width, 3))
        background = np.clip(np.full((height, width, 3), 110) + noise, 0, 255).astype(np.uint8)
        background[29:] = (150, 150, 140)
        for t in range(n_frames):
            img = background.copy()
            for label, birth, y, speed in tracks:
                age = t - birth
                if age < 0:
                    continue
                w, h = SIZES[label]
                x = age * speed if speed > 0 else width + age * speed - w
                x1, y1 = int(round(x)), int(y - h // 2)
                if x1 < 0 or x1 + w > width:
                    continue
                img[y1:y1 + h, x1:x1 + w] = COLOURS[label]
                rows.append((t, label, 1.0, x1, y1, x1 + w, y1 + h))
            frames[t] = img
        self.frames = frames
        self.labels = pd.DataFrame(rows, columns=["frame", "label", "score", "x1", "y1", "x2", "y2"]
                                   ).astype({"frame": "int64", "x1": float, "y1": float,
                                             "x2": float, "y2": float})

    def read(self, frames, size=None) -> np.ndarray:
        batch = self.frames[np.asarray(frames, dtype=np.int64)]
        if size is None or tuple(size) == (self.width, self.height):
            return batch.copy()
        return np.stack([cv2.resize(f, tuple(size), interpolation=cv2.INTER_AREA) for f in batch])

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None, size=None):
        stop = self.n_frames if stop is None else stop
        for s in range(start, stop, batch_size):
            idx = np.arange(s, min(s + batch_size, stop), dtype=np.int64)
            yield idx, self.read(idx, size)

    def truth(self, expr: str) -> np.ndarray:
        from vidql.engine.sql.framestat import evaluate
        return evaluate(expr, self.labels, np.arange(self.n_frames))


class CountingOracle:
    """label_fn over exact labels; counts frames asked and fails on a repeated frame."""

    def __init__(self, labels: pd.DataFrame):
        self.labels = labels
        self.asked: set[int] = set()
        self.calls = 0

    def __call__(self, frames: np.ndarray) -> pd.DataFrame:
        frames = np.asarray(frames, dtype=np.int64)
        repeated = self.asked.intersection(frames.tolist())
        assert not repeated, f"oracle asked twice for frames {sorted(repeated)[:5]}"
        self.asked.update(frames.tolist())
        self.calls += len(frames)
        return self.labels[self.labels["frame"].isin(frames)]


def test_toy_source_boxes_match_labels():
    src = ToyTraffic(n_frames=300, seed=1)
    counts = src.truth("objects(*)")
    assert counts.max() >= 3 and (counts == 0).any()
    row = src.labels.iloc[len(src.labels) // 2]
    frame = src.read([int(row.frame)])[0]
    box = frame[int(row.y1):int(row.y2), int(row.x1):int(row.x2)]
    assert (box.reshape(-1, 3) == COLOURS[row.label]).all(axis=1).mean() > 0.5


def test_toy_source_batches_cover_all_frames_and_resize():
    src = ToyTraffic(n_frames=50)
    seen = [idx for idx, batch in src.iter_batches(16, size=(32, 18)) if batch.shape[1:] == (18, 32, 3)]
    assert np.array_equal(np.concatenate(seen), np.arange(50))
