"""The catalog: videos, oracles and indexes in DuckDB tables, artifacts in a folder beside it.

A video `night` is a table `night(frame, ts)` and a view `night.objects` over the label
cache for the video's default oracle. Every change is one DuckDB transaction, so a failed
statement leaves the catalog as it was.
"""
from __future__ import annotations

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

from .errors import CatalogError, VideoError
from .labelcache import SCHEMA_SQL, LabelCache
from .oracle import Oracle
from .oracles import ORACLE_KINDS, make_oracle

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
RESERVED = {"vidql", "vidql_store", "memory", "main", "temp", "information_schema", "pg_catalog",
            "system"}


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or name.lower() in RESERVED:
        raise CatalogError(f"{kind} name {name!r} is not allowed: use letters, digits and _, "
                           f"not starting with a digit, and not one of {sorted(RESERVED)}")
    return name


def file_fingerprint(path: str | Path) -> str:
    """Size, modification time and the first MiB's hash: changes when the file does."""
    import hashlib

    st = os.stat(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
    return f"{st.st_size}:{int(st.st_mtime)}:{head}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Catalog:
    """Catalog tables over one DuckDB connection, plus the artifact folder."""

    def __init__(self, con: duckdb.DuckDBPyConnection, artifacts: Path, *, progress: bool = True,
                 read_only: bool = False):
        self.con = con
        self.artifacts = Path(artifacts)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self._oracles: dict[str, Oracle] = {}
        self._caches: dict[tuple[str, str], LabelCache] = {}
        self._infos: dict[str, object] = {}
        if not read_only:  # a read-only file has its catalog tables (or is no vidql database)
            con.execute(CATALOG_SQL)

    # ---- transactions -------------------------------------------------------------
    def _atomic(self, statements: list[tuple[str, list]]) -> None:
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
            q = _quote(name)
            self._atomic([
                ("INSERT INTO vidql.videos (name, path, codec, width, height, fps, frame_count, "
                 "duration, fingerprint, oracle, rendition_short_side) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                 [name, str(path), info.codec, info.width, info.height, info.fps,
                  info.frame_count, info.duration, file_fingerprint(path), rendition]),
                (f"CREATE TABLE main.{q} AS SELECT CAST(frame AS BIGINT) AS frame, "
                 f"CAST(ts AS DOUBLE) AS ts FROM __vidql_ts ORDER BY frame", []),
                (f"CREATE SCHEMA {q}", []),
                (self._objects_view_sql(name, None), []),
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

    def _objects_view_sql(self, video: str, identity: str | None) -> str:
        cond = "false" if identity is None else "oracle = '" + identity.replace("'", "''") + "'"
        return (f"CREATE OR REPLACE VIEW {_quote(video)}.objects AS SELECT frame, label, score, "
                f"x1, y1, x2, y2 FROM vidql.labels WHERE video = '{video}' AND {cond}")

    def video_info(self, name: str):
        """The probe result of a loaded video; raises if its file has changed since loading."""
        row = self.video_row(name)
        name = row["name"]
        if name not in self._infos:
            path = row["path"]
            if not Path(path).is_file():
                raise VideoError(path, f"file of video {name!r} is gone; DROP VIDEO {name} or restore it")
            if file_fingerprint(path) != row["fingerprint"]:
                raise VideoError(path, f"file of video {name!r} changed since LOAD VIDEO; its "
                                       f"labels and indexes no longer apply: DROP VIDEO {name} and load it again")
            with open(self.video_dir(name) / "info.pkl", "rb") as fh:
                self._infos[name] = pickle.load(fh)
        return self._infos[name]

    def drop_video(self, name: str) -> None:
        name = self.video_row(name)["name"]
        q = _quote(name)
        self._atomic([
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

    def add_oracle(self, name: str, kind: str, source: str, options: dict | None = None) -> Oracle:
        check_name("oracle", name)
        if name.lower() in (n.lower() for n in self.oracle_names()):
            raise CatalogError(f"an oracle named {name!r} already exists")
        oracle = make_oracle(name, kind, source, options)
        self._atomic([("INSERT INTO vidql.oracles VALUES (?, ?, ?, ?, ?)",
                       [name, kind.upper(), source, json.dumps(options or {}), oracle.identity])])
        self._oracles[name] = oracle
        return oracle

    def oracle(self, name: str) -> Oracle:
        rows = self.con.execute("SELECT name, kind, source, options FROM vidql.oracles "
                               "WHERE lower(name) = lower(?)", [name]).fetchall()
        if not rows:
            known = ", ".join(self.oracle_names()) or "none created yet"
            raise CatalogError(f"unknown oracle {name!r}; oracles: {known}")
        row = rows[0]
        if row[0] not in self._oracles:
            self._oracles[row[0]] = make_oracle(row[0], row[1], row[2], json.loads(row[3]))
        return self._oracles[row[0]]

    def oracles(self) -> pd.DataFrame:
        return self.con.execute("SELECT name, kind, source, options, identity FROM vidql.oracles "
                                "ORDER BY name").df()

    def set_oracle(self, video: str, oracle: str) -> None:
        video = self.video_row(video)["name"]
        o = self.oracle(oracle)
        self._atomic([("UPDATE vidql.videos SET oracle = ? WHERE name = ?", [o.name, video]),
                       (self._objects_view_sql(video, o.identity), [])])

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
        o = self.oracle(oracle) if oracle else self.default_oracle(row["name"])
        key = (row["name"], o.identity)
        if key not in self._caches:
            info = self.video_info(row["name"])
            self._caches[key] = LabelCache(self.con, row["name"], info.frame_count, o,
                                           self._pixel_batches(info), progress=self.progress)
        return self._caches[key]

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
