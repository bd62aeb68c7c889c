"""The label journal: where an oracle batch becomes durable, and the one place that decides
when it is fsynced.

Each batch the oracle returns is appended to `labels.journal` in the artifacts folder as
it comes, in one system call, so a killed process keeps every finished batch. The journal
fsyncs (`SyncPolicy`): after a batch once the oracle has spent SYNC_EVERY_SECONDS on
batches not yet synced (a power cut loses at most that much oracle work: a detector's
batches are synced every second or so, a table lookup's never one by one); at the end of a
labelling call made outside a query; and, inside an approximate query (`query`), once when
the query ends, before its answer is returned. So an answered query's labels survive a
power cut. Batches gather in memory, across queries, and are merged into the catalog
tables (`vidql.labels`, `vidql.labelled`, `vidql.oracle_costs`) in one transaction by
`flush`: before anything reads or changes those tables (`Catalog.flush_labels`), when many
are pending, and when the database closes. Opening a database read-write replays what a
killed process left in the journal (`replay`): a record torn by the kill is cut off (its
batch was never used), a damaged record is skipped and reading resumes at the next intact
one (a warning says what was skipped; the damaged file is kept beside the journal), and a
batch whose frames the catalog already holds is skipped, so nothing is stored twice.

A record: MAGIC, payload length (u64), CRC-32 of the payload (u32), payload. The payload is
a JSON header (video, oracle, clip, sizes, label names, cost, the dtypes of the detections'
arrays) and the raw arrays.
"""
from __future__ import annotations

import errno
import json
import os
import struct
import time
import warnings
import zlib
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from vidql.base.detections import FLOAT_COLUMNS, DetectionArrays
from vidql.base.errors import DiskFullError

MAGIC = b"VQJ1"
HEAD = struct.Struct("<4sQI")  # magic, payload length, crc32
FLUSH_FRAMES = 50_000  # pending frames that trigger a merge (bounds the memory they hold)
FLUSH_ROWS = 500_000  # pending detection rows likewise
SYNC_EVERY_SECONDS = 1.0  # oracle seconds of unsynced batches that make a batch fsync at once
DETECTION_DTYPES = ("<i8", "<i4", "<f8")  # a record's detections (frame, codes, values)


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
        """The record's payload as byte buffers; joined, they are the bytes `decode` reads.
        Detection values are stored in the dtype the oracle gave them."""
        det = self.detections
        values = det.values.astype(det.values.dtype.newbyteorder("<"), copy=False)
        header = json.dumps({"video": self.video, "oracle": self.oracle, "clip": self.clip,
                             "frames": len(self.frames), "rows": len(det),
                             "labels": list(det.names), "cost": self.cost,
                             "dtypes": [*DETECTION_DTYPES[:2], values.dtype.str]}).encode()
        arrays = [self.frames.astype("<i8", copy=False), self.counts.astype("<i4", copy=False),
                  det.frame.astype("<i8", copy=False), det.codes.astype("<i4", copy=False), values]
        return [memoryview(struct.pack("<I", len(header))), memoryview(header)] + [
            memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]

    @classmethod
    def decode(cls, payload: bytes) -> "LabelBatch":
        """The batch of a record's payload; ValueError when it does not make one."""
        try:
            (size,) = struct.unpack_from("<I", payload)
            head = json.loads(payload[4:4 + size])
            return cls._of(head, payload, 4 + size)
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise ValueError(f"a record that is no label batch ({type(exc).__name__}: {exc})"
                             ) from exc

    @classmethod
    def _of(cls, head: dict, payload: bytes, at: int) -> "LabelBatch":
        n, m = int(head["frames"]), int(head["rows"])
        frame, codes, values = head.get("dtypes", DETECTION_DTYPES)  # none: written wide
        arrays = []
        for dtype, count in (("<i8", n), ("<i4", n), (frame, m), (codes, m),
                             (values, len(FLOAT_COLUMNS) * m)):
            arrays.append(np.frombuffer(payload, dtype=dtype, count=count, offset=at))
            at += arrays[-1].nbytes
        if at != len(payload):
            raise ValueError(f"{len(payload) - at} bytes more than its arrays")
        frames, counts, det_frame, det_codes, det_values = arrays
        det = DetectionArrays(det_frame.astype(np.int64), det_codes.astype(np.int32),
                              tuple(head["labels"]),
                              det_values.astype(np.dtype(values).newbyteorder("="))
                              .reshape(m, len(FLOAT_COLUMNS)))
        return cls(str(head["video"]), str(head["oracle"]), str(head["clip"]),
                   frames.astype(np.int64), counts.astype(np.int32), det, head["cost"])


