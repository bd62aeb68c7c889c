"""Each GOP decoded at most once per query: an operator that draws in rounds (ERROR WITHIN,
ORACLE BUDGET) has the frames of its later rounds kept as their GOPs are decoded
(engine/labels/decoded.py), and answers as it did when every round decoded again."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import vidql
from conftest import shared_path
from vidql.engine.labels import decoded
from vidql.preprocess.frames import FrameReader

QUERIES = ("SELECT AVG(objects('car')) FROM g ORACLE BUDGET 40 SEED 2",
           "SELECT AVG(objects('car')) FROM g ERROR WITHIN 0.1 SEED 1")


@pytest.fixture()
def decoding(monkeypatch):
    """The GOPs decoders start at (keyframe numbers) and the frames they decode, so far."""
    seen = {"starts": [], "decoded": 0}
    start_at, close = FrameReader._start_at, FrameReader.close

    def counted_start(self, gop):
        seen["starts"].append(gop)
        return start_at(self, gop)

    def counted_close(self):
        seen["decoded"] += self.decoded
        self.decoded = 0
        close(self)

    monkeypatch.setattr(FrameReader, "_start_at", counted_start)
    monkeypatch.setattr(FrameReader, "close", counted_close)
    return seen


def test_a_query_decodes_each_gop_once(tmp_path, oracle_module, decoding):
    """Two 120-frame GOPs: ERROR WITHIN draws 140 frames in many rounds, ORACLE BUDGET in two
    stages; each query starts each GOP once and decodes at most its 240 frames (before,
    ERROR WITHIN started each GOP 17 times)."""
    from vidql.preprocess.testclip import write_counter_video

    path = write_counter_video(tmp_path / "gop120.mp4", 240, 160, 96, gop=120, bframes=0)
    with vidql.connect(tmp_path / "g.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{path}' AS g; CREATE ORACLE bright FROM PYTHON "
               "'vq_test_oracle:BrightnessOracle'; SET ORACLE g = bright; SET SAMPLING = 'always'")
        for sql in QUERIES:
            decoding["starts"].clear()
            decoding["decoded"] = 0
            result = db.sql(sql)
            assert result.report.oracle_calls >= 40  # frames not labelled before
            assert max(Counter(decoding["starts"]).values()) == 1, sql
            assert decoding["decoded"] <= 240


def _answers(db, queries) -> list[tuple]:
    """Each query's answer row and the detections of the frames it labelled."""
    out = []
    for sql in queries:
        before = db.labels("v").labelled_frames
        row = tuple(db.sql(sql).df().iloc[0])
        new = np.setdiff1d(db.labels("v").labelled_frames, before)
        out.append((row, db.labels("v").detections(new).to_numpy().tolist()))
    return out


@pytest.mark.slow
def test_same_answers_and_labels_whichever_round_decodes_a_frame(tmp_path, monkeypatch):
    """On a real clip with the real detector, the same SQL and seed give the same answers
    and the same detections with frames kept across rounds as with every round decoding
    again (no room to keep frames: how queries decoded before)."""
    clip = shared_path("data", "residential_street.mp4")
    model = shared_path("models", "yolox_nano.onnx")
    queries = [sql.replace(" g ", " v ") for sql in QUERIES]
    runs = []
    for room in (decoded.STORE_BYTES, 0):
        monkeypatch.setattr(decoded, "STORE_BYTES", room)
        with vidql.connect(tmp_path / f"{room}.db", progress=False) as db:
            db.sql(f"LOAD VIDEO '{clip}' AS v; CREATE ORACLE yolox FROM ONNX '{model}'; "
                   "SET ORACLE v = yolox; SET SAMPLING = 'always'")
            runs.append(_answers(db, queries))
    assert runs[0] == runs[1]
