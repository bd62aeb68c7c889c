"""The label journal: batches durable before use, merged when something reads the catalog
tables, replayed after a kill."""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import duckdb
import vidql
from vidql.database import artifacts_dir_for
from vidql.engine.labels import journal as labeljournal
from vidql.engine.labels.journal import HEAD, MAGIC, LabelBatch, read_records, record

from conftest import kill_when_blocked


@pytest.fixture()
def durable(monkeypatch):
    """`watch(path)`: from now on, the bytes of journal `path` that survive a power cut
    (its content at its last fsync; None before any) are `watch(path)()`."""
    last = {}
    sync = labeljournal.sync_file

    def watch(path: Path):
        def recording(fd):
            sync(fd)
            last["bytes"] = path.read_bytes()

        monkeypatch.setattr(labeljournal, "sync_file", recording)
        return lambda: last.get("bytes")

    return watch


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
    """`seconds['fsync']`: the journal's fsyncs while the statement labelled, for
    approximate and exact statements; 0 when nothing new was labelled."""
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


def _copy_database(src: Path, dst: Path) -> None:
    """Copy a closed database file with its artifact folder."""
    shutil.copy2(src, dst)
    shutil.copytree(artifacts_dir_for(src), artifacts_dir_for(dst))


@pytest.mark.parametrize("options", ["batch_size = 16", "batch_size = 16, cost_ms = 12"])
def test_an_answered_querys_labels_survive_a_power_cut(small_traffic, tmp_path, durable,
                                                       options):
    """A power cut right after an approximate query answers keeps every label it made: the
    journal as it was at its last fsync, put beside the database as it was before the
    query, gives them all back (a table lookup and a costly oracle alike)."""
    video, labels = small_traffic
    path, cut = tmp_path / "p.db", tmp_path / "cut.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE o FROM LABELS '{labels}' "
               f"WITH ({options}); SET ORACLE t = o")
    _copy_database(path, cut)  # the database file does not change: the labels wait in the journal
    query = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2"
    with vidql.connect(path, progress=False) as db:
        on_disk = durable(db.artifacts / "labels.journal")
        calls = db.sql(query).report.oracle_calls
        after_answer = on_disk()
        assert calls > 32 and len(db.catalog.journal.pending) > 2
    (artifacts_dir_for(cut) / "labels.journal").write_bytes(after_answer)
    with vidql.connect(cut, progress=False) as db:
        assert _labelled(db) == calls
        assert db.sql(query).report.oracle_calls == 0


def test_a_labelling_call_is_durable_when_it_returns_or_fails(small_traffic, tmp_path, durable,
                                                             monkeypatch):
    """Labels made outside a query (an index build's, an exact query's) are durable when
    the labelling call returns, and the batches finished before an oracle failure when the
    failure reaches the caller."""
    with _traffic(tmp_path / "c.db", small_traffic) as db:
        on_disk = durable(db.artifacts / "labels.journal")
        cache = db.labels("t")
        cache.ensure(np.arange(40))
        assert sum(len(b.frames) for b in read_records(on_disk())) == 40
        detect, calls = cache.oracle.detect_in_clip, []

        def failing(*args):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("the oracle broke")
            return detect(*args)

        monkeypatch.setattr(cache.oracle, "batch_size", 16)
        monkeypatch.setattr(cache.oracle, "detect_in_clip", failing)
        with pytest.raises(vidql.OracleError, match="the oracle broke"):
            cache.ensure(np.arange(100, 164))
        assert sum(len(b.frames) for b in read_records(on_disk())) == 40 + 16


