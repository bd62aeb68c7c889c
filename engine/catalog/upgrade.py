"""Catalogs written by earlier vidql versions, brought up to date when opened read-write.

Before collections, a video was one file: its table had `frame, ts`, labels were keyed by
(video, oracle, frame) and there was no clip table. Such a video becomes a collection of one
clip named after its file; its labels, label counts and indexes are kept.
"""
from __future__ import annotations

from pathlib import Path

from vidql.engine.labels.cache import SCHEMA_SQL
from vidql.engine.sql.sqlnames import quote_name

# the columns an old label table is copied from, `{clip}` standing for its clip
LABEL_TABLES = {"labels": "video, oracle, {clip}, frame, label, score, x1, y1, x2, y2",
                "labelled": "video, oracle, {clip}, frame, detections"}


def upgrade_catalog(catalog) -> None:
    """Give every pre-collection video its clip row and table columns, key old labels by
    clip, recreate `objects` views that predate USING ORACLE or the clip column, and give
    the videos table its `oracle_rendition` column."""
    con = catalog.con
    con.execute("ALTER TABLE vidql.videos ADD COLUMN IF NOT EXISTS oracle_rendition INTEGER")
    for name, path in con.execute("SELECT name, path FROM vidql.videos WHERE name NOT IN "
                                  "(SELECT video FROM vidql.clips)").fetchall():
        _single_file_to_collection(catalog, name, path)
    for table in LABEL_TABLES:
        if "clip" not in _columns(con, "vidql", table):
            _key_labels_by_clip(catalog, table)
    old = con.execute("SELECT schema_name FROM duckdb_views() WHERE view_name = 'objects' AND "
                      "database_name = current_database() AND (sql NOT LIKE '%getvariable%' "
                      "OR sql NOT LIKE '%clip%')").fetchall()
    videos = set(catalog.video_names())
    for (schema,) in old:
        if schema in videos:
            con.execute(catalog.objects_view_sql(schema))


def _columns(con, schema: str, table: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() AND "
        "schema_name = ? AND table_name = ? ORDER BY column_index", [schema, table]).fetchall()]


def _single_file_to_collection(catalog, name: str, path: str) -> None:
    clip = Path(path).stem or name
    table = f"main.{quote_name(name)}"
    statements = [(
        "INSERT INTO vidql.clips SELECT name, ?, 0, path, codec, width, height, fps, "
        "frame_count, duration, fingerprint, NULL, 0 FROM vidql.videos WHERE name = ?",
        [clip, name])]
    if "clip" not in _columns(catalog.con, "main", name):
        statements += [
            (f"CREATE TABLE main.__vidql_upgrade AS SELECT CAST(? AS VARCHAR) AS clip, frame, ts, "
             f"CAST(NULL AS TIMESTAMP) AS start_ts FROM {table} ORDER BY frame", [clip]),
            (f"DROP TABLE {table}", []),
            (f"ALTER TABLE main.__vidql_upgrade RENAME TO {quote_name(name)}", [])]
    catalog.run_atomically(statements)


def _key_labels_by_clip(catalog, table: str) -> None:
    """Recreate label table `table` as the label cache defines it now (SCHEMA_SQL) and copy
    the old rows in, each keyed by its video's only clip."""
    create = next(s for s in SCHEMA_SQL.split(";") if f"vidql.{table} (" in s)
    clip = ("coalesce((SELECT c.clip FROM vidql.clips c WHERE c.video = t.video AND "
            "c.ordinal = 0), t.video)")
    catalog.run_atomically([
        (f"ALTER TABLE vidql.{table} RENAME TO __old_{table}", []),
        (create, []),
        (f"INSERT INTO vidql.{table} SELECT {LABEL_TABLES[table].format(clip=clip)} "
         f"FROM vidql.__old_{table} t", []),
        (f"DROP TABLE vidql.__old_{table}", [])])
