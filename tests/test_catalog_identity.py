"""Trustworthy catalog on the real ua_detrac clip: case-sensitive class names, the oracle a
query names, oracle and video identity, and clear errors for a damaged catalog."""
from __future__ import annotations

import hashlib
import os
import shutil

import pandas as pd
import pytest

import vidql
from vidql.engine.sql.dialect import (AlterVideoPath, CreateOracle, DropOracle, PlainSQL, describe,
                                  parse)
from vidql.engine.sql.framestat import evaluate, parse_frame_expr

from conftest import shared_path


@pytest.fixture()
def detrac(tmp_path):
    """ua_detrac with its detector labels as the default oracle `gt`."""
    clip, labels = shared_path("data", "ua_detrac.mp4"), shared_path("data", "ua_detrac.labels.csv")
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip}' AS v; CREATE ORACLE gt FROM LABELS '{labels}'; "
               "SET ORACLE v = gt")
        yield db, pd.read_csv(labels)


def test_class_names_differing_in_case_are_distinct(detrac):
    db, truth = detrac
    cars = int((truth["label"] == "car").sum())
    got = db.sql("SELECT sum(objects('Car')), sum(objects('car')), sum(objects('CAR', 0.5)) "
                 "FROM v").fetchall()[0]
    assert [int(x) for x in got] == [0, cars, 0]
    frames_with_car = truth.loc[truth["label"] == "car", "frame"].nunique()
    n = db.sql("SELECT count(*) FROM v WHERE contains('car') AND NOT contains('Car')").fetchall()
    assert n[0][0] == frames_with_car
    est = db.sql("SELECT AVG(objects('car') - objects('Car')) FROM v ERROR WITHIN 1 SEED 3"
                 ).df().iloc[0, 0]
    assert abs(est - cars / 252) < 3  # the old code read objects('car') twice: 0


def test_min_scores_rounding_alike_are_distinct():
    det = pd.DataFrame({"frame": [0, 0], "label": ["car", "Car"], "score": [0.3, 0.30000001],
                        "x1": 0.0, "y1": 0.0, "x2": 1.0, "y2": 1.0})
    expr = parse_frame_expr("objects('car', 0.3) * 10 + objects('car', 0.30000001) "
                            "+ 100 * objects('Car')")
    assert len({fn.column.lower() for fn in expr.functions}) == 3
    assert evaluate(expr, det, [0]).tolist() == [110.0]  # proxies and true values alike


def test_objects_view_reads_the_oracle_the_query_names(detrac, tmp_path):
    db, truth = detrac
    buses = truth[truth["label"] == "bus"]
    buses.to_csv(tmp_path / "buses.csv", index=False)
    db.sql(f"CREATE ORACLE alt FROM LABELS '{tmp_path / 'buses.csv'}'")
    q = "SELECT label, count(*) AS n FROM v.objects WHERE frame < 10 GROUP BY label ORDER BY label"
    got = db.sql(q + " USING ORACLE alt").df()
    assert got["label"].tolist() == ["bus"]
    assert got["n"].tolist() == [int((buses["frame"] < 10).sum())]
    default = db.sql(q).df().set_index("label")["n"]
    assert default.to_dict() == truth[truth["frame"] < 10].groupby("label").size().to_dict()


def test_objects_view_of_an_older_catalog_is_upgraded(detrac):
    db, truth = detrac
    db.sql("SELECT count(*) FROM v WHERE objects('car') > 0")
    db.con.execute("CREATE OR REPLACE VIEW v.objects AS SELECT frame, label, score, x1, y1, x2, "
                   "y2 FROM vidql.labels WHERE false")  # what a view looked like before
    path = db.path
    db.close()
    with vidql.connect(path, progress=False) as again:
        n = again.sql("SELECT count(*) FROM v.objects").fetchall()[0][0]
        assert n == len(truth)


def _edit_labels(path, frames_kept):
    df = pd.read_csv(path)
    df[df["frame"] < frames_kept].to_csv(path, index=False)


