"""Run parsed statements: catalog statements, plain DuckDB SQL, exact and approximate queries."""
from __future__ import annotations

import duckdb
import pandas as pd

from .dialect import (CreateIndex, CreateOracle, DropIndex, DropVideo, LoadVideo, PlainSQL,
                      Query, SetOracle, ShowIndexes, ShowOracles, ShowVideos, parse_script)
from .errors import ParameterError, QueryError
from .exact import run_exact
from .framestat import parse_frame_expr


def execute_script(db, text: str):
    """Run every statement of `text` in order; return the last one's result."""
    result = None
    for statement in parse_script(text):
        result = execute(db, statement)
    return result


def _frame(db, df: pd.DataFrame) -> duckdb.DuckDBPyRelation:
    return db.con.from_df(df)


def _message(db, text: str) -> duckdb.DuckDBPyRelation:
    return _frame(db, pd.DataFrame({"result": [text]}))


def execute(db, stmt):
    """Run one statement; returns a DuckDB relation (or None for statements without rows)."""
    if isinstance(stmt, LoadVideo):
        options = dict(stmt.options)
        rendition = options.pop("rendition", None)
        if options:
            raise ParameterError(f"unknown LOAD VIDEO option(s) {', '.join(sorted(options))}; "
                                 f"allowed: rendition")
        db.load_video(stmt.path, stmt.name, rendition=rendition)
        return _frame(db, db.videos().query("name == @stmt.name"))
    if isinstance(stmt, ShowVideos):
        return _frame(db, db.videos())
    if isinstance(stmt, DropVideo):
        if stmt.if_exists and stmt.name.lower() not in map(str.lower, db.catalog.video_names()):
            return _message(db, f"no video {stmt.name}")
        db.drop_video(stmt.name)
        return _message(db, f"dropped video {stmt.name}")
    if isinstance(stmt, CreateOracle):
        oracle = db.create_oracle(stmt.name, stmt.kind, stmt.source, **stmt.options)
        return _message(db, f"created oracle {stmt.name}: {oracle.identity}")
    if isinstance(stmt, SetOracle):
        db.set_oracle(stmt.video, stmt.oracle)
        return _message(db, f"oracle of {stmt.video} is {stmt.oracle}")
    if isinstance(stmt, ShowOracles):
        return _frame(db, db.oracles())
    if isinstance(stmt, CreateIndex):
        index = db.create_index(stmt.name, stmt.video, **stmt.options)
        used, new = index.stats["oracle_calls"], index.stats["newly_labelled"]
        return _message(db, f"created index {stmt.name}: {index!r}, {new} frames newly "
                            f"labelled by the oracle ({used - new} of its {used} labels were "
                            "cached)")
    if isinstance(stmt, ShowIndexes):
        return _frame(db, db.indexes.table())
    if isinstance(stmt, DropIndex):
        if stmt.name.lower() in map(str.lower, db.indexes.names()):
            db.indexes.drop(stmt.name)
            return _message(db, f"dropped index {stmt.name}")
        return _plain(db, f"DROP INDEX {'IF EXISTS ' if stmt.if_exists else ''}{stmt.name}")
    if isinstance(stmt, PlainSQL):
        return _plain(db, stmt.sql)
    if isinstance(stmt, Query):
        return _query_result(db, stmt).relation
    raise TypeError(f"unknown statement {stmt!r}")


def _plain(db, sql: str):
    try:
        rel = db.con.sql(sql)
    except duckdb.Error as exc:
        raise QueryError(f"DuckDB: {exc}", sql) from None
    return rel


def _query_result(db, q: Query):
    """Run a query (exact, approximate or EXPLAIN); returns a planner.Result."""
    from .planner import explain, run_approximate

    if q.explain:
        result = explain(db, q)
    elif q.kind == "exact":
        result = _exact(db, q)
    else:
        result = run_approximate(db, q)
    db.last_report = result.report
    return result


def _exact(db, q: Query):
    from .planner import Report, Result

    videos = db.catalog.video_names()
    lower = {v.lower(): v for v in videos}
    uses_functions = bool(parse_frame_expr(q.sql).functions)
    read = []  # videos whose labels the query needs
    for table in q.tables:
        parts = table.lower().split(".")
        reads_labels = len(parts) == 2 and parts[1] == "objects" or uses_functions
        if parts[0] in lower and reads_labels and lower[parts[0]] not in read:
            read.append(lower[parts[0]])
    ranges = {}
    single = q.video or (q.tables[0] if len(q.tables) == 1 else None)  # `night` or `night.objects`
    if single is not None and q.frame_range is not None and single.split(".")[0].lower() in lower:
        lo, hi = q.frame_range
        ranges[lower[single.split(".")[0].lower()]] = (lo, None if hi is None else hi + 1)
    relation, stats = run_exact(db.catalog, q.sql, read, ranges, oracle=q.clauses.oracle)
    report = Report(operator="exact", video=", ".join(read) or None,
                    oracle=q.clauses.oracle, guarantee="exact")
    report.add_stats(stats)
    return Result(relation, report)
