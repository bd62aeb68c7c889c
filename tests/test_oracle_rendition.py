"""Oracle renditions: LOAD VIDEO ... WITH (oracle_rendition = px) keeps a lossless short-GOP
copy at the oracle's input size; ONNX detectors label from it, boxes in original pixels."""
from __future__ import annotations

from types import SimpleNamespace

import cv2
import numpy as np
import pytest

import vidql
from conftest import shared_path
from vidql.base.errors import ParameterError
from vidql.engine.catalog.catalog import ORACLE_RENDITION
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.rendition import ORACLE_GOP, Rendition

SCALED = SimpleNamespace(reads_scaled=True)  # an oracle that reads resized frames (ONNX)
PLAIN = SimpleNamespace(reads_scaled=False)


def test_load_writes_oracle_rendition_of_the_letterbox_pixels(counter_clip, tmp_path):
    """Every frame at long side 64, the very pixels cv2 INTER_LINEAR makes of the decoded
    original (lossless), a keyframe every ORACLE_GOP frames: a random read decodes at most
    that many frames."""
    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS v WITH (oracle_rendition = 64)")
        assert int(db.videos()["oracle_rendition"].iloc[0]) == 64
        rendition = Rendition.load(db.catalog.clip_dir("v", 0) / ORACLE_RENDITION)
        [cost] = db.catalog.read_costs("v", SCALED)  # what ONNX detectors read
        [original] = db.catalog.read_costs("v", PLAIN)  # what other oracles read
    assert list(cost.keyframes) == list(range(0, 120, ORACLE_GOP))
    assert cost.decoded_one_by_one([7, 45]) == 8 + 6
    assert list(original.keyframes) == list(range(0, 120, 12))  # counter_clip's own GOP
    assert (rendition.width, rendition.height) == (64, 38)  # 160x96, aspect kept, rounded down
    assert rendition.info.frame_count == 120 and list(rendition.frames) == list(range(120))
    picks = [0, 7, 45, 119]
    with FrameReader(counter_clip) as original:
        want = np.stack([cv2.resize(f, (64, 38), interpolation=cv2.INTER_LINEAR)
                         for f in original.read(picks)])
    for frame in picks:
        with FrameReader(rendition.path) as reader:
            got = reader.read([frame])[0]
            assert reader.decoded <= ORACLE_GOP, "a random read decodes at most its short GOP"
        assert np.array_equal(got, want[picks.index(frame)])


def test_load_into_keeps_the_collections_oracle_rendition(counter_clip, tmp_path):
    from vidql.preprocess.testclip import write_counter_video

    other = write_counter_video(tmp_path / "other.mp4", 30, 96, 160)
    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        db.load_video(counter_clip, "v", oracle_rendition=64)
        with pytest.raises(ParameterError, match="oracle_rendition = 64"):
            db.sql(f"LOAD VIDEO '{other}' INTO v WITH (oracle_rendition = 128)")
        db.sql(f"LOAD VIDEO '{other}' INTO v WITH (oracle_rendition = 64)")
        rendition = db.catalog.oracle_rendition("v", 1, SCALED)
    assert (rendition.width, rendition.height) == (38, 64)


@pytest.mark.parametrize("value", [0, 31, 5000, 1.5, "'x'"])
def test_oracle_rendition_out_of_range(counter_clip, value):
    with vidql.connect(progress=False) as db:
        with pytest.raises(ParameterError, match=r"oracle_rendition.*\[32, 4096\]"):
            db.sql(f"LOAD VIDEO '{counter_clip}' AS v WITH (oracle_rendition = {value})")


@pytest.mark.shared
def test_onnx_labels_from_the_rendition_in_original_pixels(tmp_path):
    """The detector gets the 416x234 rendition frames of the 960x540 clip and gives the
    same detections as on the original, boxes in the original's pixels."""
    video = shared_path("data", "ua_detrac.mp4")
    model = shared_path("models", "yolox_nano.onnx")
    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS plain WITH (oracle_rendition = 'none'); "
               f"LOAD VIDEO '{video}' AS small WITH (oracle_rendition = 416); "
               f"CREATE ORACLE yolox FROM ONNX '{model}'; SET ORACLE plain = yolox; "
               f"SET ORACLE small = yolox")
        cache = db.catalog.label_cache("small")
        with cache.frame_batches(np.arange(8), 8) as batches:
            (_, letterboxed), = list(batches)
        assert letterboxed.frames.shape == (8, 234, 416, 3)
        query = "SELECT * FROM {}.objects WHERE frame < 12 ORDER BY frame, label, x1"
        db.sql("SELECT count(*) FROM plain WHERE frame < 12 AND objects('car') >= 0")
        db.sql("SELECT count(*) FROM small WHERE frame < 12 AND objects('car') >= 0")
        plain = db.sql(query.format("plain")).df()
        small = db.sql(query.format("small")).df()
    assert len(plain) > 50 and list(plain["label"]) == list(small["label"])
    boxes = ["x1", "y1", "x2", "y2"]
    assert np.abs(plain[boxes].to_numpy() - small[boxes].to_numpy()).max() < 0.05
    assert small["x2"].max() > 416, "boxes are in the original's 960x540 pixels"