def test_changed_labels_file_is_reported_everywhere_until_replaced(tmp_path, monkeypatch):
    clip, labels = shared_path("data", "ua_detrac.mp4"), shared_path("data", "ua_detrac.labels.csv")
    (tmp_path / "lab.csv").write_bytes(labels.read_bytes())
    monkeypatch.chdir(tmp_path)
    with vidql.connect("v.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip}' AS v; CREATE ORACLE gt FROM LABELS 'lab.csv'; "
               "SET ORACLE v = gt")
        all_cars = db.sql("SELECT sum(objects('car')) FROM v").fetchall()[0][0]
        _edit_labels("lab.csv", 100)
        for query in ("SELECT sum(objects('car')) FROM v", "SELECT count(*) FROM v.objects",
                      "SELECT avg(objects('car')) FROM v ERROR WITHIN 1"):
            with pytest.raises(vidql.OracleError, match=r"oracle 'gt' changed since CREATE "
                               r"ORACLE: the contents of '.*lab.csv' changed"):
                db.sql(query)
        status = db.sql("SHOW ORACLES").df().set_index("name")["status"]
        assert "CREATE OR REPLACE ORACLE gt" in status["gt"]
        db.sql("CREATE OR REPLACE ORACLE gt FROM LABELS 'lab.csv'")
        assert db.sql("SHOW ORACLES").df()["status"].tolist() == ["ok"]
        few = db.sql("SELECT sum(objects('car')) FROM v").fetchall()[0][0]
        assert few < all_cars and db.sql("SELECT count(*) FROM v.objects").fetchall()[0][0] == \
            int((pd.read_csv("lab.csv")).shape[0])
    (tmp_path / "lab.csv").write_bytes(labels.read_bytes())  # back to the first version
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the relative path was stored as an absolute one
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        db.sql("CREATE OR REPLACE ORACLE gt FROM LABELS '../lab.csv'")
        assert db.sql("SELECT sum(objects('car')) FROM v").fetchall()[0][0] == all_cars
        assert db.last_report.oracle_calls == 0  # the old identity's labels were kept


def test_python_oracle_edit_needs_replace(db_clip):
    db, module = db_clip
    db.sql("SELECT sum(objects('car')) FROM clip WHERE frame < 10")
    path = module.__file__
    with open(path, "a") as fh:
        fh.write("\n# a comment is a new version too\n")
    with pytest.raises(vidql.OracleError, match="vq_test_oracle.py' changed"):
        db.sql("SELECT sum(objects('car')) FROM clip WHERE frame < 10")
    with open(path, "a") as fh:
        fh.write("BrightnessOracle.version = '2'\n")
    db.create_oracle("bright", "PYTHON", "vq_test_oracle:BrightnessOracle", replace=True)
    assert db.catalog.oracle("bright").identity.split(":")[4] == "2"  # the new code is loaded
    db.sql("SELECT sum(objects('car')) FROM clip WHERE frame < 10")
    assert db.last_report.oracle_calls == 10


@pytest.fixture()
def db_clip(clip_db, oracle_module):
    return clip_db, oracle_module


def test_drop_oracle(db_clip, tmp_path):
    db, _ = db_clip
    with pytest.raises(vidql.CatalogError, match="default oracle of video.*SET ORACLE clip"):
        db.sql("DROP ORACLE bright")
    pd.DataFrame({"frame": [0], "label": ["car"], "score": [1.0], "x1": 0, "y1": 0, "x2": 1,
                  "y2": 1}).to_csv(tmp_path / "one.csv", index=False)
    db.sql(f"CREATE ORACLE one FROM LABELS '{tmp_path / 'one.csv'}'")
    db.sql("SELECT count(*) FROM clip WHERE contains('car') USING ORACLE one")
    with pytest.raises(vidql.CatalogError, match="already exists; CREATE OR REPLACE"):
        db.sql(f"CREATE ORACLE one FROM LABELS '{tmp_path / 'one.csv'}'")
    assert "120 labelled frames stay cached" in db.sql("DROP ORACLE one").fetchall()[0][0]
    assert db.sql("SHOW ORACLES").df()["name"].tolist() == ["bright"]
    assert db.sql("DROP ORACLE IF EXISTS one").fetchall() == [("no oracle one",)]
    with pytest.raises(vidql.CatalogError, match="unknown oracle 'one'"):
        db.sql("DROP ORACLE one")
    db.create_oracle("one", "LABELS", tmp_path / "one.csv")
    db.sql("SELECT count(*) FROM clip WHERE contains('car') USING ORACLE one")
    assert db.last_report.oracle_calls == 0
    assert db.drop_oracle("nothing", if_exists=True) == 0


