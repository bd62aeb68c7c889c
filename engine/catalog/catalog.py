"""The catalog: videos, oracles and indexes in DuckDB tables, artifacts in a folder beside it.

A video `night` is a collection of clips (one per file; a single file is a collection of
one): a table `night(clip, frame, ts, start_ts)`, a row per clip in `vidql.clips`, and a
view `night.objects` over the label cache for the video's default oracle. Every change is one DuckDB transaction, so a failed
statement leaves the catalog as it was.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import closing, contextmanager
import os
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from vidql.preprocess import probe
from vidql.preprocess.concat import ConcatSource, LowResSource
from vidql.preprocess import DecodeStats
from vidql.preprocess.readcost import (MEASURED_FRAMES, DecodeTiming, ReadCost, load_timing,
                                       measure_decode, rendition_cost, rendition_pays,
                                       save_timing)
from vidql.preprocess.rendition import (LONG_SIDE, ORACLE_GOP, Rendition, make_oracle_rendition, make_rendition,
                                       oracle_size)
from vidql.base.files import atomic_path
from vidql.base.errors import CatalogError, OracleError, ParameterError, VideoError
from vidql.engine.catalog.upgrade import upgrade_catalog
from vidql.engine.labels.clips import ClipMap, clip_names, creation_timestamp, video_paths
from vidql.engine.labels.cache import SCHEMA_SQL, LabelCache
from vidql.engine.labels.decoded import OracleInput, clip_pixels
from vidql.engine.labels.journal import LabelJournal
from vidql.engine.sql.sqlnames import quote_name
from vidql.engine.labels.oracle_api import Oracle
from vidql.engine.labels.oracle_kinds import absolute_source, changed_sources, make_oracle

CATALOG_SQL = SCHEMA_SQL + """
CREATE TABLE IF NOT EXISTS vidql.videos (
    name VARCHAR PRIMARY KEY, path VARCHAR, codec VARCHAR, width INTEGER, height INTEGER,
    fps DOUBLE, frame_count BIGINT, duration DOUBLE, fingerprint VARCHAR, oracle VARCHAR,
    rendition_short_side INTEGER, loaded_at TIMESTAMP DEFAULT current_timestamp,
    oracle_rendition INTEGER);
CREATE TABLE IF NOT EXISTS vidql.oracles (
    name VARCHAR PRIMARY KEY, kind VARCHAR, source VARCHAR, options VARCHAR, identity VARCHAR);
