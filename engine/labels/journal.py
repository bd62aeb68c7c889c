"""The label journal: how an oracle batch becomes durable in a fraction of a millisecond.

Each batch the oracle returns is appended to `labels.journal` in the artifacts folder as
it comes, in one system call (so a killed process keeps it), and fsynced before anything
uses it (0.2-0.6 ms here, against 3-8 ms for a DuckDB commit): after each batch of a
costly oracle; for a nearly free one (a table lookup, whose batches cost nothing to label
again and come out the same), once at the end of a labelling call, or, inside an
approximate query's labelling (`LabelCache.labelling`), once when it ends, before its
answer is returned, the disk having been asked to write them as they came
(`write_back_soon`): a power cut could lose only batches of a query that never answered.
Batches gather in memory, across queries, and are merged into the catalog tables
(`vidql.labels`, `vidql.labelled`, `vidql.oracle_costs`) in one transaction by `flush`:
before anything reads or changes those tables (`Catalog.flush_labels`: exact queries, plain
SQL, the user's connection, catalog changes, a new label cache), when many are pending, and
when the database closes. A query that only samples labels never waits for a DuckDB
commit. Opening a database read-write replays what a killed process left in the
journal (`replay`); a record torn by the kill is cut off (its batch was never used), and a
batch whose frames the catalog already holds (merged before the kill truncated the journal)
is skipped, so nothing is stored twice.

A record: MAGIC, payload length (u64), CRC-32 of the payload (u32), payload. The payload is
a JSON header (video, oracle, clip, sizes, label names, cost, the dtypes of the detections'
arrays) and the raw arrays.
"""
from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from vidql.base.detections import FLOAT_COLUMNS, DetectionArrays

MAGIC = b"VQJ1"
HEAD = struct.Struct("<4sQI")  # magic, payload length, crc32
FLUSH_FRAMES = 50_000  # pending frames that trigger a merge (bounds the memory they hold)
FLUSH_ROWS = 500_000  # pending detection rows likewise
WRITE_BACK_BYTES = 64 << 10  # bytes waiting for a fsync that `write_back_soon` hands the disk
DETECTION_DTYPES = ("<i8", "<i4", "<f8")  # a record's detections (frame, codes, values), widest
VALUE_DTYPES = ("<i2", "<f4", "<f8")  # for values (score, box), the first that holds them exactly


@dataclass
class LabelBatch:
    """One oracle batch, frames numbered within its clip. `cost` = [frames, seconds] of
    the oracle since its cost was last recorded, or None."""

    video: str
    oracle: str
    clip: str
    frames: np.ndarray  # int64, within the clip
    counts: np.ndarray  # detections per frame
    detections: DetectionArrays  # frames within the clip
    cost: list | None = None

    def payload(self) -> list[memoryview]:
        """The record's payload as byte buffers, the arrays not copied; joined, they are the
        bytes `decode` reads. Detections are stored in the narrowest dtypes that hold them
        exactly: int32 frames, int16 codes, and values as int16 (whole-pixel boxes with
        score 1, a table of ground truth), float32 (a detector's output) or float64: a
        quarter or half the bytes, and so less to fsync. Values an oracle gives as int16
        or float32 are written as they are, without a test."""
        det = self.detections
        frame = "<i4" if not len(det) or (det.frame.min() >= -2**31 and det.frame.max() < 2**31) \
            else "<i8"
        codes = "<i2" if len(det.names) < 2**15 else "<i4"
        values = det.values  # as the oracle gave them when narrower than float64
        if values.dtype.str not in VALUE_DTYPES[:-1]:
            values = values.astype(VALUE_DTYPES[-1])
            for dtype in VALUE_DTYPES[:-1]:
                narrow = det.values.astype(dtype)
                if np.array_equal(narrow, det.values):
                    values = narrow
                    break
        header = json.dumps({"video": self.video, "oracle": self.oracle, "clip": self.clip,
                             "frames": len(self.frames), "rows": len(det),
                             "labels": list(det.names), "cost": self.cost,
                             "dtypes": [frame, codes, values.dtype.str]}).encode()
        arrays = [self.frames.astype("<i8", copy=False), self.counts.astype("<i4", copy=False),
                  det.frame.astype(frame, copy=False), det.codes.astype(codes, copy=False), values]
        return [memoryview(struct.pack("<I", len(header))), memoryview(header)] + [
            memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]

    @classmethod
    def decode(cls, payload: bytes) -> "LabelBatch":
        (size,) = struct.unpack_from("<I", payload)
        head = json.loads(payload[4:4 + size])
        n, m, at = head["frames"], head["rows"], 4 + size
        frame, codes, values = head.get("dtypes", DETECTION_DTYPES)  # none: written wide

        def take(dtype, count, wide):
            nonlocal at
            arr = np.frombuffer(payload, dtype=dtype, count=count, offset=at)
            at += arr.nbytes
            return arr.astype(wide)

        frames, counts = take("<i8", n, np.int64), take("<i4", n, np.int32)
        det = DetectionArrays(take(frame, m, np.int64), take(codes, m, np.int32),
                              tuple(head["labels"]),
                              take(values, len(FLOAT_COLUMNS) * m, np.dtype(values).newbyteorder("=")
                                   ).reshape(m, len(FLOAT_COLUMNS)))
        return cls(head["video"], head["oracle"], head["clip"], frames, counts, det, head["cost"])


