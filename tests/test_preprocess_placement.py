"""Placement planner and GPU transforms (GPU checks skip without CUDA / DALI)."""
import math
from pathlib import Path

import av
import numpy as np
import pytest

from vidql.base.errors import ParameterError
from vidql.preprocess import Normalize, frame_batches
from vidql.preprocess import placement
from vidql.preprocess.gpu import DaliDecodeError, DeviceTransform, cuda_available, dali_available
from vidql.preprocess.placement import Placement, candidates, choose_placement, plan_placement, predict
from vidql.preprocess.testclip import write_counter_video

RATES = {"decode_resize_cpu": 1000.0, "normalize_cpu": 4000.0, "decode_full_cpu": 400.0,
         "normalize_cuda": 1e5, "resize_normalize_cuda": 5e4, "decode_dali": 3000.0,
         "resize_cuda": 6e4}


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return Path(write_counter_video(tmp_path_factory.mktemp("placement") / "clip.mp4", 48, 160, 120))


def test_prediction_is_the_busiest_resource():
    # CPU decode+resize and CPU normalise share the CPU: 1 / (1/1000 + 1/4000) = 800 frames/s
    assert predict(("cpu", "cpu", "cpu"), RATES) == pytest.approx(800.0)
    assert predict(("cpu", "cpu", "cuda"), RATES) == pytest.approx(1000.0)
    assert predict(("cpu", "cuda", "cuda"), RATES) == pytest.approx(400.0)
    assert predict(("dali", "cuda", "cuda"), RATES) == pytest.approx(1 / (1 / 3000 + 1 / 5e4))


def test_choice_takes_the_fastest_possible_placement():
    everything = candidates(cuda=True, dali=True, normalize=True)
    assert choose_placement(RATES, everything).decode == "dali"
    no_dali = choose_placement(RATES, candidates(cuda=True, dali=False, normalize=True))
    assert (no_dali.resize, no_dali.normalize) == ("cpu", "cuda")
    slow_bus = dict(RATES, normalize_cuda=500.0)
    assert choose_placement(slow_bus, candidates(True, False, True)).name == \
        "decode=cpu,resize=cpu,normalize=cpu"
    assert candidates(cuda=False, dali=False, normalize=False) == [("cpu", "cpu", "none")]


def test_cpu_plan_measures_and_override_checks_the_machine(clip):
    plan = plan_placement(clip, (64, 48), normalize=Normalize(), probe_frames=32)
    if not cuda_available():
        assert plan.name == "decode=cpu,resize=cpu,normalize=cpu"
        with pytest.raises(ParameterError, match="not possible here"):
            plan_placement(clip, (64, 48), override="cuda")
    assert plan.stage_fps["decode_resize_cpu"] > 0 and math.isfinite(plan.predicted_fps)
    with pytest.raises(ParameterError, match="override"):
        plan_placement(clip, (64, 48), override="tpu")


def test_gpu_placements_build_device_transforms():
    args = Placement("cpu", "cuda", "cuda").pipeline_args((64, 48), Normalize())
    assert isinstance(args["transform"], DeviceTransform) and args["transform"].size == (64, 48)
    assert args["spec"].size is None  # frames leave the decoder at full size, uint8
    args = Placement("cpu", "cpu", "cuda").pipeline_args((64, 48), Normalize())
    assert args["spec"].size == (64, 48) and args["transform"].size is None


def test_device_transform_on_cpu_torch_matches_swscale(clip):
    with av.open(str(clip)) as container:
        decoded = list(container.decode(video=0))[:8]
    full = np.stack([f.to_ndarray(format="rgb24") for f in decoded])
    small = np.stack([f.to_ndarray(format="rgb24", width=64, height=48, interpolation="AREA") for f in decoded])
    resized = DeviceTransform("cpu", (64, 48))(full).numpy()
    assert resized.shape == small.shape and resized.dtype == np.uint8
    assert np.abs(resized.astype(int) - small.astype(int)).mean() < 4


cuda_only = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")


@cuda_only
def test_cuda_placement_matches_cpu(clip):
    cpu = np.concatenate([b for _, b in frame_batches(clip, size=(64, 48), normalize=Normalize())])
    gpu = [(i, b) for i, b in frame_batches(clip, size=(64, 48), normalize=Normalize(), placement="cuda")]
    assert gpu[0][1].is_cuda
    np.testing.assert_array_equal(np.concatenate([i for i, _ in gpu]), np.arange(48))
    assert np.abs(np.concatenate([b.cpu().numpy() for _, b in gpu]) - cpu).mean() < 0.1


@pytest.mark.skipif(not dali_available(), reason="needs NVIDIA DALI and a CUDA device")
def test_dali_decode_matches_cpu(clip):
    cpu = np.concatenate([b for _, b in frame_batches(clip, size=(64, 48))]).astype(int)
    dali = [(i, b) for i, b in frame_batches(clip, size=(64, 48), placement="dali", batch_size=16)]
    np.testing.assert_array_equal(np.concatenate([i for i, _ in dali]), np.arange(48))
    assert np.abs(np.concatenate([b.cpu().numpy() for _, b in dali]).astype(int) - cpu).mean() < 6


def _undecodable(path, **_):
    raise DaliDecodeError(path, "DALI cannot decode it (no IDR frame at the start)")
    yield  # a generator, as dali_frame_batches is


def test_a_video_dali_cannot_decode_is_measured_and_placed_on_the_cpu(clip, monkeypatch):
    monkeypatch.setattr(placement, "dali_frame_batches", _undecodable)
    with pytest.warns(UserWarning, match="DALI cannot decode it.*decoding it on the CPU"):
        rates = placement.measure_stages(clip, (64, 48), Normalize(), probe_frames=32, dali=True)
    assert "decode_dali" not in rates and rates["decode_resize_cpu"] > 0
    # with DALI (and CUDA) present, the plan keeps to placements whose stages were measured
    measured = dict(RATES)
    del measured["decode_dali"]
    monkeypatch.setattr(placement, "cuda_available", lambda: True)
    monkeypatch.setattr(placement, "dali_available", lambda: True)
    monkeypatch.setattr(placement, "measure_stages", lambda *a, **k: measured)
    assert plan_placement(clip, (64, 48), normalize=Normalize()).decode == "cpu"
    with pytest.raises(ParameterError, match="DALI cannot decode it"):
        plan_placement(clip, (64, 48), normalize=Normalize(), override="dali")