CREATE TABLE IF NOT EXISTS vidql.indexes (
    name VARCHAR PRIMARY KEY, video VARCHAR, method VARCHAR, options VARCHAR,
    oracle_identity VARCHAR, built_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS vidql.clips (
    video VARCHAR, clip VARCHAR, ordinal INTEGER, path VARCHAR, codec VARCHAR, width INTEGER,
    height INTEGER, fps DOUBLE, frame_count BIGINT, duration DOUBLE, fingerprint VARCHAR,
    start_ts TIMESTAMP, first_frame BIGINT, PRIMARY KEY (video, clip));
CREATE TABLE IF NOT EXISTS vidql.index_extensions (video VARCHAR, covered BIGINT);
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


_VERIFIED: dict[tuple, str] = {}  # (path, size, mtime_ns, inode) -> fingerprint it matched


def fingerprint_matches(stored: str, path: str | Path) -> bool:
    """Whether the file at `path` has the content a catalog recorded (hashed once per
    process while the file's size, time and inode stay as they were). Catalogs made before
    content fingerprints stored `size:mtime:sha256(first MiB)`; those compare size and
    head only, so a touched file still matches."""
    if stored.startswith("content:"):
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if _VERIFIED.get(key) != stored and file_fingerprint(path) == stored:
            _VERIFIED[key] = stored
        return _VERIFIED.get(key) == stored
    size, _mtime, head = stored.split(":")
    with open(path, "rb") as fh:
        now = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
    return int(size) == os.path.getsize(path) and head == now


DECODE_TIMING = "decode.json"  # a clip's measured decode time per frame (preprocess.readcost)
ORACLE_RENDITION = "oracle_rendition"  # a clip's rendition at the oracle's input size
# vidql.videos.oracle_rendition: NULL none, a long side in px, or AUTO: each ONNX detector
# that reads a clip writes one at its own input size where the clip's random reads are
# costly (`rendition_pays`), on its first labelling call
AUTO = 0
FILE_READS = "file_reads.json"  # seconds an 'auto' rendition's oracle spent reading the file


def oracle_rendition_setting(value) -> int | str | None:
    """LOAD VIDEO's `oracle_rendition` option, checked: None when not stated, 'none', AUTO
    for 'auto', or a long side in px."""
    if isinstance(value, str):
        if value.lower() in ("auto", "none"):
            return AUTO if value.lower() == "auto" else "none"
        raise ParameterError(f"oracle_rendition must be 'auto', 'none' or the oracle's input long "
                             f"side in pixels, in [{LONG_SIDE.low}, {LONG_SIDE.high}]; got {value!r}")
    if value is None:
        return None
    return LONG_SIDE.check("oracle_rendition (the oracle's input long side in pixels)", value)


def _shown_setting(value) -> str | None:
    """How SHOW VIDEOS shows a stored oracle_rendition setting."""
    return None if value is None or pd.isna(value) else "auto" if int(value) == AUTO else str(int(value))


def _agreed(values: pd.Series) -> str:
    """The clips' one value, or `mixed: ` and each value in load order."""
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


def _rates(values: pd.Series) -> str:
    """The clips' one frame rate, or the range of their rates."""
    low, high = float(values.min()), float(values.max())
    return f"{low:.4g}" if low == high else f"{low:.4g}-{high:.4g}"


def _setting(row: dict, column: str) -> int | None:
    """A video row's optional integer setting (None when unset, or a catalog predates it)."""
    value = row.get(column)
    return None if value is None or pd.isna(value) else int(value)


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
        self._checked: dict[tuple[str, int], str] = {}  # (video, ordinal) -> its checked path
        self._infos: dict[tuple[str, int], object] = {}  # (video, ordinal) -> its VideoInfo
        self._read_costs: dict[Path, object] = {}  # timed folder -> ReadCost
        self._renditions: dict[tuple[str, int, str], object] = {}  # -> its oracle Rendition (probed)
        self.read_only = read_only
        self._video_rows: dict[str, dict] | None = None  # within a query: rows read so far
        self._statement_caches: dict[tuple, LabelCache] = {}  # within a query: caches found
        self._clip_tables: dict[str, pd.DataFrame] = {}  # within a query: clip tables read
        self.executor = None  # a RayExecutor (engine.ray_executor) when not local
        self.journal = LabelJournal(self.artifacts / "labels.journal", con)
        if not read_only:  # a read-only file has its catalog tables (or is no vidql database)
            con.execute(CATALOG_SQL)
            upgrade_catalog(self)
            self.journal.replay()  # batches a killed process made durable but never merged
            self.journal.open()

    @contextmanager
    def statement(self):
        """One statement (a query or an index build): the video rows and clip tables it
        reads, and the label caches it asks for, are looked up once (a catalog change inside
        looks afresh)."""
        outer = self._video_rows is None
        if outer:
            self._video_rows = {}
        try:
            yield
        finally:
            if outer:
                self._video_rows = None
                self._forget_lookups()

    def _forget_lookups(self) -> None:
        """Forget the label caches and clip tables a statement looked up (it ended, or the
        catalog changed)."""
        self._statement_caches.clear()
        self._clip_tables.clear()

    def flush_labels(self) -> None:
        """Merge the label batches waiting in the journal into the catalog tables: before
        anything reads or changes those tables (they wait there, durable, across queries)."""
        self.journal.flush()

    def close(self) -> None:
        """Merge pending labels, stop Ray oracle actors and close the connection."""
        try:
            self.flush_labels()
        finally:
            self.journal.close()
            self.set_executor(None)
            self.con.close()

    # ---- transactions -------------------------------------------------------------
    def run_atomically(self, statements: list[tuple[str, list]]) -> None:
        """Run `statements` in one transaction, after merging pending labels (a dropped
        video's, say, must not be merged after the drop)."""
        self.flush_labels()
        if self._video_rows is not None:
            self._video_rows.clear()
        self._forget_lookups()
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
        memo = self._video_rows
        if memo is not None and name.lower() in memo:
            return dict(memo[name.lower()])
        cur = self.con.execute("SELECT * FROM vidql.videos WHERE lower(name) = lower(?)", [name])
        rows = cur.fetchall()
        if not rows:
            known = ", ".join(self.video_names()) or "none loaded yet"
            raise CatalogError(f"unknown video {name!r}; videos: {known}")
        row = {col[0]: value for col, value in zip(cur.description, rows[0], strict=True)}
        if memo is not None:
            memo[name.lower()] = dict(row)
        return row

    def video_dir(self, name: str) -> Path:
        return self.artifacts / "videos" / name

    def clip_dir(self, name: str, ordinal: int) -> Path:
        """A clip's artifacts (probe result, rendition); the first clip keeps the layout a
        single video always had."""
        vdir = self.video_dir(name)
        return vdir if ordinal == 0 else vdir / "clips" / str(ordinal)

    def clip_table(self, name: str) -> pd.DataFrame:
        """The clips of a collection in load order (every column of vidql.clips); read once
        a statement (a query's first read it three times, 1.6-3.4 ms each)."""
        name = self.video_row(name)["name"]
        if self._video_rows is not None and name in self._clip_tables:
            return self._clip_tables[name].copy()
        clips = self.con.execute("SELECT * FROM vidql.clips WHERE video = ? ORDER BY ordinal",
                                 [name]).df()
        if self._video_rows is not None:
            self._clip_tables[name] = clips.copy()
        return clips

    def clip_map(self, name: str) -> ClipMap:
        return ClipMap.of(self.clip_table(name))

    def add_video(self, source, name: str, *, rendition: int | None = None,
                  oracle_rendition: int | str | None = None, skip_bad: bool = False,
                  into: bool = False) -> tuple[dict, list[tuple[str, str]]]:
        """LOAD VIDEO: probe every file `source` names (a file, glob, folder or list) and
        register them as clips of collection `name` (a new one, or an existing one `into`,
        whose rendition settings its new clips take; `oracle_rendition`: each clip's
        oracle rendition, as `oracle_rendition_setting` reads it, 'auto' when not stated:
        see `oracle_rendition`).
        A file that cannot be read fails the whole load, naming every such file, unless
        `skip_bad`; then the rest load. A file whose content is a clip of the collection
        already is left out with a note. Nothing changes unless every step succeeds.
        Returns the collection's row and the skipped (path, reason) pairs."""
        paths = video_paths(source)
        if into:
            row = self.video_row(name)
            name, clips = row["name"], self.clip_table(name)
            rendition = _setting(row, "rendition_short_side")
            oracle_rendition = self._same_oracle_rendition(row, oracle_rendition)
        else:
            self._check_new_video_name(name)
            oracle_rendition = {None: AUTO, "none": None}.get(oracle_rendition, oracle_rendition)
            clips = pd.DataFrame({"clip": [], "ordinal": [], "first_frame": [], "frame_count": [],
                                  "fingerprint": []})
        good, bad = self._probe_all(paths)
        self._refuse_bad(source, paths, good, bad, skip_bad)
        good, loaded = self._new_content(good, clips)
        if not good:  # every file is a clip of the collection already: nothing to do
            return self.video_row(name), bad + loaded
        names = clip_names([p for p, _, _ in good], set(clips["clip"]))
        first = len(clips)
        offset = int((clips["first_frame"] + clips["frame_count"]).max()) if first else 0
        staged = [self._stage_clip(name, first + k, path, info, (rendition, oracle_rendition))
                  for k, (path, info, _) in enumerate(good)]
        try:
            self._register_clips(name, names, good, first, offset,
                                 (rendition, oracle_rendition), into, source)
        except BaseException:
            for staging in staged:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        for k, staging in enumerate(staged):
            final = self.clip_dir(name, first + k)
            if final != self.video_dir(name):
                shutil.rmtree(final, ignore_errors=True)
            self._move_staged(staging, final)
        self._forget(name)
        return self.video_row(name), bad + loaded

    @staticmethod
    def _same_oracle_rendition(row: dict, asked: int | str | None) -> int | None:
        """A collection's stored oracle rendition setting, which LOAD VIDEO ... INTO may
        restate but not change: every clip's labels come from the same kind of pixels."""
        have = _setting(row, "oracle_rendition")
        if asked is not None and {"none": None}.get(asked, asked) != have:
            raise ParameterError(f"video {row['name']!r} was loaded with oracle_rendition = "
                                 f"{_shown_setting(have) or 'none'}; LOAD VIDEO ... INTO gives "
                                 f"its new clips the same (leave out oracle_rendition)")
        return have

    @staticmethod
    def _refuse_bad(source, paths: list[Path], good: list, bad: list, skip_bad: bool) -> None:
        """VideoError naming every file that cannot be loaded (unless `skip_bad`), or saying
        that none can."""
        if bad and not skip_bad:
            listed = "; ".join(f"'{p}': {reason}" for p, reason in bad)
            raise VideoError(source if isinstance(source, str) else paths[0],
                             f"{len(bad)} of {len(paths)} files cannot be loaded ({listed}); "
                             f"nothing was loaded: fix or remove them, or LOAD VIDEO ... WITH "
                             f"(skip_bad = true) to load the rest")
        if not good:
            raise VideoError(source if isinstance(source, str) else paths[0],
                             "no file could be loaded: " + "; ".join(f"'{p}': {r}" for p, r in bad))

    @staticmethod
    def _new_content(good: list, clips: pd.DataFrame) -> tuple[list, list[tuple[str, str]]]:
        """(path, VideoInfo, fingerprint) of the files in `good` whose content is no clip of
        `clips` yet (nor an earlier file of `good`), and (path, note) of those left out."""
        seen = dict(zip(clips["fingerprint"], clips["clip"], strict=True))
        new, loaded = [], []
        for path, info in good:
            fingerprint = file_fingerprint(path)
            if fingerprint in seen:
                loaded.append((str(path), f"already loaded as clip {seen[fingerprint]!r} (same "
                                          f"content); not loaded again"))
                continue
            seen[fingerprint] = Path(path).stem
            new.append((path, info, fingerprint))
        return new, loaded

    def _check_new_video_name(self, name: str) -> None:
        check_name("video", name)
        if name.lower() in (n.lower() for n in self.video_names()):
            raise CatalogError(f"a video named {name!r} already exists; LOAD VIDEO ... INTO "
                               f"{name} appends clips, DROP VIDEO {name} removes it")
        if self.con.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "lower(table_name) = lower(?) AND table_schema = 'main'",
                            [name]).fetchall()[0][0]:
            raise CatalogError(f"a table named {name!r} already exists; choose another video name")

    @staticmethod
    def _probe_all(paths: list[Path]) -> tuple[list, list[tuple[str, str]]]:
        """(path, VideoInfo) of the files that read, (path, reason) of those that do not."""
        good, bad = [], []
        for path in paths:
            try:
                good.append((path, probe.probe_video(path)))
            except VideoError as exc:
                bad.append((str(path), exc.reason))
        return good, bad

    def _stage_clip(self, name: str, ordinal: int, path: Path, info, renditions: tuple) -> Path:
        """Write a clip's probe result (and its renditions: (short side for the embedder,
        long side for the oracle), each None for none) to a staging folder."""
        final = self.clip_dir(name, ordinal)
        staging = final.with_name(final.name + ".loading")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        probe.save_info(info, staging / probe.INFO_FILE)
        save_timing(measure_decode(info), staging / DECODE_TIMING)
        rendition, oracle_rendition = renditions
        if rendition is not None:
            make_rendition(path, staging / "rendition", int(rendition), progress=self.progress)
        if oracle_rendition not in (None, AUTO):  # 'auto' ones are written on first use
            small = make_oracle_rendition(path, staging / ORACLE_RENDITION, int(oracle_rendition),
                                          progress=self.progress, info=info)
            save_timing(measure_decode(small.info), small.folder / DECODE_TIMING)
        return staging

    @staticmethod
    def _move_staged(staging: Path, final: Path) -> None:
        """Move a staged clip folder in place (the first clip's files go into the video's
        folder, which holds the other clips' folders too)."""
        if final.is_dir():
            for item in staging.iterdir():
                target = final / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                item.rename(target)
            staging.rmdir()
        else:
            final.parent.mkdir(parents=True, exist_ok=True)
            staging.rename(final)

    def _register_clips(self, name, names, good, first, offset, renditions, into, source) -> None:
        """One transaction: the clip rows, the table rows and (for a new collection) the
        video row, its table and its `objects` view; appended `into` a collection, a row of
        `vidql.index_extensions` saying its indexes cover its first `offset` frames (deleted
        once they are extended: see IndexStore.finish_extensions)."""
        covered, rows, frames = offset, [], []
        for k, ((path, info, fingerprint), clip) in enumerate(zip(good, names, strict=True)):
            start = creation_timestamp(getattr(info, "creation_time", None))
            rows.append([name, clip, first + k, str(path), info.codec, info.width, info.height,
                         info.fps, info.frame_count, info.duration, fingerprint,
                         start, offset])
            frames.append(pd.DataFrame({"clip": clip, "frame": np.arange(info.frame_count),
                                        "ts": info.timestamps(), "start_ts": start}))
            offset += info.frame_count
        q = quote_name(name)
        statements = [("INSERT INTO vidql.clips VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", r)
                      for r in rows]
        if into:
            statements.append(("INSERT INTO vidql.index_extensions VALUES (?, ?)", [name, covered]))
        else:
            info0 = good[0][1]
            statements += [
                ("INSERT INTO vidql.videos (name, path, codec, width, height, fps, frame_count, "
                 "duration, fingerprint, oracle, rendition_short_side, oracle_rendition) "
                 "VALUES (?, ?, ?, ?, ?, ?, 0, 0, NULL, NULL, ?, ?)",
                 [name, str(good[0][0]) if len(good) == 1 and not isinstance(source, (list, tuple))
                  else str(source), info0.codec, info0.width, info0.height, info0.fps,
                  *renditions]),
                (f"CREATE TABLE main.{q} (clip VARCHAR, frame BIGINT, ts DOUBLE, "
                 f"start_ts TIMESTAMP)", []),
                (f"CREATE SCHEMA {q}", []),
                (self.objects_view_sql(name), []),
            ]
        statements += [(f"INSERT INTO main.{q} SELECT clip, CAST(frame AS BIGINT), "
                        f"CAST(ts AS DOUBLE), CAST(start_ts AS TIMESTAMP) FROM __vidql_frames "
                        f"ORDER BY frame", []),
                       self._video_totals_sql(name)]
        self.con.register("__vidql_frames", pd.concat(frames, ignore_index=True))
        try:
            self.run_atomically(statements)
        finally:
            self.con.unregister("__vidql_frames")

    @staticmethod
    def _video_totals_sql(name: str) -> tuple[str, list]:
        """Keep the collection's row in step with its clips: total frames and duration, and
        a fingerprint over every clip's (the only clip's for a single file)."""
        return ("UPDATE vidql.videos SET frame_count = t.n, duration = t.d, fingerprint = t.f "
                "FROM (SELECT sum(frame_count) AS n, sum(duration) AS d, CASE WHEN count(*) = 1 "
                "THEN min(fingerprint) ELSE 'clips:' || count(*) || ':' || "
                "md5(string_agg(fingerprint, ',' ORDER BY ordinal)) END AS f FROM vidql.clips "
                "WHERE video = ?) t WHERE name = ?", [name, name])

    def _forget(self, name: str) -> None:
        """Drop what this process remembers of a collection (after it changed)."""
        for key in [k for k in self._infos if k[0] == name]:
            del self._infos[key]
        self._read_costs.clear()
        for key in [k for k in self._renditions if k[0] == name]:
            del self._renditions[key]
        for key in [k for k in self._checked if k[0] == name]:
            del self._checked[key]
        for key in [k for k in self._caches if k[0] == name]:
            del self._caches[key]
        self._forget_lookups()

    @staticmethod
    def oracle_variable(video: str) -> str:
        """DuckDB variable naming the oracle identity `video.objects` shows (set per query)."""
        return f"vidql_oracle_{video}"

    def objects_view_sql(self, video: str) -> str:
        """`video.objects`: the labels of the oracle a query uses (the variable run_exact
        sets), else of the video's default oracle (for readers outside vidql)."""
        lit = "'" + video.replace("'", "''") + "'"
        default = (f"(SELECT o.identity FROM vidql.videos v JOIN vidql.oracles o "
                   f"ON o.name = v.oracle WHERE v.name = {lit})")
        return (f"CREATE OR REPLACE VIEW {quote_name(video)}.objects AS SELECT clip, frame, label, "
                f"score, x1, y1, x2, y2 FROM vidql.labels WHERE video = {lit} AND oracle = "
                f"coalesce(getvariable('{self.oracle_variable(video)}'), {default})")

    def check_clip(self, name: str, ordinal: int, again: bool = False) -> str:
        """The path of a clip's file; raises if the file is gone or its content changed
        since loading (checked once per process; `again`, before decoding, also when the
        file has gone since, so that a file moved meanwhile gets this error and its fix,
        not the decoder's)."""
        key = (name, int(ordinal))
        if again and key in self._checked and not Path(self._checked[key]).is_file():
            del self._checked[key]
        if key not in self._checked:
            row = self.con.execute("SELECT clip, path, fingerprint FROM vidql.clips WHERE "
                                   "video = ? AND ordinal = ?", [name, int(ordinal)]).fetchall()
            if not row:
                raise CatalogError(f"video {name!r} has no clip number {ordinal}")
            clip, path, fingerprint = row[0]
            single = self._single(name)
            what = self._clip_words(name, clip, single)
            fix = (f"ALTER VIDEO {name} SET PATH 'new/place'" if single
                   else f"ALTER VIDEO {name} SET PATH '{clip}' = 'new/place'")
            if not Path(path).is_file():
                raise VideoError(path, f"file of {what} is gone; restore it, or if it moved: {fix}")
            if not fingerprint_matches(fingerprint, path):
                raise VideoError(path, f"file of {what} changed since LOAD VIDEO (its content "
                                       f"differs); its labels and indexes no longer apply: "
                                       f"restore the file, or DROP VIDEO {name} and load it again")
            self._checked[key] = path
        return self._checked[key]

    def check_clips(self, name: str) -> None:
        """`check_clip` for every clip of a video: all that a query over labels needs of
        its files (their probe results, with every frame's timestamp, are read only to
        decode: 0.1 s at a million frames)."""
        name = self.video_row(name)["name"]
        for ordinal in self.clip_table(name)["ordinal"]:
            self.check_clip(name, ordinal)

    def clip_info(self, name: str, ordinal: int):
        """The probe result of a clip, its file checked by `check_clip`. A lost artifacts
        folder is rebuilt by probing the file again."""
        key = (name, int(ordinal))
        if key not in self._infos:
            path = self.check_clip(name, ordinal)
            self._infos[key] = self._stored_info(self.clip_dir(name, ordinal), path)
        return self._infos[key]

    def _single(self, name: str) -> bool:
        return self.con.execute("SELECT count(*) FROM vidql.clips WHERE video = ?",
                                [name]).fetchall()[0][0] == 1

    @staticmethod
    def _clip_words(name: str, clip: str, single: bool) -> str:
        """How errors name a clip: as the video when it is its only clip."""
        return f"video {name!r}" if single else f"clip {clip!r} of video {name!r}"

    def read_costs(self, name: str, oracle: Oracle) -> list:
        """Each clip's `ReadCost` (GOP layout, decode seconds per frame) of what `oracle`
        decodes now, in load order: the clip's oracle rendition where one is written for
        it, else its file. LOAD times a clip's decoding; a clip loaded before that is timed
        on first use."""
        name = self.video_row(name)["name"]
        return [self._read_cost(name, int(o), oracle) for o in self.clip_table(name)["ordinal"]]

    def _read_cost(self, name: str, ordinal: int, oracle: Oracle) -> ReadCost:
        return self._timed(*self._read_source(name, ordinal, oracle))

    def _read_source(self, name: str, ordinal: int, oracle: Oracle) -> tuple:
        """(VideoInfo, folder of its decode timing) of what `oracle` reads of a clip now:
        its oracle rendition where one is written, else its file."""
        rendition = self.oracle_rendition(name, ordinal, oracle)
        if rendition is None:
            return self.clip_info(name, ordinal), self.clip_dir(name, ordinal)
        return rendition.info, rendition.folder

    def _file_cost(self, name: str, ordinal: int) -> ReadCost:
        return self._timed(self.clip_info(name, ordinal), self.clip_dir(name, ordinal))

    def _timed(self, info, folder: Path) -> ReadCost:
        """The ReadCost of the video `info` describes, its decoding timed once (kept in
        `folder`)."""
        if folder not in self._read_costs:
            saved = folder / DECODE_TIMING
            timing = load_timing(saved)
            if timing is None:
                timing = measure_decode(info)
                if not self.read_only:
                    save_timing(timing, saved)
            self._read_costs[folder] = ReadCost.of(info, timing)
        return self._read_costs[folder]

    def _learn_decoding(self, name: str, ordinal: int, oracle: Oracle, stats: DecodeStats) -> None:
        """Keep the decode time per frame a labelling call measured on what `oracle` read of
        a clip, when it decoded at least MEASURED_FRAMES frames, and its conversion time per
        frame read, when it read that many: a query's own decoding, beside the oracle on a
        machine as busy as it is, prices the next ones better than LOAD's few frames (on a
        busy 2-core machine these read 12 ms for a 1080p frame whose queries decoded it in
        5-6)."""
        if stats.frames < MEASURED_FRAMES or self.read_only:
            return
        info, folder = self._read_source(name, ordinal, oracle)
        read = self._timed(info, folder).seconds_per_read
        if stats.converted >= MEASURED_FRAMES:
            read = stats.convert_seconds / stats.converted
        timing = DecodeTiming(stats.seconds / stats.frames, stats.frames, int(info.width),
                              int(info.height), read)
        save_timing(timing, folder / DECODE_TIMING)
        self._read_costs[folder] = ReadCost.of(info, timing)

    def rendition_to_write(self, name: str, ordinal: int, oracle: Oracle, frames: np.ndarray,
                           earlier: float = 0.0) -> tuple[float, ReadCost] | None:
        """(estimated seconds to write it, its estimated ReadCost) when a labelling call of
        a clip's `frames` by `oracle` writes the clip's 'auto' oracle rendition first; else
        None. Rent or buy: the rendition (one that pays, `_auto_rendition`, not written yet)
        is written once the file reads of its oracle's calls so far, this one included
        (estimated, kept in the clip's folder across processes), would reach what writing
        it costs (a decode of the clip and the copy's encoding), which spends at most twice
        the better of never and at once. A few frames (EXPLAIN timing a new oracle) or the
        first short calls on a long video read the file. `earlier`: estimated file reads of
        the same query's earlier calls, not on the account yet (EXPLAIN pricing a query)."""
        pending = self._pending_rendition(name, ordinal, oracle)
        if pending is None or self._reads_with(name, ordinal, pending, frames, earlier)[1] < pending[2]:
            return None
        return pending[2], pending[1]

    def _rent_or_buy(self, name: str, ordinal: int, oracle: Oracle, frames: np.ndarray) -> bool:
        """Whether a labelling call of a clip's `frames` writes its 'auto' oracle rendition
        first (`rendition_to_write`); if it reads the file instead, what that costs goes
        on the rendition's account (never in a read-only database)."""
        pending = self._pending_rendition(name, ordinal, oracle)
        if pending is None:
            return False
        account, reads = self._reads_with(name, ordinal, pending, frames)
        if reads >= pending[2]:
            return True
        if not self.read_only:
            account[str(pending[0])] = reads
            with atomic_path(self.clip_dir(name, ordinal) / FILE_READS) as tmp:
                Path(tmp).write_text(json.dumps(account))
        return False

    def _reads_with(self, name: str, ordinal: int, pending: tuple, frames: np.ndarray,
                    earlier: float = 0.0) -> tuple[dict[str, float], float]:
        """(a clip's account, the file reads on it for its pending rendition
        (`_pending_rendition`) with `earlier` ones not on it yet and reading `frames`)."""
        account = self._file_reads(name, ordinal)
        spent = account.get(str(pending[0]), 0.0) + earlier
        return account, spent + self.file_read_seconds(name, ordinal, frames)

    def file_read_seconds(self, name: str, ordinal: int, frames: np.ndarray) -> float:
        """Estimated seconds to decode a clip's `frames` from its file in one call."""
        file = self._file_cost(name, ordinal)
        return file.seconds(file.decoded_in_order(frames), len(np.unique(frames)))

    def _pending_rendition(self, name: str, ordinal: int,
                           oracle: Oracle) -> tuple[int, ReadCost, float] | None:
        """(long side, estimated ReadCost, estimated seconds to write it) of a clip's 'auto'
        oracle rendition for `oracle` that pays and is not written yet; else None."""
        auto = self._auto_rendition(name, ordinal, oracle)
        if auto is None or self.oracle_rendition(name, ordinal, oracle, write=False) is not None:
            return None
        file = self._file_cost(name, ordinal)
        return (*auto, file.seconds(file.frame_count, file.frame_count)
                + auto[1].seconds(file.frame_count))

    def _file_reads(self, name: str, ordinal: int) -> dict[str, float]:
        """A clip's account: estimated seconds each oracle input side (as text) spent
        reading its file so far (empty when absent or unreadable)."""
        try:
            account = json.loads((self.clip_dir(name, ordinal) / FILE_READS).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(account, dict):
            return {}
        return {side: float(v) for side, v in account.items() if isinstance(v, (int, float))}

    def clip_infos(self, name: str) -> list:
        """Probe results of every clip in load order (each checked as clip_info does)."""
        name = self.video_row(name)["name"]
        return [self.clip_info(name, o) for o in self.clip_table(name)["ordinal"]]

    def video_info(self, name: str):
        """The probe result of a single-file video (see clip_info)."""
        row = self.video_row(name)
        if not self._single(row["name"]):
            raise CatalogError(f"video {row['name']!r} is a collection of several clips; "
                               f"SHOW CLIPS {row['name']} lists them")
        return self.clip_info(row["name"], 0)

    @staticmethod
    def _stored_info(directory: Path, path: str):
        """The saved probe result (re-probed and saved again when the artifacts are gone)."""
        return probe.stored_info(directory, path)

    def _clip_ordinal(self, name: str, clip: str | None, statement: str) -> tuple[int, str]:
        """(ordinal, name) of a clip named in an ALTER VIDEO statement (None: the only clip)."""
        clips = self.clip_table(name)
        if clip is None:
            if len(clips) != 1:
                raise CatalogError(f"video {name!r} has {len(clips)} clips: name one, "
                                   f"ALTER VIDEO {name} SET {statement} 'clip' = ...")
            return 0, clips["clip"].iloc[0]
        hit = clips[clips["clip"].str.lower() == clip.lower()]
        if hit.empty:
            raise CatalogError(f"video {name!r} has no clip {clip!r}; SHOW CLIPS {name} lists them")
        return int(hit["ordinal"].iloc[0]), hit["clip"].iloc[0]

    def set_video_path(self, name: str, path: str | Path, clip: str | None = None) -> dict:
        """ALTER VIDEO name SET PATH ['clip' =] 'path': the same clip (same content) at a
        new place; labels, indexes and everything else stay. Other content is refused."""
        name = self.video_row(name)["name"]
        ordinal, clip = self._clip_ordinal(name, clip, "PATH")
        path = Path(path).resolve()
        old_path, fingerprint = self.con.execute(
            "SELECT path, fingerprint FROM vidql.clips WHERE video = ? AND ordinal = ?",
            [name, ordinal]).fetchall()[0]
        single = self._single(name)
        if not path.is_file():
            raise VideoError(path, "no such file")
        if not fingerprint_matches(fingerprint, path):
            raise VideoError(path, f"its content differs from "
                                   f"{self._clip_words(name, clip, single)} "
                                   f"(loaded from '{old_path}'): ALTER VIDEO ... SET PATH only "
                                   f"moves a file whose bytes are unchanged; LOAD VIDEO it under "
                                   f"another name")
        statements = [("UPDATE vidql.clips SET path = ? WHERE video = ? AND ordinal = ?",
                       [str(path), name, ordinal])]
        if single:
            statements.append(("UPDATE vidql.videos SET path = ? WHERE name = ?", [str(path), name]))
        self.run_atomically(statements)
        self._infos.pop((name, ordinal), None)
        self._checked.pop((name, ordinal), None)
        probe.save_info(self.clip_info(name, ordinal), self.clip_dir(name, ordinal) / probe.INFO_FILE)
        return self.video_row(name)

    def set_clip_start(self, name: str, clip: str, start) -> pd.DataFrame:
        """ALTER VIDEO name SET START 'clip' = TIMESTAMP '...': the clip's start time (the
        table's `start_ts`); NULL clears it. Returns the clip's row."""
        name = self.video_row(name)["name"]
        ordinal, clip = self._clip_ordinal(name, clip, "START")
        start = None if start is None or pd.isna(start) else pd.Timestamp(start)
        self.run_atomically([
            ("UPDATE vidql.clips SET start_ts = ? WHERE video = ? AND ordinal = ?",
             [start, name, ordinal]),
            (f"UPDATE main.{quote_name(name)} SET start_ts = ? WHERE clip = ?", [start, clip])])
        return self.clips(name).query("clip == @clip")

    def ensure_video_relations(self, name: str) -> None:
        """Recreate a video's table `name(clip, frame, ts, start_ts)` and view `name.objects`
        if a plain DROP TABLE / DROP SCHEMA removed them: the catalog has all they hold."""
        name = self.video_row(name)["name"]
        have = self.con.execute(
            "SELECT (SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
            " AND schema_name = 'main' AND table_name = ?), (SELECT count(*) FROM duckdb_views() "
            "WHERE database_name = current_database() AND schema_name = ? AND view_name = "
            "'objects')", [name, name]).fetchall()[0]
        if all(have):
            return
        q = quote_name(name)
        statements = [(f"CREATE SCHEMA IF NOT EXISTS {q}", []), (self.objects_view_sql(name), [])]
        if not have[0]:
            clips = self.clip_table(name)
            self.con.register("__vidql_frames", self._clip_frames(clips, self.clip_infos(name)))
            statements.append((f"CREATE TABLE main.{q} AS SELECT clip, CAST(frame AS BIGINT) AS "
                               f"frame, CAST(ts AS DOUBLE) AS ts, CAST(start_ts AS TIMESTAMP) AS "
                               f"start_ts FROM __vidql_frames", []))
        try:
            self.run_atomically(statements)
        finally:
            self.con.unregister("__vidql_frames")

    def _clip_frames(self, clips: pd.DataFrame, infos: list) -> pd.DataFrame:
        """The table rows (clip, frame, ts, start_ts) of clips, in load order."""
        return pd.concat([pd.DataFrame({"clip": c, "frame": np.arange(info.frame_count),
                                        "ts": info.timestamps(), "start_ts": s})
                          for c, s, info in zip(clips["clip"], clips["start_ts"], infos,
                                                strict=True)], ignore_index=True)

    def drop_video(self, name: str) -> None:
        name = self.video_row(name)["name"]
        q = quote_name(name)
        self.run_atomically([
            ("DELETE FROM vidql.labels WHERE video = ?", [name]),
            ("DELETE FROM vidql.labelled WHERE video = ?", [name]),
            ("DELETE FROM vidql.indexes WHERE video = ?", [name]),
            ("DELETE FROM vidql.index_extensions WHERE video = ?", [name]),
            ("DELETE FROM vidql.clips WHERE video = ?", [name]),
            ("DELETE FROM vidql.videos WHERE name = ?", [name]),
            (f"DROP TABLE IF EXISTS main.{q}", []),
            (f"DROP SCHEMA IF EXISTS {q} CASCADE", []),
        ])
        shutil.rmtree(self.video_dir(name), ignore_errors=True)
        self._forget(name)

    def videos(self) -> pd.DataFrame:
        """SHOW VIDEOS: one row per video (collection) with its clip and frame counts, its
        duration, and what its clips are: `codec` and `size` (`320x240`) one value when the
        clips agree, else `mixed: ` and the values; `fps` one rate or a range (`25-30`)."""
        videos = self.con.execute(
            "SELECT name, path, frame_count, duration, oracle, rendition_short_side AS "
            "rendition, oracle_rendition FROM vidql.videos ORDER BY name").df()
        clips = self.con.execute("SELECT video, codec, width || 'x' || height AS size, fps "
                                 "FROM vidql.clips ORDER BY video, ordinal").df()
        kinds = clips.groupby("video", sort=False).agg(
            clips=("codec", "size"), codec=("codec", _agreed), size=("size", _agreed),
            fps=("fps", _rates))
        shown = videos.join(kinds, on="name")
        shown["oracle_rendition"] = shown["oracle_rendition"].map(_shown_setting).astype("object")
        return shown[["name", "clips", "path", "codec", "size", "fps", "frame_count", "duration",
                      "oracle", "rendition", "oracle_rendition"]].astype(
            {"clips": "int64", "codec": "str", "size": "str", "fps": "str"})

    def clips(self, name: str) -> pd.DataFrame:
        """SHOW CLIPS name: the clips of a video in load order."""
        return self.clip_table(name)[["clip", "path", "codec", "width", "height", "fps",
                                      "frame_count", "duration", "start_ts", "first_frame"]]

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
        self.flush_labels()
        rows = self.con.execute("SELECT frames, seconds FROM vidql.oracle_costs WHERE oracle = ?",
                                [identity]).fetchall()
        return 1000 * rows[0][1] / rows[0][0] if rows and rows[0][0] else None

    # ---- label caches -------------------------------------------------------------
    def label_cache(self, video: str, oracle: str | None = None) -> LabelCache:
        """The label cache of a video for an oracle (its default oracle when None); within a
        statement, found once (its oracle's sources are checked once a statement)."""
        memo = (video.lower(), oracle)
        if self._video_rows is not None and memo in self._statement_caches:
            return self._statement_caches[memo]
        row = self.video_row(video)
        self.ensure_video_relations(row["name"])
        o = self.oracle(oracle) if oracle else self.default_oracle(row["name"])
        key = (row["name"], o.identity)
        if key not in self._caches:
            video = row["name"]
            self.check_clips(video)  # a clip whose file is gone or changed: an error now
            clip_map = self.clip_map(video)
            o.check_clips(clip_map.names)
            if self.executor is not None:  # the same identity, labelled on Ray actors
                name, kind, source, options, _ = self._oracle_row(o.name)
                o = self.executor.oracle(o, (name, kind, source, json.loads(options)),
                                         lambda positions: self.locate(video, clip_map,
                                                                       positions))
            self._caches[key] = LabelCache(self.con, video, clip_map, o,
                                           self._pixel_batches(video, clip_map, o),
                                           journal=self.journal, progress=self.progress)
        if self._video_rows is not None:
            self._statement_caches[memo] = self._caches[key]
        return self._caches[key]

    def locate(self, video: str, clip_map: ClipMap, positions: np.ndarray) -> list[tuple]:
        """Ascending global positions of a video (whose clips `clip_map` holds), split by
        clip: [(the clip's VideoInfo, frames within the clip, the positions, the clip's
        name, whether it is the only clip)], for whoever decodes frames by number (Ray
        actors)."""
        only = len(clip_map.names) == 1
        pieces = list(clip_map.pieces(positions))
        for o, _, _ in pieces:
            self.check_clip(video, o, again=True)
        return [(self.clip_info(video, o), local, ids, clip_map.names[o], only)
                for o, local, ids in pieces]

    def set_executor(self, executor) -> None:
        """Run labelling (and embedding) on `executor` (None: in this process) from now on."""
        for cache in self._caches.values():
            getattr(cache.oracle, "close", lambda: None)()
        self._caches.clear()
        self._forget_lookups()
        self.executor = executor

    def lowres_source(self, video: str):
        """Frames of a video for embedders and proxies (low resolution, by global position:
        a ConcatSource of its clips, each read from its rendition when it has one)."""
        name = self.video_row(video)["name"]
        clips = self.clip_table(name)
        dirs = [self.clip_dir(name, o) / "rendition" for o in clips["ordinal"]]
        for o in clips["ordinal"]:
            self.check_clip(name, o, again=True)
        return ConcatSource([LowResSource(info, d if d.is_dir() else None)
                             for info, d in zip(self.clip_infos(name), dirs, strict=True)])

    def _pixel_batches(self, name: str, clip_map: ClipMap, oracle: Oracle):
        """Frames for the oracle, clip by clip, through the pipelined runtime: (global
        positions, batch) for ascending positions, each batch what the oracle's `prepare`
        makes of its uint8 N×H×W×3 pixels (on the pipeline's transform thread, ahead of the
        oracle): a clip's oracle rendition when it has one and the oracle reads resized
        frames (`oracle_input`), else its original frames. One decoder works ahead (a
        second took cores the oracle needs), at the caller's priority: niced, it starved
        whenever other work kept the cores busy (two busy processes: a YOLOX scan of
        ua_detrac 8.5 s against 7.7 s, an ORACLE BUDGET 60 query 7.8 s against 2.6 s),
        which costs more than the 10% that nice 10 saved a scan on an idle machine.
        Inside a query, `kept` (engine/labels/decoded.py) serves frames decoded earlier and
        keeps the query's planned frames of the GOPs decoded; frames it serves cost no read
        toward an 'auto' rendition (rent or buy)."""
        def clip_batches(positions: np.ndarray, batch_size: int, kept):
            for o, local, _ in clip_map.pieces(positions):
                self.check_clip(name, o, again=True)
                held = np.zeros(len(local), bool) if kept is None else kept.held[clip_map.first[o] + local]
                write = self._rent_or_buy(name, o, oracle, local[~held])  # the file reads
                clip, stats = self.oracle_input(name, o, oracle, write), DecodeStats()
                yield from clip_pixels(clip, int(clip_map.first[o]), local, batch_size, kept, stats)
                self._learn_decoding(name, o, oracle, stats)

        def batches(positions: np.ndarray, batch_size: int, kept=None):
            return closing(clip_batches(positions, batch_size, kept))

        return batches

    def oracle_input(self, name: str, ordinal: int, oracle: Oracle, write: bool = False) -> OracleInput:
        """What `oracle` reads of a clip: its oracle rendition (`oracle_rendition`, which
        `write` lets an 'auto' video write), with boxes scaled back to the clip's pixels;
        else the clip's file, shrunk and finished by the oracle (its `prepare`)."""
        info = self.clip_info(name, ordinal)
        rendition = self.oracle_rendition(name, ordinal, oracle, write)
        size = (int(info.width), int(info.height))
        if rendition is None:
            return OracleInput(info, oracle.shrink, lambda small: oracle.prepare_shrunk(small, size),
                               oracle.shrunk_size(*size), int(info.frame_count))
        return OracleInput(rendition, lambda frames: frames,
                           lambda frames: oracle.prepare_scaled(frames, size),
                           (int(rendition.info.width), int(rendition.info.height)),
                           int(info.frame_count))

    def oracle_rendition(self, name: str, ordinal: int, oracle: Oracle, write: bool = False):
        """The oracle rendition `oracle` reads of a clip, or None: an oracle that does not
        read resized frames, a video loaded without one, or an 'auto' one that does not pay,
        or is not written yet and not to be (`write`, never in a read-only database).
        Opened, and its file probed, once per process. A lost or damaged rendition that
        LOAD wrote is made again (a read-only database: refused)."""
        setting = _setting(self.video_row(name), "oracle_rendition")
        if setting is None or not oracle.reads_scaled:
            return None
        side = setting
        if setting == AUTO:
            auto = self._auto_rendition(name, ordinal, oracle)
            if auto is None:
                return None
            side = auto[0]
        folder = self.clip_dir(name, ordinal) / (ORACLE_RENDITION if setting != AUTO
                                                  else f"{ORACLE_RENDITION}_{side}")
        key = (name, int(ordinal), folder.name)
        if key not in self._renditions:
            rendition = self._whole_rendition(folder, required=setting != AUTO)
            if rendition is None:
                if setting == AUTO and (not write or self.read_only):
                    return None
                rendition = self._write_oracle_rendition(name, ordinal, folder, side)
            self._renditions[key] = rendition
        return self._renditions[key]

    def _auto_rendition(self, name: str, ordinal: int, oracle: Oracle) -> tuple[int, ReadCost] | None:
        """(long side, estimated ReadCost) of the 'auto' oracle rendition of a clip for
        `oracle`, when its video is 'auto' and the rendition pays (`rendition_pays`); else
        None. Only a detector whose input holds the frame at a long side that `oracle_size`
        reproduces (a square letterbox) gets one: its labels on the rendition are then
        those on the file, to the bit."""
        if _setting(self.video_row(name), "oracle_rendition") != AUTO or not oracle.reads_scaled:
            return None
        info = self.clip_info(name, ordinal)
        size = (int(info.width), int(info.height))
        small = oracle.shrunk_size(*size)
        side = max(small)
        if oracle_size(*size, side) != small or small == size:
            return None
        file = self._file_cost(name, ordinal)
        cost = rendition_cost(file, size, small, ORACLE_GOP)
        return (side, cost) if rendition_pays(file, cost) else None

    def _whole_rendition(self, folder: Path, required: bool):
        """The complete oracle rendition in `folder`, or None; a read-only database refuses
        a missing or damaged one that is `required` (LOAD wrote it)."""
        try:
            rendition = Rendition.load(folder)
            if rendition.info.frame_count == rendition.source_frame_count:  # probed: whole
                return rendition
        except VideoError:
            if self.read_only and required:
                raise
        return None

    def _write_oracle_rendition(self, name: str, ordinal: int, folder: Path, side: int):
        info = self.clip_info(name, ordinal)
        rendition = make_oracle_rendition(info.path, folder, side, progress=self.progress,
                                          info=info)
        save_timing(measure_decode(rendition.info), folder / DECODE_TIMING)
        return rendition
