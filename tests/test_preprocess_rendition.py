"""Low-res renditions: original frame numbers, same content as a resized full decode, movable folders."""
import json
from pathlib import Path

import av
import numpy as np
import pytest

from vidql.base.errors import ParameterError, VidqlError
from vidql.preprocess import FrameReader, Rendition, make_rendition, open_rendition
from vidql.preprocess.rendition import rendition_size
from vidql.preprocess.testclip import write_counter_video

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return Path(write_counter_video(tmp_path_factory.mktemp("rendition") / "clip.mp4", 90, 320, 180, gop=12))


def resized_decode(path, size) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24", width=size[0], height=size[1], interpolation="AREA")
                         for f in container.decode(video=0)]).astype(np.int16)


def assert_same_frames(low: np.ndarray, reference: np.ndarray, numbers: np.ndarray, tolerance: float):
    """Each rendition frame is close to its original and closer to it than to the original's neighbours."""
    low = low.astype(np.int16)
    for picture, n in zip(low, numbers, strict=True):
        error = np.abs(picture - reference[n]).mean()
        assert error < tolerance, f"frame {n}: mean error {error:.1f}"
        for other in (n - 1, n + 1):
            if 0 <= other < len(reference) and not np.array_equal(reference[other], reference[n]):
                assert error < np.abs(picture - reference[other]).mean(), f"frame {n} looks like {other}"


def test_sizes_keep_aspect_and_are_even():
    assert rendition_size(1280, 720, 128) == (228, 128)
    assert rendition_size(320, 240, 96) == (128, 96)
    assert rendition_size(540, 960, 100) == (100, 178)


def test_rendition_frames_match_resized_original(clip, tmp_path):
    rendition = make_rendition(clip, tmp_path / "r64", 64)
    assert (rendition.width, rendition.height) == (114, 64)
    np.testing.assert_array_equal(rendition.frames, np.arange(90))
    reference = resized_decode(clip, (114, 64))
    with rendition.open() as reader:
        numbers = np.array([89, 0, 45, 45, 13, 12])
        assert_same_frames(reader.read(numbers), reference, numbers, tolerance=8)
        batches = list(reader.iter_batches(32, start=10, stop=70))
    np.testing.assert_array_equal(np.concatenate([i for i, _ in batches]), np.arange(10, 70))
    assert_same_frames(np.concatenate([b for _, b in batches]), reference, np.arange(10, 70), tolerance=8)
    assert not (tmp_path / "r64.partial").exists()


def test_every_nth_frame_keeps_original_numbers(clip, tmp_path):
    rendition = make_rendition(clip, tmp_path / "r", 48, every=4)
    np.testing.assert_array_equal(rendition.frames, np.arange(0, 90, 4))
    reference = resized_decode(clip, (rendition.width, rendition.height))
    with open_rendition(rendition.folder) as reader:
        assert len(reader) == 23
        assert_same_frames(reader.read([88, 4, 40]), reference, np.array([88, 4, 40]), tolerance=8)
        with pytest.raises(VidqlError, match=r"frame 5 is not in the rendition .*steps of 4"):
            reader.read([5])
        indices = np.concatenate([i for i, _ in reader.iter_batches(5, start=9, stop=30)])
    np.testing.assert_array_equal(indices, [12, 16, 20, 24, 28])


def test_folder_can_be_moved_and_rebuilt(clip, tmp_path):
    rendition = make_rendition(clip, tmp_path / "first", 48)
    moved = tmp_path / "elsewhere"
    rendition.folder.rename(moved)
    loaded = Rendition.load(moved)
    manifest = json.loads((moved / "rendition.json").read_text())
    assert manifest["source"] == str(clip.resolve()) and loaded.short_side == 48
    with loaded.open() as reader:
        assert reader.read([7]).shape == (1, 48, 86, 3)
    again = make_rendition(clip, moved, 32)  # replaces the folder's content only when complete
    assert Rendition.load(moved).height == again.height == 32


def test_bad_parameters_and_folders(clip, tmp_path):
    with pytest.raises(ParameterError, match="short side"):
        make_rendition(clip, tmp_path / "x", 4)
    with pytest.raises(ParameterError, match="every"):
        make_rendition(clip, tmp_path / "x", 64, every=0)
    with pytest.raises(VidqlError, match="not a complete rendition"):
        Rendition.load(tmp_path)


def test_skip_loop_filter_is_close_but_not_exact(clip):
    with FrameReader(clip) as exact, FrameReader(clip, options={"skip_loop_filter": "all"}) as fast:
        a, b = exact.read([20, 50]).astype(int), fast.read([20, 50]).astype(int)
    assert np.abs(a - b).mean() < 6


@pytest.mark.shared
def test_highway_rendition_keeps_every_frame(tmp_path):
    source = SHARED_DATA / "highway.avi"
    if not source.exists():
        pytest.skip(f"shared clip {source} is absent")
    rendition = make_rendition(source, tmp_path / "hw", 60)
    assert len(rendition.frames) == 1699 == rendition.source_frame_count
    reference = resized_decode(source, (rendition.width, rendition.height))
    numbers = np.array([0, 299, 300, 301, 1000, 1698])
    with rendition.open() as reader:
        assert_same_frames(reader.read(numbers), reference, numbers, tolerance=8)
