"""The durable label cache: the only door to an oracle.

Labels are keyed by (video, oracle identity, clip, frame); the cache itself numbers a
collection's frames by global position (engine/labels/clips.py) and converts. Each batch of oracle
output is made durable in the label journal (engine/labels/journal.py) before it is used and
merged into the catalog tables before anything reads them there; frames with zero
detections are recorded, and no frame is sent to the oracle twice. A killed process loses
at most the batch in flight.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np
import pandas as pd
from tqdm import tqdm

from vidql.base.detections import DETECTION_COLUMNS, DetectionArrays, empty_detections, with_dtypes
from vidql.base.errors import OracleError, VidqlError
from vidql.engine.labels.clips import ClipMap
from vidql.engine.sql.framestat import FrameExpr, FrameStatistics, count_detections, count_sql
from vidql.engine.labels.journal import LabelBatch, LabelJournal
from vidql.engine.labels.oracle_api import Oracle, check_detections, never_gives

MIN_AHEAD = 16  # frames labelled at once when an operator asks fewer (label_ahead)
FREE_BATCH = 8192  # frames a nearly free oracle labels a call, when its batch_size is smaller
COUNTS_AT_ONCE = 4096  # uncounted earlier labels the first statement counts, at most

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
    labels durable (the journal's fsyncs and write-back hand-overs)."""

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


class NoBar:
    """A progress bar that is not drawn."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def on_terminal() -> bool:
    """Whether stderr is a terminal (where tqdm draws its bars)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


