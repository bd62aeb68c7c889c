"""Synthetic traffic: exact, deterministic truth that the pixels actually show."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import av
import cv2
import numpy as np
import pandas as pd
import pytest

from vidql.datasets import (LABEL_COLUMNS, TrafficScene, ensure_traffic, generate_traffic,
                            read_labels, write_labels)
from vidql.datasets.traffic_model import MIN_VISIBLE_FRACTION, PERSON
from vidql.datasets.traffic_render import TrafficRenderer
from vidql.base.errors import ParameterError, VidqlError

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _per_frame(truth: pd.DataFrame, label: str, n: int) -> np.ndarray:
    return np.bincount(truth.frame[truth.label == label], minlength=n)


def test_truth_is_deterministic_seeded_and_prefix_stable():
    a = TrafficScene(6000, seed=5).truth()
    assert a.equals(TrafficScene(6000, seed=5).truth())
    assert not a.equals(TrafficScene(6000, seed=6).truth())
    longer = TrafficScene(9000, seed=5).truth()
    assert a.equals(longer[longer.frame < 6000].reset_index(drop=True))


def test_video_bytes_and_truth_repeat_for_a_seed(tmp_path):
    t1 = generate_traffic(tmp_path / "a.mp4", 90, seed=3)
    t2 = generate_traffic(tmp_path / "b.mp4", 90, seed=3)
    assert t1.equals(t2)
    assert _digest(tmp_path / "a.mp4") == _digest(tmp_path / "b.mp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4", "b.mp4"]  # no temp files left


def test_decoded_frame_i_is_rendered_frame_i(tmp_path):
    n, gop = 150, 30
    path = tmp_path / "v.mp4"
    generate_traffic(path, n, seed=1, gop=gop)
    with av.open(str(path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    with av.open(str(path)) as container:
        keys = [i for i, p in enumerate(container.demux(video=0)) if p.is_keyframe]
    assert len(decoded) == n
    assert keys == list(range(0, n, gop))
    assert decoded[0].shape == (180, 320, 3)

    def smooth(img):
        return cv2.GaussianBlur(img.astype(np.float32), (0, 0), 1.5)

    rendered = [smooth(f) for f in TrafficScene(n, seed=1).frames()]
    for i in range(3, n - 3, 6):
        window = rendered[i - 3:i + 4]
        moved = np.max([np.abs(r - rendered[i]).max(axis=2) for r in window], axis=0) > 20
        assert moved.sum() > 100  # something moves in every window
        d = smooth(decoded[i])
        errors = [np.abs(d - r)[moved].mean() for r in window]
        assert int(np.argmin(errors)) == 3, (i, errors)
        assert errors[3] < 6.0, (i, errors)


@pytest.mark.parametrize("size", [(320, 180), (256, 144)])
def test_truth_columns_and_boxes_inside_image(size):
    width, height = size
    truth = TrafficScene(3000, width, height, seed=2).truth()
    assert list(truth.columns) == LABEL_COLUMNS
    assert truth.frame.dtype == np.int64 and truth.x1.dtype == np.float64
    assert pd.api.types.is_string_dtype(truth.label)
    assert set(truth.label) <= {"car", "truck", "bus", "person"}
    assert (truth.score == 1.0).all()
    assert truth.frame.is_monotonic_increasing and truth.frame.between(0, 2999).all()
    assert (truth.x1 >= 0).all() and (truth.x2 <= width).all()
    assert (truth.y1 >= 0).all() and (truth.y2 <= height).all()
    assert (truth.x2 - truth.x1 >= 4 * width / 320 - 1e-9).all()
    assert (truth.y2 - truth.y1 >= 4 * height / 180 - 1e-9).all()
    assert not truth.duplicated().any()


def test_occluded_objects_kept_unless_mostly_hidden():
    scene = TrafficScene(4096, seed=0)
    pl = scene.placements(0, 4096)
    row = scene.objects.row[pl.obj]
    same_lane = ((pl.frame[1:] == pl.frame[:-1]) & (row[1:] == row[:-1])
                 & (scene.objects.kind[pl.obj[1:]] != PERSON))
    ahead, behind = np.flatnonzero(same_lane), np.flatnonzero(same_lane) + 1
    right = scene.objects.direction[pl.obj[ahead]] > 0
    apart = np.where(right, pl.x1[ahead] >= pl.x2[behind], pl.x2[ahead] <= pl.x1[behind])
    assert len(ahead) > 1000 and apart.all()  # vehicles queue in their lane, never overlap
    assert not pl.in_truth[pl.visible < MIN_VISIBLE_FRACTION].any()
    partly = pl.in_truth & (pl.visible < 0.9)
    assert partly.sum() > 0.02 * pl.in_truth.sum()
    assert (~pl.in_truth).sum() > 0  # some are hidden or too small to count


def test_class_rates_and_traffic_that_varies():
    n = 40000
    for seed in (0, 1):
        truth = TrafficScene(n, seed=seed).truth()
        frames_with = {lab: truth.frame[truth.label == lab].nunique() / n
                       for lab in ("car", "truck", "bus", "person")}
        assert 0.003 <= frames_with["bus"] <= 0.03, frames_with
        assert 0.01 <= frames_with["truck"] <= 0.10, frames_with
        assert frames_with["person"] >= 0.4, frames_with
        cars = _per_frame(truth, "car", n)
        assert cars.max() >= 15 and np.mean(cars == 0) > 0.05
        blocks = cars[: n // 500 * 500].reshape(-1, 500).mean(axis=1)
        assert blocks.min() < 1.0 and blocks.max() > 7.0, blocks
    short = TrafficScene(10000, seed=7).truth()  # the first bus episode is early
    assert (short.label == "bus").any()


def test_cars_are_drawn_where_the_truth_says():
    scene = TrafficScene(60, seed=4)
    pl = scene.placements(0, 60)
    empty = dataclasses.replace(pl, **{f.name: getattr(pl, f.name)[:0]
                                       for f in dataclasses.fields(pl)})
    renderer = TrafficRenderer(scene)
    with_objects = [f.astype(np.int16) for f in renderer.render(pl, 0, 60)]
    road = [f.astype(np.int16) for f in renderer.render(empty, 0, 60)]
    kind = scene.objects.kind[pl.obj]
    inside, outside = [], []
    for i in range(0, 60, 5):
        diff = np.abs(with_objects[i] - road[i]).mean(axis=2)
        covered = np.zeros(diff.shape, bool)
        for r in np.flatnonzero((pl.frame == i)):
            x1, y1, x2, y2 = (int(np.clip(v, 0, lim)) for v, lim in
                              zip((pl.x1[r], pl.y1[r], pl.x2[r], pl.y2[r]), (320, 180, 320, 180), strict=True))
            covered[y1:y2, x1:x2] = True
            if pl.in_truth[r] and pl.visible[r] == 1.0 and kind[r] != PERSON:
                inside.append(diff[y1:y2, x1:x2].mean())
        outside.append(diff[~covered].mean())
    assert len(inside) > 10
    assert np.median(inside) > 25
    assert max(outside) == 0.0  # by day nothing but the objects differs


def test_night_is_darker_with_headlights():
    scene = TrafficScene(3600, seed=0)
    tl = scene.timeline()
    day = int(tl.frame[tl.daylight == 1.0].iloc[0])
    night = int(tl.frame[tl.daylight == 0.0].iloc[0]) + 200
    day_img = next(scene.frames(day, day + 1)).astype(np.float32)
    night_img = next(scene.frames(night, night + 1)).astype(np.float32)
    assert night_img.mean() < 0.5 * day_img.mean()
    road = slice(int(0.45 * 180), int(0.93 * 180))
    assert night_img[road].std() < 0.6 * day_img[road].std()
    pl = scene.placements(night, night + 1)
    vehicles = [r for r in range(len(pl.frame))
                if scene.objects.kind[pl.obj[r]] != PERSON and pl.visible[r] == 1.0]
    lit = [night_img[max(pl.y1[r], 0):pl.y2[r], max(pl.x1[r], 0):pl.x2[r]].max() > 200
           for r in vehicles]
    assert vehicles and np.mean(lit) > 0.8


def test_labels_round_trip_csv_and_parquet(tmp_path):
    truth = TrafficScene(500, seed=1).truth()
    for name in ("t.csv", "t.parquet"):
        write_labels(truth, tmp_path / name)
        back = read_labels(tmp_path / name)
        pd.testing.assert_frame_equal(back, truth)
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header == "frame,label,score,x1,y1,x2,y2"
    empty = truth.iloc[:0]
    write_labels(empty, tmp_path / "e.csv")
    got = read_labels(tmp_path / "e.csv")
    assert len(got) == 0 and got.frame.dtype == np.int64 and got.x1.dtype == np.float64


def test_read_labels_rejects_bad_files(tmp_path):
    with pytest.raises(VidqlError, match="does not exist"):
        read_labels(tmp_path / "none.csv")
    (tmp_path / "cols.csv").write_text("frame,label,score,x1,y1\n0,car,1,0,0\n")
    with pytest.raises(VidqlError, match="x2, y2"):
        read_labels(tmp_path / "cols.csv")
    (tmp_path / "num.csv").write_text("frame,label,score,x1,y1,x2,y2\n0,car,high,0,0,1,1\n")
    with pytest.raises(VidqlError, match="score"):
        read_labels(tmp_path / "num.csv")
    (tmp_path / "frac.csv").write_text("frame,label,score,x1,y1,x2,y2\n0.5,car,1,0,0,1,1\n")
    with pytest.raises(VidqlError, match="frame"):
        read_labels(tmp_path / "frac.csv")
    (tmp_path / "zero.parquet").write_bytes(b"not parquet")
    with pytest.raises(VidqlError, match="cannot be read"):
        read_labels(tmp_path / "zero.parquet")
    with pytest.raises(VidqlError, match="suffix"):
        read_labels(tmp_path / "t.json")
    with pytest.raises(ParameterError):
        TrafficScene(10, 321, 180)


@pytest.mark.shared
def test_read_labels_reads_shared_detector_csv():
    path = SHARED / "data" / "ua_detrac.labels.csv"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    df = read_labels(path)
    assert list(df.columns) == LABEL_COLUMNS and len(df) > 1000
    assert df.frame.dtype == np.int64 and {"car", "bus"} <= set(df.label)


def test_ensure_traffic_generates_once(tmp_path, monkeypatch):
    video, labels = ensure_traffic(tmp_path, 60, seed=2)
    assert video.is_file() and labels.is_file() and "n60-s2-320x180" in video.name
    truth = read_labels(labels)
    assert truth.equals(TrafficScene(60, seed=2).truth())
    stamp = (video.stat().st_mtime_ns, labels.stat().st_mtime_ns)

    import vidql.datasets.traffic_cache as cache

    def must_not_run(*args, **kwargs):
        raise AssertionError("regenerated a cached video")

    monkeypatch.setattr(cache, "generate_traffic", must_not_run)
    assert ensure_traffic(tmp_path, 60, seed=2) == (video, labels)
    assert (video.stat().st_mtime_ns, labels.stat().st_mtime_ns) == stamp
    monkeypatch.undo()

    labels.unlink()  # as if killed between the two renames: the pair is redone
    assert ensure_traffic(tmp_path, 60, seed=2) == (video, labels)
    assert read_labels(labels).equals(truth)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([video.name, labels.name])
