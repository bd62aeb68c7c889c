"""The durable label cache: the only door to an oracle.

Labels are keyed by (video, oracle identity, frame). Each batch of oracle output is
committed to DuckDB before it is used, frames with zero detections are recorded, and no
frame is sent to the oracle twice. A killed process loses at most the batch in flight.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import duckdb
import numpy as np
import pandas as pd
from tqdm import tqdm

from vidql.detections import DETECTION_COLUMNS
from vidql.errors import OracleError, VidqlError
from .framestat import FrameExpr, FrameStatistics, count_detections, count_sql
from .oracle_api import Oracle, check_detections

MIN_AHEAD = 16  # frames labelled at once when an operator asks fewer (label_ahead)
COUNTS_AT_ONCE = 4096  # uncounted earlier labels counted in one statement when at most this many

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS vidql;
CREATE TABLE IF NOT EXISTS vidql.labels (
    video VARCHAR, oracle VARCHAR, frame BIGINT, label VARCHAR, score DOUBLE,
    x1 DOUBLE, y1 DOUBLE, x2 DOUBLE, y2 DOUBLE);
CREATE TABLE IF NOT EXISTS vidql.labelled (
    video VARCHAR, oracle VARCHAR, frame BIGINT, detections INTEGER,
    PRIMARY KEY (video, oracle, frame));
CREATE TABLE IF NOT EXISTS vidql.oracle_costs (
    oracle VARCHAR PRIMARY KEY, frames BIGINT, seconds DOUBLE);
"""


@dataclass
class LabelStats:
    """What a query cost: frames sent to the oracle, frames answered from the cache."""

    oracle_calls: int = 0
    cache_hits: int = 0
    oracle_seconds: float = 0.0
    decode_seconds: float = 0.0

    def snapshot(self) -> "LabelStats":
        return LabelStats(self.oracle_calls, self.cache_hits, self.oracle_seconds,
                          self.decode_seconds)

    def since(self, earlier: "LabelStats") -> "LabelStats":
        return LabelStats(self.oracle_calls - earlier.oracle_calls,
                          self.cache_hits - earlier.cache_hits,
                          self.oracle_seconds - earlier.oracle_seconds,
                          self.decode_seconds - earlier.decode_seconds)


