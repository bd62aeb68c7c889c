"""TASTI indexes in the catalog: CREATE / SHOW / DROP INDEX, loading, cracking.

An index lives in `<artifacts>/indexes/<name>/` and records the video fingerprint and the
oracle identity it was built with; a changed video or oracle makes it stale (a clear
error that says to rebuild), never silently wrong.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd

from .catalog import Catalog, check_name
from vidql.errors import CatalogError, ParameterError

INDEX_OPTIONS = {"train": int, "reps": int, "k": int, "seed": int, "embedder": str,
                 "size": int, "dim": int, "triplets": int}
MIN_SHORT_SIDE, MAX_SHORT_SIDE = 8, 256  # `size`: proxy frames' short side, at most the video's


class IndexStore:
    """Builds, persists and serves the TASTI indexes of a catalog's videos."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.con = catalog.con
        self._open: dict[str, object] = {}

    def names(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT name FROM vidql.indexes ORDER BY name").fetchall()]

    def directory(self, name: str):
        return self.catalog.artifacts / "indexes" / name

    def _row(self, name: str) -> dict:
        df = self.con.execute("SELECT * FROM vidql.indexes WHERE lower(name) = lower(?)", [name]).df()
        if df.empty:
            raise CatalogError(f"unknown index {name!r}; indexes: {', '.join(self.names()) or 'none'}")
        return df.iloc[0].to_dict()

    def create(self, name: str, video: str, options: dict | None = None, *,
               oracle: str | None = None, progress: bool = True):
        """Build a TASTI index over `video`, labelling representatives with its oracle."""
        from vidql.indexes import TastiIndex

        check_name("index", name)
        if name.lower() in (n.lower() for n in self.names()):
            raise CatalogError(f"an index named {name!r} already exists; DROP INDEX {name} first")
        row = self.catalog.video_row(video)
        options = self._check_options(options, row)
        video = row["name"]
        cache = self.catalog.label_cache(video, oracle)
        source = self.catalog.lowres_source(video)
        size = source.proxy_size(options.pop("size", None))
        identity = self._identity(video, cache.oracle.identity)
        before = cache.stats.snapshot()
        directory = self.directory(name)
        shutil.rmtree(directory, ignore_errors=True)
        executor = self.catalog.executor  # embedding chunks written under the index's folder
        chunk_map = None if executor is None else executor.embedding_map(source, directory / "chunks")
        try:
            index = TastiIndex.build(source, cache.detections, size=size, progress=progress,
                                     identity=identity, chunk_map=chunk_map, **options)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        index.stats["newly_labelled"] = cache.stats.since(before).oracle_calls
        index.save(directory)
        stored = {**{k: v for k, v in index.config.items()}, "oracle": cache.oracle.name}
        try:
            self.catalog.run_atomically([("INSERT INTO vidql.indexes (name, video, method, options, "
                                   "oracle_identity) VALUES (?, ?, 'TASTI', ?, ?)",
                                   [name, video, json.dumps(stored), cache.oracle.identity])])
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._open[name] = index
        return index

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
        from vidql.indexes import TastiIndex

        row = self._row(name)
        if row["name"] not in self._open:
            self.catalog.video_info(row["video"])  # raises if the video file changed
            expect = self._identity(row["video"], row["oracle_identity"])
            if not self.directory(row["name"]).is_dir():
                raise CatalogError(f"the files of index {row['name']!r} are gone (folder "
                                   f"'{self.directory(row['name'])}'): DROP INDEX {row['name']} "
                                   f"and CREATE INDEX it again")
            self._open[row["name"]] = TastiIndex.load(self.directory(row["name"]), expect=expect)
        return self._open[row["name"]]

    def for_video(self, video: str, name: str | None = None, oracle_identity: str | None = None):
        """The named index, or the newest index of `video` built with that oracle, or None."""
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
        """Cracking: frames the oracle labelled during a query join the representatives."""
        index = self.get(name)
        frames = np.setdiff1d(np.asarray(frames, dtype=np.int64), index.rep_frames)
        if len(frames) == 0:
            return 0
        added = index.add_labels(cache.detections(frames), frames)
        if added:
            index.save(self.directory(name))
        return added

    def drop(self, name: str, if_exists: bool = False) -> bool:
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
        for (name,) in self.con.execute("SELECT name FROM vidql.indexes WHERE lower(video) = "
                                        "lower(?)", [video]).fetchall():
            shutil.rmtree(self.directory(name), ignore_errors=True)
            self._open.pop(name, None)

    def table(self) -> pd.DataFrame:
        df = self.con.execute("SELECT name, video, method, options, built_at FROM vidql.indexes "
                              "ORDER BY name").df()
        return df
