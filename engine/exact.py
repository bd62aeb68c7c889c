"""Exact execution: the oracle labels every frame a query needs, then DuckDB answers.

Frame-function calls are replaced by columns of a temporary table that shadows the video
table for the query (frame, ts and one column per call). Frames that are not labelled
get NULL there, never a made-up 0.
"""
from __future__ import annotations

import duckdb
import numpy as np

from .catalog import Catalog, quote_name
from vidql.errors import QueryError
from .framestat import FrameExpr, frame_table_sql, parse_frame_expr
from .labelcache import LabelStats


def needed_frames(n_frames: int, frame_range: tuple[int | None, int | None] | None) -> np.ndarray:
    """Frames [lo, hi) of a video that a query restricted to `frame_range` reads."""
    lo, hi = frame_range or (None, None)
    lo = 0 if lo is None else max(0, int(lo))
    hi = n_frames if hi is None else min(n_frames, int(hi))
    return np.arange(lo, max(lo, hi), dtype=np.int64)


def run_exact(catalog: Catalog, sql: str, videos: list[str],
              frame_ranges: dict[str, tuple] | None = None,
              oracle: str | None = None) -> tuple[duckdb.DuckDBPyRelation | None, LabelStats]:
    """Run `sql` exactly. `videos` are the video tables it reads (`night` or `night.objects`);
    `frame_ranges` optionally limits the frames labelled per video. Returns the result
    (materialised, so it stays valid) and what labelling cost."""
    expr = bind_query(catalog, sql, videos, oracle)
    stats = LabelStats()
    shadows, variables = [], []
    try:
        for video in videos:
            cache = catalog.label_cache(video, oracle)
            before = cache.stats.snapshot()
            frames = needed_frames(cache.n_frames, (frame_ranges or {}).get(video))
            cache.ensure(frames, desc=f"exact query: labelling {video}")
            delta = cache.stats.since(before)
            stats.oracle_calls += delta.oracle_calls
            stats.cache_hits += delta.cache_hits
            stats.oracle_seconds += delta.oracle_seconds
            stats.decode_seconds += delta.decode_seconds
            variables.append(catalog.oracle_variable(video))
            catalog.con.execute(f"SET VARIABLE {quote_name(variables[-1])} = ?", [cache.oracle.identity])
            if expr.functions:
                shadows.append(_shadow_video(catalog, video, cache.oracle.identity, expr.functions))
        try:
            rel = catalog.con.sql(expr.sql)
        except duckdb.Error as exc:
            raise QueryError(f"DuckDB cannot run the query: {exc}", sql) from None
        if rel is None:
            return None, stats
        return catalog.con.from_arrow(rel.to_arrow_table()), stats
    finally:
        for name in shadows:
            catalog.con.execute(f"DROP TABLE IF EXISTS temp.{quote_name(name)}")
        for name in variables:
            catalog.con.execute(f"RESET VARIABLE {quote_name(name)}")


def bind_query(catalog: Catalog, sql: str, videos: list[str],
               oracle: str | None = None) -> FrameExpr:
    """Bind `sql` (frame functions and all) against its video tables before any oracle
    call, so that an unknown column or function costs no labelling: DuckDB binds the
    query over the frame-function columns of the labels cached so far, without running it.
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
                identity = catalog.label_cache(video, oracle).oracle.identity
                shadows.append(_shadow_video(catalog, video, identity, expr.functions))
        catalog.con.sql(expr.sql)
    except duckdb.Error as exc:
        raise QueryError(f"DuckDB cannot run the query: {exc}", sql) from None
    finally:
        for name in shadows:
            catalog.con.execute(f"DROP TABLE IF EXISTS temp.{quote_name(name)}")
    return expr


def _shadow_video(catalog: Catalog, video: str, identity: str, functions) -> str:
    """Create temp table `video` (shadowing main.video) with a column per frame function."""
    q = quote_name(video)
    labelled = (f"(SELECT v.frame, v.ts, (l.frame IS NOT NULL) AS __labelled FROM main.{q} v "
                f"LEFT JOIN vidql.labelled l ON l.frame = v.frame AND l.video = '{video}' "
                f"AND l.oracle = '{identity.replace(chr(39), chr(39) * 2)}')")
    detections = (f"(SELECT frame, label, score FROM vidql.labels WHERE video = '{video}' "
                  f"AND oracle = '{identity.replace(chr(39), chr(39) * 2)}')")
    table = frame_table_sql(functions, detections, labelled)
    cols = ", ".join(f"CASE WHEN __labelled THEN {fn.column} END AS {fn.column}" for fn in functions)
    catalog.con.execute(f"CREATE OR REPLACE TEMP TABLE {q} AS SELECT frame, ts, {cols} "
                        f"FROM ({table}) ORDER BY frame")
    return video