class LabelCache:
    """Labels of one video by one oracle, read from and written to the catalog database.

    `frame_batches(frames, batch_size)` is a context manager yielding (ids, uint8 N×H×W×3)
    batches in frame order: the pixels for oracles that need them."""

    def __init__(self, con, video: str, n_frames: int, oracle: Oracle, frame_batches, *,
                 progress: bool = True):
        self.con = con
        self.video = video
        self.n_frames = n_frames
        self.oracle = oracle
        self.frame_batches = frame_batches
        self.progress = progress
        self.stats = LabelStats()
        self._bar = None  # a query's progress bar while one is open
        self.read_only = con.execute("SELECT readonly FROM duckdb_databases() "
                                     "WHERE database_name = current_database()").fetchall()[0][0]
        done = con.execute("SELECT frame FROM vidql.labelled WHERE video = ? AND oracle = ?",
                           [video, oracle.identity]).fetchnumpy()["frame"]
        self._labelled = np.zeros(n_frames, dtype=bool)
        self._labelled[np.asarray(done, dtype=np.int64)] = True
        # per-frame detection counts by (label, min_score), -1 where not known yet: filled
        # from each batch the oracle returns, and from the catalog for earlier labels
        self._counts: dict[tuple, np.ndarray] = {}
        self._cost = [0, 0.0]  # oracle frames and seconds not yet recorded in the catalog
        self._commits = [0, 0.0]  # batches committed by this cache and their seconds

    @property
    def labelled_frames(self) -> np.ndarray:
        return np.flatnonzero(self._labelled)

    def _check_range(self, frames: np.ndarray) -> np.ndarray:
        frames = np.asarray(frames, dtype=np.int64).ravel()
        if len(frames) and (frames.min() < 0 or frames.max() >= self.n_frames):
            bad = frames[(frames < 0) | (frames >= self.n_frames)][0]
            raise VidqlError(f"frame {bad} is outside video {self.video!r} "
                             f"(frames 0..{self.n_frames - 1})")
        return frames

    def ensure(self, frames, desc: str | None = None) -> None:
        """Label every frame of `frames` not yet cached, batch by batch, each batch committed
        before the next starts. An oracle failure keeps finished batches and is re-raised."""
        frames = self._check_range(frames)
        unique = np.unique(frames)
        todo = unique[~self._labelled[unique]]
        self.stats.cache_hits += len(unique) - len(todo)
        if len(todo) == 0:
            return
        if self.read_only:
            raise VidqlError(f"{len(todo)} frames of video {self.video!r} need labels from oracle "
                             f"{self.oracle.name!r}, but the database is open read-only: open it "
                             f"without --read-only to label them")
        batch = max(1, int(self.oracle.batch_size))
        own = self._bar is None
        bar = self._progress(desc or f"labelling {self.video} with {self.oracle.name}",
                             len(todo)) if own else self._bar
        try:
            if not self.oracle.needs_pixels:
                for start in range(0, len(todo), batch):
                    self._label_batch(todo[start:start + batch], None, 0.0,
                                      last=start + batch >= len(todo))
                    bar.update(min(batch, len(todo) - start))
                return
            with self.frame_batches(todo, batch) as batches:
                t0 = time.perf_counter()
                done = 0
                for ids, pixels in batches:  # decoding runs ahead while the oracle works
                    done += len(ids)
                    self._label_batch(np.asarray(ids, dtype=np.int64), pixels,
                                      time.perf_counter() - t0, last=done >= len(todo))
                    bar.update(len(ids))
                    t0 = time.perf_counter()
        finally:
            self._cost = [0, 0.0]
            if own:
                bar.close()

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
            # batches, but never more than twice what is asked now or MIN_AHEAD; for an
            # oracle that labels frames faster than a commit takes, up to as many as it
            # labels in a commit's time (the commit saved pays for them) and as `done`
            least = max(MIN_AHEAD, min(self._frames_per_commit(), done))
            ahead = min(-(-needed // batch) * batch, max(least, 2 * now))
            self.ensure(todo[:max(needed, ahead)])

    def _frames_per_commit(self) -> int:
        """How many frames the oracle labels (measured, or at its stated cost) in the
        measured time of one commit; 0 before either is known."""
        calls, seconds = self.stats.oracle_calls, self.stats.oracle_seconds
        commits, commit_seconds = self._commits
        if not (calls and commits and seconds > 0):
            return 0
        return int(commit_seconds / commits / (seconds / calls))

    def _progress(self, desc: str, total: int | None) -> tqdm:
        """A bar on stderr, drawn only on a terminal (and when the cache shows progress)."""
        return tqdm(total=total, desc=desc, unit="frame", leave=False,
                    disable=None if self.progress else True)

    @contextmanager
    def progress_bar(self, desc: str, total: int | None = None):
        """One bar over every frame the oracle labels inside (an approximate query's calls)."""
        self._bar = self._progress(desc, total)
        try:
            yield self._bar
        finally:
            self._bar.close()
            self._bar = None

    def _label_batch(self, ids: np.ndarray, pixels: np.ndarray | None, wait: float,
                     last: bool = True) -> None:
        """Run the oracle on one batch and commit its labels before anything uses them; the
        oracle's measured cost is recorded with the last batch of a call (one statement
        fewer per batch; a killed call keeps its labels, not that estimate)."""
        t1 = time.perf_counter()
        try:
            det = self.oracle.detect(pixels, ids)
        except VidqlError:
            raise
        except Exception as exc:
            raise OracleError(f"oracle {self.oracle.name!r} failed on frames {ids[0]}..{ids[-1]} "
                              f"of video {self.video!r}: {type(exc).__name__}: {exc}; "
                              f"{int(self._labelled.sum())} labelled frames stay cached") from exc
        t2 = time.perf_counter()  # the oracle's own time; checking its output is the engine's
        det = check_detections(det, ids, self.oracle)
        rows = pd.Index(ids).get_indexer(det["frame"].to_numpy())
        self._cost = [self._cost[0] + len(ids), self._cost[1] + t2 - t1]
        t3 = time.perf_counter()
        self._commit(ids, det, np.bincount(rows, minlength=len(ids)), self._cost if last else None)
        self._commits = [self._commits[0] + 1, self._commits[1] + time.perf_counter() - t3]
        if last:
            self._cost = [0, 0.0]
        labels, scores = det["label"].to_numpy(object), det["score"].to_numpy(np.float64)
        for key, counts in self._counts.items():
            counts[ids] = count_detections(key, labels, scores, rows, len(ids))
        self._labelled[ids] = True
        self.stats.oracle_calls += len(ids)
        self.stats.decode_seconds += wait
        cost = self.oracle.simulated_cost_ms
        self.stats.oracle_seconds += (t2 - t1) if cost is None else cost * len(ids) / 1000

    def _commit(self, ids: np.ndarray, det: pd.DataFrame, counts: np.ndarray,
                cost: list | None, ignore: bool = False) -> None:
        """One transaction: the batch's detections, its frames (with their detection counts)
        and, when given, the oracle's cost [frames, seconds] since it was last recorded.
        Frames are inserted plainly (`ignore` skips frames already recorded, slower: only
        when another connection recorded one meanwhile)."""
        key = [self.video, self.oracle.identity]
        self.con.execute("BEGIN TRANSACTION")
        try:
            if len(det):
                self.con.register("__vidql_det", det)
                self.con.execute("INSERT INTO vidql.labels SELECT ?, ?, frame, label, score, "
                                 "x1, y1, x2, y2 FROM __vidql_det", key)
            self.con.execute(f"INSERT {'OR IGNORE ' if ignore else ''}INTO vidql.labelled "
                             "SELECT ?, ?, unnest(?), unnest(?)",
                             key + [ids.tolist(), counts.tolist()])
            if cost is not None:
                self.con.execute("INSERT INTO vidql.oracle_costs VALUES (?, ?, ?) ON CONFLICT DO "
                                 "UPDATE SET frames = frames + excluded.frames, "
                                 "seconds = seconds + excluded.seconds",
                                 [self.oracle.identity] + cost)
            self.con.execute("COMMIT")
        except duckdb.ConstraintException:
            self.con.execute("ROLLBACK")
            if ignore:
                raise
            self._commit(ids, det, counts, cost, ignore=True)
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("__vidql_det")

    def detections(self, frames=None) -> pd.DataFrame:
        """Cached detections (DETECTION_COLUMNS) of `frames` (all labelled frames if None),
        labelling the missing ones first."""
        if frames is None:
            sql = ("SELECT frame, label, score, x1, y1, x2, y2 FROM vidql.labels "
                   "WHERE video = ? AND oracle = ? ORDER BY frame")
            return self.con.execute(sql, [self.video, self.oracle.identity]).df()
        frames = self._check_range(frames)
        self.ensure(frames)
        self.con.register("__vidql_want", pd.DataFrame({"frame": np.unique(frames)}))
        try:
            return self.con.execute(
                f"SELECT {', '.join('l.' + c for c in DETECTION_COLUMNS)} FROM vidql.labels l "
                "JOIN __vidql_want w USING (frame) WHERE l.video = ? AND l.oracle = ? "
                "ORDER BY l.frame", [self.video, self.oracle.identity]).df()
        finally:
            self.con.unregister("__vidql_want")

    def counts(self, frames: np.ndarray, keys: list[tuple]) -> np.ndarray:
        """Detection counts (len(frames) × len(keys)) of labelled `frames` by each
        (label, min_score) key, read from the catalog once per frame and key."""
        for key in keys:
            self._counts.setdefault(key, np.full(self.n_frames, -1, dtype=np.int32))
        unknown = np.unique(frames[np.any([self._counts[k][frames] < 0 for k in keys], axis=0)]
                            if keys and len(frames) else frames[:0])
        if len(unknown):
            # frames labelled before this cache counted them (an index's, say): all in one
            # statement when they are few, else those asked now
            pending = np.flatnonzero(self._labelled & np.any([self._counts[k] < 0 for k in keys],
                                                             axis=0))
            self._load_counts(pending if len(pending) <= COUNTS_AT_ONCE else unknown, keys)
        return np.column_stack([self._counts[k][frames] for k in keys]) if keys else \
            np.zeros((len(frames), 0), dtype=np.int32)

    def _load_counts(self, frames: np.ndarray, keys: list[tuple]) -> None:
        """Counts of frames labelled before this cache saw them, computed where the labels
        live, in one statement."""
        cols = ", ".join(f"{count_sql(k)} AS c{i}" for i, k in enumerate(keys))
        got = self.con.execute(
            f"SELECT frame, {cols} FROM vidql.labels WHERE video = ? AND oracle = ? "
            "AND frame IN (SELECT unnest(?)) GROUP BY frame",
            [self.video, self.oracle.identity, frames.tolist()]).fetchnumpy()
        hit = np.asarray(got["frame"], dtype=np.int64)
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
            self._counts.setdefault(key, np.full(self.n_frames, -1, dtype=np.int32))

        def values(frames: np.ndarray) -> tuple:
            frames = self._check_range(frames)
            self.ensure(frames)
            return stats(frames, self.counts(frames, stats.keys))

        return values
