"""The label journal: batches durable before use, merged when something reads the catalog
tables, replayed after a kill."""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

import vidql
from vidql.engine.labels import cache as labelcache, journal as labeljournal
from vidql.engine.labels.journal import read_records, record

from conftest import kill_when_blocked


@pytest.fixture()
def synced(monkeypatch) -> list:
    """The file descriptors the journal makes durable from now on (it still does)."""
    calls = []
    sync = labeljournal.sync_file
    monkeypatch.setattr(labeljournal, "sync_file", lambda fd: calls.append(fd) or sync(fd))
    return calls


def _labelled(db) -> int:
    """Frames in the catalog table itself (db.con would merge pending batches first)."""
    return db.catalog.con.execute("SELECT count(*) FROM vidql.labelled").fetchall()[0][0]


def _traffic(path, small_traffic):
    video, labels = small_traffic
    db = vidql.connect(path, progress=False)
    if "t" not in db.catalog.video_names():
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
    return db


def test_batches_wait_in_the_journal_until_the_catalog_tables_are_read(small_traffic, tmp_path):
    """Batches wait in the journal (durable), across queries, and the catalog tables do not
    hold them yet; a statistic asked for meanwhile is counted from them; reading the tables
    through SQL merges them all and empties the journal."""
    with _traffic(tmp_path / "j.db", small_traffic) as db:
        cache = db.labels("t")
        cache.ensure(np.arange(0, 100))
        db.catalog.flush_labels()
        db.sql("SELECT AVG(objects('car')) FROM t WHERE frame >= 100 ERROR WITHIN 0.5 SEED 1")
        waiting = len(db.catalog.journal.pending)
        assert _labelled(db) == 100 and waiting >= 2
        records = read_records((db.artifacts / "labels.journal").read_bytes())
        assert len(records) == waiting
        for record, batch in zip(records, db.catalog.journal.pending, strict=True):
            pd.testing.assert_frame_equal(record.detections.to_frame(),  # bit for bit
                                          batch.detections.to_frame())
            np.testing.assert_array_equal(record.frames, batch.frames)
        labelled = len(cache.labelled_frames)
        (inside,) = cache.true_values("objects('bus')")(np.arange(labelled))
        mixed = cache.detections(np.arange(80, 120))  # merged frames and frames in the journal
        assert _labelled(db) == 100
        assert db.sql("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] == \
            len(cache.labelled_frames) == _labelled(db)
        assert not db.catalog.journal.pending
        assert (db.artifacts / "labels.journal").stat().st_size == 0
        pd.testing.assert_frame_equal(mixed, cache.detections(np.arange(80, 120)))
        calls = cache.stats.oracle_calls
        frames = cache.labelled_frames
    with _traffic(tmp_path / "j.db", small_traffic) as db:  # a new cache reads the catalog
        (after,) = db.labels("t").true_values("objects('bus')")(np.arange(labelled))
        assert db.labels("t").stats.oracle_calls == 0 and calls == len(frames)
    np.testing.assert_array_equal(inside, after)


def test_replay_cuts_a_torn_record_and_skips_merged_batches(small_traffic, tmp_path):
    """What a killed process leaves: whole records are merged when the database is next
    opened; a record torn by the kill is dropped (its batch was never used); a batch the
    catalog already holds (merged before the journal was emptied) is not stored twice."""
    path = tmp_path / "r.db"
    with _traffic(path, small_traffic) as db:
        cache, journal = db.labels("t"), db.catalog.journal
        cache.ensure(np.arange(0, 20))
        merged = list(journal.pending)
        db.catalog.flush_labels()
        cache.ensure(np.arange(20, 60))
        lost = list(journal.pending)
        journal.pending = []  # as if the process died before this merge
        assert _labelled(db) == 20
        rows_before = db.con.execute("SELECT count(*) FROM vidql.labels").fetchall()[0][0]
        journal_path = db.artifacts / "labels.journal"
    journal_path.write_bytes(b"".join(_record(b) for b in merged + lost)
                             + _record(lost[0])[:-7])  # the kill tore the last record
    assert len(read_records(journal_path.read_bytes())) == len(merged) + len(lost)
    with _traffic(path, small_traffic) as db:
        assert _labelled(db) == 60 and journal_path.stat().st_size == 0
        rows = db.con.execute("SELECT count(*) FROM vidql.labels").fetchall()[0][0]
        assert rows == rows_before + sum(len(b.detections) for b in lost)
        cache = db.labels("t")
        cache.ensure(np.arange(60))
        assert cache.stats.oracle_calls == 0


def _record(batch) -> bytes:
    return b"".join(record(batch))


def test_sigkill_during_a_query_keeps_its_journalled_batches(counter_clip, oracle_module,
                                                             tmp_path):
    """An exact query's oracle blocks in its fifth call; killed there, the four batches
    before it (in the journal only) are in the catalog once the database is reopened, and
    the query then labels only the rest."""
    db_path, block_after = tmp_path / "db.vidql", 4
    kill_when_blocked(tmp_path, db_path, counter_clip,
                      """db.sql("SELECT sum(objects('car')) FROM clip")""", block_after)
    with vidql.connect(db_path, progress=False) as db:
        batch = db.labels("clip").oracle.batch_size
        assert _labelled(db) == block_after * batch < 120
        oracle_module.CALLS.clear()
        db.sql("SELECT sum(objects('car')) FROM clip")
        assert sum(oracle_module.CALLS) == 120 - block_after * batch
        assert _labelled(db) == 120


def test_a_labelling_call_is_fsynced_once_for_a_nearly_free_oracle(small_traffic, tmp_path,
                                                                   monkeypatch, synced):
    """Every batch is written as it comes; a table lookup's batches are fsynced once, when
    the labelling call ends (even when it fails), a costly oracle's after each batch. A
    table lookup gets up to FREE_BATCH frames a call, whatever its batch_size."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "f.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; "
               f"CREATE ORACLE free FROM LABELS '{labels}' WITH (batch_size = 16); "
               f"CREATE ORACLE costly FROM LABELS '{labels}' WITH (batch_size = 16, "
               "cost_ms = 40); SET ORACLE t = free")
        journal = db.artifacts / "labels.journal"
        for name, frames, batches in (("free", np.arange(64), 1),
                                      ("costly", np.arange(64, 128), 4)):
            cache = db.catalog.label_cache("t", name)
            written = len(read_records(journal.read_bytes())) if journal.exists() else 0
            synced.clear()
            cache.ensure(frames)
            assert len(read_records(journal.read_bytes())) - written == batches, name
            assert len(synced) == (1 if name == "free" else batches), name
        monkeypatch.setattr(labelcache, "FREE_BATCH", 16)  # several calls, one of them failing
        cache = db.catalog.label_cache("t", "free")
        detect, calls = cache.oracle.detect_in_clip, []

        def failing(*args):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("the oracle broke")
            return detect(*args)

        monkeypatch.setattr(cache.oracle, "detect_in_clip", failing)
        synced.clear()
        with pytest.raises(vidql.OracleError, match="the oracle broke"):
            cache.ensure(np.arange(128, 192))
        assert len(synced) == 1 and len(cache.labelled_frames) == 64 + 32  # two batches kept


def test_a_query_fsyncs_a_nearly_free_oracle_once(small_traffic, tmp_path, synced,
                                                  monkeypatch):
    """An approximate query's labelling calls (ERROR WITHIN makes one per round) fsync a
    table lookup's batches once, when its labelling ends (also when it fails), before the
    answer; each batch is still written to the journal as it comes, and the disk is asked to
    start writing them once WRITE_BACK_BYTES wait, so that fsync finds them written."""
    video, labels = small_traffic
    hints = []
    if hasattr(os, "posix_fadvise"):
        fadvise = os.posix_fadvise
        monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, size, advice: hints.append(
            (fd, at, size, advice)) or fadvise(fd, at, size, advice))
        monkeypatch.setattr(labeljournal, "WRITE_BACK_BYTES", 4096)
    with vidql.connect(tmp_path / "q.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; "
               f"CREATE ORACLE free FROM LABELS '{labels}' WITH (batch_size = 16); "
               "SET ORACLE t = free")
        journal = db.artifacts / "labels.journal"
        synced.clear()
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2")
        assert len(read_records(journal.read_bytes())) > 2 and len(synced) == 1
        if hasattr(os, "posix_fadvise"):  # each from where the one before stopped
            assert len(hints) > 1 and {h[3] for h in hints} == {os.POSIX_FADV_DONTNEED}
            assert [h[1] for h in hints] == sorted({h[1] for h in hints}) and hints[0][1] == 0
        cache = db.labels("t")
        synced.clear()
        with pytest.raises(RuntimeError, match="stop"), cache.labelling("a query"):
            cache.ensure(np.arange(250, 266))
            cache.ensure(np.arange(266, 282))
            assert synced == []
            raise RuntimeError("stop")
        assert len(synced) == 1 and np.isin(np.arange(250, 282), cache.labelled_frames).all()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux/POSIX only")
def test_the_first_bytes_since_a_fsync_are_handed_to_the_disk_at_once(small_traffic, tmp_path,
                                                                        monkeypatch):
    """Inside a query's labelling, a nearly free oracle's first batch since the last fsync
    is handed to the disk as soon as it is written (a query labelling a few frames writes
    far less than WRITE_BACK_BYTES), so the fsync before the answer finds it written; the
    batches after it wait for WRITE_BACK_BYTES, and the next labelling starts afresh."""
    hints = []
    fadvise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, size, advice: hints.append(
        at) or fadvise(fd, at, size, advice))
    with _traffic(tmp_path / "h.db", small_traffic) as db:
        cache = db.labels("t")
        journal = db.artifacts / "labels.journal"
        for query in range(2):
            start = journal.stat().st_size
            hints.clear()
            with cache.labelling(f"query {query}"):
                cache.ensure(np.arange(10 * query, 10 * query + 4))
                assert hints == [start]
                cache.ensure(np.arange(10 * query + 150, 10 * query + 154))
            assert hints == [start] and journal.stat().st_size > start


def test_a_read_write_database_opens_its_journal_with_it(small_traffic, tmp_path, monkeypatch):
    """The journal file is opened when a read-write database opens (and emptied in place
    after a merge), so that no query's first batch waits to open it."""
    opened = []
    real = os.open
    with _traffic(tmp_path / "o.db", small_traffic) as db:
        db.sql("SELECT 1").fetchall()
    monkeypatch.setattr(labeljournal.os, "open", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    with _traffic(tmp_path / "o.db", small_traffic) as db:
        assert [str(p) for p in opened] == [str(db.artifacts / "labels.journal")]
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1")
        db.catalog.flush_labels()  # merged: the journal is emptied through the same file
        assert (db.artifacts / "labels.journal").stat().st_size == 0
        db.labels("t").ensure(np.arange(280, 290))
        assert len(read_records((db.artifacts / "labels.journal").read_bytes())) == 1
    assert len(opened) == 1


def test_records_keep_detections_in_the_narrowest_exact_dtypes():
    """A detector's float32 output is written as float32, whole-pixel boxes with score 1 (a
    ground-truth table) as int16, frames as int32 and label codes as int16: a half or a
    quarter of the bytes, read back exactly, values in the dtype written. Values float32
    cannot hold stay float64 (whole ones int16 cannot hold go to float32), values an oracle
    gives as int16 or float32 are written as they are, and a record written before (all
    arrays wide, no dtypes in its header) still reads."""
    import json
    import struct
    from dataclasses import replace

    from vidql.base.detections import DetectionArrays
    from vidql.engine.labels.journal import LabelBatch

    rng = np.random.default_rng(3)
    m = 500
    frames = np.arange(100, 164)
    det = DetectionArrays(np.sort(rng.choice(frames, m)), rng.integers(0, 3, m).astype(np.int32),
                          ("car", "bus", "person"),
                          np.column_stack([rng.random(m).astype(np.float32),
                                           np.round(rng.random((m, 4)) * 300)]).astype(np.float64))
    counts = np.bincount(det.frame - 100, minlength=64).astype(np.int32)
    whole = np.column_stack([np.ones(m), det.values[:, 1:]])
    for values, most, stored in ((det.values, 27, np.float32), (det.values + 0.1, 47, np.float64),
                                 (whole, 17, np.int16), (whole * 200, 27, np.float32),
                                 (whole.astype(np.int16), 17, np.int16),  # as an oracle gives
                                 (det.values.astype(np.float32), 27, np.float32)):
        batch = LabelBatch("v", "o", "c", frames, counts, replace(det, values=values), [64, 0.5])
        payload = b"".join(batch.payload())
        assert len(payload) < 1000 + most * m
        back = LabelBatch.decode(payload)
        for got, want in ((back.frames, frames), (back.counts, counts), (back.detections.frame,
                          det.frame), (back.detections.codes, det.codes),
                          (back.detections.values, values)):
            assert got.dtype == (stored if got is back.detections.values else want.dtype)
            np.testing.assert_array_equal(got, want)
        assert back.detections.names == det.names and back.cost == [64, 0.5]
    header = json.dumps({"video": "v", "oracle": "o", "clip": "c", "frames": 64, "rows": m,
                         "labels": list(det.names), "cost": None}).encode()
    wide = b"".join([struct.pack("<I", len(header)), header, frames.astype("<i8").tobytes(),
                     counts.astype("<i4").tobytes(), det.frame.astype("<i8").tobytes(),
                     det.codes.astype("<i4").tobytes(), det.values.astype("<f8").tobytes()])
    old = LabelBatch.decode(wide)
    np.testing.assert_array_equal(old.detections.values, det.values)
    np.testing.assert_array_equal(old.detections.frame, det.frame)


def test_a_short_write_is_completed(tmp_path, monkeypatch):
    """A record goes to the journal in one gathered write; when the system writes only part
    of it (it may, e.g. when interrupted), the rest follows, so the record is whole."""
    parts = [b"head", memoryview(b"0123456789"), memoryview(np.arange(5, dtype="<i4"))]
    expected = b"".join(bytes(p) for p in parts)
    path = tmp_path / "j"
    for written in (3, 9, len(expected)):
        writev = os.writev if hasattr(os, "writev") else None
        if writev is not None:
            monkeypatch.setattr(os, "writev", lambda fd, bufs, n=written: os.write(
                fd, b"".join(bytes(b) for b in bufs)[:n]))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            assert labeljournal.write_all(fd, parts) == len(expected)
        finally:
            os.close(fd)
        assert path.read_bytes() == expected


def test_a_report_says_how_long_its_labels_took_to_make_durable(small_traffic, tmp_path,
                                                                 monkeypatch):
    """`seconds['fsync']`: the journal's fsyncs and write-back hand-overs while the statement
    labelled (a few tenths of a millisecond a query on this machine's disk, most of what
    the label path adds to LIMIT at 10k frames), for approximate and exact statements; 0
    when nothing new was labelled."""
    sync = labeljournal.sync_file

    def slow_sync(fd):
        time.sleep(0.05)
        sync(fd)

    monkeypatch.setattr(labeljournal, "sync_file", slow_sync)
    with _traffic(tmp_path / "r.db", small_traffic) as db:
        db.sql("SELECT count(*) FROM t WHERE frame < 8 AND objects('car') > 0")
        assert db.last_report.seconds["fsync"] >= 0.05 and "fsync" in str(db.last_report)
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2")
        assert 0.05 <= db.last_report.seconds["fsync"] < db.last_report.seconds["total"]
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2")  # all cached
        assert db.last_report.seconds["fsync"] == 0
