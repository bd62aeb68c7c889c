"""TASTI indexes in the catalog: CREATE / REFRESH / SHOW / DROP INDEX, loading, cracking.

An index lives in `<artifacts>/indexes/<name>/` and records the video fingerprint and the
oracle identity it was built with; a changed video or oracle makes it stale (a clear
error that says to rebuild), never silently wrong.

Cracking (a query's labelled frames joining the representatives) runs on a thread of its
own after the query's answer is ready: it only serves later queries, and it costs a search
of every frame against the new representatives (seconds at a million frames). Everything
that uses an index waits for it first (`settle`), so no query sees a half-cracked index.
"""
from __future__ import annotations

import json
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pandas as pd

from vidql.engine.catalog.catalog import Catalog, check_name
from vidql.base.errors import CatalogError, ParameterError, VidqlError

INDEX_OPTIONS = {"train": int, "reps": int, "k": int, "seed": int, "embedder": str,
                 "size": int, "dim": int, "triplets": int}
MIN_SHORT_SIDE, MAX_SHORT_SIDE = 8, 256  # `size`: proxy frames' short side, at most the video's


def describe_extensions(done: dict) -> str:
    """extend_for_video's answer in words: 'idx: 240 frames added; ...'."""
    return "; ".join(f"{name}: {how} frames added" if isinstance(how, int) else f"{name}: {how}"
                     for name, how in done.items())


