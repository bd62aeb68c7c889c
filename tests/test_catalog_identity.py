"""Trustworthy catalog on the real ua_detrac clip: case-sensitive class names, the oracle a
query names, oracle and video identity, and clear errors for a damaged catalog."""
from __future__ import annotations

import hashlib
import os
import shutil

import pandas as pd
import pytest

import vidql
from vidql.engine.sql.dialect import (AlterVideoPath, CreateOracle, DropOracle, describe,
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


def test_class_names_differing_in_case_are_distinct(detrac, tmp_path):
    """A label file that gives both 'car' and 'Car' counts them apart, exactly and
    approximately (each call its own column)."""
    db, truth = detrac
    mixed = truth.copy()
    mixed.loc[(mixed["label"] == "car") & (mixed["frame"] < 100), "label"] = "Car"
    mixed.to_csv(tmp_path / "mixed.csv", index=False)
    db.sql(f"CREATE ORACLE mixed FROM LABELS '{tmp_path / 'mixed.csv'}'; SET ORACLE v = mixed")
    cars, upper = int((mixed["label"] == "car").sum()), int((mixed["label"] == "Car").sum())
    sure = int(((mixed["label"] == "Car") & (mixed["score"] >= 0.5)).sum())
    assert cars and upper and sure < upper
    got = db.sql("SELECT sum(objects('Car')), sum(objects('car')), sum(objects('Car', 0.5)) "
                 "FROM v").fetchall()[0]
    assert [int(x) for x in got] == [upper, cars, sure]
    frames_with_car = mixed.loc[mixed["label"] == "car", "frame"].nunique()
    n = db.sql("SELECT count(*) FROM v WHERE contains('car') AND NOT contains('Car')").fetchall()
    assert n[0][0] == frames_with_car
    est = db.sql("SELECT AVG(objects('car') - objects('Car')) FROM v ERROR WITHIN 1 SEED 3"
                 ).df().iloc[0, 0]
    assert abs(est - (cars - upper) / 252) < 3  # the old code read objects('car') twice


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


def test_a_label_the_oracle_never_gives_is_an_error(small_traffic, tmp_path, clip_db):
    """A frame function of a label the oracle can never give (its labels known ahead) is a
    QueryError naming the nearest classes (the same name in another case first), raised
    before any oracle call: approximate, exact and EXPLAIN alike. It used to answer 0 with
    a note in the report."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "n.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        refused = {
            "SELECT AVG(objects('Car')) FROM t ERROR WITHIN 0.5 SEED 1": "'Car'; did you mean 'car'",
            "SELECT COUNT(*) FROM t WHERE contains('Bus') ORACLE BUDGET 50": "did you mean 'bus'",
            "SELECT frame FROM t WHERE objects('cars') >= 1 LIMIT 3": "did you mean 'car'",
            "SELECT frame FROM t WHERE contains('BUS') RECALL TARGET 90% ORACLE BUDGET 100":
                "did you mean 'bus'",
            "SELECT AVG(objects('car') + objects('trucks')) FROM t ORACLE BUDGET 30":
                "did you mean 'truck'",
            "SELECT count(*) FROM t WHERE frame < 20 AND contains('persons')":
                "did you mean 'person'",
            "SELECT sum(objects('Car')) FROM t WHERE NOT contains('bus')": "did you mean 'car'",
            "EXPLAIN SELECT frame FROM t WHERE contains('BUS') LIMIT 3": "did you mean 'bus'",
            "EXPLAIN SELECT count(*) FROM t WHERE frame < 20 AND contains('Car')":
                "did you mean 'car'",
        }
        for query, message in refused.items():
            with pytest.raises(vidql.QueryError, match=message) as err:
                db.sql(query)
            assert str(err.value).startswith("oracle 'truth' has no class ")
            assert "class names are case-sensitive" in str(err.value)
        with pytest.raises(vidql.QueryError, match="no class 'red truck'; did you mean 'truck'"):
            db.sql("SELECT frame FROM t WHERE contains('red truck') LIMIT 3")
        with pytest.raises(vidql.QueryError, match="no class 'zq'") as err:
            db.sql("SELECT frame FROM t WHERE contains('zq') LIMIT 3")
        assert "did you mean" not in str(err.value) and "its classes: person" in str(err.value)
        assert len(db.labels("t").labelled_frames) == 0  # refused before any oracle call
        # a COCO class absent from the clip's labels (all COCO names) is a legitimate 0
        assert db.sql("SELECT count(*) FROM t WHERE frame < 20 AND contains('bicycle')"
                      ).fetchall() == [(0,)]
        budget = db.sql("SELECT AVG(objects('bicycle')) FROM t ORACLE BUDGET 30 SEED 1").df()
        assert budget["estimate"].iloc[0] == 0
    clip_db.sql("SELECT count(*) FROM clip WHERE frame < 4 AND contains('Car')")  # PYTHON: any
    assert clip_db.last_report.oracle_calls == 4


def test_a_label_file_of_other_names_knows_only_its_own(small_traffic, tmp_path):
    """A label file whose labels are not all COCO names can be asked only about its own:
    a COCO class it lacks is an error too."""
    from vidql.datasets import read_labels

    video, labels = small_traffic
    renamed = read_labels(labels).replace({"label": {"car": "vehicle", "person": "pedestrian"}})
    renamed.to_csv(tmp_path / "renamed.csv", index=False)
    with vidql.connect(tmp_path / "r.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE own FROM LABELS "
               f"'{tmp_path / 'renamed.csv'}'; SET ORACLE t = own")
        with pytest.raises(vidql.QueryError, match="no class 'vehicles'; did you mean 'vehicle'"):
            db.sql("SELECT count(*) FROM t WHERE contains('vehicles')")
        with pytest.raises(vidql.QueryError, match="no class 'bicycle'"):
            db.sql("SELECT count(*) FROM t WHERE contains('bicycle')")
        assert db.sql("SELECT count(*) FROM t WHERE frame < 50 AND contains('vehicle')"
                      ).fetchall()[0][0] > 0


def test_nearest_labels_and_the_vocabulary_of_a_label_file():
    """The same name in another case is the nearest; else difflib's close names. A label
    file of COCO names may be asked about any COCO class, another only about its own."""
    from vidql.engine.labels.oracle_api import COCO_CLASSES, label_vocabulary, nearest_labels

    assert nearest_labels("Car", ("cat", "car", "Car ")) == ["car"]
    assert nearest_labels("red truck", COCO_CLASSES) == ["truck"]
    assert nearest_labels("cars", COCO_CLASSES) == ["car"]  # not 'chair' or 'carrot'
    assert nearest_labels("mat", ("bat", "cat", "carrot")) == ["cat", "bat"]  # equally near
    assert nearest_labels("zq", COCO_CLASSES) == []
    assert label_vocabulary(("car", "bus", "")) == ("car", "bus") + tuple(
        c for c in COCO_CLASSES if c not in ("car", "bus"))
    assert label_vocabulary(("car", "Car")) == ("car", "Car")