class LabelJournal:
    """The journal file of one catalog (connection `con`), the batches appended since they
    were last merged into its tables, and the durability policy: when a batch is fsynced
    (`append`, `call_ended`, `query`)."""

    def __init__(self, path: Path, con: duckdb.DuckDBPyConnection):
        self.path = Path(path)
        self.con = con
        self.pending: list[LabelBatch] = []
        self._fd: int | None = None  # the journal file, open for appending
        self._size = 0  # the file's bytes (a failed append is cut back to them)
        self._unsynced: float | None = None  # oracle seconds of batches not yet fsynced
        self._queries = 0  # approximate queries open: their batches are fsynced as they end
        self._pending_frames = self._pending_rows = 0
        self.sync_seconds = 0.0  # spent in fsyncs

    def open(self) -> None:
        """Open the journal file for appending, if it is not open. A read-write catalog
        opens it with the database, so that no query's first batch waits for it."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                               | getattr(os, "O_BINARY", 0), 0o644)
            self._size = os.fstat(self._fd).st_size

    def append(self, batch: LabelBatch, oracle_seconds: float) -> None:
        """Write `batch` (a killed process keeps it) and keep it for the next merge; fsync
        it now once the oracle has spent SYNC_EVERY_SECONDS on unsynced batches (this one's
        took `oracle_seconds`), else when the labelling call or query ends."""
        self.open()
        self._write(record(batch))
        self._unsynced = (self._unsynced or 0.0) + oracle_seconds
        self.pending.append(batch)
        self._pending_frames += len(batch.frames)
        self._pending_rows += len(batch.detections)
        if self._unsynced >= SYNC_EVERY_SECONDS:
            self.sync()

    def call_ended(self) -> None:
        """A labelling call ended (or failed): its batches are fsynced now, before any is
        used, unless a query is open (then they are fsynced when it ends)."""
        if not self._queries:
            self.sync()

    @contextmanager
    def query(self):
        """An approximate query: the batches labelled inside are fsynced once, when it ends
        (before its answer is returned, also when it fails)."""
        self._queries += 1
        try:
            yield
        finally:
            self._queries -= 1
            self.sync()

    def _write(self, parts: list) -> None:
        try:
            self._size += write_all(self._fd, parts)
        except OSError as exc:
            os.ftruncate(self._fd, self._size)  # no torn record before the next one
            if exc.errno == errno.ENOSPC:
                raise self._disk_full("the label journal could not take the oracle's last "
                                      "batch") from exc
            raise

    def sync(self) -> None:
        """fsync what `append` wrote since the last sync, if anything."""
        if self._unsynced is not None and self._fd is not None:
            self._fsync()
        self._unsynced = None

    def _fsync(self) -> None:
        t0 = time.perf_counter()
        try:
            sync_file(self._fd)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise self._disk_full("the label journal could not be synced") from exc
            raise
        finally:
            self.sync_seconds += time.perf_counter() - t0

    def _disk_full(self, what: str) -> DiskFullError:
        return DiskFullError(f"the disk is full: {what}; the labels written before are safe in "
                             f"the label journal {str(self.path)!r} and are merged into the "
                             f"catalog when there is room: free disk space and run the "
                             f"statement again")

    @property
    def full(self) -> bool:
        """Whether so many batches wait that they should be merged now."""
        return self._pending_frames >= FLUSH_FRAMES or self._pending_rows >= FLUSH_ROWS

    def flush(self) -> None:
        """Merge the pending batches into the catalog tables in one transaction, then empty
        the journal. On a full disk they stay pending (and in the journal)."""
        if not self.pending:
            return
        try:
            merge(self.con, self.pending)
        except (OSError, duckdb.Error) as exc:
            if not disk_full(exc):
                raise
            raise self._disk_full(f"merging {self._pending_frames} labelled frames into the "
                                  f"catalog failed") from exc
        self.pending, self._pending_frames, self._pending_rows = [], 0, 0
        self.truncate()

    def truncate(self) -> None:
        """Empty the journal file (durably)."""
        self.open()
        os.ftruncate(self._fd, 0)
        self._fsync()
        self._unsynced, self._size = None, 0

    def replay(self) -> int:
        """Merge what a killed process left in the journal (batches the catalog does not hold
        yet); returns the number of frames recovered. Damaged records are skipped, with a
        warning, and the damaged file is kept beside the journal; a directory where the
        journal belongs is moved aside likewise."""
        if self.path.is_dir():
            self._move_aside("is a directory")
        if not self.path.exists() or not self.path.stat().st_size:
            return 0
        batches, damage = scan_records(self.path.read_bytes())
        fresh = [b for b in batches if len(b.frames) and not _recorded(self.con, b)]
        if fresh:
            merge(self.con, fresh)
        if damage:
            self._move_aside(f"was damaged: {'; '.join(damage)}; {len(batches)} intact records "
                             f"were kept")
        self.truncate()
        return sum(len(b.frames) for b in fresh)

    def _move_aside(self, why: str) -> None:
        """Rename the journal path aside (nothing is deleted) and warn, saying `why`."""
        for n in range(1, 1000):
            aside = self.path.with_name(f"{self.path.name}.damaged-{n}")
            if not aside.exists():
                break
        os.replace(self.path, aside)
        warnings.warn(f"label journal {str(self.path)!r} {why}; it was moved to {str(aside)!r} "
                      f"and a new journal started", stacklevel=3)

    def close(self) -> None:
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (an OSError or a DuckDB error) says the disk is full."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return isinstance(exc, duckdb.Error) and "no space left on device" in str(exc).lower()


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
    data and the size, not the times), else fsync."""
    getattr(os, "fdatasync", os.fsync)(fd)


