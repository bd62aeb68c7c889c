"""The ONNX oracle (YOLOX-Nano) on a real clip agrees with the reference labels."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import vidql
from conftest import shared_path

pytestmark = pytest.mark.shared


@pytest.mark.slow
def test_yolox_matches_reference_labels_on_ua_detrac():
    video = shared_path("data", "ua_detrac.mp4")
    model = shared_path("models", "yolox_nano.onnx")
    reference = pd.read_csv(shared_path("data", "ua_detrac.labels.csv"))
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS detrac; "
               f"CREATE ORACLE yolox FROM ONNX '{model}' WITH (score = 0.3); "
               f"SET ORACLE detrac = yolox")
        mine = db.sql("SELECT frame, objects('car') AS cars FROM detrac ORDER BY frame").df()
        assert db.last_report.oracle_calls == len(mine) == 252
    cars = mine["cars"].to_numpy()
    ref = reference[reference.label == "car"].groupby("frame").size().reindex(
        np.arange(252), fill_value=0).to_numpy()
    assert (cars >= 1).mean() > 0.9, "most frames of a busy intersection show a car"
    assert (np.abs(cars - ref) <= 1).mean() >= 0.95


def test_yolox_threads_chosen_by_measurement_same_detections():
    """On the CPU the first batch picks the intra-op threads (default, 1 or one per core)
    that run fastest; the detections are those of onnxruntime's default session."""
    import os

    from vidql.engine.labels.oracle_models import OnnxDetector
    from vidql.preprocess.frames import FrameReader

    model = shared_path("models", "yolox_nano.onnx")
    with FrameReader(shared_path("data", "ua_detrac.mp4")) as reader:
        frames = reader.read(np.arange(4))
    ids = np.arange(4)
    measured, default = OnnxDetector("m", model), OnnxDetector("d", model)
    default.threads_chosen = True  # keeps its first session: onnxruntime's default threads
    mine = measured.detect(frames, ids)
    assert measured.threads in {0, 1, os.cpu_count()} and measured.runs in {1, os.cpu_count()}
    pd.testing.assert_frame_equal(mine, default.detect(frames, ids), rtol=1e-4)
