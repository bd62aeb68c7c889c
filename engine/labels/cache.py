"""The durable label cache: the only door to an oracle.

Labels are keyed by (video, oracle identity, clip, frame); the cache itself numbers a
collection's frames by global position (engine/labels/clips.py) and converts. Each batch of oracle
output is made durable in the label journal (engine/labels/journal.py) before it is used and
merged into the catalog tables before anything reads them there; the journal decides
when a batch is fsynced (the cache tells it when a labelling call or a query ends). Frames
with zero detections are recorded, and no frame is sent to the oracle twice. A killed
process loses at most the batch in flight.
"""
from __future__ import annotations

import sys
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np
import pandas as pd
from tqdm import tqdm

from vidql.base.detections import DETECTION_COLUMNS, DetectionArrays, empty_detections, with_dtypes
from vidql.base.errors import OracleError, VidqlError
from vidql.engine.labels.clips import ClipMap
from vidql.engine.labels.decoded import DecodedFrames
from vidql.engine.sql.framestat import FrameExpr, FrameStatistics, count_detections, count_sql
from vidql.engine.labels.journal import LabelBatch, LabelJournal
from vidql.engine.labels.oracle_api import Oracle, check_detections

MIN_AHEAD = 16  # frames labelled at once when an operator asks fewer (label_ahead)
# a labelling call that decodes is cut into at least this many oracle batches, so the oracle
# works on the first while the decoder reads the rest (a call of one batch waits for all of
# its decoding first: ERROR WITHIN's rounds waited 11 ms a label on a 1080p clip's copy)
OVERLAP_BATCHES = 4

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS vidql;
CREATE TABLE IF NOT EXISTS vidql.labels (
    video VARCHAR, oracle VARCHAR, clip VARCHAR, frame BIGINT, label VARCHAR, score DOUBLE,
    x1 DOUBLE, y1 DOUBLE, x2 DOUBLE, y2 DOUBLE);
CREATE TABLE IF NOT EXISTS vidql.labelled (
    video VARCHAR, oracle VARCHAR, clip VARCHAR, frame BIGINT, detections INTEGER,
    PRIMARY KEY (video, oracle, clip, frame));
CREATE TABLE IF NOT EXISTS vidql.oracle_costs (
    oracle VARCHAR PRIMARY KEY, frames BIGINT, seconds DOUBLE);
"""


@dataclass
class LabelStats:
    """What a query cost: frames sent to the oracle, frames answered from labels made
    before it, and seconds: the oracle's, waiting for decoded frames, and making the new
    labels durable (the journal's fsyncs)."""

    oracle_calls: int = 0
    cache_hits: int = 0
    oracle_seconds: float = 0.0
    decode_seconds: float = 0.0
    fsync_seconds: float = 0.0

    def snapshot(self) -> "LabelStats":
        return replace(self)

    def since(self, earlier: "LabelStats") -> "LabelStats":
        return LabelStats(*(getattr(self, f.name) - getattr(earlier, f.name)
                            for f in fields(self)))

    def plus(self, other: "LabelStats") -> "LabelStats":
        return LabelStats(*(getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)))


