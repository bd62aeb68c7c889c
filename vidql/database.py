"""`vidql.connect()` and the Database: the public face over the catalog and the executor."""
from __future__ import annotations

import inspect
import tempfile
from pathlib import Path

import duckdb
import pandas as pd

from vidql.api import VideoQuery
from vidql.engine.catalog.catalog import Catalog, oracle_rendition_setting
from vidql.engine.catalog.indexstore import IndexStore
from vidql.base.errors import CatalogError, OracleError, ParameterError, VideoError, VidqlError
from vidql.engine.sql.sqlnames import ORACLE_KINDS
from vidql.engine.catalog.ray_executor import executor_name, make_executor
from vidql.engine.executor import execute_script
from vidql.engine.labels.cache import LabelCache
from vidql.engine.sql.framestat import frame_statistic


STORE_CATALOG = "vidql_store"
LOCK_REMEDY = ("\nDuckDB lets one process write a database file or several read it. Close the "
               "process named above (a `vidql shell` holds the file only while a statement "
               "runs), or open the file with --read-only (vidql.connect(..., read_only=True)) "
               "in every process that only reads it.")


def artifacts_dir_for(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".artifacts")


class Database:
    """A vidql database: a DuckDB file plus a folder of artifacts beside it.

    `path=None` gives an in-memory database with a temporary artifact folder. With
    `read_only`, several processes can open the file at once; nothing can be written
    (no new labels, catalog changes or tables)."""

    def __init__(self, path: str | Path | None = None, *, progress: bool = True,
                 read_only: bool = False, executor: str | None = None,
                 workers: int | None = None):
        executor = executor_name(executor)  # checked before anything opens
        self._tmp = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vidql-")
            self.path = None
            con = duckdb.connect(":memory:")
            artifacts = Path(self._tmp.name)
        else:
            self.path = Path(path)
            if self.path.exists() and self.path.is_dir():
                raise VidqlError(f"database path '{self.path}' is a folder; give a file name, "
                                 f"e.g. '{self.path / 'vidql.db'}'")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:  # a fixed catalog name: DuckDB would name it after the file, which may clash
                con = duckdb.connect(":memory:")  # with a video's schema (night.db, night.objects)
                con.execute(f"ATTACH '{self.path.as_posix().replace(chr(39), chr(39) * 2)}' "
                            f"AS {STORE_CATALOG}{' (READ_ONLY)' if read_only else ''}")
                con.execute(f"USE {STORE_CATALOG}")
            except duckdb.Error as exc:
                raise VidqlError(f"cannot open database '{self.path}': {exc}"
                                 + (LOCK_REMEDY if "lock" in str(exc).lower() else "")) from None
            artifacts = artifacts_dir_for(self.path)
        self._con = con  # the user's (`con`); vidql's own statements run on a cursor of it
        self.read_only = read_only and path is not None
        self.catalog = Catalog(self._engine_connection(con), artifacts, progress=progress,
                               read_only=self.read_only)
        self.indexes = IndexStore(self.catalog)
        self.progress = progress
        self.last_report = None  # the report of the last query run through sql()
        self.executor = "local"
        self.sampling = "cheaper"  # SET SAMPLING: scan exactly where that is priced cheaper
        try:
            self.set_executor(executor, workers)
            if not self.read_only:
                self.indexes.recover(progress=progress)
        except BaseException:
            self.close()
            raise

    def _engine_connection(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        """A connection of its own for vidql's statements (catalog, labels, queries), so a
        result the user leaves open on `con` never blocks them."""
        engine = con.cursor()
        if self.path is not None:
            engine.execute(f"USE {STORE_CATALOG}")
        return engine

    # ---- lifecycle ----------------------------------------------------------------
    def close(self) -> None:
        try:
            self.indexes.close()  # a query's cracking finishes and is saved
        finally:
            self.catalog.close()  # merges pending labels, stops Ray oracle actors
            self._con.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection, for SQL of your own; labels waiting in the label journal
        are merged into the catalog tables first, so `vidql.labels` reads them."""
        self.catalog.flush_labels()
        return self._con

    @property
    def artifacts(self) -> Path:
        return self.catalog.artifacts

    def set_executor(self, executor: str | None, workers: int | None = None) -> None:
        """SET EXECUTOR: 'local' (this process), 'ray' (the Ray cluster of $RAY_ADDRESS, or a
        local one) or 'ray://host:port'; None reads $VIDQL_EXECUTOR. `workers`: Ray oracle
        actors and embedding tasks at a time (default: the cluster's CPUs)."""
        name = executor_name(executor)
        if name != self.executor or workers is not None:
            self.catalog.set_executor(make_executor(name, workers))
            self.executor = name

    # ---- catalog ------------------------------------------------------------------
    def load_video(self, path, name: str | None = None, *, rendition: int | None = None,
                   skip_bad: bool = False, into: bool = False,
                   oracle_rendition: int | str | None = None) -> dict:
        """Probe video files and register table `name(clip, frame, ts, start_ts)`: `path` is
        a file, a glob ('clips/*.mp4'), a folder or a list of files (one clip each); `into`
        appends them as clips of the existing video `name` (and extends its indexes).
        A file that cannot be read fails the load unless `skip_bad`; one whose content is a
        clip of the video already is left out. `rendition` (short side px) keeps a low-res
        copy for embedders; `oracle_rendition` (the oracle's input long side px, e.g. 416)
        keeps a lossless short-GOP copy at that size which oracles that read resized
        frames (ONNX detectors) label from; 'auto' (the default for a new video) lets each
        such detector write one at its input size on first use where the cost model says
        random reads of a clip are costly; 'none' never. Returns the video's
        row with `skipped`: the (path, reason) of files left out, and `indexes`: for each
        index extended over appended clips, the frames added (or why it was not)."""
        if name is None:
            if not isinstance(path, (str, Path)) or any(ch in str(path) for ch in "*?["):
                raise ParameterError("name the video: load_video(paths, 'name')")
            name = Path(path).stem.replace("-", "_").replace(".", "_")
        oracle_rendition = oracle_rendition_setting(oracle_rendition)
        row, skipped = self.catalog.add_video(path, name, rendition=rendition,
                                              oracle_rendition=oracle_rendition,
                                              skip_bad=skip_bad, into=into)
        extended = self.indexes.finish_extensions(progress=self.progress).get(row["name"], {}) \
            if into else {}
        return {**row, "skipped": skipped, "indexes": extended}

    def drop_video(self, name: str) -> None:
        """Drop a video with its labels and indexes."""
        self.indexes.drop_for_video(self.catalog.video_row(name)["name"])
        self.catalog.drop_video(name)

    def set_video_path(self, name: str, path: str | Path, clip: str | None = None) -> dict:
        """ALTER VIDEO name SET PATH: point a video (or its clip `clip`) at its moved or
        copied file (same content); labels and indexes stay. Other content raises VideoError."""
        try:
            return self.catalog.set_video_path(name, path, clip)
        except VidqlError:
            raise
        except OSError as exc:  # e.g. /proc/self/mem: a name that is no readable file
            raise VideoError(path, f"cannot read it ({exc.strerror or exc}); give the path of "
                                   f"the moved video file") from None

    def videos(self) -> pd.DataFrame:
        return self.catalog.videos()

    def create_oracle(self, name: str, kind: str, source: str, *, replace: bool = False,
                      **options):
        """CREATE [OR REPLACE] ORACLE: the oracle's identity (the digest of its source files
        and its options) is fixed here; `replace=True` adopts a new version of `name`."""
        for what, value in (("name", name), ("kind", kind)):
            if not isinstance(value, str):
                raise OracleError(f"create_oracle takes the oracle's {what} as a string, got "
                                  f"{value!r}; kinds: {', '.join(ORACLE_KINDS)}")
        if not isinstance(source, (str, Path)):
            raise OracleError(f"create_oracle takes the oracle's source as a path or string, "
                              f"got {source!r}")
        return self.catalog.add_oracle(name, kind, str(source), options, replace=replace)

    def drop_oracle(self, name: str, *, if_exists: bool = False) -> int:
        """DROP ORACLE (refused while a video uses it by default); returns the number of
        labelled frames that stay cached under its identity."""
        if if_exists and name.lower() not in map(str.lower, self.catalog.oracle_names()):
            return 0
        return self.catalog.drop_oracle(name)

    def set_oracle(self, video: str, oracle: str) -> None:
        self.catalog.set_oracle(video, oracle)

    def oracles(self) -> pd.DataFrame:
        return self.catalog.oracles()

    def labels(self, video: str, oracle: str | None = None) -> LabelCache:
        """The durable label cache of a video (for its default oracle unless named)."""
        return self.catalog.label_cache(video, oracle)

    def create_index(self, name: str, video: str, *, oracle: str | None = None, **options):
        """Build a TASTI index (options: train, reps, k, seed, embedder, size, dim, triplets)."""
        return self.indexes.create(name, video, options, oracle=oracle, progress=self.progress)

    def proxy(self, video: str, statistic: str, *, index: str | None = None):
        """Proxy scores of a frame statistic (e.g. "objects('car')") for every frame."""
        cache = self.labels(video)
        name, idx = self.indexes.for_video(self.catalog.video_row(video)["name"], index,
                                           cache.oracle.identity)
        if idx is None:
            raise CatalogError(f"video {video!r} has no index for oracle {cache.oracle.name!r}: "
                               f"CREATE INDEX ... ON {video} USING TASTI")
        return idx.proxy(frame_statistic(statistic))

    # ---- queries ------------------------------------------------------------------
    def video(self, name: str):
        """Start a Python query over a video: `db.video("night").where(...).select(...)`."""
        return VideoQuery(self, self.catalog.video_row(name)["name"])

    def sql(self, query: str):
        """Run one statement or a `;`-separated script; returns the last one's Result (None
        for a statement without rows). The caller's Result variables read as tables by name."""
        caller = inspect.currentframe().f_back
        return execute_script(self, query, {**caller.f_globals, **caller.f_locals})

    def __repr__(self) -> str:
        where = "in memory" if self.path is None else str(self.path)
        return f"<vidql.Database {where}: {len(self.catalog.video_names())} videos>"


def connect(path: str | Path | None = None, *, progress: bool = True,
            read_only: bool = False, executor: str | None = None,
            workers: int | None = None) -> Database:
    """Open or create a vidql database (in memory when `path` is None; `read_only` opens an
    existing file for reading, which other processes may read at the same time).
    `executor`: 'local' (default, or $VIDQL_EXECUTOR), 'ray' or 'ray://host:port' runs
    labelling and index embedding on a Ray cluster (`pip install vidql[ray]`), with
    `workers` actors (default: the cluster's CPUs)."""
    return Database(path, progress=progress, read_only=read_only, executor=executor,
                    workers=workers)


__all__ = ["connect", "Database"]
