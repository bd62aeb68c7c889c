"""The catalog: videos, oracles and indexes in DuckDB tables, artifacts in a folder beside it.

A video `night` is a table `night(frame, ts)` and a view `night.objects` over the label
cache for the video's default oracle. Every change is one DuckDB transaction, so a failed
statement leaves the catalog as it was.
"""
from __future__ import annotations

import dataclasses
import json
from contextlib import closing
import os
import pickle
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from vidql.errors import CatalogError, OracleError, VideoError
from .labelcache import SCHEMA_SQL, LabelCache
from .oracle_api import Oracle
from .oracle_kinds import absolute_source, changed_sources, make_oracle

CATALOG_SQL = SCHEMA_SQL + """
CREATE TABLE IF NOT EXISTS vidql.videos (
    name VARCHAR PRIMARY KEY, path VARCHAR, codec VARCHAR, width INTEGER, height INTEGER,
    fps DOUBLE, frame_count BIGINT, duration DOUBLE, fingerprint VARCHAR, oracle VARCHAR,
    rendition_short_side INTEGER, loaded_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS vidql.oracles (
    name VARCHAR PRIMARY KEY, kind VARCHAR, source VARCHAR, options VARCHAR, identity VARCHAR);
CREATE TABLE IF NOT EXISTS vidql.indexes (
    name VARCHAR PRIMARY KEY, video VARCHAR, method VARCHAR, options VARCHAR,
    oracle_identity VARCHAR, built_at TIMESTAMP DEFAULT current_timestamp);
"""

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NAME_LENGTH = 128  # names become folder names in the artifacts folder
RESERVED = {"vidql", "vidql_store", "memory", "main", "temp", "information_schema", "pg_catalog",
            "system"}


def check_name(kind: str, name: str) -> str:
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        raise CatalogError(f"{kind} name {name[:20]}... is {len(name)} characters long; "
                           f"at most {MAX_NAME_LENGTH} are allowed")
    if not isinstance(name, str) or not NAME_RE.match(name) or name.lower() in RESERVED:
        raise CatalogError(f"{kind} name {name!r} is not allowed: use letters, digits and _, "
                           f"not starting with a digit, and not one of {sorted(RESERVED)}")
    return name


FINGERPRINT_WHOLE = 64 << 20  # files up to this size are hashed whole
FINGERPRINT_CHUNKS, FINGERPRINT_CHUNK = 64, 1 << 20  # else: this many evenly spaced chunks


def file_fingerprint(path: str | Path) -> str:
    """A video's identity by content: its size and a SHA-256 of its bytes (of 64 evenly
    spaced 1 MiB chunks, first and last included, for files over 64 MiB). A touched,
    copied or moved file with the same bytes keeps its fingerprint."""
    import hashlib

    size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= FINGERPRINT_WHOLE:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        else:
            for offset in np.linspace(0, size - FINGERPRINT_CHUNK, FINGERPRINT_CHUNKS).astype(np.int64):
                fh.seek(int(offset))
                h.update(fh.read(FINGERPRINT_CHUNK))
    return f"content:{size}:{h.hexdigest()[:32]}"


def fingerprint_matches(stored: str, path: str | Path) -> bool:
    """Whether the file at `path` has the content a catalog recorded. Catalogs made before
    content fingerprints stored `size:mtime:sha256(first MiB)`; those compare size and
    head only, so a touched file still matches."""
    import hashlib

    if stored.startswith("content:"):
        return file_fingerprint(path) == stored
    size, _mtime, head = stored.split(":")
    with open(path, "rb") as fh:
        now = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
    return int(size) == os.path.getsize(path) and head == now