def record(batch: LabelBatch) -> list:
    """The journal record of `batch` as buffers: its head, then its payload."""
    payload = batch.payload()
    crc = 0
    for part in payload:
        crc = zlib.crc32(part, crc)
    return [HEAD.pack(MAGIC, sum(len(part) for part in payload), crc), *payload]


def read_records(data: bytes) -> list[LabelBatch]:
    """The intact records of a journal's bytes."""
    return scan_records(data)[0]


def scan_records(data: bytes) -> tuple[list[LabelBatch], list[str]]:
    """The intact records of a journal's bytes, and what was skipped, in words. A damaged
    stretch is skipped up to the next record whose CRC checks; a record cut off at the end
    (a process killed while writing it) is dropped without a word: it was never used."""
    out, damage, at = [], [], 0
    while at + HEAD.size <= len(data):
        end = _record_end(data, at)
        if end is not None:
            try:
                out.append(LabelBatch.decode(data[at + HEAD.size:end]))
            except ValueError as exc:
                damage.append(f"{exc} at byte {at}")
            at = end
            continue
        after = _next_record(data, at + 1)
        if after is None and _torn(data, at):
            break
        stop = len(data) if after is None else after
        damage.append(f"{stop - at} unreadable bytes at byte {at}")
        at = stop
    return out, damage


def _record_end(data: bytes, at: int) -> int | None:
    """Where the record at `at` ends, if one starts there whose CRC checks."""
    if at + HEAD.size > len(data):
        return None
    magic, size, crc = HEAD.unpack_from(data, at)
    end = at + HEAD.size + size
    if magic != MAGIC or end > len(data) or zlib.crc32(data[at + HEAD.size:end]) != crc:
        return None
    return end


def _next_record(data: bytes, start: int) -> int | None:
    """The offset of the first intact record at or after `start`."""
    at = data.find(MAGIC, start)
    while at >= 0:
        if _record_end(data, at) is not None:
            return at
        at = data.find(MAGIC, at + 1)
    return None


def _torn(data: bytes, at: int) -> bool:
    """Whether the bytes from `at` are the start of a record cut off by the end of the file."""
    if at + HEAD.size > len(data):
        return True
    magic, size, _ = HEAD.unpack_from(data, at)
    return magic == MAGIC and at + HEAD.size + size > len(data)


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
            _insert_group(con, key, group, new)
        for oracle, (n, seconds) in costs.items():
            con.execute("INSERT INTO vidql.oracle_costs VALUES (?, ?, ?) ON CONFLICT DO UPDATE "
                        "SET frames = frames + excluded.frames, seconds = seconds + "
                        "excluded.seconds", [oracle, n, seconds])
        con.execute("COMMIT")
    except BaseException:
        with suppress(duckdb.Error):  # a failed COMMIT (a full disk) may end the transaction
            con.execute("ROLLBACK")
        raise


def _insert_group(con, key: tuple, group: list[LabelBatch], new: str) -> None:
    """Insert the detections and frames of one (video, oracle, clip)'s batches."""
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