class IndexStore:
    """Builds, persists and serves the TASTI indexes of a catalog's videos."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.con = catalog.con
        self._open: dict[str, object] = {}
        self._cracker: ThreadPoolExecutor | None = None  # one thread, started by `crack`
        self._cracking: tuple[str, Future] | None = None  # (index, its running crack)
        self.crack_seconds = 0.0  # how long the last crack ran on its thread

    def settle(self) -> None:
        """Wait for a crack still running. One that failed leaves the index as its files
        hold it (a save commits whole or not at all): it is reloaded, with a warning."""
        if self._cracking is None:
            return
        name, running = self._cracking
        self._cracking = None
        try:
            running.result()
        except Exception as exc:  # cracking only speeds later queries up
            self._open.pop(name, None)
            warnings.warn(f"cracking index {name!r} after the last query failed ({exc}); the "
                          f"index stays as it was before that query", RuntimeWarning,
                          stacklevel=2)

    def close(self) -> None:
        """Finish a running crack and stop its thread."""
        self.settle()
        if self._cracker is not None:
            self._cracker.shutdown()
            self._cracker = None

    def names(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT name FROM vidql.indexes ORDER BY name").fetchall()]

    def directory(self, name: str):
        self.settle()
        return self.catalog.artifacts / "indexes" / name

    def _row(self, name: str) -> dict:
        cur = self.con.execute("SELECT * FROM vidql.indexes WHERE lower(name) = lower(?)", [name])
        rows = cur.fetchall()
        if not rows:
            raise CatalogError(f"unknown index {name!r}; indexes: {', '.join(self.names()) or 'none'}")
        return {col[0]: value for col, value in zip(cur.description, rows[0], strict=True)}

    def create(self, name: str, video: str, options: dict | None = None, *,
               oracle: str | None = None, progress: bool = True):
        """Build a TASTI index over `video`, labelling representatives with its oracle."""
        self.settle()
        check_name("index", name)
        if name.lower() in (n.lower() for n in self.names()):
            raise CatalogError(f"an index named {name!r} already exists; DROP INDEX {name} first")
        row = self.catalog.video_row(video)
        options = self._check_options(options, row)
        video = row["name"]
        index, stored, oracle_identity = self._build(video, options, oracle, progress)
        directory = self.directory(name)
        shutil.rmtree(directory, ignore_errors=True)
        index.save(directory)
        try:
            self.catalog.run_atomically([("INSERT INTO vidql.indexes (name, video, method, options, "
                                   "oracle_identity) VALUES (?, ?, 'TASTI', ?, ?)",
                                   [name, video, json.dumps(stored), oracle_identity])])
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._open[name] = index
        return index

    def _build(self, video: str, options: dict, oracle: str | None, progress: bool,
               threads: int | None = None):
        """(index, options to store, oracle identity): a TASTI index over every frame of
        `video` built with checked `options`, labelled by `oracle` (cached labels reused)."""
        with self.catalog.statement():
            return self._build_labelled(video, options, oracle, progress, threads)

    def _build_labelled(self, video: str, options: dict, oracle: str | None, progress: bool,
                        threads: int | None):
        from vidql.indexes import TastiIndex
        from vidql.indexes.tasti import EMBEDDER_SHORT_SIDE, default_embedder

        cache = self.catalog.label_cache(video, oracle)
        source = self.catalog.lowres_source(video)
        build = dict(options)
        embedder = build.get("embedder") or default_embedder()
        size = source.proxy_size(build.pop("size", None) or EMBEDDER_SHORT_SIDE.get(embedder))
        identity = self._identity(video, cache.oracle.identity)
        before = cache.stats.snapshot()
        executor = self.catalog.executor  # Ray: embedding chunks written to shared storage
        scratch = self.catalog.artifacts / "indexes" / f".{video}.chunks"
        shutil.rmtree(scratch, ignore_errors=True)
        chunk_map = None if executor is None else executor.embedding_map(source, scratch)
        try:
            with cache.quiet():
                index = TastiIndex.build(source, cache.detections, size=size, progress=progress,
                                         identity=identity, threads=threads, chunk_map=chunk_map,
                                         **build)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        index.stats["newly_labelled"] = cache.stats.since(before).oracle_calls
        if "note" in index.stats:  # a message's table cell may be cut short; a warning is not
            warnings.warn(f"index over video {video!r}: {index.stats['note']}", stacklevel=2)
        stored = {**index.config, "oracle": cache.oracle.name, "given": options}
        return index, stored, cache.oracle.identity

    def refresh(self, name: str, *, progress: bool = True):
        """REFRESH INDEX: rebuild index `name` (retraining) over every frame of its video
        loaded now, with the options and oracle it was created with, reusing cached labels
        (and the build's torch threads, so unchanged frames give the same index and no
        oracle call). The new files replace the old folder only once complete: a failed
        refresh leaves the old index usable. Returns the new index."""
        self.settle()
        row = self._row(name)
        name, video = row["name"], row["video"]
        stored = json.loads(row["options"])
        options = self._check_options(self._given_options(stored), self.catalog.video_row(video))
        index, stored, oracle_identity = self._build(video, options, stored.get("oracle"),
                                                     progress, self._built_threads(name))
        directory = self.directory(name)
        staging, old = (directory.with_name(f".{name}.{part}") for part in ("refresh", "old"))
        for path in (staging, old):
            shutil.rmtree(path, ignore_errors=True)
        try:
            index.save(staging)
            if directory.is_dir():
                directory.rename(old)
            staging.rename(directory)
            self.catalog.run_atomically([
                ("UPDATE vidql.indexes SET options = ?, oracle_identity = ?, "
                 "built_at = current_timestamp WHERE name = ?",
                 [json.dumps(stored), oracle_identity, name])])
        except BaseException:
            if old.is_dir():
                shutil.rmtree(directory, ignore_errors=True)
                old.rename(directory)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
        self._open.pop(name, None)
        return self.get(name)

    def extend_for_video(self, video: str, covered: int, *, progress: bool = True) -> dict:
        """After clips were appended to `video` (which had `covered` frames): each index over
        it that covered exactly those frames embeds only the new frames with its trained
        embedder and labels representatives among them (farthest-point-first against the
        existing ones); no retraining. Returns {index: frames added (0 when it covers the
        video already), or why it was left as it is (then it is stale and REFRESH INDEX
        rebuilds it)}."""
        self.settle()
        done = {}
        rows = self.con.execute("SELECT name, oracle_identity, options FROM vidql.indexes WHERE "
                                "video = ? ORDER BY name", [video]).fetchall()
        for name, oracle_identity, options in rows:
            self._open.pop(name, None)
            try:
                done[name] = self._extend_one(name, video, covered, oracle_identity,
                                              json.loads(options).get("oracle"), progress)
            except VidqlError as exc:
                done[name] = f"not extended ({exc}); REFRESH INDEX {name} rebuilds it"
        return done

    def _extend_one(self, name: str, video: str, covered: int, oracle_identity: str,
                    oracle: str | None, progress: bool) -> int:
        """Extend index `name` (which covered `covered` frames of `video`) over the rest of
        the video and save it; the frames added."""
        from vidql.indexes import TastiIndex  # torch and FAISS load only for an index

        index = TastiIndex.load(self.directory(name))
        identity = self._identity(video, oracle_identity)
        if index.identity == identity:  # extended before a kill kept this from being noted
            self._open[name] = index
            return 0
        if index.n_frames != covered or index.identity.get("oracle") != oracle_identity:
            raise CatalogError(f"index {name!r} did not cover the video as loaded before")
        cache = self.catalog.label_cache(video, oracle)
        if cache.oracle.identity != oracle_identity:
            raise CatalogError(f"the oracle of index {name!r} changed since it was built")
        with cache.quiet():
            added = index.extend(self.catalog.lowres_source(video), cache.detections,
                                 progress=progress)
        index.identity = identity
        index.save(self.directory(name))
        self._open[name] = index
        return added

    def finish_extensions(self, *, progress: bool = True) -> dict[str, dict]:
        """Extend the indexes of every video that clips were appended to (LOAD VIDEO ...
        INTO commits a row of `vidql.index_extensions` with its clips; a process killed
        before extending left it there) and delete those rows. Returns {video:
        extend_for_video's answer}."""
        pending = self.con.execute("SELECT video, min(covered) FROM vidql.index_extensions "
                                   "GROUP BY video ORDER BY video").fetchall()
        done = {}
        for video, covered in pending:
            done[video] = self.extend_for_video(video, int(covered), progress=progress)
            self.catalog.run_atomically([("DELETE FROM vidql.index_extensions WHERE video = ?",
                                          [video])])
        return done

    def recover(self, *, progress: bool = True) -> None:
        """On opening a database to write: finish what a killed process left half done (a
        REFRESH INDEX between its two renames, a LOAD VIDEO ... INTO before its indexes
        were extended), with a warning saying what was done."""
        for name in self.names():
            restored = self._restore_refreshed(name)
            if restored:
                warnings.warn(f"index {name!r}: restored its {restored} copy, left by a REFRESH "
                              f"INDEX that was interrupted", RuntimeWarning, stacklevel=2)
        try:
            finished = self.finish_extensions(progress=progress)
        except Exception as exc:  # kept for the next open; the database opens regardless
            warnings.warn(f"extending indexes over clips appended by an interrupted LOAD VIDEO "
                          f"... INTO failed ({exc}); the next open tries again",
                          RuntimeWarning, stacklevel=2)
            return
        for video, done in finished.items():
            if done:
                warnings.warn(f"finished extending the indexes of video {video!r} over the clips "
                              f"an interrupted LOAD VIDEO ... INTO appended: "
                              f"{describe_extensions(done)}", RuntimeWarning, stacklevel=2)

    def _restore_refreshed(self, name: str) -> str | None:
        """Index `name`'s folder, put back from the copy REFRESH INDEX leaves beside it (the
        new build when complete and built for the catalog's row, else the old one) when a
        kill between its renames left none; leftover copies removed. Which copy, or None."""
        directory = self.directory(name)
        copies = [(part, directory.with_name(f".{name}.{part}")) for part in ("refresh", "old")]
        if not any(path.exists() for _, path in copies):
            return None
        from vidql.indexes import TastiIndex

        restored = None
        if not directory.is_dir():
            expect = {"oracle": self._row(name)["oracle_identity"]}
            for part, path in copies:
                try:
                    TastiIndex.load(path, expect=expect)
                except VidqlError:
                    continue
                path.rename(directory)
                restored = part
                break
        for _, path in copies:
            shutil.rmtree(path, ignore_errors=True)
        return restored

    @staticmethod
    def _given_options(stored: dict) -> dict:
        """The options an index was created with, from its catalog row: as given, or (rows
        written before they were kept) the values its build used, `size` as a short side."""
        if "given" in stored:
            return stored["given"]
        given = {k: stored[k] for k in INDEX_OPTIONS if k in stored and k != "size"}
        if "size" in stored:
            given["size"] = min(stored["size"])
        return given

    def _built_threads(self, name: str) -> int | None:
        """The torch threads index `name` was built with; None when its files are unreadable."""
        from vidql.indexes import TastiIndex

        try:
            return TastiIndex.load(self.directory(name)).stats.get("torch_threads")
        except VidqlError:
            return None

    @staticmethod
    def _check_options(options: dict | None, video_row: dict) -> dict:
        """CREATE INDEX options checked against their allowed ranges before any work."""
        from vidql.indexes.tasti import check_int, check_options

        options = dict(options or {})
        unknown = sorted(set(options) - set(INDEX_OPTIONS))
        if unknown:
            raise ParameterError(f"unknown index option(s) {', '.join(unknown)}; "
                                 f"allowed: {', '.join(INDEX_OPTIONS)}")
        checked = check_options(int(video_row["frame_count"]),
                                **{k: v for k, v in options.items() if k != "size"})
        checked = {k: checked[k] for k in options if k != "size"}
        if "size" in options:
            short = min(int(video_row["width"]), int(video_row["height"]))
            checked["size"] = check_int("size (the proxy frames' short side in pixels)",
                                        options["size"], MIN_SHORT_SIDE,
                                        max(MIN_SHORT_SIDE, min(MAX_SHORT_SIDE, short)))
        return checked

    def _identity(self, video: str, oracle_identity: str) -> dict:
        row = self.catalog.video_row(video)
        return {"video_fingerprint": row["fingerprint"], "oracle": oracle_identity,
                "frames": int(row["frame_count"])}

    def get(self, name: str):
        """Open an index (cached in memory); stale ones raise IndexMismatchError."""
        self.settle()
        from vidql.indexes import TastiIndex

        row = self._row(name)
        if row["name"] not in self._open:
            self.catalog.check_clips(row["video"])  # raises naming a clip whose file changed
            expect = self._identity(row["video"], row["oracle_identity"])
            if not self.directory(row["name"]).is_dir():
                raise CatalogError(f"the files of index {row['name']!r} are gone (folder "
                                   f"'{self.directory(row['name'])}'): DROP INDEX {row['name']} "
                                   f"and CREATE INDEX it again")
            self._open[row["name"]] = TastiIndex.load(self.directory(row["name"]), expect=expect)
        return self._open[row["name"]]

    def for_video(self, video: str, name: str | None = None, oracle_identity: str | None = None):
        """The named index, or the newest index of `video` built with that oracle, or None."""
        self.settle()
        if name is not None:
            row = self._row(name)
            if row["video"].lower() != video.lower():
                raise CatalogError(f"index {row['name']!r} is over video {row['video']!r}, "
                                   f"not {video!r}")
            if oracle_identity is not None and row["oracle_identity"] != oracle_identity:
                from vidql.indexes import IndexMismatchError
                built_with = json.loads(row["options"]).get("oracle", row["oracle_identity"])
                now = self.con.execute("SELECT identity FROM vidql.oracles WHERE name = ?",
                                       [built_with]).fetchall()
                if now and now[0][0] != row["oracle_identity"]:
                    raise IndexMismatchError(
                        f"index {row['name']!r} was built with an earlier version of oracle "
                        f"{built_with!r} ({row['oracle_identity']}), replaced since: DROP INDEX "
                        f"{row['name']} and CREATE INDEX again, or CREATE OR REPLACE ORACLE "
                        f"{built_with} from its old source")
                raise IndexMismatchError(
                    f"index {row['name']!r} was built with oracle {built_with!r}, not the oracle "
                    f"this query uses; run the query USING ORACLE {built_with}, or "
                    f"CREATE INDEX over {video} with this oracle")
            return row["name"], self.get(row["name"])
        sql = "SELECT name FROM vidql.indexes WHERE lower(video) = lower(?)"
        params = [video]
        if oracle_identity is not None:
            sql += " AND oracle_identity = ?"
            params.append(oracle_identity)
        rows = self.con.execute(sql + " ORDER BY built_at DESC", params).fetchall()
        return (rows[0][0], self.get(rows[0][0])) if rows else (None, None)

    def other_oracle_indexes(self, video: str, oracle_identity: str) -> list[str]:
        """Indexes of `video` built with another oracle (unusable for this oracle's queries)."""
        return [r[0] for r in self.con.execute(
            "SELECT name FROM vidql.indexes WHERE lower(video) = lower(?) AND oracle_identity <> ? "
            "ORDER BY name", [video, oracle_identity]).fetchall()]

    def crack(self, name: str, cache, frames: np.ndarray) -> int:
        """Cracking: frames the oracle labelled during a query join the representatives, on
        the cracking thread (their labels are read here). Returns how many join."""
        index = self.get(name)
        frames = np.setdiff1d(np.asarray(frames, dtype=np.int64), index.rep_frames)
        if len(frames) == 0:
            return 0
        detections, directory = cache.detections(frames), self.directory(name)

        def add_and_save() -> None:
            t0 = time.perf_counter()
            if index.add_labels(detections, frames):
                index.save(directory)
            self.crack_seconds = time.perf_counter() - t0

        self.crack_seconds = 0.0
        if self._cracker is None:
            self._cracker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidql-crack")
        self._cracking = (name, self._cracker.submit(add_and_save))
        return len(frames)

    def drop(self, name: str, if_exists: bool = False) -> bool:
        self.settle()
        try:
            row = self._row(name)
        except CatalogError:
            if if_exists:
                return False
            raise
        self.catalog.run_atomically([("DELETE FROM vidql.indexes WHERE name = ?", [row["name"]])])
        shutil.rmtree(self.directory(row["name"]), ignore_errors=True)
        self._open.pop(row["name"], None)
        return True

    def drop_for_video(self, video: str) -> None:
        self.settle()
        for (name,) in self.con.execute("SELECT name FROM vidql.indexes WHERE lower(video) = "
                                        "lower(?)", [video]).fetchall():
            shutil.rmtree(self.directory(name), ignore_errors=True)
            self._open.pop(name, None)

    def table(self) -> pd.DataFrame:
        df = self.con.execute("SELECT name, video, method, options, built_at FROM vidql.indexes "
                              "ORDER BY name").df()
        return df
