"""Synthetic traffic video with exact ground truth (`generate_traffic`, `TrafficScene`).

A fixed camera looks across a street: a far sidewalk under a row of buildings, three lanes
going left, a median, three lanes going right, a near sidewalk. Farther rows are drawn
smaller and slower (perspective). Video starts near 6:30; a simulated day lasts `DAY_PERIOD`
frames, and the light goes from day to night (darker, bluish, low contrast, more sensor
noise, headlights, lit windows and street lamps). Traffic swells at two rush hours, with
waves from an upstream signal and slow random drift; vehicles queue in their lane and never
overlap there, but nearer lanes hide parts of farther ones. Pedestrians walk both sidewalks,
some stop for a while. The camera jitters by a pixel or two.

Over long videos (seeds 0-2, 200k frames): about 4.5 cars a frame (0 to ~30, a quarter of
frames with none), a truck in 2.5-4.5% of frames, a bus in about 1% (clustered episodes of
1-3 buses; the first episode comes early in every video, so a 10k-frame video has a bus in
about 2-3% of frames), a person in about 85%.

Ground truth is exact, one row per object per frame, `frame,label,score,x1,y1,x2,y2`,
score 1.0, boxes in pixels of the rendered image, clipped to it. Box rule: an object is in
the truth when at least `MIN_VISIBLE_FRACTION` (30%) of its box is both inside the image and
not covered by the boxes of objects drawn in front of it, and its clipped box is at least
4 px (scaled from 320x180) on each side. So partly occluded objects stay, as a detector
sees them, and boxes are not shrunk by occlusion.

Everything random comes from `seed` through streams keyed by purpose and time block, so
the truth of a video is a prefix of the truth of a longer video with the same seed and size.
"""
from __future__ import annotations

from functools import cached_property
from typing import Iterator

import numpy as np
import pandas as pd
from tqdm import tqdm

from vidql.base.errors import ParameterError

from .traffic_model import (CHUNK, LABELS, MIN_SIDE, MIN_VISIBLE_FRACTION, PERSON, ROW_GROUND,
                            Objects, Placements, jitter, pixel_size, simulate, timeline)


