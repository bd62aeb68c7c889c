"""REFRESH INDEX: rebuild an index (retraining) with its options over every frame loaded
now, reusing cached labels, replacing its files only when the new index is complete."""
import numpy as np
import pandas as pd
import pytest

import vidql
from vidql.engine.sql.dialect import RefreshIndex, describe, parse
from vidql.engine.sql.framestat import frame_statistic
from vidql.base.errors import CatalogError, QueryError
from vidql.indexes import IndexMismatchError, TastiIndex

OPTIONS = "WITH (embedder = 'triplet', train = 20, reps = 40, triplets = 300, size = 24)"


def labelled_calls(db) -> int:
    return db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0]


def test_refresh_index_parses():
    assert parse("REFRESH INDEX cams_idx;") == RefreshIndex("cams_idx")
    assert parse('refresh index "Cams"') == RefreshIndex("Cams")
    assert "rebuild index cams_idx" in describe(RefreshIndex("cams_idx"))
    with pytest.raises(QueryError, match="REFRESH INDEX name"):
        parse("REFRESH INDEX")
    with pytest.raises(QueryError, match="unexpected"):
        parse("REFRESH INDEX a b")


def test_refresh_after_a_build_retrains_with_the_same_options_and_no_new_labels(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql(f"CREATE INDEX ti ON t {OPTIONS}")
        built = db.indexes.get("ti")
        labelled, stamp = labelled_calls(db), db.indexes.table()["built_at"][0]
        files = {p.name: p.stat().st_ino for p in db.indexes.directory("ti").iterdir()}
        message = db.sql("REFRESH INDEX ti").df()["result"][0]
        assert "refreshed index ti" in message and "0 frames newly labelled" in message
        assert labelled_calls(db) == labelled  # every label it needed was cached
        index = db.indexes.get("ti")
        assert index is not built and index.stats["newly_labelled"] == 0
        assert index.config == built.config and index.stats["embedding"] == "triplet CNN"
        assert np.array_equal(np.sort(index.rep_frames), np.sort(built.rep_frames))
        car = frame_statistic("objects('car')")
        assert np.allclose(index.proxy(car), built.proxy(car), atol=1e-6)
        assert db.indexes.table()["built_at"][0] >= stamp
        assert all(p.stat().st_ino != files.get(p.name) for p in db.indexes.directory("ti").iterdir()
                   if p.is_file())  # every file new
        assert sorted(p.name for p in db.indexes.directory("ti").parent.iterdir()) == ["ti"]
        r = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 2 USING INDEX ti SEED 1")
        assert r.report.operator and np.isfinite(r.df().iloc[0, 0])
    with vidql.connect(traffic_db, progress=False) as db:  # the catalog row and files agree
        assert db.indexes.get("ti").n_frames == 300


def test_refresh_rebuilds_a_stale_index_with_the_replaced_oracle(traffic_db, small_traffic,
                                                                  tmp_path):
    _, labels = small_traffic
    halved = pd.read_parquet(labels)
    halved = halved[halved["frame"] % 2 == 0]  # another version of the oracle
    halved.to_parquet(tmp_path / "v2.parquet")
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t WITH (embedder = 'pixel', reps = 40)")
        db.sql(f"CREATE OR REPLACE ORACLE truth FROM LABELS '{tmp_path / 'v2.parquet'}'")
        with pytest.raises(IndexMismatchError):
            db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 2 USING INDEX ti")
        message = db.sql("REFRESH INDEX ti").df()["result"][0]
        assert "40 frames newly labelled" in message  # the new oracle's labels
        index = db.indexes.get("ti")
        odd = index.rep_frames[index.rep_frames % 2 == 1]
        assert len(odd) and index.labels["frame"].isin(odd).sum() == 0
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 2 USING INDEX ti")


def test_failed_refresh_leaves_the_old_index_usable(traffic_db, monkeypatch):
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t WITH (embedder = 'pixel', reps = 40)")
        folder = db.indexes.directory("ti")
        files = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}
        save = TastiIndex.save

        def save_then_fail(self, directory):
            save(self, directory)
            raise OSError("disk full")

        monkeypatch.setattr(TastiIndex, "save", save_then_fail)
        with pytest.raises(OSError, match="disk full"):
            db.sql("REFRESH INDEX ti")
        monkeypatch.undo()
        assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()} == files
        assert sorted(p.name for p in folder.parent.iterdir()) == ["ti"]
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 2 USING INDEX ti")
        with pytest.raises(CatalogError, match="unknown index 'nope'"):
            db.sql("REFRESH INDEX nope")
    with vidql.connect(traffic_db, progress=False, read_only=True) as db:
        with pytest.raises(CatalogError, match="read-only"):
            db.sql("REFRESH INDEX ti")


KILLED_BETWEEN_RENAMES = """
import os, pathlib, signal, vidql
rename = pathlib.Path.rename

def rename_then_die(self, target):
    moved = rename(self, target)
    if pathlib.Path(target).name == ".ti.old":  # the old index moved aside, the new not yet in
        os.kill(os.getpid(), signal.SIGKILL)
    return moved

db = vidql.connect({db!r}, progress=False)
pathlib.Path.rename = rename_then_die
db.sql("REFRESH INDEX ti")
"""


@pytest.mark.parametrize("complete", ["refresh", "old"])
def test_a_kill_between_the_renames_of_refresh_leaves_a_usable_index(traffic_db, complete):
    """SIGKILL after REFRESH INDEX moved the old folder aside and before the new one took its
    place: the next open restores the new copy when complete (else the old one), and
    approximate queries use it."""
    import subprocess
    import sys

    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t WITH (embedder = 'pixel', reps = 40, seed = 0)")
        folder = db.indexes.directory("ti")
    child = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES.format(db=str(traffic_db))],
                           capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    assert not folder.exists() and (folder.parent / ".ti.old").is_dir()
    if complete == "old":  # a new copy cut short: its metadata, written last, missing
        (folder.parent / ".ti.refresh" / "meta.json").unlink()
    with pytest.warns(RuntimeWarning, match=f"restored its {complete} copy"):
        db = vidql.connect(traffic_db, progress=False)
    with db:
        assert sorted(p.name for p in folder.parent.iterdir()) == ["ti"]
        r = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 2 USING INDEX ti SEED 1")
        assert r.report.index == "ti" and np.isfinite(r.df().iloc[0, 0])
        assert db.indexes.get("ti").n_frames == 300