class LabelCache:
    """Labels of one video by one oracle, read from and written to the catalog database.

    `frame_batches(frames, batch_size)` is a context manager yielding (ids, batch) in frame
    order for oracles that need pixels, each batch what the oracle's `prepare` made of the
    uint8 N×H×W×3 frames. `journal` is the catalog's label journal, shared by its caches."""

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
        self._counts_chunk = COUNTS_AT_ONCE  # earlier labels the next statement counts, at most
        self._cost = [0, 0.0]  # oracle frames and seconds not yet recorded in the catalog
        self._elsewhere = None  # (detections, frames, their arrays, rows) given to count_from

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
        to the journal as it comes and fsynced after it (a nearly free oracle's: once, when
        the call ends, or inside `labelling`, when that ends). An oracle failure keeps
        finished batches and is re-raised."""
        self._label_missing(self._check_range(frames), desc)

    def _label_missing(self, frames: np.ndarray, desc: str | None = None) -> None:
        """`ensure` of frames known to be in range."""
        known = self._labelled[frames]
        new = frames
        if self._seen is not None:  # a query's frame is a hit once, if labelled before it began
            new = frames[~self._seen[frames]]
            self._seen[new] = True
        hits = new[self._labelled[new]]
        if len(hits):
            self.stats.cache_hits += len(self._distinct(hits))
        if known.all():  # often: an operator reads what it had labelled ahead
            return
        todo = self._distinct(frames[~known])
        if self.read_only:
            raise VidqlError(f"{len(todo)} frames of video {self.video!r} need labels from oracle "
                             f"{self.oracle.name!r}, but the database is open read-only: open it "
                             f"without --read-only to label them")
        batch = max(1, int(self.oracle.batch_size))
        own = self._bar is None
        bar = self._progress(desc or f"labelling {self.video} with {self.oracle.name}",
                             len(todo)) if own else self._bar
        synced = self.journal.sync_seconds
        try:
            stream = getattr(self.oracle, "detect_stream", None)  # batches in flight at once
            if stream is not None:
                done = 0
                for ids, det, seconds in stream(todo, batch):  # made durable as each finishes
                    done += len(ids)
                    self._label_batch(ids, None, 0.0, last=done >= len(todo), found=(det, seconds))
                    bar.update(len(ids))
                return
            if not self.oracle.needs_pixels:  # batches never span two clips
                # a nearly free oracle (a table) gets up to FREE_BATCH frames a call: it has
                # no memory or latency reason for small batches, and each batch costs a
                # check, a journal record and counts of its own
                step = max(batch, FREE_BATCH) if self.oracle.nearly_free else batch
                chunks = [ids[start:start + step] for _, _, ids in self.clip_map.pieces(todo)
                          for start in range(0, len(ids), step)]
                for k, ids in enumerate(chunks):
                    self._label_batch(ids, None, 0.0, last=k == len(chunks) - 1)
                    bar.update(len(ids))
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
        finally:  # every batch of the call durable before any is used, even on a failure
            # (inside `labelling`, a nearly free oracle's batches are synced when it ends,
            # their writing started now)
            if self._bar is not None and self.oracle.nearly_free:
                self.journal.write_back_soon()
            else:
                self.journal.sync()
            self.stats.fsync_seconds += self.journal.sync_seconds - synced
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
            # batches, but never more than twice what is asked now or MIN_AHEAD; for a
            # nearly free oracle (a table), up to as many as `done`, so that batches grow
            # geometrically. The rule depends on nothing measured: a query labels the same
            # frames on every run and executor
            least = max(MIN_AHEAD, done if self.oracle.nearly_free else 0)
            ahead = min(-(-needed // batch) * batch, max(least, 2 * now))
            self.ensure(todo[:max(needed, ahead)])

    def _progress(self, desc: str, total: int | None) -> tqdm | NoBar:
        """A bar on stderr, drawn only on a terminal (and when the cache shows progress);
        else a `NoBar` (a disabled tqdm costs 0.1-0.2 ms a query, in a query's cold caches)."""
        if not (self.progress and on_terminal()):
            return NoBar()
        return tqdm(total=total, desc=desc, unit="frame", leave=False)

    @contextmanager
    def labelling(self, desc: str, total: int | None = None):
        """An approximate query's labelling: one bar over every frame the oracle labels
        inside, and a nearly free oracle's batches fsynced once, when it ends (before the
        answer is returned), instead of at the end of each of the operator's calls. A killed
        process keeps them either way: each was written to the journal as it came. Each
        frame the query uses counts once: a cache hit if labelled before it began, else an
        oracle call (not both, when its operator labelled it ahead and then read it)."""
        self._bar = self._progress(desc, total)
        self._seen = np.zeros(self.n_frames, dtype=bool)
        try:
            yield self._bar
        finally:
            synced = self.journal.sync_seconds
            self.journal.sync()
            self.stats.fsync_seconds += self.journal.sync_seconds - synced
            self._bar.close()
            self._bar, self._seen = None, None

    def _label_batch(self, ids: np.ndarray, pixels: np.ndarray | None, wait: float,
                     last: bool = True, found: tuple | None = None) -> None:
        """Run the oracle on one batch (or take its `found` (detections, seconds) from the
        oracle's `detect_stream`) and make its labels durable before anything uses them; the
        oracle's measured cost is recorded with the last batch of a call (a killed call
        keeps its labels, not that estimate)."""
        setup = self.oracle.setup_seconds
        t1 = time.perf_counter()
        ordinal, local = self.clip_map.split(ids)
        if ordinal[0] != ordinal[-1]:
            raise RuntimeError(f"internal: a label batch spans two clips of {self.video!r}")
        clip = self.clip_map.names[ordinal[0]]
        try:
            if found is None:
                det = self.oracle.detect_in_clip(pixels, local, clip,
                                                 len(self.clip_map.names) == 1)
        except VidqlError:
            raise
        except Exception as exc:
            where = f" of clip {clip!r}" if len(self.clip_map.names) > 1 else ""
            raise OracleError(f"oracle {self.oracle.name!r} failed on frames {local[0]}.."
                              f"{local[-1]}{where} of video {self.video!r}: "
                              f"{type(exc).__name__}: {exc}; "
                              f"{int(self._labelled.sum())} labelled frames stay cached") from exc
        t2 = time.perf_counter() if found is None else t1 + found[1]  # the oracle's own time
        if found is None:  # checking its output is the engine's time
            rows = check_detections(det, local, self.oracle)
        else:  # labelled elsewhere (Ray actors), by global position: numbered in the clip
            rows = check_detections(found[0], ids, self.oracle)
            det = found[0].shifted(-int(self.clip_map.first[ordinal[0]]))
        # its one-time set-up (an ONNX detector's thread choice) is no cost per frame
        self._cost = [self._cost[0] + len(ids),
                      self._cost[1] + t2 - t1 - (self.oracle.setup_seconds - setup)]
        self._journal(clip, local, det, np.bincount(rows, minlength=len(ids)),
                      self._cost if last else None, sync=not self.oracle.nearly_free)
        if last:
            self._cost = [0, 0.0]
        for key, counts in self._counts.items():
            counts[ids] = count_detections(key, det, rows, len(ids))
        self._labelled[ids] = True
        self.stats.oracle_calls += len(ids)
        self.stats.decode_seconds += wait
        cost = self.oracle.simulated_cost_ms
        self.stats.oracle_seconds += (t2 - t1) if cost is None else cost * len(ids) / 1000

    def _journal(self, clip: str, frames: np.ndarray, det: DetectionArrays, counts: np.ndarray,
                 cost: list | None, sync: bool) -> None:
        """Write one batch of `clip` to the journal (fsynced now with `sync`, else by the end
        of the labelling call): its detections and frames, both numbered within the clip,
        each frame's detection count and, when given, the oracle's cost [frames, seconds]
        since it was last recorded."""
        self.journal.append(LabelBatch(self.video, self.oracle.identity, clip,
                                       np.asarray(frames, dtype=np.int64), counts, det, cost),
                            sync=sync)
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
            missing = (got < 0).any(axis=1)
            # frames labelled before this cache counted them (an index's, say): all in one
            # statement when they are few, else those asked now and a chunk of the others,
            # twice as many each time (a statement costs ~3 ms however few frames it counts)
            pending = np.flatnonzero(self._labelled & np.logical_or.reduce(
                [self._counts[k] < 0 for k in keys]))
            if len(pending) > self._counts_chunk:
                pending = np.union1d(frames[missing], pending[:self._counts_chunk])
                self._counts_chunk *= 2
            self._load_counts(pending, keys)
            for i, key in enumerate(keys):
                got[:, i] = self._counts[key][frames]
        return got

    def count_from(self, frames: np.ndarray, detections: pd.DataFrame) -> None:
        """Count statistics of `frames` (global positions, all labelled by this cache's
        oracle: an index's representatives) from their `detections` (DETECTION_COLUMNS,
        by global position) held in memory elsewhere, instead of reading them back from
        the catalog (2.4 ms a query at 10k frames). The same `detections` again (the next
        query over an unchanged index) cost nothing: they were converted and counted."""
        if self._elsewhere is not None and self._elsewhere[0] is detections:
            return
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        det = DetectionArrays.of(detections)
        known = self._labelled[frames]
        if not known.all():  # labelled since this cache read the catalog: read there
            frames = frames[known]
            det = det.where(np.isin(det.frame, frames))
        self._elsewhere = (detections, frames, det, np.searchsorted(frames, det.frame))
        for key, counts in self._counts.items():
            self._count_elsewhere(key, counts)

    def _count_elsewhere(self, key: tuple, counts: np.ndarray) -> None:
        if self._elsewhere is not None:
            _, frames, det, rows = self._elsewhere
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
        detections per call; statistics only of labels the oracle never gives are known
        without it (`never_gives`). The callback's `needs_oracle` says which."""
        stats = FrameStatistics(exprs)
        if never_gives(self.oracle, [label for label, _ in stats.keys]):  # every count is 0
            def known(frames: np.ndarray) -> tuple:
                frames = self._check_range(frames)
                return stats(frames, np.zeros((len(frames), len(stats.keys)), dtype=np.int32))

            known.needs_oracle = False
            return known
        for key in stats.keys:  # counted from each batch the oracle labels from now on
            self._count_key(key)

        def values(frames: np.ndarray) -> tuple:
            frames = self._check_range(frames)
            self._label_missing(frames)
            return stats(frames, self.counts(frames, stats.keys))

        values.needs_oracle = True
        return values
