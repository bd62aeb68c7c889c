"""The pipelined runtime: exact frames, frame order, error propagation, backpressure, shutdown."""
import _thread
import os
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest

from vidql.base.errors import OracleError, VidqlError, VideoError
from vidql.preprocess import FrameSpec, Normalize, Pipeline, PipelineError, frame_batches, run_pipeline
from vidql.preprocess.pipeline import thread_names
from vidql.preprocess.rendition import make_rendition
from vidql.preprocess.testclip import write_counter_video

SIZE = (64, 48)


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    deadline = time.monotonic() + 2
    while thread_names() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_names() == [], "pipeline threads outlived the test"


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("pipeline")
    return [Path(write_counter_video(folder / "a.mp4", 96, 160, 120, gop=12)),
            Path(write_counter_video(folder / "b.mp4", 40, 160, 120, gop=10)),
            Path(write_counter_video(folder / "c.avi", 30, 160, 120, gop=10, codec="mpeg4"))]


def direct(path, size=SIZE) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24", width=size[0], height=size[1], interpolation="AREA")
                         for f in container.decode(video=0)])


@pytest.mark.parametrize("workers,batch_size", [(1, 16), (2, 7), (3, 64)])
def test_every_frame_in_order_and_exact(clips, workers, batch_size):
    expected = direct(clips[0])
    batches = list(frame_batches(clips[0], size=SIZE, batch_size=batch_size, workers=workers))
    indices = np.concatenate([i for i, _ in batches])
    np.testing.assert_array_equal(indices, np.arange(96))
    assert all(len(i) == batch_size for i, _ in batches[:-1])
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), expected)


def test_chunks_follow_keyframes(clips):
    pipeline = Pipeline(clips[0], size=SIZE, workers=2, chunk_frames=20)
    starts = [c.targets[0] for c in pipeline.chunks]
    assert starts == [0, 24, 48, 72]  # every chunk begins on a keyframe (GOP 12)
    assert pipeline.decoder_threads == 1


def test_selected_frames_ascending_once(clips):
    expected = direct(clips[0])
    wanted = [90, 3, 3, 47, 12, 11, 95, 0, 60]
    got = list(frame_batches(clips[0], size=SIZE, batch_size=4, frames=wanted, workers=2))
    indices = np.concatenate([i for i, _ in got])
    np.testing.assert_array_equal(indices, sorted(set(wanted)))
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), expected[indices])


def test_several_videos_batches_never_span_files(clips):
    seen = run_pipeline(clips, lambda b: (b.source, b.indices.copy(), b.frames.shape), size=SIZE,
                        batch_size=32, workers=2)
    sources = [s for s, _, _ in seen]
    assert sources == [str(clips[0])] * 3 + [str(clips[1])] * 2 + [str(clips[2])]
    np.testing.assert_array_equal(np.concatenate([i for s, i, _ in seen if s == str(clips[1])]), np.arange(40))
    assert seen[-1][2] == (30, 48, 64, 3)


def test_full_size_crop_and_gray(clips):
    expected = direct(clips[1], size=(160, 120))
    got = np.concatenate([b for _, b in frame_batches(clips[1], batch_size=8)])
    np.testing.assert_array_equal(got, expected)
    crop = FrameSpec(size=(40, 30), crop=(80, 60, 80, 60))  # the bottom-right quarter at half size
    quarter = np.concatenate([b for _, b in frame_batches(clips[1], spec=crop, batch_size=8)])
    np.testing.assert_array_equal(quarter, direct(clips[1], size=(80, 60))[:, 30:60, 40:80])
    gray = np.concatenate([b for _, b in frame_batches(clips[1], spec=FrameSpec(size=SIZE, pixel_format="gray"))])
    assert gray.shape == (40, 48, 64, 1)
    assert abs(float(gray.mean()) - float(direct(clips[1]).mean())) < 20
    with pytest.raises(VidqlError, match="reaches outside"):
        Pipeline(clips[1], spec=FrameSpec(size=SIZE, crop=(100, 0, 80, 60)))


def test_normalize_transform_numpy_and_torch_agree(clips):
    norm = Normalize()
    out = list(frame_batches(clips[1], size=SIZE, batch_size=16, transform=norm))
    raw = direct(clips[1])[:16]
    assert out[0][1].shape == (16, 3, 48, 64) and out[0][1].dtype == np.float32
    expected = (raw / 255.0 - np.array(norm.mean)) / np.array(norm.std)
    np.testing.assert_allclose(out[0][1], expected.transpose(0, 3, 1, 2), atol=1e-5)
    import torch

    on_torch = norm.to_torch(raw, "cpu")
    np.testing.assert_allclose(on_torch.numpy(), out[0][1], atol=1e-5)
    assert on_torch.dtype == torch.float32


def test_rendition_source_uses_original_numbers(clips, tmp_path):
    rendition = make_rendition(clips[0], tmp_path / "r", 48, every=3)
    got = list(frame_batches(rendition, batch_size=10, workers=2))
    indices = np.concatenate([i for i, _ in got])
    np.testing.assert_array_equal(indices, np.arange(0, 96, 3))
    frames = np.concatenate([b for _, b in got]).astype(np.int16)
    reference = direct(clips[0], size=(rendition.width, rendition.height))[indices].astype(np.int16)
    errors = np.abs(frames - reference).mean(axis=(1, 2, 3))
    shifted = np.abs(frames[1:] - reference[:-1]).mean(axis=(1, 2, 3))
    assert errors.max() < 12 and (errors[1:] < shifted).all()
    with pytest.raises(VidqlError, match="not in the rendition"):
        list(frame_batches(rendition, frames=[4]))


