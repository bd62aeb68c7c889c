"""YOLOX and YOLOv8 output decoding of the ONNX oracle, with crafted network outputs: box
geometry back to frame pixels, letterbox and colour order, score threshold, class-wise NMS."""
from __future__ import annotations

import numpy as np
import pytest

from vidql.engine.detectors import OnnxDetector, _yolox_grids
from vidql.engine.errors import OracleError
from vidql.engine.oracle import COCO_CLASSES

CAR, BUS = COCO_CLASSES.index("car"), COCO_CLASSES.index("bus")


def fake_detector(outputs: np.ndarray, input_hw=(320, 320), layout="auto") -> OnnxDetector:
    """An OnnxDetector whose network returns `outputs`; the blobs it was given are kept."""
    det = OnnxDetector.__new__(OnnxDetector)
    det.name, det.score, det.nms, det.layout = "fake", 0.3, 0.45, layout
    det.classes, det.input_hw, det.fixed_batch = list(COCO_CLASSES), input_hw, None
    det._grids = _yolox_grids(input_hw[0])
    det.blobs = []

    def run(blobs):
        det.blobs.append(blobs)
        return np.repeat(outputs[None], len(blobs), axis=0)

    det._run = run
    return det


def boxes_of(df, label):
    return df[df["label"] == label][["x1", "y1", "x2", "y2"]].to_numpy()


def test_yolov8_layout_centred_letterbox_and_class_wise_nms():
    anchors = 2100
    out = np.zeros((4 + 80, anchors), dtype=np.float32)

    def put(a, centre, size, cls, score):
        out[:4, a] = [*centre, *size]
        out[4 + cls, a] = score

    put(0, (100, 140), (40, 20), BUS, 0.9)
    put(1, (102, 141), (40, 20), BUS, 0.8)   # overlaps the first bus: suppressed
    put(2, (100, 140), (40, 20), CAR, 0.7)   # same box, other class: kept
    put(3, (250, 200), (30, 30), CAR, 0.1)   # below the score threshold
    frame = np.full((240, 320, 3), (200, 100, 50), dtype=np.uint8)
    det = fake_detector(out)
    df = det.detect(frame[None], np.array([7]))
    assert sorted(df["label"]) == ["bus", "car"] and (df["frame"] == 7).all()
    # centred letterbox: 240 rows sit 40 px below the top of the 320×320 input
    np.testing.assert_allclose(boxes_of(df, "bus"), [[80, 90, 120, 110]], atol=1e-4)
    assert df.loc[df["label"] == "bus", "score"].item() == pytest.approx(0.9)
    # auto layout guessed YOLOX preprocessing first, then redid it as YOLOv8: RGB / 255
    final = det.blobs[-1][0]
    assert len(det.blobs) == 2 and final.max() <= 1.0
    np.testing.assert_allclose(final[:, 100, 10], [200 / 255, 100 / 255, 50 / 255], rtol=1e-6)
    np.testing.assert_allclose(final[:, 10, 10], [114 / 255] * 3, rtol=1e-6)  # padding


def test_yolox_layout_grid_decoding_bgr_and_objectness():
    grids, strides = _yolox_grids(416)
    out = np.zeros((len(grids), 85), dtype=np.float32)
    anchor = 5 * 52 + 10  # stride-8 grid cell x=10, y=5
    out[anchor, :4] = [0.5, 0.5, np.log(4.0), np.log(2.0)]
    out[anchor, 4] = 0.9            # objectness
    out[anchor, 5 + CAR] = 0.9      # class score: confidence 0.81
    out[anchor + 1, :5] = [0.5, 0.5, 0.0, 0.0, 0.5]
    out[anchor + 1, 5 + BUS] = 0.5  # confidence 0.25 < 0.3
    frame = np.zeros((104, 208, 3), dtype=np.uint8)
    frame[..., 0] = 255  # red in RGB
    det = fake_detector(out, input_hw=(416, 416))
    df = det.detect(frame[None], np.array([3]))
    assert list(df["label"]) == ["car"]
    assert df["score"].item() == pytest.approx(0.81, rel=1e-5)
    # input pixels: centre (84, 44), 32×16; the frame was scaled by 2 into the top-left corner
    np.testing.assert_allclose(boxes_of(df, "car"), [[34, 18, 50, 26]], atol=1e-4)
    blob = det.blobs[-1][0]
    assert len(det.blobs) == 1 and blob[2, 0, 0] == 255 and blob[0, 0, 0] == 0  # BGR, 0..255
    assert (blob[:, 300, 300] == 114).all()  # padding below the image


def test_unknown_output_layout_is_a_clear_error():
    det = fake_detector(np.zeros((50, 50), dtype=np.float32))
    with pytest.raises(OracleError, match="cannot tell the ONNX output layout"):
        det.detect(np.zeros((1, 64, 64, 3), dtype=np.uint8), np.array([0]))