class TrafficScene:
    """One synthetic traffic video: its objects, per-frame conditions, truth and frames."""

    def __init__(self, n_frames: int, width: int = 320, height: int = 180, seed: int = 0):
        if int(n_frames) < 1:
            raise ParameterError(f"n_frames must be at least 1, got {n_frames}")
        if int(width) < 32 or int(height) < 32 or int(width) % 2 or int(height) % 2:
            raise ParameterError(
                f"width and height must be even and at least 32 (yuv420p), got {width}x{height}")
        if int(seed) < 0:
            raise ParameterError(f"seed must be a non-negative integer, got {seed}")
        self.n_frames, self.width, self.height, self.seed = (
            int(n_frames), int(width), int(height), int(seed))

    @cached_property
    def objects(self) -> Objects:
        return simulate(self.seed, self.n_frames)

    @cached_property
    def _pixel_sizes(self) -> tuple[np.ndarray, np.ndarray]:
        o = self.objects
        return pixel_size(o.kind, o.variant, o.row, self.width, self.height)

    def timeline(self) -> pd.DataFrame:
        """Per-frame conditions: hour of day, daylight (0-1), gain, traffic density."""
        tl = timeline(self.seed, np.arange(self.n_frames, dtype=np.float64))
        return pd.DataFrame({"frame": np.arange(self.n_frames, dtype=np.int64), "hour": tl.hour,
                             "daylight": tl.daylight, "gain": tl.gain, "density": tl.density})

    def jitter_pixels(self, f0: int, f1: int) -> tuple[np.ndarray, np.ndarray]:
        """Integer camera offsets (dx, dy) of frames [f0, f1): image = scene shifted by -d."""
        jx, jy = jitter(self.seed, np.arange(f0, f1, dtype=np.float64))
        return (np.floor(jx * self.width + 0.5).astype(np.int64),
                np.floor(jy * self.height + 0.5).astype(np.int64))

    def placements(self, f0: int, f1: int) -> Placements:
        """Boxes, visibility and truth flags of every object drawn in frames [f0, f1)."""
        o = self.objects
        W, H = self.width, self.height
        wpx, hpx = self._pixel_sizes
        t_first = np.floor(o.t0) + 1
        t_last = np.floor(o.t0 + o.dwell + (1 + o.length + 0.02) / o.speed)
        lo = np.maximum(t_first, f0).astype(np.int64)
        hi = np.minimum(t_last, f1 - 1).astype(np.int64)
        alive = np.flatnonzero(hi >= lo)
        counts = hi[alive] - lo[alive] + 1
        obj = np.repeat(alive, counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        frame = np.repeat(lo[alive], counts) + np.arange(len(obj)) - starts

        t = frame.astype(np.float64)
        moving_time = t - o.t0[obj] - np.clip(t - o.t_stop[obj], 0, o.dwell[obj])
        p = o.speed[obj] * moving_time
        right = o.direction[obj] > 0
        left = np.where(right, p - o.length[obj], 1 - p)
        jx, jy = self.jitter_pixels(f0, f1)
        x1 = np.floor(left * W + 0.5).astype(np.int64) - jx[frame - f0]
        ground = np.floor(ROW_GROUND[o.row[obj]] * H + 0.5).astype(np.int64)
        y1 = ground - hpx[obj] - jy[frame - f0]
        x2, y2 = x1 + wpx[obj], y1 + hpx[obj]
        drawn = (x2 > 0) & (x1 < W) & (y2 > 0) & (y1 < H)
        order = np.lexsort((obj, o.row[obj], frame))
        order = order[drawn[order]]
        frame, obj, x1, y1, x2, y2 = (a[order] for a in (frame, obj, x1, y1, x2, y2))
        moving = (o.kind[obj] != PERSON) | (np.abs(t[order] - o.t_stop[obj] - 0.5 * o.dwell[obj])
                                            >= 0.5 * o.dwell[obj])
        visible = _visible_fraction(frame, x1, y1, x2, y2, W, H)
        cw = np.minimum(x2, W) - np.maximum(x1, 0)
        ch = np.minimum(y2, H) - np.maximum(y1, 0)
        in_truth = ((visible >= MIN_VISIBLE_FRACTION) & (cw >= MIN_SIDE[0] * W - 1e-9)
                    & (ch >= MIN_SIDE[1] * H - 1e-9))
        return Placements(frame, obj, x1, y1, x2, y2, visible, in_truth, moving)

    def truth(self, progress: bool = False) -> pd.DataFrame:
        """Exact labels: one row per object per frame that obeys the truth rule."""
        parts = []
        bar = progress_bar(self.n_frames, progress, "truth")
        for f0 in range(0, self.n_frames, CHUNK):
            f1 = min(f0 + CHUNK, self.n_frames)
            parts.append(self.truth_rows(self.placements(f0, f1)))
            if bar is not None:
                bar.update(f1 - f0)
        if bar is not None:
            bar.close()
        return pd.concat(parts, ignore_index=True)

    def truth_rows(self, pl: Placements) -> pd.DataFrame:
        k = pl.in_truth
        labels = pd.Series(pd.array(LABELS, dtype="str")).take(self.objects.kind[pl.obj[k]])
        return pd.DataFrame({
            "frame": pl.frame[k].astype(np.int64), "label": labels.to_numpy(),
            "score": np.ones(int(k.sum())),
            "x1": np.clip(pl.x1[k], 0, self.width).astype(np.float64),
            "y1": np.clip(pl.y1[k], 0, self.height).astype(np.float64),
            "x2": np.clip(pl.x2[k], 0, self.width).astype(np.float64),
            "y2": np.clip(pl.y2[k], 0, self.height).astype(np.float64)})

    def frames(self, start: int = 0, stop: int | None = None) -> Iterator[np.ndarray]:
        """Rendered RGB frames (H x W x 3 uint8) in order; the buffer is reused, copy to keep."""
        from .traffic_render import TrafficRenderer  # OpenCV loads only when pixels are drawn

        stop = self.n_frames if stop is None else min(stop, self.n_frames)
        renderer = TrafficRenderer(self)
        for f0 in range(start, stop, CHUNK):
            pl = self.placements(f0, min(f0 + CHUNK, stop))
            yield from renderer.render(pl, f0, min(f0 + CHUNK, stop))


def _visible_fraction(frame, x1, y1, x2, y2, W: int, H: int) -> np.ndarray:
    """Fraction of an 8x8 grid of points over each box that is inside the image and not
    inside a box drawn later in the same frame (rows must be sorted back to front)."""
    n = len(frame)
    fx1, fy1, fx2, fy2 = (a.astype(np.float64) for a in (x1, y1, x2, y2))
    cells = (np.arange(8) + 0.5) / 8
    gx = fx1[:, None] + cells * (fx2 - fx1)[:, None]  # (n, 8) grid columns
    gy = fy1[:, None] + cells * (fy2 - fy1)[:, None]
    weights = np.left_shift(np.uint64(1), np.arange(8, dtype=np.uint64))
    spread = np.left_shift(np.uint64(1), np.arange(0, 64, 8, dtype=np.uint64))

    def bits(inside_cols, inside_rows):
        col = (inside_cols.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        row = (inside_rows.astype(np.uint64) * spread).sum(axis=1, dtype=np.uint64)
        return col * row  # byte r holds the column bits where grid row r is inside

    in_image = bits((gx >= 0) & (gx < W), (gy >= 0) & (gy < H))
    covered = np.zeros(n, dtype=np.uint64)
    k = 1
    while k < n:
        i = np.arange(n - k)
        j = i + k
        same = frame[i] == frame[j]
        if not same.any():
            break
        i, j = i[same], j[same]
        hit = (fx1[j] < fx2[i]) & (fx2[j] > fx1[i]) & (fy1[j] < fy2[i]) & (fy2[j] > fy1[i])
        i, j = i[hit], j[hit]
        if len(i):
            cov = bits((gx[i] >= fx1[j, None]) & (gx[i] < fx2[j, None]),
                       (gy[i] >= fy1[j, None]) & (gy[i] < fy2[j, None]))
            np.bitwise_or.at(covered, i, cov)
        k += 1
    return np.bitwise_count(in_image & ~covered).astype(np.float64) / 64


def progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    return tqdm(total=total, desc=desc, unit="frame")
