"""Exact execution: the oracle labels every frame a query needs, then DuckDB answers.

Frame-function calls are replaced by columns of a temporary table that shadows the video
table for the query (frame, ts and one column per call). Frames that are not labelled
get NULL there, never a made-up 0.
"""
from __future__ import annotations

import duckdb
import numpy as np

from vidql.engine.catalog.catalog import Catalog, quote_name
from vidql.engine.labels.clips import ClipMap
from vidql.engine.sql.dialect_statements import Query
from vidql.base.errors import QueryError
from vidql.engine.sql.framestat import FrameExpr, frame_table_sql, parse_frame_expr
from vidql.engine.labels.cache import LabelStats
from vidql.engine.labels.oracle_api import check_labels
from vidql.engine.result import Result


def label_bounds(q: Query, videos: list[str]) -> dict[str, tuple[tuple[str, ...], str | None, bool]]:
    """{video: (restriction parts, alias, of_objects)} for the one video table an exact
    query `q` reads once, in its FROM, as `night` or as `night.objects` (of_objects), when
    its WHERE has parts without frame functions (dialect_query `_exact_where`): only the
    frames they keep need labels. Another read of that video (a subquery, its `objects`)
    needs every frame, and then `q` has no bounds."""
    if not q.restriction_parts:
        return {}
    single = q.video or (q.tables[0] if len(q.tables) == 1 else None)  # `night` or `night.objects`
    names = {v.lower(): v for v in videos}
    video = names.get(single.split(".")[0].lower()) if single is not None else None
    return {} if video is None else {video: (q.restriction_parts, q.video_alias, "." in single)}


def kept_sql(video: str, restriction: str | None, alias: str | None, key: str | None = None) -> str:
    """SQL (parameter: the video's name) for the frames of `video` that `restriction` (SQL
    over the video table's columns, its table named `alias` if given) keeps, in
    global-position order: column `position`, and `k`, the value of the expression `key`
    over the video table's columns, when given."""
    named = f" AS {quote_name(alias)}" if alias else ""
    kept = f"SELECT {f'({key}) AS k, ' if key else ''}clip, frame FROM main.{quote_name(video)}{named}"
    if restriction:
        kept += f" WHERE {restriction}"
    return (f"SELECT {'v.k, ' if key else ''}c.first_frame + v.frame AS position FROM "
            f"({kept}) v JOIN (SELECT clip AS c_clip, first_frame FROM vidql.clips WHERE "
            f"video = ?) c ON v.clip = c.c_clip ORDER BY position")


def needed_frames(con: duckdb.DuckDBPyConnection, video: str, clip_map: ClipMap,
                  bounds: tuple[tuple[str, ...], str | None, bool] | None) -> np.ndarray:
    """Global positions, ascending, of the frames of `video` that an exact query bounded by
    `bounds` (`label_bounds`) reads: those its restriction keeps, evaluated on the video
    table. On `video.objects`, the parts that name a column of detections (`label`) keep
    every frame. None: every frame."""
    parts, alias, of_objects = bounds or ((), None, False)
    if of_objects:
        parts = [p for p in parts if _binds(con, video, p, alias)]
    if not parts:
        every = [first + np.arange(count) for first, count in zip(clip_map.first, clip_map.counts, strict=True)]
        return np.concatenate(every).astype(np.int64) if every else np.empty(0, dtype=np.int64)
    restriction = " AND ".join(parts)
    try:
        got = con.execute(kept_sql(video, restriction, alias), [video]).fetchnumpy()
    except duckdb.Error as exc:
        raise QueryError(f"cannot apply the frame restriction {restriction!r}: {exc}") from None
    return np.asarray(got["position"], dtype=np.int64)


def _binds(con: duckdb.DuckDBPyConnection, video: str, part: str, alias: str | None) -> bool:
    """Whether `part` of a WHERE can be evaluated on the video table's columns."""
    try:
        con.execute(kept_sql(video, part, alias) + " LIMIT 0", [video])
        return True
    except duckdb.Error:
        return False


def label_reads(videos: list[str], tables: list[str], uses_functions: bool) -> list[str]:
    """The videos of `videos` whose labels a query over `tables` needs: those it reads as
    `video.objects`, and any video table it reads when `uses_functions` (frame functions)."""
    lower = {v.lower(): v for v in videos}
    read = []
    for table in tables:
        parts = table.lower().split(".")
        video = lower.get(parts[0])
        reads_objects = len(parts) == 2 and parts[1] == "objects"
        if video is not None and (reads_objects or uses_functions) and video not in read:
            read.append(video)
    return read