class LabelJournal:
    """The journal file of one catalog (connection `con`) and the batches appended since
    they were last merged into its tables."""

    def __init__(self, path: Path, con: duckdb.DuckDBPyConnection):
        self.path = Path(path)
        self.con = con
        self.pending: list[LabelBatch] = []
        self._fd: int | None = None  # the journal file, open for appending
        self._unsynced = False  # written since the last fsync
        self._size = self._written_back = 0  # the file's bytes; of them, those written back
        self._synced = 0  # the file's bytes at the last fsync
        self._pending_frames = self._pending_rows = 0
        self.sync_seconds = 0.0  # spent making writes durable: fsyncs and write-back hand-overs

    def open(self) -> None:
        """Open the journal file for appending, if it is not open. A read-write catalog
        opens it with the database, so that no query's first batch waits for it."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                               | getattr(os, "O_BINARY", 0), 0o644)
            self._size = self._written_back = self._synced = os.fstat(self._fd).st_size

    def append(self, batch: LabelBatch, sync: bool = True) -> None:
        """Write `batch` (a killed process keeps it), fsync it unless `sync` is False (then
        `sync()` must run before the batch is used) and keep it for the next merge."""
        self.open()
        self._size += write_all(self._fd, record(batch))
        self._unsynced = True
        if sync:
            self.sync()
        self.pending.append(batch)
        self._pending_frames += len(batch.frames)
        self._pending_rows += len(batch.detections)

    def write_back_soon(self) -> None:
        """Have the system start writing what `append` wrote since it last did, without
        waiting for it: the fsync before the answer then finds it on disk (0.18 ms here
        instead of 0.4). The first bytes written since the last fsync are handed over at
        once (a query that labels a few frames writes a few hundred bytes), later ones once
        WRITE_BACK_BYTES wait (each hand-over costs 50-100 us). Only a hint, where the
        system takes it (POSIX_FADV_DONTNEED starts the writeback on Linux); a thread
        syncing meanwhile cost more, in switches, than the wait it saved."""
        if self._fd is None or self._size == self._written_back or \
                not hasattr(os, "posix_fadvise"):
            return
        first = self._written_back == self._synced  # nothing handed over since the last fsync
        if not first and self._size - self._written_back < WRITE_BACK_BYTES:
            return
        t0 = time.perf_counter()
        try:
            os.posix_fadvise(self._fd, self._written_back, 0, os.POSIX_FADV_DONTNEED)
        except OSError:  # a file system that refuses the hint: the fsync does it all
            pass
        self._written_back = self._size
        self.sync_seconds += time.perf_counter() - t0

    def sync(self) -> None:
        """fsync what `append` wrote since the last sync, if anything."""
        if self._unsynced and self._fd is not None:
            self._fsync()
            self._synced = self._written_back = self._size
        self._unsynced = False

    def _fsync(self) -> None:
        t0 = time.perf_counter()
        sync_file(self._fd)
        self.sync_seconds += time.perf_counter() - t0

    @property
    def full(self) -> bool:
        """Whether so many batches wait that they should be merged now."""
        return self._pending_frames >= FLUSH_FRAMES or self._pending_rows >= FLUSH_ROWS

    def flush(self) -> None:
        """Merge the pending batches into the catalog tables in one transaction, then empty
        the journal."""
        if not self.pending:
            return
        merge(self.con, self.pending)
        self.pending, self._pending_frames, self._pending_rows = [], 0, 0
        self.truncate()

    def truncate(self) -> None:
        """Empty the journal file (durably)."""
        self.open()
        os.ftruncate(self._fd, 0)
        self._fsync()
        self._unsynced = False
        self._size = self._written_back = self._synced = 0

    def replay(self) -> int:
        """Merge what a killed process left in the journal (batches the catalog does not hold
        yet); returns the number of frames recovered."""
        if not self.path.exists() or not self.path.stat().st_size:
            return 0
        batches = read_records(self.path.read_bytes())
        fresh = [b for b in batches if len(b.frames) and not _recorded(self.con, b)]
        if fresh:
            merge(self.con, fresh)
        self.truncate()
        return sum(len(b.frames) for b in fresh)

    def close(self) -> None:
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_all(fd: int, parts: list) -> int:
    """Write the buffers `parts` to `fd`, gathered in one system call where the system can;
    returns the bytes written."""
    size = sum(memoryview(part).nbytes for part in parts)
    if hasattr(os, "writev"):
        done = os.writev(fd, parts)
        if done == size:
            return size
        rest = memoryview(b"".join(parts))[done:]  # a short write (rare for a file): the rest
    else:
        rest = memoryview(b"".join(parts))
    while rest:
        rest = rest[os.write(fd, rest):]
    return size


def sync_file(fd: int) -> None:
    """Make what was written to file `fd` durable: fdatasync where the system has it (the
    data and the size, not the times: 15-20% less than fsync here), else fsync."""
    getattr(os, "fdatasync", os.fsync)(fd)


def record(batch: LabelBatch) -> list:
    """The journal record of `batch` as buffers: its head, then its payload."""
    payload = batch.payload()
    crc = 0
    for part in payload:
        crc = zlib.crc32(part, crc)
    return [HEAD.pack(MAGIC, sum(len(part) for part in payload), crc), *payload]


def read_records(data: bytes) -> list[LabelBatch]:
    """The whole records of a journal's bytes, up to the first torn or damaged one."""
    out, at = [], 0
    while at + HEAD.size <= len(data):
        magic, size, crc = HEAD.unpack_from(data, at)
        payload = data[at + HEAD.size:at + HEAD.size + size]
        if magic != MAGIC or len(payload) != size or zlib.crc32(payload) != crc:
            break
        out.append(LabelBatch.decode(payload))
        at += HEAD.size + size
    return out