def quote_name(name: str) -> str:
    """`name` as a DuckDB identifier (double-quoted, inner quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


class Catalog:
    """Catalog tables over one DuckDB connection, plus the artifact folder."""

    def __init__(self, con: duckdb.DuckDBPyConnection, artifacts: Path, *, progress: bool = True,
                 read_only: bool = False):
        self.con = con
        self.artifacts = Path(artifacts)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self._oracles: dict[str, tuple[Oracle, tuple]] = {}  # name -> (oracle, source stats)
        self._caches: dict[tuple[str, str], LabelCache] = {}
        self._infos: dict[str, object] = {}
        self.executor = None  # a RayExecutor (engine.ray_executor) when not local
        if not read_only:  # a read-only file has its catalog tables (or is no vidql database)
            con.execute(CATALOG_SQL)
            self._upgrade_objects_views()

    # ---- transactions -------------------------------------------------------------
    def run_atomically(self, statements: list[tuple[str, list]]) -> None:
        self.con.execute("BEGIN TRANSACTION")
        try:
            for sql, params in statements:
                self.con.execute(sql, params)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    # ---- videos -------------------------------------------------------------------
    def video_names(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT name FROM vidql.videos ORDER BY name").fetchall()]

    def video_row(self, name: str) -> dict:
        df = self.con.execute("SELECT * FROM vidql.videos WHERE lower(name) = lower(?)", [name]).df()
        if df.empty:
            known = ", ".join(self.video_names()) or "none loaded yet"
            raise CatalogError(f"unknown video {name!r}; videos: {known}")
        return df.iloc[0].to_dict()

    def video_dir(self, name: str) -> Path:
        return self.artifacts / "videos" / name

    def add_video(self, path: str | Path, name: str, *, rendition: int | None = None) -> dict:
        """Probe and register a video; nothing changes unless every step succeeds."""
        from vidql.preprocess.probe import probe_video

        check_name("video", name)
        if name.lower() in (n.lower() for n in self.video_names()):
            raise CatalogError(f"a video named {name!r} already exists; DROP VIDEO {name} first "
                               f"or choose another name")
        if self.con.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "lower(table_name) = lower(?) AND table_schema = 'main'",
                            [name]).fetchall()[0][0]:
            raise CatalogError(f"a table named {name!r} already exists; choose another video name")
        path = Path(path).resolve()
        info = probe_video(path)
        vdir = self.video_dir(name)
        staging = vdir.with_name(vdir.name + ".loading")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            with open(staging / "info.pkl", "wb") as fh:
                pickle.dump(info, fh)
            if rendition is not None:
                from vidql.preprocess.rendition import make_rendition

                make_rendition(path, staging / "rendition", int(rendition), progress=self.progress)
            ts = self._timestamps(info)
            self.con.register("__vidql_ts", pd.DataFrame({"frame": np.arange(info.frame_count),
                                                          "ts": ts}))
            q = quote_name(name)
            self.run_atomically([
                ("INSERT INTO vidql.videos (name, path, codec, width, height, fps, frame_count, "
                 "duration, fingerprint, oracle, rendition_short_side) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                 [name, str(path), info.codec, info.width, info.height, info.fps,
                  info.frame_count, info.duration, file_fingerprint(path), rendition]),
                (f"CREATE TABLE main.{q} AS SELECT CAST(frame AS BIGINT) AS frame, "
                 f"CAST(ts AS DOUBLE) AS ts FROM __vidql_ts ORDER BY frame", []),
                (f"CREATE SCHEMA {q}", []),
                (self._objects_view_sql(name), []),
            ])
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            self.con.unregister("__vidql_ts")
        shutil.rmtree(vdir, ignore_errors=True)
        staging.rename(vdir)
        self._infos[name] = info
        return self.video_row(name)

    @staticmethod
    def _timestamps(info) -> np.ndarray:
        n = info.frame_count
        pts = np.array([np.nan if p is None else p for p in info.pts], dtype=np.float64)
        if len(pts) == n and info.pts_unique and not np.isnan(pts).any():
            return (pts - pts[0]) * float(info.time_base)
        return np.arange(n) / (info.fps or 1.0)

    @staticmethod
    def oracle_variable(video: str) -> str:
        """DuckDB variable naming the oracle identity `video.objects` shows (set per query)."""
        return f"vidql_oracle_{video}"

    def _objects_view_sql(self, video: str) -> str:
        """`video.objects`: the labels of the oracle a query uses (the variable run_exact
        sets), else of the video's default oracle (for readers outside vidql)."""
        lit = "'" + video.replace("'", "''") + "'"
        default = (f"(SELECT o.identity FROM vidql.videos v JOIN vidql.oracles o "
                   f"ON o.name = v.oracle WHERE v.name = {lit})")
        return (f"CREATE OR REPLACE VIEW {quote_name(video)}.objects AS SELECT frame, label, score, "
                f"x1, y1, x2, y2 FROM vidql.labels WHERE video = {lit} AND oracle = "
                f"coalesce(getvariable('{self.oracle_variable(video)}'), {default})")

    def _upgrade_objects_views(self) -> None:
        """Catalogs made before views followed USING ORACLE get the current view."""
        old = self.con.execute("SELECT schema_name FROM duckdb_views() WHERE view_name = "
                               "'objects' AND database_name = current_database() AND "
                               "sql NOT LIKE '%getvariable%'").fetchall()
        videos = set(self.video_names())
        for (schema,) in old:
            if schema in videos:
                self.con.execute(self._objects_view_sql(schema))

    def video_info(self, name: str):
        """The probe result of a loaded video; raises if its file is gone or its content
        changed since loading. A lost artifacts folder is rebuilt by probing the file again."""
        row = self.video_row(name)
        name = row["name"]
        if name not in self._infos:
            path = row["path"]
            if not Path(path).is_file():
                raise VideoError(path, f"file of video {name!r} is gone; restore it, or if it "
                                       f"moved: ALTER VIDEO {name} SET PATH 'new/place'")
            if not fingerprint_matches(row["fingerprint"], path):
                raise VideoError(path, f"file of video {name!r} changed since LOAD VIDEO (its "
                                       f"content differs); its labels and indexes no longer "
                                       f"apply: restore the file, or DROP VIDEO {name} and load "
                                       f"it again")
            self._infos[name] = self._stored_info(name, path)
        return self._infos[name]

    def _stored_info(self, name: str, path: str):
        """The saved probe result (re-probed and saved again when the artifacts are gone)."""
        from vidql.preprocess.probe import probe_video

        saved = self.video_dir(name) / "info.pkl"
        if saved.is_file():
            with open(saved, "rb") as fh:
                info = pickle.load(fh)
            return info if info.path == path else dataclasses.replace(info, path=path)
        info = probe_video(path)
        saved.parent.mkdir(parents=True, exist_ok=True)
        with open(saved, "wb") as fh:
            pickle.dump(info, fh)
        return info

    def set_video_path(self, name: str, path: str | Path) -> dict:
        """ALTER VIDEO name SET PATH: the same video (same content) at a new place; labels,
        indexes and everything else stay. A file with other content is refused."""
        row = self.video_row(name)
        name, path = row["name"], Path(path).resolve()
        if not path.is_file():
            raise VideoError(path, "no such file")
        if not fingerprint_matches(row["fingerprint"], path):
            raise VideoError(path, f"its content differs from video {name!r} (loaded from "
                                   f"'{row['path']}'): ALTER VIDEO ... SET PATH only moves a "
                                   f"video whose bytes are unchanged; LOAD VIDEO it under "
                                   f"another name")
        self.run_atomically([("UPDATE vidql.videos SET path = ? WHERE name = ?", [str(path), name])])
        self._infos.pop(name, None)
        info = self.video_info(name)
        with open(self.video_dir(name) / "info.pkl", "wb") as fh:
            pickle.dump(info, fh)
        return self.video_row(name)

    def ensure_video_relations(self, name: str) -> None:
        """Recreate a video's table `name(frame, ts)` and view `name.objects` if a plain
        DROP TABLE / DROP SCHEMA removed them: the catalog has everything they hold."""
        name = self.video_row(name)["name"]
        have = self.con.execute(
            "SELECT (SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
            " AND schema_name = 'main' AND table_name = ?), (SELECT count(*) FROM duckdb_views() "
            "WHERE database_name = current_database() AND schema_name = ? AND view_name = "
            "'objects')", [name, name]).fetchall()[0]
        if all(have):
            return
        info = self.video_info(name)
        q = quote_name(name)
        statements = [(f"CREATE SCHEMA IF NOT EXISTS {q}", []), (self._objects_view_sql(name), [])]
        if not have[0]:
            self.con.register("__vidql_ts", pd.DataFrame({"frame": np.arange(info.frame_count),
                                                          "ts": self._timestamps(info)}))
            statements.append((f"CREATE TABLE main.{q} AS SELECT CAST(frame AS BIGINT) AS frame, "
                               f"CAST(ts AS DOUBLE) AS ts FROM __vidql_ts ORDER BY frame", []))
        try:
            self.run_atomically(statements)
        finally:
            self.con.unregister("__vidql_ts")

    def drop_video(self, name: str) -> None:
        name = self.video_row(name)["name"]
        q = quote_name(name)
        self.run_atomically([
            ("DELETE FROM vidql.labels WHERE video = ?", [name]),
            ("DELETE FROM vidql.labelled WHERE video = ?", [name]),
            ("DELETE FROM vidql.indexes WHERE video = ?", [name]),
            ("DELETE FROM vidql.videos WHERE name = ?", [name]),
            (f"DROP TABLE IF EXISTS main.{q}", []),
            (f"DROP SCHEMA IF EXISTS {q} CASCADE", []),
        ])
        shutil.rmtree(self.video_dir(name), ignore_errors=True)
        self._infos.pop(name, None)
        for key in [k for k in self._caches if k[0] == name]:
            del self._caches[key]

    def videos(self) -> pd.DataFrame:
        return self.con.execute(
            "SELECT name, path, codec, width, height, fps, frame_count, duration, oracle, "
            "rendition_short_side AS rendition FROM vidql.videos ORDER BY name").df()

    # ---- oracles ------------------------------------------------------------------
    def oracle_names(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT name FROM vidql.oracles ORDER BY name").fetchall()]

    def add_oracle(self, name: str, kind: str, source: str, options: dict | None = None, *,
                   replace: bool = False) -> Oracle:
        """CREATE [OR REPLACE] ORACLE: the identity (source digests, options) is fixed here.
        Replacing keeps the labels cached under the old identity (going back is free)."""
        check_name("oracle", name)
        existing = {n.lower(): n for n in self.oracle_names()}.get(name.lower())
        if existing and not replace:
            raise CatalogError(f"an oracle named {name!r} already exists; CREATE OR REPLACE "
                               f"ORACLE {name} FROM ... adopts a new version, DROP ORACLE "
                               f"{name} removes it")
        source, options = absolute_source(kind, source, options or {})
        oracle = make_oracle(existing or name, kind, source, options)
        row = [kind.upper(), source, json.dumps(options), oracle.identity]
        if existing:
            self.run_atomically([("UPDATE vidql.oracles SET kind = ?, source = ?, options = ?, "
                           "identity = ? WHERE name = ?", [*row, existing])])
        else:
            self.run_atomically([("INSERT INTO vidql.oracles VALUES (?, ?, ?, ?, ?)", [name, *row])])
        self._oracles[oracle.name] = (oracle, self._source_stats(oracle))
        return oracle

    def drop_oracle(self, name: str) -> int:
        """DROP ORACLE; refused while a video uses it as its default oracle. Its cached labels
        stay under its identity (an oracle created again from the same source reuses them);
        returns how many labelled frames that is."""
        row = self._oracle_row(name)
        users = [r[0] for r in self.con.execute(
            "SELECT name FROM vidql.videos WHERE oracle = ? ORDER BY name", [row[0]]).fetchall()]
        if users:
            raise CatalogError(f"oracle {row[0]!r} is the default oracle of video(s) "
                               f"{', '.join(users)}: SET ORACLE {users[0]} = <another oracle> "
                               f"(or DROP VIDEO {users[0]}) first")
        self.run_atomically([("DELETE FROM vidql.oracles WHERE name = ?", [row[0]])])
        self._oracles.pop(row[0], None)
        return self.con.execute("SELECT count(*) FROM vidql.labelled WHERE oracle = ?",
                                [row[4]]).fetchall()[0][0]

    def _oracle_row(self, name: str) -> tuple:
        rows = self.con.execute("SELECT name, kind, source, options, identity FROM vidql.oracles "
                               "WHERE lower(name) = lower(?)", [name]).fetchall()
        if not rows:
            known = ", ".join(self.oracle_names()) or "none created yet"
            raise CatalogError(f"unknown oracle {name!r}; oracles: {known}")
        return rows[0]

    @staticmethod
    def _source_stats(oracle: Oracle) -> tuple:
        """Size and modification time of an oracle's source files (None when missing)."""
        stats = []
        for path in oracle.sources:
            try:
                st = os.stat(path)
                stats.append((st.st_size, st.st_mtime_ns))
            except OSError:
                stats.append(None)
        return tuple(stats)

    def oracle(self, name: str) -> Oracle:
        """The oracle as created. Its sources are re-checked whenever their size or time
        changes: different bytes raise OracleError (the identity is fixed at CREATE ORACLE)."""
        name, kind, source, options, identity = self._oracle_row(name)
        cached = self._oracles.get(name)
        if cached and cached[0].identity == identity and self._source_stats(cached[0]) == cached[1]:
            return cached[0]
        try:
            oracle = make_oracle(name, kind, source, json.loads(options))
        except OracleError as exc:
            raise OracleError(f"oracle {name!r} can no longer be built from its source as "
                              f"created: {exc}; if its source moved: CREATE OR REPLACE ORACLE "
                              f"{name} FROM {kind} '<new place>'") from None
        if oracle.identity != identity:
            changed = changed_sources(identity, oracle)
            what = (f"the contents of {', '.join(repr(c) for c in changed)}" if changed
                    else "its code's version or options")
            raise OracleError(
                f"oracle {name!r} changed since CREATE ORACLE: {what} changed (identity "
                f"{identity} is now {oracle.identity}). Restore the source to keep using the "
                f"labels cached for it, or run CREATE OR REPLACE ORACLE {name} FROM {kind} "
                f"'{source}' to adopt the new version (the old labels stay cached)")
        self._oracles[name] = (oracle, self._source_stats(oracle))
        return oracle

    def oracles(self) -> pd.DataFrame:
        """SHOW ORACLES, with a `status` column: ok, or why the oracle cannot be used now."""
        df = self.con.execute("SELECT name, kind, source, options, identity FROM vidql.oracles "
                              "ORDER BY name").df()
        df["status"] = [self._oracle_status(n) for n in df["name"]]
        return df

    def _oracle_status(self, name: str) -> str:
        try:
            self.oracle(name)
        except OracleError as exc:
            return str(exc)
        return "ok"

    def set_oracle(self, video: str, oracle: str) -> None:
        video = self.video_row(video)["name"]
        o = self.oracle(oracle)
        self.run_atomically([("UPDATE vidql.videos SET oracle = ? WHERE name = ?", [o.name, video])])

    def default_oracle(self, video: str) -> Oracle:
        row = self.video_row(video)
        if row["oracle"] is not None and not pd.isna(row["oracle"]):
            return self.oracle(row["oracle"])
        names = self.oracle_names()
        if len(names) == 1:
            return self.oracle(names[0])
        raise CatalogError(f"video {row['name']!r} has no oracle: SET ORACLE {row['name']} = <name>"
                           f" (oracles: {', '.join(names) or 'none created yet; CREATE ORACLE first'})")

    def measured_ms_per_frame(self, identity: str) -> float | None:
        """The oracle's measured milliseconds per frame over every batch it has labelled."""
        rows = self.con.execute("SELECT frames, seconds FROM vidql.oracle_costs WHERE oracle = ?",
                                [identity]).fetchall()
        return 1000 * rows[0][1] / rows[0][0] if rows and rows[0][0] else None

    # ---- label caches -------------------------------------------------------------
    def label_cache(self, video: str, oracle: str | None = None) -> LabelCache:
        """The label cache of a video for an oracle (its default oracle when None)."""
        row = self.video_row(video)
        self.ensure_video_relations(row["name"])
        o = self.oracle(oracle) if oracle else self.default_oracle(row["name"])
        key = (row["name"], o.identity)
        if key not in self._caches:
            info = self.video_info(row["name"])
            if self.executor is not None:  # the same identity, labelled on Ray actors
                from .ray_executor import single_clip

                name, kind, source, options, _ = self._oracle_row(o.name)
                o = self.executor.oracle(o, (name, kind, source, json.loads(options)),
                                         single_clip(info))
            self._caches[key] = LabelCache(self.con, row["name"], info.frame_count, o,
                                           self._pixel_batches(info), progress=self.progress)
        return self._caches[key]

    def set_executor(self, executor) -> None:
        """Run labelling (and embedding) on `executor` (None: in this process) from now on."""
        for cache in self._caches.values():
            getattr(cache.oracle, "close", lambda: None)()
        self._caches.clear()
        self.executor = executor

    def lowres_source(self, video: str) -> "LowResSource":
        """Frames of a video for embedders and proxies (low resolution, original numbering)."""
        rendition = self.video_dir(self.video_row(video)["name"]) / "rendition"
        return LowResSource(self.video_info(video), rendition if rendition.is_dir() else None)

    @staticmethod
    def _pixel_batches(info):
        """Original-resolution frames for the oracle, through the pipelined runtime."""
        from vidql.preprocess import frame_batches

        def batches(frames: np.ndarray, batch_size: int):
            return closing(frame_batches(info, frames=frames, batch_size=batch_size))

        return batches


class LowResSource:
    """A frame source (n_frames, read, iter_batches) over a video for low-res consumers:
    its rendition when it has one (original frame numbers), else the original, resized."""

    DEFAULT_SHORT_SIDE = 36

    def __init__(self, info, rendition_dir: Path | None = None):
        from vidql.preprocess import Rendition

        self.info = info
        self.n_frames = info.frame_count
        self.rendition = Rendition.load(rendition_dir) if rendition_dir else None

    def proxy_size(self, short_side: int | None = None) -> tuple[int, int]:
        """(width, height) with the given short side, keeping the aspect ratio (even sizes)."""
        s = short_side or self.DEFAULT_SHORT_SIDE
        w, h = self.info.width, self.info.height
        scale = s / min(w, h)
        return max(2, round(w * scale / 2) * 2), max(2, round(h * scale / 2) * 2)

    def read(self, frames, size=None) -> np.ndarray:
        from vidql.preprocess.frames import FrameReader

        reader = self.rendition.open() if self.rendition else FrameReader(self.info.path, self.info)
        with reader:
            return reader.read(frames, size=size)

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None, size=None):
        from vidql.preprocess import frame_batches

        stop = self.n_frames if stop is None else stop
        frames = None if (start, stop) == (0, self.n_frames) else np.arange(start, stop)
        with closing(frame_batches(self.rendition or self.info, size=size, batch_size=batch_size,
                                   frames=frames)) as batches:
            yield from batches
