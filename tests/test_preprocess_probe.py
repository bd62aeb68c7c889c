"""probe_video: exact layout of good videos, clear VideoErrors for bad ones."""
from pathlib import Path

import av
from av.video.frame import PictureType
import numpy as np
import pytest

from vidql.base.errors import VideoError
from conftest import shared_path
from vidql.preprocess import probe_video
from vidql.preprocess.testclip import counter_frame, write_counter_video


def shared_clip(name: str) -> Path:
    return shared_path("data", name)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return Path(write_counter_video(tmp_path_factory.mktemp("probe") / "counter.mp4", 60, gop=12, bframes=2))


def test_generated_h264_layout_from_packets(clip):
    info = probe_video(clip)
    assert (info.codec, info.width, info.height, info.frame_count) == ("h264", 320, 240, 60)
    assert info.fps == pytest.approx(30.0)
    assert info.duration == pytest.approx(2.0)
    assert info.keyframes.tolist() == [0, 12, 24, 36, 48]
    assert info.counted_by == "packets"  # no full decode was needed
    assert list(info.pts) == sorted(info.pts) and info.pts_unique
    with av.open(str(clip)) as container:
        decoded = [(f.pts, f.pict_type) for f in container.decode(video=0)]
    assert [p for p, _ in decoded] == list(info.pts)
    assert any(kind == PictureType.B for _, kind in decoded), "the clip should contain B-frames"


def test_probe_is_hashable_and_frozen(clip):
    info = probe_video(clip)
    assert hash(info) == hash(probe_video(clip))
    with pytest.raises(AttributeError):
        info.frame_count = 3


def test_per_frame_layout_is_int64_arrays_and_old_pickles_still_load(clip):
    """pts and keyframes are arrays (a million-entry tuple took 0.1 s to unpickle and was
    walked by the garbage collector); an info pickled when they were tuples, pts with None
    for a frame without a timestamp, loads as the same arrays."""
    import gc
    import pickle

    import numpy as np

    from vidql.preprocess.probe import MISSING_PTS, VideoInfo

    info = probe_video(clip)
    for name in ("pts", "keyframes", "keyframe_seek_ts"):
        assert getattr(info, name).dtype == np.int64 and not gc.is_tracked(getattr(info, name))
    assert pickle.loads(pickle.dumps(info)) == info
    old = {k: tuple(v.tolist()) if isinstance(v, np.ndarray) else v
           for k, v in info.__getstate__().items()}
    loaded = VideoInfo.__new__(VideoInfo)
    loaded.__setstate__(old)  # what unpickling an old info.pkl does
    assert loaded == info and hash(loaded) == hash(info)
    old["pts"] = (None,) + old["pts"][1:]
    loaded = VideoInfo.__new__(VideoInfo)
    loaded.__setstate__(old)
    assert loaded.pts[0] == MISSING_PTS and loaded.pts[1:].tolist() == info.pts[1:].tolist()


def test_an_old_saved_info_is_saved_again_as_data(clip, tmp_path, monkeypatch):
    """An info.pkl of an older vidql (arrays as tuples) is read through the allow-list
    without probing the video, and saved anew as .npz + JSON (no pickle left)."""
    import pickle

    import numpy as np

    import vidql.preprocess.probe as probe

    info = probe_video(clip)
    old = probe.VideoInfo.__new__(probe.VideoInfo)
    old.__dict__.update({k: tuple(v.tolist()) if isinstance(v, np.ndarray) else v
                         for k, v in info.__getstate__().items()})
    (tmp_path / "info.pkl").write_bytes(pickle.dumps(old))
    (tmp_path / "new.pkl").write_bytes(pickle.dumps(info))  # as vidql wrote it last
    monkeypatch.setattr(probe, "probe_video", lambda path: pytest.fail(f"probed {path}"))
    assert probe.stored_info(tmp_path, str(clip)) == info
    assert not (tmp_path / "info.pkl").exists()
    assert probe.load_info(tmp_path / probe.INFO_FILE) == info
    (tmp_path / probe.INFO_FILE).unlink()
    (tmp_path / "new.pkl").rename(tmp_path / "info.pkl")
    assert probe.stored_info(tmp_path, str(clip)) == info