def _recorded(con, batch: LabelBatch) -> bool:
    """Whether the catalog holds the batch (merged whole, so its first frame tells)."""
    return bool(con.execute("SELECT count(*) FROM vidql.labelled WHERE video = ? AND oracle = ? "
                            "AND clip = ? AND frame = ?",
                            [batch.video, batch.oracle, batch.clip, int(batch.frames[0])]
                            ).fetchall()[0][0])


def merge(con: duckdb.DuckDBPyConnection, batches: list[LabelBatch]) -> None:
    """Insert `batches` (frames, detections, oracle costs) in one transaction. Rows are
    inserted plainly (fast); if another connection recorded one of the frames meanwhile,
    the frames it holds are skipped instead."""
    groups: dict[tuple, list[LabelBatch]] = {}
    for b in batches:
        groups.setdefault((b.video, b.oracle, b.clip), []).append(b)
    costs: dict[str, list] = {}
    for b in batches:
        if b.cost is not None:
            total = costs.setdefault(b.oracle, [0, 0.0])
            total[0], total[1] = total[0] + b.cost[0], total[1] + b.cost[1]
    try:
        _insert(con, groups, costs, skip_recorded=False)
    except duckdb.ConstraintException:
        _insert(con, groups, costs, skip_recorded=True)


def _insert(con, groups: dict, costs: dict, *, skip_recorded: bool) -> None:
    """One transaction: per (video, oracle, clip), its detections and frames."""
    new = ("WHERE NOT EXISTS (SELECT 1 FROM vidql.labelled l WHERE l.video = $1 AND "
           "l.oracle = $2 AND l.clip = $3 AND l.frame = t.frame)") if skip_recorded else ""
    con.execute("BEGIN TRANSACTION")
    try:
        for key, group in groups.items():
            det = pd.concat([b.detections.to_frame() for b in group], ignore_index=True)
            if len(det):
                con.register("__vidql_det", det)
                con.execute("INSERT INTO vidql.labels SELECT $1, $2, $3, frame, label, score, "
                            f"x1, y1, x2, y2 FROM __vidql_det t {new}", list(key))
                con.unregister("__vidql_det")
            con.execute("INSERT INTO vidql.labelled SELECT $1, $2, $3, t.frame, t.detections "
                        f"FROM (SELECT unnest($4) AS frame, unnest($5) AS detections) t {new}",
                        list(key) + [np.concatenate([b.frames for b in group]).tolist(),
                                     np.concatenate([b.counts for b in group]).tolist()])
        for oracle, (n, seconds) in costs.items():
            con.execute("INSERT INTO vidql.oracle_costs VALUES (?, ?, ?) ON CONFLICT DO UPDATE "
                        "SET frames = frames + excluded.frames, seconds = seconds + "
                        "excluded.seconds", [oracle, n, seconds])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
