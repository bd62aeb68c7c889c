"""Run parsed statements: catalog statements, plain DuckDB SQL, exact and approximate queries."""
from __future__ import annotations

import time
from contextlib import contextmanager

import duckdb
import pandas as pd

from vidql.engine.sql.dialect import (AlterVideoPath, AlterVideoStart, CreateIndex, CreateOracle, DropIndex,
                      DropOracle, DropVideo, LoadVideo, PlainSQL, Query, RefreshIndex, SetExecutor, SetSampling,
                      SetOracle, ShowClips, ShowIndexes, ShowOracles, ShowVideos, WriteResult,
                      describe, script_statements)
from vidql.engine.sql.dialect_lex import tokenize
from vidql.engine.sql.sqlnames import quote_name
from vidql.base.errors import CatalogError, ParameterError, QueryError, VidqlError
from vidql.engine.exact import label_bounds, label_reads, run_exact
from vidql.engine.sql.framestat import parse_frame_expr
from vidql.engine.labels.cache import on_terminal
from vidql.engine.catalog.indexstore import describe_extensions
from vidql.engine.result import Report, Result
from vidql.preprocess.rendition import SHORT_SIDE


CATALOG_WRITES = (LoadVideo, DropVideo, CreateOracle, DropOracle, SetOracle, AlterVideoPath,
                  AlterVideoStart, CreateIndex, DropIndex, RefreshIndex)


def execute_script(db, text: str, scope: dict | None = None):
    """Run every statement of `text` in order; return the last one's result. Results,
    relations and data frames among `scope` (the caller's variables) are read by name where
    no table has that name, as DuckDB does (`r = db.sql(...)`, `db.sql("SELECT * FROM r")`)."""
    results = [result for _, result in execute_each(db, text, scope)]
    return results[-1] if results else None


def execute_each(db, text: str, scope: dict | None = None):
    """`execute_script`, yielding (statement text, its result) as each statement finishes."""
    statements = script_statements(text)
    with _readable_results(db.catalog.con, text, scope or {}):
        for written, statement in statements:
            if db.read_only and isinstance(statement, CATALOG_WRITES):
                raise CatalogError(f"the database is open read-only and this statement writes "
                                   f"({describe(statement)}): open it without --read-only")
            yield written, execute(db, statement)