def test_sigkill_during_an_approximate_query_keeps_its_finished_batches(counter_clip,
                                                                        oracle_module,
                                                                        tmp_path):
    """Killed while its oracle works on its fifth batch, an approximate query (whose batches
    are fsynced only when it answers) has lost none of the four before: reopened, the
    database holds them, and the query then labels only the rest. (The batches' sizes are
    those of the same query run to the end in another database.)"""
    db_path, block_after = tmp_path / "db.vidql", 4
    query = "SELECT AVG(objects('car')) FROM clip ERROR WITHIN 0.01 SEED 3"
    with vidql.connect(tmp_path / "whole.vidql", progress=False) as whole:
        whole.load_video(counter_clip, "clip")
        whole.create_oracle("bright", "PYTHON", "vq_test_oracle:BrightnessOracle")
        whole.set_oracle("clip", "bright")
        whole.sql(query)
    finished = sum(oracle_module.CALLS[:block_after])
    kill_when_blocked(tmp_path, db_path, counter_clip, f"db.sql({query!r})", block_after)
    with vidql.connect(db_path, progress=False) as db:
        assert _labelled(db) == finished > 0
        oracle_module.CALLS.clear()
        again = db.sql(query).report
        assert sum(oracle_module.CALLS) == again.oracle_calls
        assert again.cache_hits == finished


def _journal_of(path: Path, small_traffic, frames: int = 200, step: int = 10) -> list:
    """Label `frames` frames of the traffic video in batches of `step`, killed before the
    merge: the journal's records (as bytes) and the database, closed."""
    with _traffic(path, small_traffic) as db:
        db.labels("t").ensure(np.arange(frames))
        batches = list(db.catalog.journal.pending)
        db.catalog.journal.pending = []  # as if the process died before the merge
    parts = []
    for b in batches:
        for start in range(0, len(b.frames), step):
            keep = b.frames[start:start + step]
            det = b.detections.where(np.isin(b.detections.frame, keep))
            parts.append(_record(LabelBatch(b.video, b.oracle, b.clip, keep,
                                            b.counts[start:start + step], det, None)))
    return parts


def _reopen_warns(path: Path, match: str) -> int:
    """Open the database (a warning matching `match`); the frames its catalog holds."""
    with pytest.warns(UserWarning, match=match):
        db = vidql.connect(path, progress=False)
    with db:
        return _labelled(db)


def test_a_flipped_byte_loses_only_its_record(small_traffic, tmp_path):
    """One flipped byte at 10% of the journal costs the record it falls in, not every
    record after it: replay resynchronises on the next intact record, warns, and keeps
    the damaged file beside the journal."""
    path = tmp_path / "f.db"
    parts = _journal_of(path, small_traffic)
    data = bytearray(b"".join(parts))
    at = len(data) // 10
    data[at] ^= 0xFF
    journal = artifacts_dir_for(path) / "labels.journal"
    journal.write_bytes(bytes(data))
    assert _reopen_warns(path, "damaged") == 200 - 10
    assert (artifacts_dir_for(path) / "labels.journal.damaged-1").read_bytes() == bytes(data)


