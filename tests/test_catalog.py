"""Catalog: loading videos, bad input, oracles, persistence."""
from __future__ import annotations

import shutil

import pytest

import vidql
from vidql.base.errors import CatalogError, OracleError, QueryError, VideoError


def test_load_video_registers_table(counter_clip, tmp_path):
    with vidql.connect(tmp_path / "db.vidql") as db:
        row = db.load_video(counter_clip, "clip")
        assert row["frame_count"] == 120 and row["width"] == 160
        n, lo, hi = db.con.execute("SELECT count(*), min(frame), max(frame) FROM clip").fetchall()[0]
        assert (n, lo, hi) == (120, 0, 119)
        ts = db.con.execute("SELECT ts FROM clip ORDER BY frame").fetchnumpy()["ts"]
        assert ts[0] == 0 and abs(ts[30] - 1.0) < 1e-6
        assert list(db.videos()["name"]) == ["clip"]
    with vidql.connect(tmp_path / "db.vidql") as db:  # persisted
        assert list(db.videos()["name"]) == ["clip"]
        db.drop_video("clip")
        assert db.videos().empty
        assert not (db.artifacts / "videos" / "clip").exists()


def _catalog_state(db):
    tables = db.con.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "ORDER BY ALL").fetchall()
    return tables, db.videos().to_dict("records")


@pytest.mark.parametrize("case", ["missing", "text", "truncated", "corrupt", "duplicate", "badname"])
def test_bad_videos_leave_catalog_unchanged(case, counter_clip, tmp_path):
    with vidql.connect() as db:
        db.load_video(counter_clip, "clip")
        before = _catalog_state(db)
        path, name = tmp_path / "bad.mp4", "other"
        data = counter_clip.read_bytes()
        if case == "missing":
            path = tmp_path / "nope.mp4"
        elif case == "text":
            path.write_text("this is not a video\n" * 100)
        elif case == "truncated":
            path.write_bytes(data[: len(data) // 3])
        elif case == "corrupt":
            path.write_bytes(b"\x00" * 4096 + data[4096:])
        elif case == "duplicate":
            path, name = counter_clip, "clip"
        elif case == "badname":
            path, name = counter_clip, "1bad name"
        expected = CatalogError if case in ("duplicate", "badname") else VideoError
        with pytest.raises(expected) as err:
            db.load_video(path, name)
        if expected is VideoError:
            assert str(path) in str(err.value)
        assert _catalog_state(db) == before


def test_changed_file_is_detected(counter_clip, tmp_path):
    clip = tmp_path / "clip.mp4"
    shutil.copy(counter_clip, clip)
    db_path = tmp_path / "db.vidql"
    with vidql.connect(db_path) as db:
        db.load_video(clip, "clip")
    clip.write_bytes(clip.read_bytes()[::-1])
    with vidql.connect(db_path) as db:
        with pytest.raises(VideoError, match="changed since LOAD VIDEO"):
            db.catalog.video_info("clip")


def test_a_file_moved_while_open_gets_the_alter_video_hint(counter_clip, oracle_module,
                                                            tmp_path):
    """A clip checked earlier in this process and moved since: decoding it says the file
    is gone and how to point vidql at it (it said FFmpeg's "cannot open"), and after
    ALTER VIDEO ... SET PATH the query labels only the frames it lacks."""
    clip = tmp_path / "clip.mp4"
    shutil.copy(counter_clip, clip)
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip}' AS clip; CREATE ORACLE bright FROM PYTHON "
               "'vq_test_oracle:BrightnessOracle'; SET ORACLE clip = bright")
        db.sql("SELECT objects('car') FROM clip WHERE frame < 5")
        clip.rename(tmp_path / "moved.mp4")
        with pytest.raises(VideoError, match="gone; restore it, or if it moved: ALTER VIDEO"):
            db.sql("SELECT objects('car') FROM clip WHERE frame < 10")
        db.sql(f"ALTER VIDEO clip SET PATH '{tmp_path / 'moved.mp4'}'")
        assert len(db.sql("SELECT objects('car') FROM clip WHERE frame < 10").df()) == 10
        assert db.last_report.oracle_calls == 5


def test_a_query_over_labels_reads_no_probe_result(traffic_db, monkeypatch):
    """Queries with a LABELS oracle check the video file but never read its probe result
    (every frame's timestamp: 0.1 s to unpickle at a million frames, and a 5 ms pause of
    the garbage collector inside the query after it); a changed file is still refused."""
    import vidql.preprocess.probe as probe

    for saved in (traffic_db.parent / f"{traffic_db.name}.artifacts").rglob(probe.INFO_FILE):
        saved.unlink()  # reading the probe result would now probe the file again

    def no_probe(path):
        raise AssertionError(f"probed {path}")

    monkeypatch.setattr(probe, "probe_video", no_probe)
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("SELECT AVG(objects('car')) FROM t ORACLE BUDGET 20 SEED 1")
        assert db.sql("SELECT count(*) FROM t WHERE frame < 5 AND objects('car') >= 0"
                      ).df().iloc[0, 0] == 5


class _Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch '{self.marker}'",)