@contextmanager
def _readable_results(con, text: str, scope: dict):
    """Register the readable values of `scope` that `text` names and no table does, while
    it runs."""
    words = {tok.text.strip('"').lower() for tok in tokenize(text)}
    named = {name: value.table if isinstance(value, Result) else value
             for name, value in scope.items() if name.lower() in words
             and isinstance(value, (Result, duckdb.DuckDBPyRelation, pd.DataFrame))}
    if named:
        tables = {row[0].lower() for row in
                  con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        named = {name: value for name, value in named.items() if name.lower() not in tables}
    for name, value in named.items():
        con.register(name, value)
    try:
        yield
    finally:
        for name in named:
            con.unregister(name)


def _frame(db, df: pd.DataFrame) -> Result:
    return Result.of(db.catalog.con, df)


def _message(db, text: str) -> Result:
    return _frame(db, pd.DataFrame({"result": [text]}))


def _load_video(db, stmt: LoadVideo) -> Result:
    """The video's SHOW VIDEOS row; with a `skipped` column naming the files skip_bad left
    out and why, and (INTO) an `indexes` column saying how each index was extended."""
    options = dict(stmt.options)
    rendition = _load_rendition(options.pop("rendition", None), stmt.into)
    oracle_rendition = options.pop("oracle_rendition", None)
    skip_bad = options.pop("skip_bad", False)
    if options:
        raise ParameterError(f"unknown LOAD VIDEO option(s) {', '.join(sorted(options))}; "
                             f"allowed: oracle_rendition, rendition, skip_bad")
    if not isinstance(skip_bad, bool):
        raise ParameterError(f"LOAD VIDEO option skip_bad must be true or false, got {skip_bad!r}")
    row = db.load_video(stmt.path, stmt.name, rendition=rendition, skip_bad=skip_bad,
                        into=stmt.into, oracle_rendition=oracle_rendition)
    frame = db.videos().query("name == @row['name']")
    if row["skipped"]:
        frame = frame.assign(skipped="; ".join(f"'{p}': {why}" for p, why in row["skipped"]))
    if row["indexes"]:
        frame = frame.assign(indexes=describe_extensions(row["indexes"]))
    return _frame(db, frame)


def _load_rendition(rendition, into: bool) -> int | None:
    """LOAD VIDEO's `rendition` option, checked (refused on INTO: the collection's own)."""
    if rendition is None:
        return None
    if into:
        raise ParameterError("LOAD VIDEO ... INTO takes the collection's rendition setting; "
                             "leave out rendition")
    return SHORT_SIDE.check("LOAD VIDEO option rendition (short side in pixels)", rendition)


def _drop_video(db, stmt: DropVideo) -> Result:
    if stmt.if_exists and stmt.name.lower() not in map(str.lower, db.catalog.video_names()):
        return _message(db, f"no video {stmt.name}")
    db.drop_video(stmt.name)
    return _message(db, f"dropped video {stmt.name}")


def _alter_video_path(db, stmt: AlterVideoPath) -> Result:
    db.set_video_path(stmt.name, stmt.path, clip=stmt.clip)
    return _frame(db, db.videos().query("name == @stmt.name"))


def _alter_video_start(db, stmt: AlterVideoStart) -> Result:
    return _frame(db, db.catalog.set_clip_start(stmt.name, stmt.clip, _start_time(stmt.start)))


def _start_time(text: str | None) -> pd.Timestamp | None:
    """A clip's start time as written in ALTER VIDEO ... SET START, or a ParameterError."""
    if text is None:
        return None
    try:
        return pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ParameterError(f"SET START {text!r} is not a time ({exc}); write e.g. "
                             f"TIMESTAMP '2026-11-02 08:00:00'") from None


def _create_oracle(db, stmt: CreateOracle) -> Result:
    oracle = db.create_oracle(stmt.name, stmt.kind, stmt.source, replace=stmt.replace,
                              **stmt.options)
    return _message(db, f"{'replaced' if stmt.replace else 'created'} oracle {stmt.name}: "
                        f"{oracle.identity}")


def _drop_oracle(db, stmt: DropOracle) -> Result:
    if stmt.if_exists and stmt.name.lower() not in map(str.lower, db.catalog.oracle_names()):
        return _message(db, f"no oracle {stmt.name}")
    kept = db.drop_oracle(stmt.name)
    return _message(db, f"dropped oracle {stmt.name}; its {kept} labelled frames stay cached "
                        f"and are reused if an oracle with the same source is created")


def _set_oracle(db, stmt: SetOracle) -> Result:
    db.set_oracle(stmt.video, stmt.oracle)
    return _message(db, f"oracle of {stmt.video} is {stmt.oracle}")


def _set_executor(db, stmt: SetExecutor) -> Result:
    db.set_executor(stmt.executor)
    return _message(db, f"executor is {stmt.executor}")


def _set_sampling(db, stmt: SetSampling) -> Result:
    db.sampling = stmt.mode
    return _message(db, f"sampling is {stmt.mode}")


def _create_index(db, stmt: CreateIndex) -> Result:
    index = db.create_index(stmt.name, stmt.video, **stmt.options)
    used, new = index.stats["oracle_calls"], index.stats["newly_labelled"]
    note = index.stats.get("note")
    return _message(db, f"created index {stmt.name}: {index!r}, {new} frames newly "
                        f"labelled by the oracle ({used - new} of its {used} labels were "
                        f"cached); embedding: {index.stats['embedding']}" + (f" ({note})" if note else ""))


def _refresh_index(db, stmt: RefreshIndex) -> Result:
    index = db.indexes.refresh(stmt.name, progress=db.progress)
    used, new = index.stats["oracle_calls"], index.stats["newly_labelled"]
    return _message(db, f"refreshed index {stmt.name}: {index!r}, retrained over "
                        f"{index.n_frames} frames, {new} frames newly labelled by the oracle "
                        f"({used - new} of its {used} labels were cached)")


def _drop_index(db, stmt: DropIndex) -> Result | None:
    if stmt.name.lower() in map(str.lower, db.indexes.names()):
        db.indexes.drop(stmt.name)
        return _message(db, f"dropped index {stmt.name}")
    duckdb_index = db.catalog.con.execute(
        "SELECT count(*) FROM duckdb_indexes() WHERE lower(index_name) = lower(?)",
        [stmt.name]).fetchall()[0][0]
    if not (duckdb_index or stmt.if_exists):
        raise CatalogError(f"unknown index {stmt.name!r}; indexes: "
                           f"{', '.join(db.indexes.names()) or 'none'}")
    return _plain(db, f"DROP INDEX {'IF EXISTS ' if stmt.if_exists else ''}{quote_name(stmt.name)}")


_HANDLERS = {
    LoadVideo: _load_video,
    ShowVideos: lambda db, stmt: _frame(db, db.videos()),
    ShowClips: lambda db, stmt: _frame(db, db.catalog.clips(stmt.name)),
    AlterVideoStart: _alter_video_start,
    DropVideo: _drop_video,
    AlterVideoPath: _alter_video_path,
    CreateOracle: _create_oracle,
    DropOracle: _drop_oracle,
    SetOracle: _set_oracle,
    SetExecutor: _set_executor,
    SetSampling: _set_sampling,
    ShowOracles: lambda db, stmt: _frame(db, db.oracles()),
    CreateIndex: _create_index,
    RefreshIndex: _refresh_index,
    ShowIndexes: lambda db, stmt: _frame(db, db.indexes.table()),
    DropIndex: _drop_index,
    PlainSQL: lambda db, stmt: _plain(db, stmt.sql),
    Query: lambda db, stmt: run_query(db, stmt),
    WriteResult: lambda db, stmt: write_result(db, stmt),
}


def execute(db, stmt):
    """Run one statement; returns a Result (None for statements without rows)."""
    handler = _HANDLERS.get(type(stmt))
    if handler is None:
        raise TypeError(f"unknown statement {stmt!r}")
    return handler(db, stmt)


def _plain(db, sql: str) -> Result | None:
    db.catalog.flush_labels()  # the statement may read vidql.labels
    try:
        rel = db.catalog.con.sql(sql)
        return None if rel is None else Result.of(db.catalog.con, rel)
    except duckdb.Error as exc:
        raise QueryError(f"DuckDB: {exc}", sql) from None


def write_result(db, stmt: WriteResult) -> Result | None:
    """COPY (query) TO ... / CREATE TABLE ... AS query: run the query, then let DuckDB write
    its rows. The answer says how many rows were written, with the query's report; a query
    that reads no video is DuckDB's alone."""
    q = stmt.query
    videos = {v.lower() for v in db.catalog.video_names()}
    if q.kind == "exact" and not any(t.split(".")[0].lower() in videos for t in q.tables):
        return _plain(db, stmt.sql)
    result = run_query(db, q)
    con = db.catalog.con
    name = f"vidql_result_{id(result)}"
    result.relation.create_view(name)
    try:
        _plain(db, f"{stmt.before}SELECT * FROM {quote_name(name)}{stmt.after}")
    finally:
        con.execute(f"DROP VIEW IF EXISTS {quote_name(name)}")
    rows = f"{len(result)} row{'' if len(result) == 1 else 's'}"
    answer = _message(db, f"wrote {rows}: {' '.join(stmt.before.split())}<query>"
                          f"{' '.join(stmt.after.split())}")
    answer.report = result.report
    return answer


def run_query(db, q: Query) -> Result | None:
    """Run a query (exact, approximate or EXPLAIN); the Result carries its report."""
    from vidql.engine.explain import explain
    from vidql.engine.planner import run_approximate
    from vidql.engine.scan_choice import as_aggregate, scan_is_cheaper

    with db.catalog.statement():
        if q.explain:
            result = explain(db, q)
        elif q.kind == "exact":
            result = _exact(db, q)
        elif why := scan_is_cheaper(db, q):
            result = as_aggregate(db, _exact(db, q), q, why)
        else:
            with _forecast(db, q):
                result = run_approximate(db, q)
    if result is not None:
        result.query, result.catalog = q.text, db.catalog  # to show the frames its rows name
    db.last_report = None if result is None else result.report
    return result


@contextmanager
def _forecast(db, q: Query):
    """While `q` runs, its label cache's `forecast`: EXPLAIN's estimate of its oracle calls
    (which labels nothing: the oracle is not timed for it), the total of its progress bar
    where no ORACLE BUDGET gives one. Computed only where the bar is drawn; a query the
    estimate refuses raises its own error."""
    cache, calls = _forecast_calls(db, q) if db.progress and on_terminal() \
        and q.clauses.budget is None else (None, None)
    if cache is None:
        yield
        return
    cache.forecast = calls
    try:
        yield
    finally:
        cache.forecast = None


def _forecast_calls(db, q: Query):
    """(the query's label cache, its forecast oracle calls), or (None, None)."""
    from vidql.engine.explain import estimated_calls
    from vidql.engine.planner import Binding

    try:
        b = Binding(db, q)
        return b.cache, estimated_calls(q, b)
    except VidqlError:
        return None, None


def _exact(db, q: Query):
    videos = db.catalog.video_names()
    lower = {v.lower(): v for v in videos}
    uses_functions = bool(parse_frame_expr(q.sql).functions)
    tables = []  # the video tables it reads, labelled or not
    for table in q.tables:
        video = lower.get(table.split(".")[0].lower())
        if video is not None and video not in tables:
            db.catalog.ensure_video_relations(video)
            tables.append(video)
    read = label_reads(videos, q.tables, uses_functions)
    t0 = time.perf_counter()
    result, stats = run_exact(db.catalog, q.sql, read, label_bounds(q, videos),
                              oracle=q.clauses.oracle)
    report = Report(operator="exact", video=", ".join(tables) or None,
                    oracle=q.clauses.oracle, guarantee="exact")
    report.seconds["total"] = time.perf_counter() - t0
    report.add_stats(stats)
    oracles = {db.catalog.label_cache(v, q.clauses.oracle).oracle for v in read}
    costs = {oracle.simulated_cost_ms for oracle in oracles}
    report.simulated_cost_ms = costs.pop() if len(costs) == 1 else None
    if result is not None:
        result.report = report
    return result
