"""'auto' oracle renditions, a new video's default: an ONNX detector writes one at its own
input size, only for clips whose random reads cost at least RENDITION_GAIN times more than
the rendition's would (the cost model of preprocess/readcost.py), in the labelling call
whose file reads would bring its reads so far to the cost of writing it (rent or buy), and
EXPLAIN prices writing it."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import vidql
from test_detector_decode import constant_onnx
from vidql.base.errors import ParameterError
from vidql.engine.catalog.catalog import FILE_READS, ORACLE_RENDITION
from vidql.preprocess.rendition import ORACLE_GOP
from vidql.preprocess.testclip import write_counter_video

SIDE = 64  # the test detector's square input
FOLDER = f"{ORACLE_RENDITION}_{SIDE}"
N = 720


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """A YOLOv8-layout ONNX detector with a 64x64 input that finds nothing."""
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    constant_onnx(path, np.zeros((4 + 80, 84), dtype=np.float32), (SIDE, SIDE))
    return path


@pytest.fixture(scope="module")
def long_gop(tmp_path_factory):
    """640x360, one keyframe every 120 frames: a random read decodes 60 frames on average."""
    return write_counter_video(tmp_path_factory.mktemp("v") / "long.mp4", N, 640, 360,
                               gop=120, bframes=0)


def load(db, clip, detector, option: str = "") -> None:
    db.sql(f"LOAD VIDEO '{clip}' AS v{option}; CREATE ORACLE m FROM ONNX '{detector}' "
           "WITH (layout = 'yolov8'); SET ORACLE v = m")


def test_auto_writes_the_rendition_on_first_use_where_random_reads_are_costly(long_gop, detector,
                                                                             tmp_path):
    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        load(db, long_gop, detector)
        assert db.videos()["oracle_rendition"].iloc[0] == "auto"
        folder = db.catalog.clip_dir("v", 0) / FOLDER
        oracle = db.labels("v").oracle
        [file] = db.catalog.read_costs("v", SimpleNamespace(reads_scaled=False))
        [cost] = db.catalog.read_costs("v", oracle)  # the file's, until the rendition is written
        assert cost is file and list(file.keyframes) == list(range(0, N, 120))
        # a few frames (EXPLAIN timing the oracle), or even a scan (in file order: the copy
        # would save nothing), read the file
        assert db.catalog.rendition_to_write("v", 0, oracle, np.array([100, 350])) is None
        assert db.catalog.rendition_to_write("v", 0, oracle, np.arange(N)) is None
        db.sql("SELECT count(*) FROM v WHERE frame < 16 AND objects('car') >= 1").df()
        # rent or buy: 60 frames of the 6 GOPs read from the file (about 660 frames decoded)
        # cost less than writing the copy (720 frames decoded, converted and encoded) ...
        db.sql("SELECT AVG(objects('car')) FROM v ORACLE BUDGET 60 SEED 1").df()
        spent = json.loads((db.catalog.clip_dir("v", 0) / FILE_READS).read_text())[str(SIDE)]
        writing, planned = db.catalog.rendition_to_write("v", 0, oracle, np.arange(N))
        assert list(planned.keyframes) == list(range(0, N, ORACLE_GOP))
        assert planned.random_read_seconds() * 4 <= file.random_read_seconds()
        assert not folder.exists() and spent > 0
        # ... so a later sample, whose reads bring the total past it, writes it first, and
        # its EXPLAIN says so
        for seed in range(2, 6):
            sql = f"SELECT AVG(objects('car')) FROM v ORACLE BUDGET 120 SEED {seed}"
            plan = db.sql(f"EXPLAIN {sql}").df().iloc[0]
            if "includes writing the oracle rendition first" in plan["note"]:
                break
            db.sql(sql).df()
            assert not folder.exists()
        writing, _ = db.catalog.rendition_to_write("v", 0, oracle, np.arange(N))
        assert plan["estimated_decode_seconds"] >= writing
        db.sql(sql).df()
        assert (folder / "rendition.mp4").is_file()
        [written] = db.catalog.read_costs("v", oracle)
        assert list(written.keyframes) == list(range(0, N, ORACLE_GOP))
        assert db.catalog.rendition_to_write("v", 0, oracle, np.arange(N)) is None
        assert db.catalog.oracle_input("v", 0, oracle).kept_size == (SIDE, 36)
        again = db.sql("EXPLAIN SELECT count(*) FROM v WHERE objects('car') >= 1").df().iloc[0]
        assert "oracle rendition" not in again["note"]


def test_no_rendition_where_reads_are_cheap_or_none_is_asked(counter_clip, long_gop, detector,
                                                             tmp_path):
    """counter_clip (160x96, GOP 12): a copy at 64x38 would read no faster; 'none' never
    writes one."""
    for clip, option in ((counter_clip, ""), (long_gop, " WITH (oracle_rendition = 'none')")):
        with vidql.connect(progress=False) as db:
            load(db, clip, detector, option)
            db.sql("SELECT count(*) FROM v WHERE frame < 16 AND objects('car') >= 1").df()
            oracle = db.labels("v").oracle
            assert db.catalog.oracle_rendition("v", 0, oracle) is None
            assert not any(db.catalog.clip_dir("v", 0).glob(f"{ORACLE_RENDITION}*"))
            assert db.catalog.rendition_to_write("v", 0, oracle, np.arange(96)) is None


def test_a_read_only_database_reads_the_file_until_the_rendition_is_written(long_gop, detector,
                                                                            tmp_path):
    path = tmp_path / "db.duckdb"
    with vidql.connect(path, progress=False) as db:
        load(db, long_gop, detector)
    with vidql.connect(path, read_only=True, progress=False) as db:
        oracle = db.labels("v").oracle
        assert db.catalog.oracle_rendition("v", 0, oracle) is None
        assert db.catalog.oracle_input("v", 0, oracle).kept_size == (SIDE, 36)  # shrunk file


def test_load_into_keeps_auto(long_gop, counter_clip, detector, tmp_path):
    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        load(db, long_gop, detector)
        with pytest.raises(ParameterError, match="oracle_rendition = auto"):
            db.sql(f"LOAD VIDEO '{counter_clip}' INTO v WITH (oracle_rendition = 'none')")
        db.sql(f"LOAD VIDEO '{counter_clip}' INTO v WITH (oracle_rendition = 'auto')")
        assert db.videos()["oracle_rendition"].iloc[0] == "auto"


@pytest.mark.parametrize("value", ["'sometimes'", "0"])
def test_oracle_rendition_option_values(counter_clip, value):
    with vidql.connect(progress=False) as db:
        with pytest.raises(ParameterError, match=r"oracle_rendition.*\[32, 4096\]"):
            db.sql(f"LOAD VIDEO '{counter_clip}' AS v WITH (oracle_rendition = {value})")


@pytest.mark.slow
@pytest.mark.shared
def test_the_same_answer_from_the_auto_rendition_as_from_the_file(tmp_path):
    """On hangzhou_junction_720p (GOP 125) the default writes YOLOX-Nano's 416-px copy in
    the call that brings its reads of the file to the copy's cost (each sample reads nearly
    every GOP, about a quarter of it; five samples and the exact scan read 1.4x it), and
    the same SQL with the same SEED answers as it does reading the file."""
    from conftest import shared_path

    video = shared_path("data", "hangzhou_junction_720p.mp4")
    model = shared_path("models", "yolox_nano.onnx")
    sample = "SELECT AVG(objects('car')) FROM v ORACLE BUDGET {} SEED 3"
    queries = [sample.format(budget) for budget in (40, 80, 160)]
    queries += [sample.format(120).replace("SEED 3", f"SEED {seed}") for seed in (4, 5)]
    queries.append("SELECT AVG(objects('car')) FROM v")
    answers = {}
    for option in ("", " WITH (oracle_rendition = 'none')"):
        with vidql.connect(tmp_path / f"db{len(answers)}.duckdb", progress=False) as db:
            db.sql(f"LOAD VIDEO '{video}' AS v{option}; CREATE ORACLE y FROM ONNX '{model}'; "
                   "SET ORACLE v = y")
            answers[option] = [db.sql(sql).df().iloc[0].tolist() for sql in queries]
            written = (db.catalog.clip_dir("v", 0) / f"{ORACLE_RENDITION}_416").is_dir()
            assert written == (option == "")
    assert answers[""] == answers[" WITH (oracle_rendition = 'none')"]


def test_frames_a_query_kept_are_no_file_reads(long_gop, detector, tmp_path):
    """A labelling call's frames served from the query's decoded frames (decoded by an
    earlier call) cost no read of the file, so they put nothing on the account toward the
    copy (before, each ERROR WITHIN round charged a fresh random read of all its frames,
    and a query that read the file once bought the copy midway)."""
    from vidql.engine.labels.decoded import DecodedFrames

    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        load(db, long_gop, detector)
        cache = db.labels("v")
        account = db.catalog.clip_dir("v", 0) / FILE_READS
        kept = DecodedFrames(N)
        kept.plan(np.r_[[5, 300, 6, 301], np.setdiff1d(np.arange(N), [5, 300, 6, 301])])
        kept.unplan(np.array([5, 300]))
        with cache.frame_batches(np.array([5, 300]), 8, kept) as batches:
            assert [ids.tolist() for ids, _ in batches] == [[5, 300]]
        first = json.loads(account.read_text())[str(SIDE)]
        assert first > 0 and kept.held[[6, 301]].all()
        kept.unplan(np.array([6, 301]))
        with cache.frame_batches(np.array([6, 301]), 8, kept) as batches:
            assert [ids.tolist() for ids, _ in batches] == [[6, 301]]
        assert json.loads(account.read_text())[str(SIDE)] == first


def test_explain_counts_a_querys_earlier_calls_toward_the_copy(long_gop, detector, tmp_path):
    """A query of several labelling calls, none of which alone reads enough of the file to
    buy the copy: its calls' reads add up, so pricing has the call that brings them past
    the copy's cost write it (as the engine's account does), and no call after reads the
    file (before, each call was priced as the query's first)."""
    from vidql.engine.pricing import decode_seconds

    with vidql.connect(tmp_path / "db.duckdb", progress=False) as db:
        load(db, long_gop, detector)
        cache, oracle = db.labels("v"), db.labels("v").oracle
        calls = [np.arange(k, N, 120) for k in range(5, 120, 10)]  # every GOP, each call
        assert all(db.catalog.rendition_to_write("v", 0, oracle, c) is None for c in calls)
        writing, _ = db.catalog.rendition_to_write("v", 0, oracle, np.arange(N), 1e9)
        priced = decode_seconds(db.catalog, "v", cache, calls)
        assert priced.writing == pytest.approx(writing)
        alone = [decode_seconds(db.catalog, "v", cache, [c]) for c in calls]
        assert sum(d.writing for d in alone) == 0
        assert priced.seconds < sum(d.seconds for d in alone) + writing