def test_a_planted_info_pickle_runs_no_code_when_frames_are_decoded(counter_clip, oracle_module,
                                                                      tmp_path):
    """An info.pkl in the artifacts whose unpickling would run a shell command is refused
    by the allow-list: no code runs, the clip is probed again and its frames decode."""
    import pickle

    path = tmp_path / "db.vidql"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS clip; CREATE ORACLE bright FROM PYTHON "
               "'vq_test_oracle:BrightnessOracle'; SET ORACLE clip = bright")
    folder = next((tmp_path / "db.vidql.artifacts").rglob("info.npz")).parent
    (folder / "info.npz").unlink()
    marker = tmp_path / "code-ran"
    (folder / "info.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    with vidql.connect(path, progress=False) as db:
        rows = db.sql("SELECT count(*) FROM clip WHERE frame < 5 AND objects('car') >= 0")
        assert rows.fetchall() == [(5,)]
    assert not marker.exists()
    assert (folder / "info.npz").is_file() and not (folder / "info.pkl").exists()


def test_a_query_reads_the_clip_table_once_and_a_change_is_seen_next(traffic_db):
    """A statement reads a video's clip table once (a query's first read it for checking the
    files, for the clip map and for its index); a catalog change is seen by the next one."""
    clip_sql = "SELECT * FROM vidql.clips WHERE video = ? ORDER BY ordinal"

    class Counting:
        def __init__(self, con):
            self.con, self.reads = con, 0

        def execute(self, sql, *args):
            self.reads += sql == clip_sql
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX t_idx ON t USING TASTI WITH (embedder = 'pixel', reps = 20, seed = 0)")
    with vidql.connect(traffic_db, progress=False) as db:
        db.catalog.con = counting = Counting(db.catalog.con)
        db.sql("SELECT AVG(objects('car')) FROM t ORACLE BUDGET 20 SEED 1")
        assert counting.reads == 1
        clip = db.catalog.clip_table("t")["clip"].iloc[0]
        db.sql(f"ALTER VIDEO t SET START '{clip}' = TIMESTAMP '2026-11-02 08:00:00'")
        assert str(db.catalog.clip_table("t")["start_ts"].iloc[0]) == "2026-11-02 08:00:00"


def test_oracle_errors(tmp_path):
    with vidql.connect() as db:
        with pytest.raises(OracleError, match="not found"):
            db.create_oracle("o", "ONNX", tmp_path / "missing.onnx")
        with pytest.raises(OracleError, match="never downloads"):
            db.create_oracle("f", "TORCHVISION", "ssdlite320_mobilenet_v3_large",
                             weights=str(tmp_path / "none.pth"))
        with pytest.raises(OracleError, match="unknown oracle kind"):
            db.create_oracle("x", "MAGIC", "a")
        with pytest.raises(OracleError, match="module:callable"):
            db.create_oracle("p", "PYTHON", "nocolon")
        with pytest.raises(CatalogError, match="unknown oracle"):
            db.catalog.oracle("nothing")
        assert db.oracles().empty


def test_torchvision_oracle_from_weights_file(tmp_path, counter_clip):
    """A user's own checkpoint loads (here an untrained one, saved by the test)."""
    import torch
    from torchvision.models import detection

    net = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
    torch.save(net.state_dict(), tmp_path / "ssd.pth")
    with vidql.connect() as db:
        db.load_video(counter_clip, "clip")
        db.create_oracle("ssd", "TORCHVISION", "ssdlite320_mobilenet_v3_large",
                         weights=str(tmp_path / "ssd.pth"), score=0.0)
        det = db.labels("clip", "ssd").detections([0, 1])
        assert set(det["frame"]) <= {0, 1}
        assert {"frame", "label", "score", "x1"} <= set(det.columns)


def test_drop_indexed_video_then_reopen(traffic_db, small_traffic):
    """DROP VIDEO takes the video's index (catalog row and files) and labels with it; the
    database reopens without them, and the video's name can be used again."""
    video, _ = small_traffic
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t WITH (train = 20, reps = 40, triplets = 200, size = 24)")
        folder = db.indexes.directory("ti")
        assert folder.exists() and list(db.indexes.table()["name"]) == ["ti"]
        db.sql("DROP VIDEO t")
        assert db.indexes.table().empty and not folder.exists()
    with vidql.connect(traffic_db, progress=False) as db:
        assert db.videos().empty and db.indexes.table().empty
        with pytest.raises(QueryError, match="t does not exist"):
            db.sql("SELECT count(*) FROM t")
        assert db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] == 0
        db.sql(f"LOAD VIDEO '{video}' AS t; SET ORACLE t = truth")
        assert db.sql("SELECT count(*) FROM t WHERE objects('car') >= 0").fetchall()[0][0] == 300


def test_drop_index_names_vidql_and_duckdb_indexes(traffic_con):
    """DROP INDEX of a name no index has is a CatalogError listing vidql's indexes (it was
    DuckDB's 'Index with name ... does not exist'); DuckDB's own indexes and IF EXISTS still
    go to DuckDB."""
    db = traffic_con
    with pytest.raises(vidql.CatalogError, match="unknown index 'nope'; indexes: none"):
        db.sql("DROP INDEX nope")
    db.sql("DROP INDEX IF EXISTS nope")
    db.sql("CREATE TABLE t (a INT); CREATE INDEX t_a ON t (a)")
    db.sql("DROP INDEX t_a")
    assert db.sql("SELECT count(*) FROM duckdb_indexes()").fetchone() == (0,)
