"""Saving and showing any query's result: COPY (query) TO and CREATE TABLE ... AS around vidql
queries; `vidql sql` formats (table, csv, json, markdown), every statement, no silent row cut,
numbers rounded for display only."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from vidql.base.errors import QueryError
from vidql.cli import main
from vidql.display import rounded
from vidql.engine.sql.dialect import PlainSQL, WriteResult, parse

ERROR_QUERY = "SELECT AVG(objects('car')) AS cars FROM v ERROR WITHIN 0.5 SEED 3"
LIMIT_QUERY = "SELECT clip, frame FROM v WHERE objects('car') >= 3 LIMIT 5 SEED 1"


def test_copy_writes_an_approximate_answer_in_each_format(traffic_con, tmp_path):
    answer = traffic_con.sql(ERROR_QUERY).df()  # columns estimate, ci_low, ci_high, ...
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet),
                      ("json", lambda p: pd.read_json(p, lines=True))):
        path = tmp_path / f"avg.{fmt}"
        result = traffic_con.sql(f"COPY ({ERROR_QUERY}) TO '{path}' (FORMAT {fmt})")
        assert result.fetchone()[0].startswith("wrote 1 row: COPY (<query>) TO")
        assert result.report.guarantee.startswith("AVG within ±0.5")
        assert read(path)["estimate"].tolist() == pytest.approx(answer["estimate"].tolist())


def test_copy_writes_a_selection(traffic_con, tmp_path):
    path = tmp_path / "frames.csv"
    result = traffic_con.sql(f"COPY ({LIMIT_QUERY}) TO '{path}' (HEADER, DELIMITER ',')")
    assert result.report.operator.startswith("LIMIT")
    frames = pd.read_csv(path)
    assert list(frames.columns[:2]) == ["clip", "frame"] and len(frames) == 5
    cars = traffic_con.sql("SELECT frame, objects('car') AS n FROM v").df().set_index("frame")["n"]
    assert (cars[frames["frame"]] >= 3).all()


def test_copy_writes_find_rare(traffic_con, tmp_path):
    traffic_con.sql("CREATE INDEX vi ON v USING TASTI WITH (embedder = 'pixel', reps = 20)")
    path = tmp_path / "rare.json"
    traffic_con.sql(f"COPY (SELECT clip, frame FROM v WHERE objects('car') >= 4 FIND RARE "
                    f"ORACLE BUDGET 40 SEED 2) TO '{path}' (FORMAT json)")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows and {"clip", "frame"} <= set(rows[0])


def test_create_table_as_an_approximate_query(traffic_con):
    result = traffic_con.sql(f"CREATE TABLE est AS {ERROR_QUERY}")
    assert result.report.operator.startswith("aggregate")
    traffic_con.sql(f"CREATE OR REPLACE TEMP TABLE est2 AS ({LIMIT_QUERY})")
    assert traffic_con.sql("SELECT count(*) FROM est").fetchone() == (1,)
    assert traffic_con.sql("SELECT count(*) FROM est2").fetchone() == (5,)


def test_create_table_as_an_exact_query_with_frame_functions(traffic_con):
    traffic_con.sql("CREATE TABLE counts AS SELECT frame, objects('car') AS cars FROM v "
                    "WHERE frame < 10")
    assert traffic_con.sql("SELECT count(*), min(frame) FROM counts").fetchone() == (10, 0)


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 42 AS x) TO 'x.csv'",
    "CREATE TABLE t AS SELECT 1",
    "CREATE TABLE t (a INT)",
    "CREATE VIEW w AS SELECT 1",
    "COPY t TO 'x.csv'",
])
def test_statements_without_a_video_stay_duckdb_statements(sql):
    stmt = parse(sql)
    assert isinstance(stmt, (PlainSQL, WriteResult))
    if isinstance(stmt, WriteResult):
        assert stmt.sql == sql and stmt.query.kind == "exact"


def test_plain_copy_and_create_run_in_duckdb_alone(traffic_con, tmp_path):
    traffic_con.sql(f"COPY (SELECT 42 AS x) TO '{tmp_path / 'x.csv'}'; "
                    f"CREATE TABLE plain AS SELECT 1 AS one")
    assert pd.read_csv(tmp_path / "x.csv")["x"].tolist() == [42]
    assert traffic_con.sql("SELECT one FROM plain").fetchone() == (1,)


def test_a_clause_error_inside_copy_points_into_the_query(traffic_con, tmp_path):
    with pytest.raises(QueryError, match="ERROR WITHIN"):
        traffic_con.sql(f"COPY (SELECT AVG(objects('car')) FROM v ERROR WITHIN -1) "
                        f"TO '{tmp_path / 'x.csv'}'")


SCRIPT = ("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 3; "
          "SELECT frame, ts FROM t WHERE frame < 45")


def test_sql_command_prints_every_statement_with_its_report(traffic_db, capsys):
    assert main(["sql", SCRIPT, "--db", str(traffic_db)]) == 0
    out = capsys.readouterr().out
    assert "-- operator: aggregate" in out and "-- operator: exact" in out  # both statements
    assert "… 5 more rows (45 in all" in out and "│    39 │" in out and "│    40 │" not in out
    estimate = re.search(r"│\s+(\d+\.\d+) │", out).group(1)
    assert len(estimate.split(".")[1]) <= 3  # rounded for reading
    assert main(["sql", SCRIPT, "--db", str(traffic_db), "--max-rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "│    44 │" in out and "more row" not in out


def test_sql_command_writes_json_lines_with_the_report(traffic_db, tmp_path):
    path = tmp_path / "out.json"
    assert main(["sql", SCRIPT, "--db", str(traffic_db), "--format", "json",
                 "--out", str(path)]) == 0
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["statement"].startswith("SELECT AVG") and first["report"]["seed"] == 3
    assert first["report"]["guarantee"].startswith("AVG within ±0.5")
    estimate = first["rows"][0]["estimate"]
    assert first["columns"][0] == "estimate" and estimate != round(estimate, 3)  # full precision
    assert len(second["rows"]) == 45 and second["rows"][1] == {"frame": 1, "ts": 1 / 30}


def test_sql_command_writes_csv_and_markdown(traffic_db, tmp_path, capsys):
    path = tmp_path / "frames.csv"
    assert main(["sql", "SELECT frame, ts FROM t WHERE frame < 45", "--db", str(traffic_db),
                 "--format", "csv", "--out", str(path)]) == 0
    frames = pd.read_csv(path)
    assert len(frames) == 45 and frames["ts"][1] == pytest.approx(1 / 30, rel=1e-12)
    assert "operator: exact" in capsys.readouterr().err
    assert main(["sql", SCRIPT, "--db", str(traffic_db), "--format", "markdown",
                 "--max-rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "| frame | ts |\n|---|---|\n| 0 | 0.0 |\n| 1 | 0.03333 |" in out
    assert "… 42 more rows" in out and "> operator: aggregate" in out


def test_rounding_keeps_full_precision_in_df(traffic_con):
    result = traffic_con.sql("SELECT 3.755516140110698::DOUBLE AS x, 0.000123456::DOUBLE AS y, "
                             "61.189610727238225::DOUBLE AS z, 'nan'::DOUBLE AS w, 7 AS n")
    assert rounded(result.relation).fetchall()[0][:3] == (3.756, 0.0001235, 61.19)
    assert result.df()["x"][0] == 3.755516140110698