def on_terminal() -> bool:
    """Whether stderr is a terminal (where tqdm draws its bars)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


class LabelCache:
    """Labels of one video by one oracle, read from and written to the catalog database.

    `frame_batches(frames, batch_size, kept)` is a context manager yielding (ids, batch)
    for oracles that need pixels, each batch what the oracle's `prepare` made of the uint8
    N×H×W×3 frames; `kept` (a query's `DecodedFrames`, or None) gives frames decoded
    earlier and keeps planned ones decoded on the way. `journal` is the catalog's label journal, shared by its caches."""

    def __init__(self, con, video: str, clip_map: ClipMap, oracle: Oracle, frame_batches, *,
                 journal: LabelJournal, progress: bool = True):
        self.con = con
        self.journal = journal
        self.video = video
        self.clip_map = clip_map
        self.n_frames = clip_map.n_frames
        self.oracle = oracle
        self.frame_batches = frame_batches
        self.progress = progress
        self.stats = LabelStats()
        self._bar = None  # a query's progress bar while one is open
        self._seen = None  # inside `labelling`: frames the query has labelled or found cached
        self._kept = None  # inside `labelling`: frames decoded ahead for the query's draws
        self.forecast = None  # a query's forecast oracle calls (EXPLAIN's), for its bar's total
        self.read_only = con.execute("SELECT readonly FROM duckdb_databases() "
                                     "WHERE database_name = current_database()").fetchall()[0][0]
        journal.flush()  # every labelled frame in the catalog tables, read once here
        done = con.execute("SELECT c.first_frame + l.frame AS position FROM vidql.labelled l "
                           "JOIN vidql.clips c ON c.video = l.video AND c.clip = l.clip "
                           "WHERE l.video = ? AND l.oracle = ?",
                           [video, oracle.identity]).fetchnumpy()["position"]
        self._labelled = np.zeros(self.n_frames, dtype=bool)
        self._labelled[np.asarray(done, dtype=np.int64)] = True
        # per-frame detection counts by (label, min_score), -1 where not known yet: filled
        # from each batch the oracle returns, and from the catalog for earlier labels
        self._counts: dict[tuple, np.ndarray] = {}
        self._elsewhere = None  # (frames, their detections, rows) given to count_from

    @property
    def labelled_frames(self) -> np.ndarray:
        return np.flatnonzero(self._labelled)

    def _check_range(self, frames: np.ndarray) -> np.ndarray:
        frames = np.asarray(frames, dtype=np.int64).ravel()
        # one pass: a negative position, seen unsigned, is beyond any video
        if len(frames) and frames.view(np.uint64).max() >= self.n_frames:
            bad = frames[(frames < 0) | (frames >= self.n_frames)][0]
            raise VidqlError(f"frame {bad} is outside video {self.video!r} "
                             f"(positions 0..{self.n_frames - 1})")
        return frames

    def _distinct(self, frames: np.ndarray) -> np.ndarray:
        """The distinct `frames`, ascending: from a mask of the video's frames when they are
        many for its length (a linear pass), else by sorting them."""
        if len(frames) * 16 < self.n_frames:
            return np.unique(frames)
        mask = np.zeros(self.n_frames, dtype=bool)
        mask[frames] = True
        return np.flatnonzero(mask)

    def ensure(self, frames, desc: str | None = None) -> None:
        """Label every frame of `frames` not yet cached, batch by batch, each batch written
        to the journal as it comes (the journal decides when it is fsynced: at the latest
        when the call ends, or, inside `labelling`, when the query ends). An oracle failure
        keeps finished batches and is re-raised."""
        self._label_missing(self._check_range(frames), desc)

    def _label_missing(self, frames: np.ndarray, desc: str | None = None) -> None:
        """`ensure` of frames known to be in range."""
        known = self._labelled[frames]
        self._count_hits(frames)
        if known.all():  # often: an operator reads what it had labelled ahead
            return
        todo = self._distinct(frames[~known])
        if self._kept is not None:
            self._kept.unplan(todo)
        if self.read_only:
            raise VidqlError(f"{len(todo)} frames of video {self.video!r} need labels from oracle "
                             f"{self.oracle.name!r}, but the database is open read-only: open it "
                             f"without --read-only to label them")
        own = self._bar is None  # else a query's labelling, which counts its own fsyncs
        bar = self._progress(desc or f"labelling {self.video} with {self.oracle.name}",
                             len(todo)) if own else self._bar
        synced = self.journal.sync_seconds
        try:
            with closing(self._batches(todo)) as batches:
                for ids, pixels, wait, found in batches:
                    self._label_batch(ids, pixels, wait, found)
                    bar.update(len(ids))
        finally:  # the call's batches durable before any is used, even on a failure
            self.journal.call_ended()
            if own:
                self.stats.fsync_seconds += self.journal.sync_seconds - synced
                bar.close()

    def _count_hits(self, frames: np.ndarray) -> None:
        """Count the cache hits among `frames`: inside a query, each frame once, if it was
        labelled before the query began."""
        new = frames
        if self._seen is not None:
            new = frames[~self._seen[frames]]
            self._seen[new] = True
        hits = new[self._labelled[new]]
        if len(hits):
            self.stats.cache_hits += len(self._distinct(hits))

    def _batches(self, todo: np.ndarray):
        """(ids, pixels, seconds waited for them, found) for each oracle batch of `todo`:
        `found` is (detections, seconds) from the oracle's `detect_stream` (batches in
        flight at once), else None; pixels only for oracles that need them, in batches small
        enough for decoding to overlap the oracle (OVERLAP_BATCHES). A batch never spans two
        clips."""
        batch = max(1, int(self.oracle.batch_size))
        stream = getattr(self.oracle, "detect_stream", None)
        if stream is not None:
            for ids, det, seconds in stream(todo, batch):
                yield ids, None, 0.0, (det, seconds)
        elif not self.oracle.needs_pixels:
            for _, _, ids in self.clip_map.pieces(todo):
                for start in range(0, len(ids), batch):
                    yield ids[start:start + batch], None, 0.0, None
        else:
            batch = min(batch, -(-len(todo) // OVERLAP_BATCHES))
            with self.frame_batches(todo, batch, self._kept) as batches:
                t0 = time.perf_counter()
                for ids, pixels in batches:  # decoding runs ahead while the oracle works
                    yield np.asarray(ids, dtype=np.int64), pixels, time.perf_counter() - t0, None
                    t0 = time.perf_counter()

    def label_ahead(self, frames, now: int, done: int = 0) -> None:
        """An operator asks for `frames[:now]` now and for the rest of `frames` next, in
        that order, having had `done` frames labelled for it so far: when some of the first
        are not labelled, label them with the next unlabelled ones, so an operator asking a
        frame at a time still labels in batches (of at least MIN_AHEAD frames, or a whole
        oracle batch as its requests grow)."""
        frames = self._check_range(frames)
        needed = int((~self._labelled[frames[:now]]).sum())
        if needed:
            todo = frames[~self._labelled[frames]]
            batch = max(1, int(self.oracle.batch_size))
            # frames labelled ahead are real oracle calls the query may not use: whole
            # batches, but never more than twice what is asked now or MIN_AHEAD; for a
            # nearly free oracle (a table), up to as many as `done`, so that batches grow
            # geometrically. The rule depends on nothing measured: a query labels the same
            # frames on every run and executor
            least = max(MIN_AHEAD, done if self.oracle.nearly_free else 0)
            ahead = min(-(-needed // batch) * batch, max(least, 2 * now))
            self.ensure(todo[:max(needed, ahead)])

    def plan_draws(self, frames, done: int = 0) -> None:
        """Inside `labelling`: the query, having had `done` frames labelled for it, will ask
        for `frames` in this order (as far as it goes), so frames of GOPs decoded before then
        may be kept for it (engine/labels/decoded.py)."""
        if self._kept is not None:
            frames = self._check_range(frames)
            self._kept.plan(frames[~self._labelled[frames]], done)

    def _progress(self, desc: str, total: int | None) -> tqdm:
        """A bar on stderr, drawn only on a terminal (and when the cache shows progress)."""
        return tqdm(total=total, desc=desc, unit="frame", leave=False,
                    disable=not (self.progress and on_terminal()))

    @contextmanager
    def quiet(self):
        """No bar of the cache's own inside: an index build draws one over the frames it
        labels (through `detections`), chunk by chunk."""
        shown, self.progress = self.progress, False
        try:
            yield
        finally:
            self.progress = shown

    @contextmanager
    def labelling(self, desc: str, total: int | None = None):
        """An approximate query's labelling: one bar over every frame the oracle labels
        inside (its total: `total`, else the `forecast` marked as an estimate, else none),
        and the journal told that a query runs (`LabelJournal.query`: its batches
        are durable before its answer is returned). Each frame the query uses counts once:
        a cache hit if labelled before it began, else an oracle call (not both, when its
        operator labelled it ahead and then read it)."""
        if total is None and self.forecast is not None:
            desc, total = f"{desc} (total: EXPLAIN's estimate)", self.forecast
        self._bar = self._progress(desc, total)
        self._seen = np.zeros(self.n_frames, dtype=bool)
        self._kept = DecodedFrames(self.n_frames) if self.oracle.needs_pixels else None
        synced = self.journal.sync_seconds
        try:
            with self.journal.query():
                yield self._bar
        finally:
            self.stats.fsync_seconds += self.journal.sync_seconds - synced
            self._bar.close()
            self._bar, self._seen, self._kept = None, None, None

    def _label_batch(self, ids: np.ndarray, pixels: np.ndarray | None, wait: float,
                     found: tuple | None = None) -> None:
        """Run the oracle on one batch (or take its `found` (detections, seconds) from the
        oracle's `detect_stream`) and hand its labels, with the oracle's measured cost, to
        the journal before anything uses them."""
        setup = self.oracle.setup_seconds
        t1 = time.perf_counter()
        ordinal, local = self.clip_map.split(ids)
        if ordinal[0] != ordinal[-1]:
            raise RuntimeError(f"internal: a label batch spans two clips of {self.video!r}")
        clip = self.clip_map.names[ordinal[0]]
        if found is None:
            det = self._detect(pixels, local, clip)
            t2 = time.perf_counter()
            rows = check_detections(det, local, self.oracle)  # the engine's time
        else:  # labelled elsewhere (Ray actors), by global position: numbered in the clip
            t2 = t1 + found[1]  # the oracle's own time
            rows = check_detections(found[0], ids, self.oracle)
            det = found[0].shifted(-int(self.clip_map.first[ordinal[0]]))
        cost = self.oracle.simulated_cost_ms
        spent = (t2 - t1) if cost is None else cost * len(ids) / 1000
        # its one-time set-up (an ONNX detector's thread choice) is no cost per frame
        self._journal(LabelBatch(self.video, self.oracle.identity, clip,
                                 np.asarray(local, dtype=np.int64),
                                 np.bincount(rows, minlength=len(ids)), det,
                                 [len(ids), t2 - t1 - (self.oracle.setup_seconds - setup)]), spent)
        for key, counts in self._counts.items():
            counts[ids] = count_detections(key, det, rows, len(ids))
        self._labelled[ids] = True
        self.stats.oracle_calls += len(ids)
        self.stats.decode_seconds += wait
        self.stats.oracle_seconds += spent

    def _detect(self, pixels: np.ndarray | None, local: np.ndarray, clip: str) -> DetectionArrays:
        """The oracle's detections of one batch; its failure as an OracleError."""
        try:
            return self.oracle.detect_in_clip(pixels, local, clip, len(self.clip_map.names) == 1)
        except VidqlError:
            raise
        except Exception as exc:
            where = f" of clip {clip!r}" if len(self.clip_map.names) > 1 else ""
            raise OracleError(f"oracle {self.oracle.name!r} failed on frames {local[0]}.."
                              f"{local[-1]}{where} of video {self.video!r}: "
                              f"{type(exc).__name__}: {exc}; "
                              f"{int(self._labelled.sum())} labelled frames stay cached") from exc

    def _journal(self, batch: LabelBatch, oracle_seconds: float) -> None:
        """Write one batch (frames and detections numbered within its clip, each frame's
        detection count, the oracle's cost [frames, seconds]) to the journal, which took
        the oracle `oracle_seconds`; merge the journal's batches when many wait."""
        self.journal.append(batch, oracle_seconds)
        if self.journal.full:
            self.journal.flush()

    def detections(self, frames=None) -> pd.DataFrame:
        """Cached detections (DETECTION_COLUMNS) of `frames` (all labelled frames if None),
        labelling the missing ones first: those of batches still in the journal from memory,
        the rest from the catalog tables, ordered by frame."""
        if frames is None:
            frames = self.labelled_frames
        else:
            frames = self._check_range(frames)
            self.ensure(frames)
        wanted = np.unique(frames)
        waiting, found, parts = np.zeros(len(wanted), dtype=bool), [], []
        for first, b in self._pending_batches():  # only those holding wanted frames
            hit = np.isin(wanted, first + b.frames)
            if hit.any():
                waiting |= hit
                det = b.detections.shifted(first)
                found.append(det.where(np.isin(det.frame, wanted)))
        if found:
            parts.append(DetectionArrays.concat(found).to_frame())
        rest = wanted[~waiting]
        if len(rest):
            with self._wanted(rest):
                parts.append(self.con.execute(
                    f"SELECT w.position AS frame, "
                    f"{', '.join('l.' + c for c in DETECTION_COLUMNS[1:])} FROM vidql.labels l "
                    "JOIN __vidql_want w ON l.clip = w.clip AND l.frame = w.frame "
                    "WHERE l.video = ? AND l.oracle = ?", [self.video, self.oracle.identity]).df())
        parts = [part for part in parts if len(part)]
        if not parts:
            return empty_detections()
        det = with_dtypes(pd.concat(parts, ignore_index=True))
        return det.iloc[np.argsort(det["frame"].to_numpy(), kind="stable")].reset_index(drop=True)

    def _pending_batches(self) -> list[tuple[int, LabelBatch]]:
        """This cache's batches that wait in the journal (not in the catalog tables yet),
        each with the global position of its clip's first frame."""
        first = dict(zip(self.clip_map.names, self.clip_map.first.tolist(), strict=True))
        return [(first[b.clip], b) for b in self.journal.pending
                if b.video == self.video and b.oracle == self.oracle.identity and len(b.frames)]

    @contextmanager
    def _wanted(self, positions: np.ndarray):
        """Table `__vidql_want(clip, frame, position)` of global positions, while inside."""
        clip, frame = self.clip_map.split(positions)
        names = np.asarray(self.clip_map.names, dtype=object)
        self.con.register("__vidql_want", pd.DataFrame({"clip": names[clip], "frame": frame,
                                                        "position": positions}))
        try:
            yield
        finally:
            self.con.unregister("__vidql_want")

    def counts(self, frames: np.ndarray, keys: list[tuple]) -> np.ndarray:
        """Detection counts (len(frames) × len(keys)) of labelled `frames` by each
        (label, min_score) key, read from the catalog once per frame and key."""
        if not keys:
            return np.zeros((len(frames), 0), dtype=np.int32)
        got = np.empty((len(frames), len(keys)), dtype=np.int32)
        for i, key in enumerate(keys):
            self._count_key(key)
            got[:, i] = self._counts[key][frames]
        if got.min(initial=0) < 0:
            # frames labelled before this cache counted them: all in one statement
            self._load_counts(np.flatnonzero(self._labelled & np.logical_or.reduce(
                [self._counts[k] < 0 for k in keys])), keys)
            for i, key in enumerate(keys):
                got[:, i] = self._counts[key][frames]
        return got

    def count_from(self, frames: np.ndarray, detections: pd.DataFrame) -> None:
        """Count statistics of `frames` (global positions, all labelled by this cache's
        oracle: an index's representatives) from their `detections` (DETECTION_COLUMNS,
        by global position) held in memory elsewhere, instead of reading them back from
        the catalog."""
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        det = DetectionArrays.of(detections)
        known = self._labelled[frames]
        if not known.all():  # labelled since this cache read the catalog: read there
            frames = frames[known]
            det = det.where(np.isin(det.frame, frames))
        self._elsewhere = (frames, det, np.searchsorted(frames, det.frame))
        for key, counts in self._counts.items():
            self._count_elsewhere(key, counts)

    def _count_elsewhere(self, key: tuple, counts: np.ndarray) -> None:
        if self._elsewhere is not None:
            frames, det, rows = self._elsewhere
            counts[frames] = count_detections(key, det, rows, len(frames))

    def _count_key(self, key: tuple) -> None:
        """Count `key` in every batch the oracle labels from now on, in the batches of this
        cache that wait in the journal (the catalog tables do not hold them yet) and in the
        detections given to `count_from`."""
        if key in self._counts:
            return
        counts = self._counts[key] = np.full(self.n_frames, -1, dtype=np.int32)
        for first, b in self._pending_batches():
            counts[first + b.frames] = count_detections(key, b.detections,
                                                        b.detections.rows_in(b.frames), len(b.frames))
        self._count_elsewhere(key, counts)

    def _load_counts(self, frames: np.ndarray, keys: list[tuple]) -> None:
        """Counts of frames labelled before this cache saw them, computed where the labels
        live, in one statement (frames in the journal are counted by `_count_key`)."""
        cols = ", ".join(f"{count_sql(k)} AS c{i}" for i, k in enumerate(keys))
        got = self.con.execute(
            f"SELECT w.position, {cols} FROM vidql.labels l JOIN vidql.clips c ON "
            "c.video = l.video AND c.clip = l.clip JOIN (SELECT unnest($3) AS position) w ON "
            "w.position = c.first_frame + l.frame WHERE l.video = $1 AND l.oracle = $2 "
            "GROUP BY w.position", [self.video, self.oracle.identity, frames.tolist()]
        ).fetchnumpy()
        hit = np.asarray(got["position"], dtype=np.int64)
        for i, k in enumerate(keys):
            self._counts[k][frames] = 0  # labelled frames without rows have no detections
            self._counts[k][hit] = np.asarray(got[f"c{i}"], dtype=np.int32)

    def true_values(self, *exprs: FrameExpr | str) -> Callable[[np.ndarray], tuple]:
        """A callback for operators: frame numbers -> a tuple with the true values of each
        frame statistic. Values come from the counts of the batches the oracle just returned
        (or, for frames labelled earlier, from one catalog statement), not from a lookup of
        detections per call."""
        stats = FrameStatistics(exprs)
        for key in stats.keys:  # counted from each batch the oracle labels from now on
            self._count_key(key)

        def values(frames: np.ndarray) -> tuple:
            frames = self._check_range(frames)
            self._label_missing(frames)
            return stats(frames, self.counts(frames, stats.keys))

        return values
