"""A clip's reading cost (preprocess/readcost.py): the frames a read decodes, as
FrameReader.decoded counts them, and the decode time LOAD records."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import vidql
from vidql.preprocess import FrameReader
from vidql.preprocess.probe import probe_video
from vidql.preprocess.readcost import DecodeTiming, ReadCost, load_timing, measure_decode, save_timing
from vidql.preprocess.testclip import write_counter_video

N, GOP = 120, 24
PLAIN = SimpleNamespace(reads_scaled=False)  # an oracle that reads the file


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "gop24.mp4"
    write_counter_video(path, N, 160, 96, gop=GOP, bframes=0)
    return probe_video(path)


def cost_of(info) -> ReadCost:
    return ReadCost.of(info, DecodeTiming(0.002, 10, info.width, info.height))


def test_keyframes_are_the_gops(clip):
    assert list(cost_of(clip).keyframes) == list(range(0, N, GOP))


@pytest.mark.parametrize("frames", [[5], [5, 7, 30], [0, 23, 24, 47, 100], [119], list(range(0, N, 7))])
def test_in_order_price_is_what_the_reader_decodes(clip, frames):
    with FrameReader(clip.path, clip, threads=1) as reader:
        reader.read(frames)
        assert reader.decoded == cost_of(clip).decoded_in_order(frames)


def test_one_by_one_price_is_what_single_reads_decode(clip):
    frames = [100, 5, 30, 7]
    decoded = 0
    for f in frames:
        with FrameReader(clip.path, clip, threads=1) as reader:
            reader.read([f])
            decoded += reader.decoded
    assert decoded == cost_of(clip).decoded_one_by_one(frames) == 101 - 96 + 6 + 7 + 8


def test_seconds_are_frames_times_the_decode_time(clip):
    assert cost_of(clip).seconds(50) == pytest.approx(0.1)


def test_only_the_frames_read_are_converted():
    """Decoding 120 frames to read 10 converts 10: a 1080p frame converts to RGB in about
    half its decode time, so a call that reads most of what it decodes costs more per
    decoded frame than one that skips most (learned from both, one decode time swung 2x)."""
    cost = ReadCost(np.arange(0, 240, 120), 240, 0.004, 0.002)
    assert cost.seconds(120, 10) == pytest.approx(120 * 0.004 + 10 * 0.002)
    assert cost.random_read_seconds() == pytest.approx(60.5 * 0.004 + 0.002)


def test_load_records_the_decode_time(clip, tmp_path):
    timing = measure_decode(clip)
    assert timing.frames_timed == 48 and 0 < timing.seconds_per_frame < 1
    assert 0 < timing.seconds_per_read < 1
    with vidql.connect(tmp_path / "db.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip.path}' AS v")
        saved = load_timing(db.catalog.clip_dir("v", 0) / "decode.json")
        assert saved is not None and saved.width == 160 and saved.frames_timed == 48
        (db.catalog.clip_dir("v", 0) / "decode.json").write_text("{not json")
    with vidql.connect(tmp_path / "db.db", progress=False) as db:  # damaged: timed again
        [cost] = db.catalog.read_costs("v", PLAIN)
        assert cost.frame_count == N and cost.seconds_per_frame > 0
        assert load_timing(db.catalog.clip_dir("v", 0) / "decode.json") is not None


def test_random_read_cost_and_when_a_rendition_pays():
    """A random read decodes (L+1)/2 frames of an L-frame GOP on average; an oracle
    rendition (GOP 8, a lossless pixel LOSSLESS_PIXEL_COST times dearer) pays where the
    clip's GOPs are long and its frames much larger than the oracle's input."""
    from vidql.preprocess.readcost import LOSSLESS_PIXEL_COST, rendition_cost, rendition_pays

    camera = ReadCost(np.arange(0, 1200, 120), 1200, 0.004)  # 1080p, GOP 120
    assert camera.random_read_seconds() == pytest.approx(60.5 * 0.004)
    small = rendition_cost(camera, (1920, 1080), (416, 234), 8)
    assert list(small.keyframes[:3]) == [0, 8, 16]
    assert small.seconds_per_frame == pytest.approx(0.004 * LOSSLESS_PIXEL_COST * 416 * 234 / (1920 * 1080))
    assert rendition_pays(camera, small)  # about 27x
    webcam = ReadCost(np.arange(0, 1200, 12), 1200, 0.0005)  # 320x240, GOP 12
    assert not rendition_pays(webcam, rendition_cost(webcam, (320, 240), (416, 312), 8))


def test_a_query_that_decodes_enough_frames_keeps_its_decode_time(clip, tmp_path, oracle_module):
    """LOAD's few timed frames are replaced by what a labelling call measured decoding at
    least 48 frames (a call of fewer keeps them): a made-up 1 s a frame is corrected."""
    with vidql.connect(tmp_path / "db.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip.path}' AS v; CREATE ORACLE bright FROM PYTHON "
               "'vq_test_oracle:BrightnessOracle'; SET ORACLE v = bright")
        saved = db.catalog.clip_dir("v", 0) / "decode.json"
        save_timing(DecodeTiming(1.0, 48, 160, 96), saved)
    with vidql.connect(tmp_path / "db.db", progress=False) as db:
        db.sql("SELECT count(*) FROM v WHERE frame < 20 AND objects('car') >= 1").df()
        assert load_timing(saved).seconds_per_frame == 1.0
        db.sql("SELECT count(*) FROM v WHERE frame >= 40 AND objects('car') >= 1").df()
        learned = load_timing(saved)
        [cost] = db.catalog.read_costs("v", PLAIN)
    assert learned.frames_timed == N - 24 and learned.seconds_per_frame < 0.1  # from keyframe 24
    assert 0 < learned.seconds_per_read < 0.1  # 80 frames read and converted
    assert cost.seconds_per_frame == learned.seconds_per_frame
    assert cost.seconds_per_read == learned.seconds_per_read


def test_a_timing_without_conversions_is_measured_again(clip, tmp_path):
    """decode.json written before conversions were timed apart is read as missing."""
    saved = tmp_path / "decode.json"
    saved.write_text('{"seconds_per_frame": 0.004, "frames_timed": 48, "width": 160, "height": 96}')
    assert load_timing(saved) is None