def run_exact(catalog: Catalog, sql: str, videos: list[str],
              bounds: dict[str, tuple] | None = None, oracle: str | None = None
              ) -> tuple[Result | None, LabelStats]:
    """Run `sql` exactly. `videos` are the video tables it reads (`night` or `night.objects`);
    `bounds` (`label_bounds`) optionally limits the frames labelled per video. Returns the
    result (materialised, so it stays valid) and what labelling cost."""
    expr = bind_query(catalog, sql, videos, oracle)
    stats = LabelStats()
    shadows, variables = [], []
    try:
        for video in videos:
            cache = catalog.label_cache(video, oracle)
            before = cache.stats.snapshot()
            frames = needed_frames(catalog.con, video, cache.clip_map,
                                   (bounds or {}).get(video))
            cache.ensure(frames, desc=f"exact query: labelling {video}")
            stats = stats.plus(cache.stats.since(before))
            catalog.flush_labels()  # the shadow table reads the labels from the catalog tables
            variables.append(catalog.oracle_variable(video))
            catalog.con.execute(f"SET VARIABLE {quote_name(variables[-1])} = ?", [cache.oracle.identity])
            if expr.functions:
                shadows.append(_shadow_video(catalog, video, cache.oracle.identity, expr.functions))
        catalog.flush_labels()  # a query may name vidql.labels itself
        try:
            rel = catalog.con.sql(expr.sql)
        except duckdb.Error as exc:
            raise QueryError(f"DuckDB cannot run the query: {exc}", sql) from None
        if rel is None:
            return None, stats
        return Result.of(catalog.con, _named_as_written(rel, expr)), stats
    finally:
        for name in shadows:
            catalog.con.execute(f"DROP TABLE IF EXISTS temp.{quote_name(name)}")
        for name in variables:
            catalog.con.execute(f"RESET VARIABLE {quote_name(name)}")


def _named_as_written(rel: duckdb.DuckDBPyRelation, expr: FrameExpr) -> duckdb.DuckDBPyRelation:
    """`rel` with a column DuckDB named after a suffixed frame-function column
    (`objects('Car') #1a2b3c4d`, see FrameFunction.column) named as the call, where no other
    column has that name in any case."""
    taken = {name.lower() for name in rel.columns}
    renames = []
    for fn in expr.functions:
        suffixed = fn.column[1:-1].replace('""', '"')
        if (suffixed != fn.canonical and rel.columns.count(suffixed) == 1
                and fn.canonical.lower() not in taken):
            renames.append(f"{fn.column} AS {quote_name(fn.canonical)}")
            taken.add(fn.canonical.lower())
    return rel.project(f"* RENAME ({', '.join(renames)})") if renames else rel


def bind_query(catalog: Catalog, sql: str, videos: list[str],
               oracle: str | None = None) -> FrameExpr:
    """Bind `sql` (frame functions and all) against its video tables before any oracle
    call, so that an unknown column or function costs no labelling: DuckDB binds the
    query over an empty table with the video's columns and a column per frame function,
    without running it.
    A frame function of a label the video's oracle can never give is refused here too.
    Returns the query's frame expression."""
    expr = parse_frame_expr(sql)
    if expr.functions and len(videos) != 1:
        raise QueryError("frame functions such as objects('car') need exactly one video table "
                         f"in the query; it reads {', '.join(videos) or 'none'}", sql, 0,
                         hint=f"videos: {', '.join(catalog.video_names()) or 'none loaded'}")
    shadows = []
    try:
        if expr.functions:
            for video in videos:
                # an unknown or changed oracle, or a class it has not: an error now
                check_labels(catalog.label_cache(video, oracle).oracle,
                             [fn.label for fn in expr.functions], sql)
                shadows.append(_empty_shadow(catalog, video, expr.functions))
        catalog.con.sql(expr.sql)
    except duckdb.Error as exc:
        raise QueryError(f"DuckDB cannot run the query: {exc}", sql) from None
    finally:
        for name in shadows:
            catalog.con.execute(f"DROP TABLE IF EXISTS temp.{quote_name(name)}")
    return expr


def _empty_shadow(catalog: Catalog, video: str, functions) -> str:
    """Create an empty temp table `video` with the columns and types of `_shadow_video`'s
    (a count is BIGINT, `contains` BOOLEAN): enough to bind a query, and no join to run."""
    q = quote_name(video)
    cols = ", ".join(f"{'0::BIGINT' if fn.kind == 'objects' else 'false'} AS {fn.column}"
                     for fn in functions)
    catalog.con.execute(f"CREATE OR REPLACE TEMP TABLE {q} AS SELECT clip, frame, ts, start_ts, "
                        f"{cols} FROM main.{q} LIMIT 0")
    return video


def _shadow_video(catalog: Catalog, video: str, identity: str, functions) -> str:
    """Create temp table `video` (shadowing main.video) with a column per frame function.
    Frames are joined to labels by global position (clip's first frame + frame)."""
    q = quote_name(video)
    v, o = _literal(video), _literal(identity)
    labelled = (f"(SELECT c.first_frame + v.frame AS frame, c.first_frame + v.frame AS __position, "
                f"v.clip AS __clip, v.frame AS "
                f"__frame, v.ts, v.start_ts, (l.frame IS NOT NULL) AS __labelled FROM main.{q} v "
                f"JOIN vidql.clips c ON c.video = {v} AND c.clip = v.clip LEFT JOIN "
                f"vidql.labelled l ON l.video = {v} AND l.oracle = {o} AND l.clip = v.clip AND "
                f"l.frame = v.frame)")
    detections = (f"(SELECT c.first_frame + l.frame AS frame, l.label, l.score FROM vidql.labels "
                  f"l JOIN vidql.clips c ON c.video = l.video AND c.clip = l.clip WHERE "
                  f"l.video = {v} AND l.oracle = {o})")
    table = frame_table_sql(functions, detections, labelled)
    cols = ", ".join(f"CASE WHEN __labelled THEN {fn.column} END AS {fn.column}"
                     for fn in functions)
    catalog.con.execute(f"CREATE OR REPLACE TEMP TABLE {q} AS SELECT __clip AS clip, __frame AS "
                        f"frame, ts, start_ts, {cols} FROM ({table}) ORDER BY __position")
    return video


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
