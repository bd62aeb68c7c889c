"""FrameReader: random and in-order reads equal a full sequential PyAV decode, frame for frame."""
import hashlib
from pathlib import Path

import av
import numpy as np
import pytest

from vidql.base.errors import VidqlError, VideoError
from conftest import shared_path
from vidql.preprocess import FrameReader, probe_video
from vidql.preprocess.testclip import write_counter_video


def shared_clip(name: str) -> Path:
    return shared_path("data", name)


def digest(picture: np.ndarray) -> str:
    return hashlib.md5(np.ascontiguousarray(picture).tobytes()).hexdigest()


def sequential_digests(path, size=None) -> list[str]:
    """Digest of every frame of a plain full decode with PyAV, optionally resized by swscale."""
    kwargs = {} if size is None else {"width": size[0], "height": size[1], "interpolation": "AREA"}
    with av.open(str(path)) as container:
        return [digest(f.to_ndarray(format="rgb24", **kwargs)) for f in container.decode(video=0)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return Path(write_counter_video(tmp_path_factory.mktemp("frames") / "counter.mp4", 150, gop=12, bframes=2))


@pytest.fixture(scope="module")
def clip_frames(clip) -> np.ndarray:
    with av.open(str(clip)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_random_reads_equal_sequential_decode(clip, clip_frames):
    rng = np.random.default_rng(1)
    with FrameReader(clip) as reader:
        for _ in range(6):
            wanted = rng.integers(0, len(clip_frames), size=rng.integers(1, 25))
            np.testing.assert_array_equal(reader.read(wanted), clip_frames[wanted])


def test_order_duplicates_and_edges(clip, clip_frames):
    last = len(clip_frames) - 1
    wanted = [last, 0, 13, 13, 12, 11, last, 1, 0]
    with FrameReader(clip) as reader:
        got = reader.read(wanted)
        assert got.dtype == np.uint8 and got.shape == (len(wanted), 240, 320, 3)
        np.testing.assert_array_equal(got, clip_frames[wanted])
        assert reader.read([]).shape == (0, 240, 320, 3)


def test_one_gop_is_decoded_once(clip):
    with FrameReader(clip) as reader:
        reader.read([35, 24, 30, 29, 26])  # all in the GOP starting at frame 24
        assert reader.seeks == 1
        assert reader.decoded <= 12 + 4  # the GOP, plus at most the decoder's reorder look-ahead
        reader.read([100])
        assert reader.seeks == 2


def test_resized_reads_equal_swscale_of_direct_decode(clip):
    expected = sequential_digests(clip, size=(64, 48))
    with FrameReader(clip) as reader:
        got = reader.read([5, 77, 149, 0], size=(64, 48))
    assert got.shape == (4, 48, 64, 3)
    assert [digest(g) for g in got] == [expected[i] for i in (5, 77, 149, 0)]


def test_iter_batches_in_order(clip, clip_frames):
    with FrameReader(clip) as reader:
        batches = list(reader.iter_batches(32, start=20, stop=131))
    indices = np.concatenate([i for i, _ in batches])
    np.testing.assert_array_equal(indices, np.arange(20, 131))
    assert [len(i) for i, _ in batches] == [32, 32, 32, 15]
    assert all(i.dtype == np.int64 for i, _ in batches)
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), clip_frames[20:131])


def test_out_of_range_names_file_and_range(clip):
    with FrameReader(clip) as reader:
        with pytest.raises(VidqlError, match=r"frame 150 is out of range .*counter\.mp4.*0\.\.149"):
            reader.read([3, 150])
        with pytest.raises(VidqlError, match="out of range"):
            reader.read([-1])
        with pytest.raises(VidqlError, match="out of range"):
            list(reader.iter_batches(8, start=140, stop=151))