def _scalar(db, sql):
    return db.sql(sql).fetchall()[0][0]


@pytest.mark.parametrize("with_index", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_touched_or_moved_video_keeps_labels_and_index(tmp_path, with_index):
    clip, labels = shared_path("data", "ua_detrac.mp4"), shared_path("data", "ua_detrac.labels.csv")
    mine = tmp_path / "clip.mp4"
    mine.write_bytes(clip.read_bytes())
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{mine}' AS v; CREATE ORACLE gt FROM LABELS '{labels}'; "
               "SET ORACLE v = gt")
        if with_index:
            db.sql("CREATE INDEX vi ON v WITH (train = 20, reps = 40, triplets = 200, size = 24)")
        cars = _scalar(db, "SELECT sum(objects('car')) FROM v")
    os.utime(mine, (1e9, 1e9))  # touched: same bytes, another time
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        assert _scalar(db, "SELECT sum(objects('car')) FROM v") == cars
        assert db.last_report.oracle_calls == 0
    (tmp_path / "archive").mkdir()
    moved = tmp_path / "archive" / "clip.mp4"
    shutil.move(mine, moved)
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        with pytest.raises(vidql.VideoError, match="ALTER VIDEO v SET PATH"):
            db.sql("SELECT sum(objects('car')) FROM v")
        other = shared_path("data", "highway.avi")
        with pytest.raises(vidql.VideoError, match="content differs from video 'v'"):
            db.sql(f"ALTER VIDEO v SET PATH '{other}'")
        db.sql(f"ALTER VIDEO v SET PATH '{moved}'")
        assert db.videos()["path"].tolist() == [str(moved)]
        assert _scalar(db, "SELECT sum(objects('car')) FROM v") == cars
        assert db.last_report.oracle_calls == 0
        if with_index:
            est = db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 USING INDEX vi").df()
            assert db.last_report.oracle_calls == 0 and est.iloc[0, 0] > 0  # index kept
    copy = tmp_path / "copy.mp4"
    shutil.copy(moved, copy)
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        db.set_video_path("v", copy)
        assert db.catalog.video_info("v").path == str(copy)
        assert _scalar(db, "SELECT count(*) FROM v WHERE contains('bus')") > 0
        if not with_index:
            return
        shutil.rmtree(db.indexes.directory("vi"))
        with pytest.raises(vidql.CatalogError, match="files of index 'vi' are gone.*DROP INDEX vi"):
            db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 USING INDEX vi")
        pd.read_csv(labels).head(100).to_csv(tmp_path / "few.csv", index=False)
        db.sql(f"CREATE OR REPLACE ORACLE gt FROM LABELS '{tmp_path / 'few.csv'}'")
        with pytest.raises(vidql.VidqlError, match="earlier version of oracle 'gt'"):
            db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 USING INDEX vi")


def test_catalog_of_old_fingerprints_still_opens(tmp_path):
    clip, labels = shared_path("data", "ua_detrac.mp4"), shared_path("data", "ua_detrac.labels.csv")
    mine = tmp_path / "clip.mp4"
    mine.write_bytes(clip.read_bytes())
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{mine}' AS v; CREATE ORACLE gt FROM LABELS '{labels}'")
        head = hashlib.sha256(mine.read_bytes()[:1 << 20]).hexdigest()[:16]
        for table in ("videos", "clips"):  # size:mtime:head, as before
            db.con.execute(f"UPDATE vidql.{table} SET fingerprint = ?",
                           [f"{mine.stat().st_size}:12345:{head}"])
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        assert _scalar(db, "SELECT count(*) FROM v WHERE contains('car')") == 252
    mine.write_bytes(clip.read_bytes()[:-10])
    with vidql.connect(tmp_path / "v.db", progress=False) as db:
        with pytest.raises(vidql.VideoError, match="changed since LOAD VIDEO"):
            db.sql("SELECT count(*) FROM v WHERE contains('car')")