# ---- failures and shutdown ---------------------------------------------------------------

def test_consumer_error_names_frames_and_file(clips):
    def consumer(batch):
        if batch.indices[0] >= 40:
            raise ValueError("model exploded")

    with pytest.raises(PipelineError, match=r"consumer failed on frames 40\.\.59 of .*a\.mp4.*model exploded") as caught:
        run_pipeline(clips[0], consumer, size=SIZE, batch_size=20, workers=2)
    assert caught.value.stage == "consumer" and caught.value.frames == (40, 59)
    assert isinstance(caught.value.__cause__, ValueError)


def test_vidql_errors_pass_through_with_a_note(clips):
    def consumer(batch):
        raise OracleError("oracle down")

    with pytest.raises(OracleError, match="oracle down") as caught:
        run_pipeline(clips[0], consumer, size=SIZE, batch_size=20)
    assert any("frames 0..19" in note for note in caught.value.__notes__)


def test_transform_error_stops_pipeline(clips):
    calls = []

    def transform(batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise RuntimeError("bad transform")
        return batch

    with pytest.raises(PipelineError, match=r"transform failed on frames 16\.\.23") as caught:
        list(frame_batches(clips[0], size=SIZE, batch_size=8, transform=transform))
    assert caught.value.stage == "transform"
    assert len(calls) == 3


def test_corrupt_file_in_the_middle_of_a_run(clips, tmp_path):
    data = bytearray(clips[0].read_bytes())
    middle = len(data) // 2
    data[middle:middle + 3000] = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(bytes(data))
    delivered = []
    with pytest.raises(VideoError, match=r"broken\.mp4.*frame \d+") as caught:
        run_pipeline([clips[1], broken, clips[2]], lambda b: delivered.append((b.source, b.indices.copy())),
                     size=SIZE, batch_size=8, workers=2)
    assert caught.value.path == str(broken)
    first = np.concatenate([i for s, i in delivered if s == str(clips[1])])
    np.testing.assert_array_equal(first, np.arange(40))  # the video before it was delivered in full
    assert all(s != str(clips[2]) for s, _ in delivered)  # nothing after it
    later = [i for s, i in delivered if s == str(broken)]
    if later:  # frames of the broken video before the damage arrive in order
        np.testing.assert_array_equal(np.concatenate(later), np.arange(sum(map(len, later))))


def test_leaving_the_loop_early_stops_threads(clips):
    with Pipeline(clips[0], size=SIZE, batch_size=4, workers=2) as pipeline:
        for _ in pipeline:
            assert thread_names()
            break
    assert thread_names() == []
    batches = frame_batches(clips[0], size=SIZE, batch_size=4)
    next(batches)
    batches.close()
    assert thread_names() == []


def test_keyboard_interrupt_in_consumer(clips):
    def consumer(batch):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pipeline(clips[0], consumer, size=SIZE, batch_size=4, workers=2)
    assert thread_names() == []


def test_ctrl_c_while_waiting_on_the_pipeline(clips):
    timer = threading.Timer(0.3, _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt):
        timer.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # iterate slowly until Ctrl-C arrives
            for _ in frame_batches(clips[0], size=SIZE, batch_size=2, workers=2):
                time.sleep(0.02)
    timer.join()
    assert thread_names() == []


def test_backpressure_bounds_work_ahead(clips):
    pipeline = Pipeline(clips[0], size=SIZE, batch_size=4, workers=2, chunk_frames=12, max_batches=2)
    ahead = []
    consumed = 0
    with pipeline:
        for batch in pipeline:
            time.sleep(0.01)
            consumed += len(batch)
            ahead.append(pipeline.decoded_frames - consumed)
    # chunks in flight, plus batches queued, in transform, awaiting order and in the consumer
    bound = (pipeline.workers + 1) * 12 + (2 * 2 + 2 * 1 + 3) * 4
    assert max(ahead) <= bound < 96
    assert pipeline.decoded_frames == 96


def test_decoder_threads_set_the_default_number_of_decoders(clips):
    from vidql.preprocess.pipeline import decoder_threads

    with decoder_threads(1):
        assert Pipeline(clips[0], size=SIZE, chunk_frames=20).workers == 1
        assert Pipeline(clips[0], size=SIZE, chunk_frames=20, workers=2).workers == 2  # given
    with decoder_threads(None):  # no advice: the default, a decoder per core
        assert Pipeline(clips[0], size=SIZE, chunk_frames=20).workers == \
            Pipeline(clips[0], size=SIZE, chunk_frames=20).workers


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
def test_decoder_threads_can_decode_at_lower_priority(clips):
    """Inside `decoder_threads(n, nice=k)` decoders run k steps nicer than their caller;
    the pipeline's other threads (and the caller) keep its priority."""
    from vidql.preprocess.pipeline import decoder_threads

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with decoder_threads(2, nice=3):
        pipeline = Pipeline(clips[0], size=SIZE, chunk_frames=20)
    seen = {}
    with pipeline:
        for _ in pipeline:
            for thread in threading.enumerate():
                if thread.name.startswith("vidql-") and thread.native_id is not None:
                    try:
                        seen[thread.name] = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                    except OSError:
                        pass
    decoders = {p for name, p in seen.items() if name.startswith("vidql-decode")}
    others = {p for name, p in seen.items() if not name.startswith("vidql-decode")}
    assert decoders == {mine + 3} and others == {mine}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