def test_a_record_with_a_valid_crc_and_a_bad_header_is_skipped(small_traffic, tmp_path):
    """A record whose CRC checks but whose header is no label batch (not JSON, or missing
    fields) is skipped with a warning; connect does not fail and keeps the others."""
    path = tmp_path / "h.db"
    parts = _journal_of(path, small_traffic, frames=40)
    bad = []
    for payload in (struct.pack("<I", 8) + b"not json",
                    struct.pack("<I", 2) + json.dumps({}).encode()):
        bad.append(HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
    (artifacts_dir_for(path) / "labels.journal").write_bytes(
        parts[0] + bad[0] + b"".join(parts[1:3]) + bad[1] + parts[3])
    assert _reopen_warns(path, "no label batch") == 40


def test_a_journal_path_that_is_a_directory_is_moved_aside(small_traffic, tmp_path):
    """A directory where the journal belongs does not stop connect: it is moved aside,
    with what it holds, with a warning, and a new journal works."""
    path = tmp_path / "d.db"
    _journal_of(path, small_traffic, frames=20)
    journal = artifacts_dir_for(path) / "labels.journal"
    journal.unlink()
    journal.mkdir()
    (journal / "keep.txt").write_text("mine")
    assert _reopen_warns(path, "is a directory") == 0
    assert (journal.with_name("labels.journal.damaged-1") / "keep.txt").read_text() == "mine"
    with _traffic(path, small_traffic) as db:
        db.labels("t").ensure(np.arange(10))
        db.catalog.flush_labels()
        assert _labelled(db) == 10 and journal.is_file()


class _FullDiskOnCommit:
    """A connection whose COMMIT fails as on a full disk, DuckDB having ended the
    transaction."""

    def __init__(self, con):
        self._con = con

    def __getattr__(self, name):
        return getattr(self._con, name)

    def execute(self, sql, *args):
        if sql == "COMMIT":
            self._con.execute("ROLLBACK")
            raise duckdb.IOException("Could not write file \"x.db\": No space left on device")
        return self._con.execute(sql, *args)


def test_a_merge_on_a_full_disk_says_so_and_keeps_the_labels(small_traffic, tmp_path):
    """A merge that fails on a full disk says that the disk is full and that the labels are
    safe in the journal (not DuckDB's 'cannot rollback'); once there is room, they merge."""
    with _traffic(tmp_path / "m.db", small_traffic) as db:
        db.labels("t").ensure(np.arange(30))
        journal = db.catalog.journal
        con, journal.con = journal.con, _FullDiskOnCommit(journal.con)
        with pytest.raises(vidql.VidqlError, match="disk is full.*safe in the label journal"):
            db.catalog.flush_labels()
        journal.con = con
        assert len(read_records((db.artifacts / "labels.journal").read_bytes())) == 1
        db.catalog.flush_labels()
        assert _labelled(db) == 30


def test_a_journal_write_on_a_full_disk_says_so_and_leaves_no_torn_record(small_traffic,
                                                                        tmp_path, monkeypatch):
    """A batch the journal cannot take (ENOSPC) is a VidqlError saying the disk is full,
    the half-written record is cut off, and the batches before it stay."""
    with _traffic(tmp_path / "w.db", small_traffic) as db:
        cache = db.labels("t")
        cache.ensure(np.arange(10))
        journal = db.artifacts / "labels.journal"
        size = journal.stat().st_size
        real = os.write

        def full(fd, parts):
            real(fd, b"".join(bytes(p) for p in parts)[:20])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(labeljournal, "write_all", full)
        with pytest.raises(vidql.VidqlError, match="disk is full.*safe in the label journal"):
            cache.ensure(np.arange(10, 20))
        assert journal.stat().st_size == size
        monkeypatch.undo()
        monkeypatch.setattr(labeljournal, "sync_file", lambda fd: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")))
        with pytest.raises(vidql.VidqlError, match="disk is full"):
            cache.ensure(np.arange(20, 30))
        monkeypatch.undo()
        assert len(read_records(journal.read_bytes())) == 2


def test_older_records_still_read():
    """Records written by earlier versions read back exactly: all arrays wide with no dtypes
    in the header, or in narrower dtypes named there."""
    rng = np.random.default_rng(3)
    m, frames = 50, np.arange(100, 164)
    det_frame, codes = np.sort(rng.choice(frames, m)), rng.integers(0, 3, m)
    values = np.round(rng.random((m, 5)) * 300)
    counts = np.bincount(det_frame - 100, minlength=64)
    for dtypes in (None, ["<i4", "<i2", "<i2"]):
        head = {"video": "v", "oracle": "o", "clip": "c", "frames": 64, "rows": m,
                "labels": ["car", "bus", "person"], "cost": [64, 0.5]}
        frame_t, code_t, value_t = dtypes or ["<i8", "<i4", "<f8"]
        if dtypes:
            head["dtypes"] = dtypes
        header = json.dumps(head).encode()
        payload = b"".join([struct.pack("<I", len(header)), header, frames.astype("<i8").tobytes(),
                            counts.astype("<i4").tobytes(), det_frame.astype(frame_t).tobytes(),
                            codes.astype(code_t).tobytes(), values.astype(value_t).tobytes()])
        back = LabelBatch.decode(payload)
        np.testing.assert_array_equal(back.detections.values, values)
        np.testing.assert_array_equal(back.detections.frame, det_frame)
        np.testing.assert_array_equal(back.detections.codes, codes)
        np.testing.assert_array_equal(back.counts, counts)
        assert back.cost == [64, 0.5] and back.detections.names == ("car", "bus", "person")