def test_overlong_name_is_a_clear_error(detrac):
    db, _ = detrac
    with pytest.raises(vidql.CatalogError, match="200 characters long; at most 128"):
        db.sql(f"LOAD VIDEO '{shared_path('data', 'highway.avi')}' AS {'x' * 200}")
    with pytest.raises(vidql.QueryError, match="255"):  # longer than any name: refused unparsed
        db.sql(f"LOAD VIDEO '{shared_path('data', 'highway.avi')}' AS {'x' * 300}")
    with pytest.raises(vidql.CatalogError, match="at most 128"):
        db.sql(f"CREATE ORACLE {'o' * 200} FROM LABELS '{shared_path('data', 'highway.labels.csv')}'")


def test_lost_artifacts_are_probed_again(detrac):
    db, truth = detrac
    cars = int((truth["label"] == "car").sum())
    assert _scalar(db, "SELECT sum(objects('car')) FROM v") == cars
    path = db.path
    db.close()
    shutil.rmtree(path.with_name(path.name + ".artifacts"))
    with vidql.connect(path, progress=False) as again:
        assert _scalar(again, "SELECT sum(objects('car')) FROM v") == cars  # probed again


def test_dropped_video_table_is_recreated_from_the_catalog(detrac):
    db, truth = detrac
    db.sql("DROP TABLE v")
    assert _scalar(db, "SELECT sum(objects('car')) FROM v WHERE frame < 10") == \
        int(((truth["label"] == "car") & (truth["frame"] < 10)).sum())
    db.sql("DROP TABLE v; DROP SCHEMA v CASCADE")
    assert _scalar(db, "SELECT count(*) FROM v.objects") == len(truth)
    assert _scalar(db, "SELECT max(ts) FROM v") > 8


@pytest.mark.parametrize("text, expected", [
    ("CREATE OR REPLACE ORACLE t FROM LABELS 'a.csv' WITH (cost_ms = 3)",
     CreateOracle("t", "LABELS", "a.csv", {"cost_ms": 3}, replace=True)),
    ("DROP ORACLE IF EXISTS yolox", DropOracle("yolox", True)),
    ("ALTER VIDEO night SET PATH 'archive/night.mp4';", AlterVideoPath("night", "archive/night.mp4")),
    ("CREATE OR REPLACE TABLE t AS SELECT 1", PlainSQL("CREATE OR REPLACE TABLE t AS SELECT 1")),
])
def test_housekeeping_statements_parse(text, expected):
    assert parse(text) == expected
    assert describe(parse(text))


@pytest.mark.parametrize("text, message", [
    ("ALTER VIDEO night SET 'x.mp4'", "expected SET PATH"),
    ("ALTER VIDEO night SET PATH ''", "path is empty"),
    ("DROP ORACLE", "oracle's name"),
    ("CREATE OR REPLACE ORACLE t FROM MAGIC 'x'", "unknown oracle kind"),
])
def test_housekeeping_statement_errors(text, message):
    with pytest.raises(vidql.QueryError, match=message):
        parse(text)


