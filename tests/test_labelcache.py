"""The durable label cache: never twice, zero-detection frames, crashes and SIGKILL."""
from __future__ import annotations


import numpy as np
import pytest

import vidql
from vidql.base.errors import OracleError

from conftest import kill_when_blocked


def _db_with_oracle(path, clip, **options):
    db = vidql.connect(path, progress=False)
    if "clip" not in db.catalog.video_names():
        db.load_video(clip, "clip")
        db.create_oracle("bright", "PYTHON", "vq_test_oracle:BrightnessOracle", **options)
        db.set_oracle("clip", "bright")
    return db


def test_never_twice_and_zero_detections(counter_clip, oracle_module, tmp_path):
    with _db_with_oracle(tmp_path / "db.vidql", counter_clip) as db:
        cache = db.labels("clip")
        cache.ensure(np.arange(0, 40))
        calls = sum(oracle_module.CALLS)
        assert calls == 40 and cache.stats.oracle_calls == 40
        cache.ensure(np.arange(20, 60))
        assert sum(oracle_module.CALLS) == 60 and cache.stats.cache_hits == 20
        n = db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0]
        assert n == 60  # every frame recorded, with or without detections
        zero = db.con.execute("SELECT count(*) FROM vidql.labelled WHERE detections = 0").fetchall()[0][0]
        rows = db.con.execute("SELECT count(DISTINCT frame) FROM vidql.labels").fetchall()[0][0]
        assert zero + rows == 60
        (values,) = cache.true_values("objects('car')")(np.array([5, 3, 5]))
        assert values[0] == values[2] and sum(oracle_module.CALLS) == 60


def test_oracle_failure_keeps_finished_batches(counter_clip, oracle_module, tmp_path):
    db_path = tmp_path / "db.vidql"
    with _db_with_oracle(db_path, counter_clip) as db:
        oracle_module.FAIL_AT_CALL = 3
        with pytest.raises(OracleError, match="model crashed"):
            db.labels("clip").ensure(np.arange(100))
        batch = db.labels("clip").oracle.batch_size
        assert db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] == 2 * batch
    oracle_module.FAIL_AT_CALL = None
    oracle_module.CALLS.clear()
    with _db_with_oracle(db_path, counter_clip) as db:
        cache = db.labels("clip")
        cache.ensure(np.arange(100))
        assert sum(oracle_module.CALLS) == 100 - 2 * batch == cache.stats.oracle_calls


def test_sigkill_midway_keeps_committed_batches(counter_clip, oracle_module, tmp_path):
    """The child's oracle blocks in its fifth call; killed there, the four batches before it
    are in the database, and a reopened database labels only the rest."""
    db_path, block_after = tmp_path / "db.vidql", 4
    kill_when_blocked(tmp_path, db_path, counter_clip, 'db.labels("clip").ensure(np.arange(120))',
                      block_after)
    with vidql.connect(db_path, progress=False) as db:  # opens cleanly after the kill
        done = db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0]
        batch = db.labels("clip").oracle.batch_size
        assert batch * block_after < 120
        assert done == block_after * batch  # every batch before the blocked one was committed
        oracle_module.CALLS.clear()
        cache = db.labels("clip")
        cache.ensure(np.arange(120))
        assert sum(oracle_module.CALLS) == 120 - done
        assert db.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] == 120


def test_frame_recorded_meanwhile_is_skipped(small_traffic, tmp_path):
    """Frames are inserted plainly (fast); one recorded in the catalog after the cache read
    it (here by a direct statement) is skipped, not an error, and keeps its row."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "m.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        cache = db.labels("t")
        db.con.execute("INSERT INTO vidql.labelled SELECT 't', ?, clip, 7, 99 FROM vidql.clips",
                       [cache.oracle.identity])
        cache.ensure(np.arange(5, 15))
        assert cache.stats.oracle_calls == 10
        rows = db.con.execute("SELECT frame, detections FROM vidql.labelled ORDER BY frame"
                              ).fetchall()
        assert [f for f, _ in rows] == list(range(5, 15)) and rows[2] == (7, 99)


def test_a_query_counts_a_cache_hit_once_and_only_for_earlier_labels(small_traffic, tmp_path):
    """A query's cache hits are the frames it used that were labelled before it began, each
    once: frames its operator has labelled ahead and then reads are oracle calls, not hits
    as well (ERROR WITHIN reported about twice its labels); the same query again labels
    nothing and hits every frame it uses."""
    video, labels = small_traffic
    query = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 2"
    with vidql.connect(tmp_path / "h.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}' "
               "WITH (batch_size = 16); SET ORACLE t = truth")
        first = db.sql(query)
        used = int(first.df()["labels_used"][0])
        assert first.report.cache_hits == 0 and first.report.oracle_calls >= used > 0
        again = db.sql(query)
        assert again.report.oracle_calls == 0 and again.report.cache_hits == used
        more = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 3")
        calls, hits = more.report.oracle_calls, more.report.cache_hits
        assert 0 < hits <= used and calls + hits >= int(more.df()["labels_used"][0])


def test_a_frame_outside_the_video_is_refused_before_any_oracle_call(counter_clip,
                                                                      oracle_module, tmp_path):
    with _db_with_oracle(tmp_path / "db.vidql", counter_clip) as db:
        cache = db.labels("clip")
        n = cache.n_frames
        values = cache.true_values("objects('car')")
        for bad in ([-1], [0, n], [3, -(2**62)]):
            with pytest.raises(vidql.VidqlError, match=rf"frame {bad[-1]} is outside video"):
                values(np.array(bad))
            with pytest.raises(vidql.VidqlError, match="is outside video"):
                cache.ensure(np.array(bad))
        assert sum(oracle_module.CALLS) == 0 and len(cache.labelled_frames) == 0
        (ok,) = values(np.array([0, n - 1]))
        assert len(ok) == 2 and sum(oracle_module.CALLS) == 2


def test_a_small_call_is_cut_into_batches_that_overlap_decoding(counter_clip, oracle_module,
                                                                  tmp_path):
    """A call of one oracle batch's frames goes to the oracle in OVERLAP_BATCHES parts, so the
    oracle starts on the first while the rest decode (before, the whole batch waited for all
    of its decoding); a long call keeps whole batches."""
    from vidql.engine.labels.cache import OVERLAP_BATCHES

    with _db_with_oracle(tmp_path / "db.vidql", counter_clip) as db:
        cache = db.labels("clip")
        batch = cache.oracle.batch_size
        cache.ensure(np.arange(batch))
        assert oracle_module.CALLS == [batch // OVERLAP_BATCHES] * OVERLAP_BATCHES
        oracle_module.CALLS.clear()
        cache.ensure(np.arange(batch, batch + 10 * batch))
        assert oracle_module.CALLS == [batch] * 10
