"""A detector exported with batch 1 gets a free batch on the GPU, and only where the edit
reproduces one-frame runs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import shared_path
from vidql.engine.labels.onnx_batch import free_batch

onnx = pytest.importorskip("onnx", reason="the onnx package (dev and gpu extras) edits models")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


def _model(path, nodes, initializers, output_shape, batch=1):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _shape(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _runs(session, frames):
    name = session.get_inputs()[0].name
    return session.run(None, {name: frames})[0]


def test_a_per_image_reshape_gets_a_free_batch(tmp_path):
    path = _model(tmp_path / "m.onnx", [helper.make_node("Mul", ["x", "k"], ["s"]),
                                        helper.make_node("Reshape", ["s", "shape"], ["y"])],
                  [helper.make_tensor("k", TensorProto.FLOAT, [1], [2.0]), _shape("shape", [1, 3, -1])],
                  [1, 3, 16])
    edited = free_batch(path)
    assert edited is not None
    frames = np.random.default_rng(1).normal(size=(5, 3, 4, 4)).astype(np.float32)
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batched = _runs(ort.InferenceSession(edited, providers=["CPUExecutionProvider"]), frames)
    singles = np.concatenate([_runs(original, f[None]) for f in frames])
    assert batched.shape == (5, 3, 16) and np.array_equal(batched, singles)


def test_an_edit_that_breaks_the_graph_is_refused(tmp_path):
    """The leading 1 of this Reshape is not the batch (a transpose moved it): 0 there copies
    the channels, and the model no longer runs on two frames."""
    path = _model(tmp_path / "m.onnx", [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2, 3]),
                                        helper.make_node("Reshape", ["t", "shape"], ["y"])],
                  [_shape("shape", [1, 3, -1])], [1, 3, 16])
    assert free_batch(path) is None


def test_a_model_with_a_free_batch_is_left_alone(tmp_path):
    path = _model(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"])], [],
                  ["n", 3, 4, 4], batch="n")
    assert free_batch(path) is None


def test_yolox_on_the_gpu_runs_a_batch_at_a_time_with_the_same_detections(monkeypatch):
    """The oracle takes the edited model where its session runs on CUDA (faked here: the CPU
    stands in), and labels frames as the model exported with batch 1 does."""
    from vidql.engine.labels.oracle_models import OnnxDetector

    model = shared_path("models", "yolox_nano.onnx")
    frames = np.random.default_rng(2).integers(0, 255, (3, 240, 320, 3), dtype=np.uint8)
    frames[:, 60:180, 80:240] = [200, 30, 30]  # a block: something to box now and then
    as_exported = OnnxDetector("yolox", model, batch_size=3)
    assert as_exported.fixed_batch == 1
    want = as_exported.detect(frames, np.arange(3))
    monkeypatch.setattr(ort.InferenceSession, "get_providers",
                        lambda self: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    on_gpu = OnnxDetector("yolox", model, batch_size=3)
    assert on_gpu.fixed_batch is None and on_gpu.session.get_inputs()[0].shape[0] == "batch"
    runs = []
    real_run = ort.InferenceSession.run
    monkeypatch.setattr(ort.InferenceSession, "run",
                        lambda self, names, feed: runs.append(len(next(iter(feed.values()))))
                        or real_run(self, names, feed))
    got = on_gpu.detect(frames, np.arange(3))
    assert runs == [3]
    assert got.reset_index(drop=True).equals(want.reset_index(drop=True))
    runs.clear()  # one input shape: fewer frames are padded, more are cut into full runs
    got = pd.concat([on_gpu.detect(frames[:2], np.arange(2)), on_gpu.detect(frames, np.arange(3)),
                     on_gpu.detect(np.concatenate([frames, frames[:1]]), np.arange(4))])
    assert runs == [3, 3, 3, 3]
    want = pd.concat([want[want.frame < 2], want, want, want[want.frame == 0].assign(frame=3)])
    assert got.reset_index(drop=True).equals(want.reset_index(drop=True))
