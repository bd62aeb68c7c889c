"""One result type: db.sql() and the Python builder return a Result that reads like a DuckDB
relation, carries the report, and can be read by name from further SQL."""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

import vidql
from vidql.engine.result import Result

AVG = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 CONFIDENCE 95% SEED 3"
COLUMNS = ["estimate", "ci_low", "ci_high", "confidence", "oracle_calls", "labels_used",
           "population_frames"]


def test_sql_and_builder_return_the_same_result_type(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        r = db.sql(AVG)
        built = db.video("t").using(seed=3).aggregate("avg", vidql.objects("car"), error=0.5)
        for result in (r, built):
            assert isinstance(result, Result)
            assert result.columns == COLUMNS and len(result) == 1
            assert result.report.operator.startswith("aggregate")
            assert result.report.oracle_calls + result.report.cache_hits > 0
        first, second = r.df(), built.df()  # the second answers from the label cache
        assert first.drop(columns="oracle_calls").equals(second.drop(columns="oracle_calls"))
        assert second["oracle_calls"][0] == 0 and built.report.cache_hits == second["labels_used"][0]
        assert second["population_frames"][0] == 300  # the frames of t, not those labelled
        assert db.last_report is built.report


def test_result_reads_like_a_relation(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        r = db.sql(AVG)
        row = r.fetchall()[0]
        assert r.fetchone() == row and r.fetchone() is None  # a cursor over the rows
        assert r.df()["estimate"][0] == row[0]
        assert r.fetchnumpy()["estimate"][0] == row[0]
        assert isinstance(r.to_arrow_table(), pa.Table) and r.arrow().read_all().num_rows == 1
        assert "estimate" in repr(r) and "guarantee:" in repr(r)
        r.show()
        rows = db.sql("SELECT frame, objects('car') AS cars FROM t WHERE frame < 4")
        assert len(rows) == 4 and rows.report.guarantee == "exact"
        assert rows.fetchmany(3) == rows.fetchall()[:3]


def test_integer_sums_read_as_duckdb_gives_them(traffic_db):
    """DuckDB sums integers into HUGEINT, which Python reads as int; a Result's rows pass
    through Arrow (decimal128), and gave Decimal('2093'), which a float cannot multiply."""
    with vidql.connect(traffic_db, progress=False) as db:
        for sql in ("SELECT sum(objects('car')) AS cars, count(*) AS n FROM t",
                    "SELECT sum(frame) AS cars, count(*) AS n FROM t"):  # exact, plain DuckDB
            r = db.sql(sql)
            expected = duckdb.sql(sql.replace("objects('car')", "frame * 0 + 7").replace(
                " FROM t", " FROM range(300) r(frame)")).types
            assert [str(kind) for kind in r.types] == [str(kind) for kind in expected]
            cars, n = r.fetchall()[0]
            assert type(cars) is int and type(n) is int and r.fetchone() == (cars, n)
            assert r.df()["cars"][0] * 0.5 == cars * 0.5


def test_result_is_readable_by_name_from_sql(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        r = db.sql(AVG)
        estimate = r.fetchall()[0][0]
        assert db.sql("SELECT estimate FROM r").fetchall() == [(estimate,)]
        assert duckdb.sql("SELECT estimate FROM r").fetchall() == [(estimate,)]
        assert db.con.sql("SELECT count(*) FROM r").fetchall() == [(1,)]
        rel = r.relation  # noqa: F841 (DuckDB finds the local variable by its name)
        assert db.sql("SELECT estimate FROM rel").fetchall() == [(estimate,)]
        t = r  # a variable does not shadow the video table of the same name
        assert db.sql("SELECT count(*) FROM t").fetchall() == [(300,)] and t is r


def test_catalog_and_plain_statements_have_no_report(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        videos = db.sql("SHOW VIDEOS")
        assert isinstance(videos, Result) and videos.report is None
        assert videos.df()["name"].tolist() == ["t"]
        assert db.sql("CREATE TABLE extra AS SELECT 1 AS x").report is None
        assert np.array_equal(db.sql("SELECT x FROM extra").fetchnumpy()["x"], [1])


def test_explain_report_shows_the_estimate_not_a_guarantee(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        plan = db.sql("EXPLAIN " + AVG)
        summary = plan.report.summary()
        assert f"estimated oracle calls: {plan.df()['estimated_oracle_calls'][0]}" in summary
        assert "guarantee" not in summary and "simulated" in plan.df()["note"][0]


def test_a_report_says_the_index_cracks_after_the_answer():
    from vidql.engine.result import Report

    report = Report(operator="limit")
    report.seconds["cracking"] = 0.004
    assert "cracking 0.00s (reading the new representatives' labels; the index grows after " \
           "the answer)" in report.summary()