def test_a_label_the_oracle_never_gives_is_noted(small_traffic, tmp_path, clip_db):
    """A query naming a label its oracle never gives (a LABELS table's labels, a detector's
    classes) still answers (0 is right for it), but its report says so, naming the label in
    another case when the oracle has one; approximate, exact and EXPLAIN alike. A label the
    oracle gives, or an oracle whose labels are not known ahead (PYTHON), gets no note."""
    from vidql.engine.labels.oracle_api import unknown_label_note
    from vidql.engine.labels.oracle_models import OnnxDetector

    video, labels = small_traffic
    with vidql.connect(tmp_path / "n.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        approx = db.sql("SELECT AVG(objects('Car')) FROM t ERROR WITHIN 0.5 SEED 1")
        assert approx.df()["estimate"].iloc[0] == 0
        note = approx.report.details["label_note"]
        assert "never gives label 'Car'" in note and "it gives 'car'" in note
        assert note in approx.report.summary()
        exact = db.sql("SELECT count(*) FROM t WHERE frame < 20 AND contains('bicycle')")
        assert exact.fetchall() == [(0,)]
        assert "never gives label 'bicycle'" in exact.report.details["label_note"]
        assert "case-sensitive" not in exact.report.details["label_note"]
        plan = db.sql("EXPLAIN SELECT frame FROM t WHERE contains('BUS') LIMIT 3").df()
        assert "never gives label 'BUS'" in plan["note"].iloc[0]
        plan = db.sql("EXPLAIN SELECT count(*) FROM t WHERE frame < 20 AND contains('Car')").df()
        assert "never gives label 'Car'" in plan["note"].iloc[0]
        assert "it gives 'car'" in plan["note"].iloc[0]
        fine = db.sql("SELECT AVG(objects('car')) FROM t WHERE contains('person') "
                      "ORACLE BUDGET 40 SEED 1")
        assert "label_note" not in fine.report.details
    clip_db.sql("SELECT count(*) FROM clip WHERE frame < 4 AND contains('Car')")
    assert "label_note" not in clip_db.last_report.details
    detector = OnnxDetector.__new__(OnnxDetector)
    detector.name, detector.labels = "yolo", ("person", "car")
    assert "it gives 'person'" in unknown_label_note(detector, ["Person", None, "car"])
    assert unknown_label_note(detector, [None, "car"]) is None


def test_statistics_only_of_labels_the_oracle_never_gives_call_no_oracle(small_traffic, tmp_path):
    """`objects('CAR')` of an oracle that never gives 'CAR' is 0 on every frame, so a query
    whose statistics name only such labels answers without the oracle (a LIMIT labelled
    frame after frame looking for a hit), with the answer labelling gives and the note; a
    RECALL or PRECISION TARGET returns the exact set (RECALL returned most frames: with no
    positive drawn, no smaller set was certified). Exact queries too; EXPLAIN expects no call.
    A query that also names a label the oracle gives, or reads `t.objects`, labels as before."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "g.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        limit = db.sql("SELECT frame FROM t WHERE objects('CAR') >= 1 LIMIT 3")
        assert len(limit.df()) == 0 and limit.report.oracle_calls == 0
        assert "never gives label 'CAR'" in limit.report.details["label_note"]
        avg = db.sql("SELECT AVG(objects('Car') * 2 + 1) FROM t ERROR WITHIN 0.5 SEED 1").df()
        assert avg[["estimate", "ci_low", "ci_high", "oracle_calls"]].values.tolist() == [[1, 1, 1, 0]]
        count = db.sql("SELECT COUNT(*) FROM t WHERE contains('Bus') ORACLE BUDGET 50 SEED 1")
        assert count.df()["estimate"].iloc[0] == 0 and count.report.oracle_calls == 0
        assert len(db.labels("t").labelled_frames) == 0
        db.sql("CREATE INDEX ti ON t USING TASTI WITH (train = 20, reps = 40, triplets = 100)")
        before = len(db.labels("t").labelled_frames)
        recall = db.sql("SELECT frame FROM t WHERE contains('BUS') RECALL TARGET 90% "
                        "ORACLE BUDGET 100")
        assert len(recall.df()) == 0 and recall.report.oracle_calls == 0  # exact, not a guess
        assert recall.report.guarantee.startswith("exact")
        rare = db.sql("SELECT frame FROM t WHERE objects('Car') > 0 FIND RARE ORACLE BUDGET 50")
        assert len(rare.df()) == 0 and len(db.labels("t").labelled_frames) == before
        plan = db.sql("EXPLAIN SELECT AVG(objects('Car')) FROM t ERROR WITHIN 0.1").df()
        assert plan["estimated_oracle_calls"].iloc[0] == 0
        exact = db.sql("SELECT count(*), sum(objects('Car')) FROM t WHERE NOT contains('BUS')")
        assert exact.fetchall() == [(300, 0)] and exact.report.oracle_calls == 0
        assert db.sql("EXPLAIN SELECT count(*) FROM t WHERE contains('Bus')"
                      ).df()["estimated_oracle_calls"].iloc[0] == 0
        assert len(db.labels("t").labelled_frames) == before
        mixed = db.sql("SELECT AVG(objects('car') + objects('Car')) FROM t ORACLE BUDGET 30 SEED 1")
        assert mixed.report.oracle_calls > 0
        objects = db.sql("SELECT count(*) FROM t.objects WHERE label = 'Car' AND frame < 250")
        assert objects.fetchall() == [(0,)] and objects.report.oracle_calls > 0  # detections read
