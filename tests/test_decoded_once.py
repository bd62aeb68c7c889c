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


def test_limit_keeps_the_frames_of_its_later_batches(tmp_path, oracle_module, decoding,
                                                     monkeypatch):
    """LIMIT labels along its ranking a batch at a time (48 batches of 5 here): told the
    frames after each batch but the first (`plan`), the label cache keeps those of the GOPs
    it decodes. Two 120-frame GOPs: 380 frames decoded, against 8091 when every batch
    decodes its GOPs again (as LIMIT did before)."""
    from vidql import queries
    from vidql.preprocess.testclip import write_counter_video

    path = write_counter_video(tmp_path / "gop120.mp4", 240, 160, 96, gop=120, bframes=0)
    got, real = {}, queries.limit_query

    def unplanned(proxy, predicate, **kw):  # the predicate without its `plan`
        return real(proxy, lambda positions: predicate(positions), **kw)

    for planned in (True, False):
        if not planned:
            monkeypatch.setattr(queries, "limit_query", unplanned)
        decoding["starts"].clear()
        decoding["decoded"] = 0
        with vidql.connect(tmp_path / f"{planned}.db", progress=False) as db:
            db.sql(f"LOAD VIDEO '{path}' AS g; CREATE ORACLE bright FROM PYTHON "
                   "'vq_test_oracle:BrightnessOracle'; SET ORACLE g = bright")
            result = db.sql("SELECT frame FROM g WHERE objects('car') >= 9 LIMIT 5 SEED 3")
            assert result.report.oracle_calls == 240  # no frame is that bright: every batch runs
        got[planned] = decoding["decoded"]
    assert got[True] <= 2 * 240 < 10 * 240 < got[False]


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


def test_keeping_decodes_on_only_where_it_saves_decoding():
    """A 120-frame GOP's planned frames (the query's every other frame, in a random order of
    draws, eight draws made) are worth decoding on to, even those due late; in an 8-frame
    GOP only a draw due soon is, and one far off is left to a later round."""
    wanted = np.array([10])
    planned = np.random.default_rng(0).permutation(np.setdiff1d(np.arange(240), wanted))
    draws = np.arange(9, 9 + len(planned))
    keep = decoded.frames_to_keep(wanted, planned, draws, 8, np.array([0, 120]), room=1000)
    assert keep.tolist() == planned[planned < 120].tolist()
    short = np.arange(0, 240, 8)
    soon = decoded.frames_to_keep(np.array([1]), np.array([6, 5]), np.array([9, 900]), 8,
                                  short, room=100)
    assert soon.tolist() == [6, 5]  # 5 comes free on the way to 6
    late = decoded.frames_to_keep(np.array([1]), np.array([6, 5]), np.array([800, 900]), 8,
                                  short, room=100)
    assert late.tolist() == []
    assert decoded.frames_to_keep(wanted, planned, draws, 8, np.array([0, 120]),
                                  room=2).tolist() == keep[:2].tolist()


def _keep_all(wanted, planned, draws, drawn, keyframes, room):
    """Every planned frame of the GOPs `wanted` touches (how frames were kept before)."""
    touched = np.unique(np.searchsorted(keyframes, wanted, side="right"))
    return planned[np.isin(np.searchsorted(keyframes, planned, side="right"), touched)][:room]


def test_short_gops_decode_less_than_keeping_whole_gops(tmp_path, oracle_module, decoding,
                                                        monkeypatch):
    """8-frame GOPs (an oracle rendition's): ERROR WITHIN's rounds draw a few frames each from
    a plan of every frame. Keeping every planned frame of each GOP decoded (before) decoded
    whole GOPs for draws that mostly never came (on a 1080p clip's copy, 539 frames for 96
    labels, against 428 keeping none); now it decodes fewer than that, and no more than
    keeping none, with the same answer."""
    from vidql.preprocess.testclip import write_counter_video

    path = write_counter_video(tmp_path / "gop8.mp4", 960, 160, 96, gop=8, bframes=0)
    runs = {}
    for how in ("now", "whole GOPs", "none"):
        monkeypatch.setattr(decoded, "STORE_BYTES", 0 if how == "none" else 256 << 20)
        if how == "whole GOPs":
            monkeypatch.setattr(decoded, "frames_to_keep", _keep_all)
        with vidql.connect(tmp_path / f"{len(runs)}.db", progress=False) as db:
            db.sql(f"LOAD VIDEO '{path}' AS g; CREATE ORACLE bright FROM PYTHON "
                   "'vq_test_oracle:BrightnessOracle'; SET ORACLE g = bright; "
                   "SET SAMPLING = 'always'")
            decoding["decoded"] = 0
            result = db.sql("SELECT AVG(objects('car')) FROM g ERROR WITHIN 0.3 SEED 1")
            runs[how] = (decoding["decoded"], result.report.oracle_calls,
                         tuple(result.df().iloc[0]))
    assert runs["now"][1:] == runs["whole GOPs"][1:] == runs["none"][1:]
    assert runs["now"][0] < runs["whole GOPs"][0]
    assert runs["now"][0] <= runs["none"][0]