def test_saved_info_is_data_and_reads_back_equal(clip, tmp_path):
    import zipfile

    from vidql.preprocess.probe import load_info, save_info

    info = probe_video(clip)
    save_info(info, tmp_path / "info.npz")
    assert load_info(tmp_path / "info.npz") == info
    with zipfile.ZipFile(tmp_path / "info.npz") as z:
        assert sorted(z.namelist()) == ["keyframe_seek_ts.npy", "keyframes.npy", "meta.npy", "pts.npy"]


class _Planted:
    """Unpickling it would run a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch '{self.marker}'",)


@pytest.mark.parametrize("damage", ["planted", "garbage", "other_object", "bad_npz", "bad_json",
                                    "wrong_field"])
def test_a_damaged_or_planted_info_is_probed_again_and_runs_nothing(clip, tmp_path, damage):
    """A pickle that would run code, a damaged pickle or .npz, or one of the wrong shape is
    never trusted: the video is probed again and the result saved as data."""
    import json
    import pickle

    import numpy as np

    from vidql.preprocess.probe import INFO_FILE, load_info, save_info, stored_info

    info = probe_video(clip)
    marker = tmp_path / "ran"
    npz = tmp_path / INFO_FILE
    if damage == "planted":
        (tmp_path / "info.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    elif damage == "garbage":
        (tmp_path / "info.pkl").write_bytes(b"\x80\x04not a pickle")
    elif damage == "other_object":
        (tmp_path / "info.pkl").write_bytes(pickle.dumps({"path": str(clip)}))
    elif damage == "bad_npz":
        npz.write_bytes(b"PK\x03\x04 truncated")
    else:
        meta = {"path": str(clip)} if damage == "bad_json" else None
        save_info(info, npz)
        with np.load(npz) as data:
            arrays = {k: data[k] for k in data.files}
        if meta is None:
            meta = json.loads(bytes(arrays["meta"]).decode()) | {"frame_count": "60"}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(npz, "wb") as out:
            np.savez(out, **arrays)
    assert stored_info(tmp_path, str(clip)) == info
    assert not marker.exists()
    assert load_info(npz) == info and not (tmp_path / "info.pkl").exists()


@pytest.mark.shared
def test_highway_header_lies_count_by_decoding():
    info = probe_video(shared_clip("highway.avi"))
    assert info.codec == "mpeg4"
    assert info.frame_count == 1699 != info.header_frame_count
    assert info.counted_by == "decoding"
    assert info.keyframes.tolist() == [0, 300, 600, 900, 1200, 1500]
    assert len(info.pts) == 1699 and info.pts_unique


@pytest.mark.shared
@pytest.mark.parametrize("name,count,size", [("ua_detrac.mp4", 252, (960, 540)),
                                             ("indoor_people.mp4", 1394, (768, 432))])
def test_shared_mp4_counts(name, count, size):
    info = probe_video(shared_clip(name))
    assert info.frame_count == count and (info.width, info.height) == size
    assert info.counted_by == "packets" and info.keyframes[0] == 0


# ---- bad inputs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, clip) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    data = clip.read_bytes()
    files = {}

    def put(name: str, content: bytes) -> None:
        files[name] = folder / name
        files[name].write_bytes(content)

    put("text.txt", b"hello world, this is not a video\n" * 50)
    put("text.mp4", b"hello world, this is not a video\n" * 50)
    put("empty.mp4", b"")
    put("first_half_cut.mp4", data[len(data) // 2:])
    put("second_half_cut.mp4", data[: len(data) // 2])
    # what FFmpeg made of one CI run's first_half_cut.mp4 (the encoder is not deterministic)
    put("lyrics.mp4", b"[00:01.00]hello\n[00:02.50]world\n" * 5)
    avi = Path(write_counter_video(folder / "mpeg4.avi", 24, codec="mpeg4")).read_bytes()
    assert b"FMP4" in avi
    put("unknown_codec.avi", avi.replace(b"FMP4", b"QQQQ"))
    files["audio_only.m4a"] = folder / "audio_only.m4a"
    with av.open(str(files["audio_only.m4a"]), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    # an mp4 with its index first (faststart), cut after two thirds of the data
    files["faststart_cut.mp4"] = folder / "faststart_cut.mp4"
    with av.open(str(folder / "faststart.mp4"), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for i in range(60):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(counter_frame(i, 160, 120), format="rgb24")))
        container.mux(stream.encode(None))
    whole = (folder / "faststart.mp4").read_bytes()
    put("faststart_cut.mp4", whole[: len(whole) * 2 // 3])
    avi_noise = bytearray(Path(write_counter_video(folder / "long.avi", 120, codec="mpeg4")).read_bytes())
    middle = len(avi_noise) // 2
    avi_noise[middle:middle + 3000] = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    put("noise_in_middle.avi", bytes(avi_noise))
    return files


@pytest.mark.parametrize("name,words", [
    ("missing.mp4", "does not exist"),
    ("text.txt", "no video stream"),
    ("text.mp4", "not a video"),
    ("empty.mp4", "truncated, corrupt or not a video"),
    ("audio_only.m4a", "no video stream"),
    ("first_half_cut.mp4", "truncated, corrupt or not a video"),
    ("second_half_cut.mp4", "truncated, corrupt or not a video"),
    ("lyrics.mp4", "FFmpeg reads it as 'lrc' with subtitle streams only); it is truncated, corrupt"),
    ("audio_only.m4a", "with audio streams only"),
    ("faststart_cut.mp4", "truncated file"),
    ("unknown_codec.avi", "unsupported codec"),
    ("noise_in_middle.avi", "corrupt"),
])
def test_bad_files_raise_video_error(bad_files, tmp_path, name, words):
    path = bad_files.get(name, tmp_path / name)
    with pytest.raises(VideoError) as caught:
        probe_video(path)
    assert caught.value.path == str(path)
    assert words in str(caught.value)


def test_directory_is_not_a_video(tmp_path):
    with pytest.raises(VideoError, match="not a regular file"):
        probe_video(tmp_path)


@pytest.mark.parametrize("pts", [tuple(range(512, 512 + 300 * 512, 512)),  # even steps: arithmetic
                                 (0, 3, 7, 8, 20), (5,), ()])
def test_pts_index_numbers_timestamps_as_a_dict_would(pts):
    from vidql.preprocess.probe import PtsIndex

    index, expected = PtsIndex(pts), {t: i for i, t in enumerate(pts)}
    assert len(index) == len(expected)
    for t in list(pts) + [-1, 1, 511, 513, None, (pts[-1] + 1) if pts else 0, 10**9]:
        assert index.get(t) == expected.get(t) and (t in index) == (t in expected), t
    if pts:
        assert index[pts[-1]] == len(pts) - 1
        with pytest.raises(KeyError):
            index[-12345]


def test_an_evenly_stepped_million_timestamps_are_numbered_without_a_map():
    import tracemalloc

    from vidql.preprocess.probe import PtsIndex

    pts = tuple(range(0, 512 * 1_000_000, 512))
    tracemalloc.start()
    try:
        index = PtsIndex(pts)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1 << 20, held  # a dict of them holds about 80 MB
    assert index.get(512 * 999_999) == 999_999 and index.get(512 * 1_000_000) is None


def test_duration_comes_from_the_frames_timestamps_not_the_header(tmp_path):
    """An AVI whose header says 60 fps while its frames are 1/30 s apart (every other frame
    dropped): the duration is how long its frames last, as their `ts` say."""
    import vidql
    from fractions import Fraction

    path = tmp_path / "dropped.avi"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=60)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            frame = av.VideoFrame.from_ndarray(counter_frame(i, 64, 48), format="rgb24")
            frame.pts, frame.time_base = 2 * i, Fraction(1, 60)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    info = probe_video(path)
    assert (info.fps, info.frame_count) == (60.0, 30)  # the header's rate; 30 frames decode
    assert info.duration == pytest.approx(1.0)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{path}' AS v")
        last = db.sql("SELECT max(ts) FROM v").fetchone()[0]
        assert last == pytest.approx(29 / 30)
        assert db.sql("SHOW CLIPS v").df()["duration"].tolist() == pytest.approx([1.0])
        assert db.sql("SHOW VIDEOS").df()["duration"].tolist() == pytest.approx([1.0])