def test_mpeg4_avi_random_reads(tmp_path):
    path = write_counter_video(tmp_path / "counter.avi", 80, codec="mpeg4", gop=10)
    expected = sequential_digests(path)
    wanted = [79, 3, 45, 45, 10, 9, 60]
    with FrameReader(path) as reader:
        assert reader.info.frame_count == 80
        assert [digest(g) for g in reader.read(wanted)] == [expected[i] for i in wanted]


def test_decoding_error_mid_file_names_file_and_frame(clip, tmp_path):
    data = bytearray(clip.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4000] = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(bytes(data))
    info = probe_video(broken)  # the packet index is intact; the damage shows only when decoding
    with FrameReader(broken, info) as reader:
        with pytest.raises(VideoError, match=r"broken\.mp4.*frame \d+") as caught:
            for _ in reader.iter_batches(16):
                pass
    assert caught.value.path == str(broken)


@pytest.mark.shared
@pytest.mark.parametrize("name,n_reads", [("ua_detrac.mp4", 12), ("highway.avi", 40), ("indoor_people.mp4", 40)])
@pytest.mark.slow
def test_shared_clips_random_reads_exact(name, n_reads):
    path = shared_clip(name)
    expected = sequential_digests(path)
    rng = np.random.default_rng(7)
    wanted = np.concatenate([rng.integers(0, len(expected), size=n_reads), [len(expected) - 1, 0]])
    with FrameReader(path) as reader:
        assert reader.info.frame_count == len(expected)
        assert [digest(g) for g in reader.read(wanted)] == [expected[i] for i in wanted]
        with pytest.raises(VidqlError, match=f"{name}.*0..{len(expected) - 1}"):
            reader.read([len(expected)])


@pytest.mark.shared
@pytest.mark.slow
def test_highway_batches_cover_every_frame_once():
    path = shared_clip("highway.avi")
    expected = sequential_digests(path, size=(128, 96))
    with FrameReader(path) as reader:
        got = [(i, digest(f)) for idx, batch in reader.iter_batches(256, size=(128, 96))
               for i, f in zip(idx.tolist(), batch, strict=True)]
    assert [i for i, _ in got] == list(range(1699))
    assert [d for _, d in got] == expected


def test_keyframes_only_decode(clip, clip_frames):
    with FrameReader(clip) as reader:
        batches = list(reader.iter_keyframes(4))
    indices = np.concatenate([i for i, _ in batches])
    np.testing.assert_array_equal(indices, np.arange(0, 150, 12))
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), clip_frames[indices])


@pytest.mark.shared
def test_keyframes_only_on_untrusted_layout():
    with FrameReader(shared_clip("highway.avi")) as reader:
        indices = np.concatenate([i for i, _ in reader.iter_keyframes(4, size=(64, 48))])
    np.testing.assert_array_equal(indices, [0, 300, 600, 900, 1200, 1500])


def test_open_gop_random_reads(tmp_path):
    path = write_counter_video(tmp_path / "open.mp4", 72, 160, 96, gop=12, bframes=3, open_gop=True)
    expected = sequential_digests(path)
    wanted = [71, 11, 12, 13, 35, 24, 23, 60, 0, 47]
    with FrameReader(path) as reader:
        assert [digest(g) for g in reader.read(wanted)] == [expected[i] for i in wanted]


def test_readers_of_one_info_share_the_timestamp_map(clip, clip_frames):
    """The pts -> frame map of a video is built once per VideoInfo, not once per reader
    (an oracle query opens readers batch after batch), and is never pickled."""
    import pickle

    info = probe_video(clip)
    first, second = FrameReader(clip, info), FrameReader(clip, info)
    assert first._index_of_pts is second._index_of_pts is info.index_of_pts
    assert len(info.index_of_pts) == info.frame_count
    copy = pickle.loads(pickle.dumps(info))
    assert "index_of_pts" not in copy.__dict__ and copy == info
    with FrameReader(clip, copy) as reader:
        assert digest(reader.read([7])[0]) == digest(clip_frames[7])
