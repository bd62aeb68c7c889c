"""A detector exported with its batch fixed at 1, given a free batch dimension.

On a GPU one run of many frames costs little more than a run of one (YOLOX-Nano on an
H200: 0.63 ms a frame at 32 a run, 4.3 ms at one), so an ONNX oracle on the GPU runs the
edited model. On a CPU batching gains nothing (17 ms a frame either way on one thread),
so the CPU runs the model as exported.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

CHECK_FRAMES = 2  # frames of random pixels the edited model is checked on


def free_batch(path: str | Path) -> bytes | None:
    """The model at `path` with its batch dimension free, serialised; None where the `onnx`
    package is missing, nothing fixes the batch, or the edit does not reproduce one-frame
    runs of the model as exported on CHECK_FRAMES random frames.

    The edit: inputs and outputs get a named first dimension, and each constant Reshape
    target that starts with 1 starts with 0 (copy the input's first dimension), as YOLOX's
    export (`[1, 85, -1]`) and most others that flatten per image write it."""
    try:
        import onnx
        import onnx.numpy_helper
    except ImportError:
        return None
    model = onnx.load(str(path))
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    constants |= {node.output[0]: attr.t for node in graph.node if node.op_type == "Constant"
                  for attr in node.attribute if attr.name == "value"}
    edited = False
    for node in graph.node:
        allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
        if node.op_type != "Reshape" or allow_zero or node.input[1] not in constants:
            continue
        tensor = constants[node.input[1]]
        shape = onnx.numpy_helper.to_array(tensor).copy()
        if shape.ndim == 1 and len(shape) > 1 and shape[0] == 1:
            shape[0] = 0
            tensor.CopyFrom(onnx.numpy_helper.from_array(shape, tensor.name))
            edited = True
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = "batch"
            edited = True
    if not edited:
        return None
    edited_bytes = model.SerializeToString()
    return edited_bytes if _same_outputs(path, edited_bytes) else None


def _same_outputs(path: str | Path, edited: bytes) -> bool:
    """Whether the edited model's run on CHECK_FRAMES frames gives what as many one-frame
    runs of the original give (on the CPU, where both are exact)."""
    import onnxruntime as ort

    cpu = ["CPUExecutionProvider"]
    original = ort.InferenceSession(str(path), providers=cpu)
    inp = original.get_inputs()[0]
    if not all(isinstance(d, int) for d in inp.shape[1:]):
        return False
    frames = np.random.default_rng(0).uniform(0, 255, (CHECK_FRAMES, *inp.shape[1:]))
    frames = frames.astype(np.float32)
    try:
        batched = ort.InferenceSession(edited, providers=cpu).run(None, {inp.name: frames})
    except Exception:  # the edit broke the graph: a shape no longer fits
        return False
    singles = [original.run(None, {inp.name: frame[None]}) for frame in frames]
    for k, out in enumerate(batched):
        want = np.concatenate([single[k] for single in singles])
        if out.shape != want.shape or not np.allclose(out, want, rtol=1e-4,
                                                      atol=1e-4 * (1 + np.abs(want).max())):
            return False
    return True
