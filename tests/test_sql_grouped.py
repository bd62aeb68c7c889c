"""GROUP BY over the video table's own columns for approximate aggregates (issue 11, item
5): ERROR WITHIN and ORACLE BUDGET return one row per group, named as in the SELECT, each
interval holding the exact per-group answer (the same SQL without the clause), and the
report says all groups hold at once and how confidence and budget were split."""
from __future__ import annotations

import pandas as pd
import pytest

import vidql
from vidql.base.errors import QueryError

COLUMNS = ["estimate", "ci_low", "ci_high", "confidence", "oracle_calls", "labels_used",
           "population_frames"]


@pytest.fixture()
def db(traffic_con):
    return traffic_con


def exact(small_traffic, sql: str, key: str) -> pd.Series:
    """The exact per-group answers, from a fresh database (so the approximate run's cache
    is untouched), keyed by the group column."""
    video, labels = small_traffic
    with vidql.connect(progress=False) as con:
        con.sql(f"LOAD VIDEO '{video}' AS v; CREATE ORACLE truth FROM LABELS '{labels}'; "
                "SET ORACLE v = truth")
        df = con.sql(sql).df()
    return df.set_index(key).iloc[:, 0]


def check_rows(df: pd.DataFrame, key: str, truth: pd.Series) -> None:
    assert list(df.columns) == [key, *COLUMNS]
    assert sorted(df[key].tolist()) == sorted(truth.index.tolist()) == df[key].tolist()
    for _, row in df.iterrows():
        assert row["ci_low"] - 1e-9 <= truth[row[key]] <= row["ci_high"] + 1e-9, row
        assert row["confidence"] == 0.95


def test_error_within_per_time_bucket(db, small_traffic):
    base = "SELECT floor(ts / 4) AS bucket, AVG(objects('car')) FROM v GROUP BY bucket"
    df = db.sql(base + " ERROR WITHIN 0.5 SEED 3").df()
    report = db.last_report
    check_rows(df, "bucket", exact(small_traffic, base, "bucket"))
    assert len(df) == 3 and (df["ci_high"] - df["estimate"] <= 0.5 + 1e-9).all()
    assert df["oracle_calls"].sum() == report.oracle_calls > 0
    assert "every group" in report.guarantee and "all 3 groups at once" in report.guarantee
    assert "Sidak: each of 3 groups at 98.3048%" in report.guarantee
    assert report.details["groups"]["count"] == 3


def test_error_within_ratio_form_with_restriction_and_expression_name(db, small_traffic):
    base = ("SELECT AVG(objects('car')) FROM v WHERE objects('car') >= 3 AND frame < 240 "
            "GROUP BY frame // 60")
    df = db.sql(base + " ERROR WITHIN 1 SEED 1").df()
    truth = exact(small_traffic, base.replace("SELECT", "SELECT frame // 60,"), "(frame // 60)")
    check_rows(df.rename(columns={"frame // 60": "(frame // 60)"}), "(frame // 60)", truth)
    assert df.columns[0] == "frame // 60" and len(df) == 4


def test_sum_error_within_scales_per_group(db, small_traffic):
    base = ("SELECT time_bucket(INTERVAL 5 SECOND, to_timestamp(ts)) AS tb, "
            "SUM(objects('car')) AS cars FROM v GROUP BY tb")
    df = db.sql(base + " ERROR WITHIN 10% SEED 2").df()
    check_rows(df, "tb", exact(small_traffic, base, "tb"))
    assert len(df) == 2 and "relative error" in db.last_report.guarantee


def test_budget_per_group(db, small_traffic):
    base = ("SELECT frame // 100 AS part, COUNT(*) FROM v WHERE objects('car') >= 3 "
            "GROUP BY part")
    df = db.sql(base + " ORACLE BUDGET 120 SEED 4").df()
    report = db.last_report
    check_rows(df, "part", exact(small_traffic, base, "part"))
    assert report.oracle_calls <= 120 and df["labels_used"].sum() == 120
    assert df["population_frames"].tolist() == [100, 100, 100]  # each group's frames
    budgets = report.details["groups"]["budgets"]
    assert sum(budgets) == 120 and len(budgets) == 3 == len(df)
    assert "with ≤ 120 oracle calls in all" in report.guarantee
    assert f"budget 120 split {budgets}" in report.guarantee
    assert "all 3 groups at once" in report.guarantee


def test_budget_avg_per_group_and_count_star_exact(db, small_traffic):
    base = "SELECT floor(ts / 4) AS b, AVG(objects('car')) FROM v GROUP BY b"
    df = db.sql(base + " ORACLE BUDGET 60 SEED 5").df()
    check_rows(df, "b", exact(small_traffic, base, "b"))
    sizes = db.sql("SELECT floor(ts / 4) AS b, COUNT(*) FROM v GROUP BY b ERROR WITHIN 1").df()
    assert sizes["estimate"].tolist() == [120.0, 120.0, 60.0]
    assert db.last_report.oracle_calls == 0


def test_explain_accepts_grouped_forms(db):
    for query in ("SELECT floor(ts / 4) AS b, AVG(objects('car')) FROM v GROUP BY b "
                  "ERROR WITHIN 0.5",
                  "SELECT floor(ts / 4) AS b, AVG(objects('car')) FROM v GROUP BY b "
                  "ORACLE BUDGET 60"):
        plan = db.sql("EXPLAIN " + query).df()
        assert plan["estimated_oracle_calls"][0] >= 0
    db.sql("SELECT COUNT(*) FROM v WHERE objects('car') >= 1 ORACLE BUDGET 60 SEED 1")
    plan = db.sql("EXPLAIN SELECT floor(ts / 4) AS b, AVG(objects('car')) FROM v GROUP BY b "
                  "ERROR WITHIN 0.5 SEED 1").df()
    assert "dry run" in plan["note"][0] and plan["estimated_oracle_calls"][0] > 0


def test_frame_function_groups_keep_their_paths(db):
    df = db.sql("SELECT objects('car') >= 3 AS busy, AVG(objects('car')) FROM v GROUP BY busy "
                "ORACLE BUDGET 100 SEED 1").df()
    assert list(df.columns) == ["busy", *COLUMNS] and len(df) == 2
    assert "a value on no sampled frame has no row" in db.last_report.details["note"]
    with pytest.raises(QueryError, match="GROUP BY over frame functions with ERROR WITHIN"):
        db.sql("SELECT objects('car') >= 3 AS busy, AVG(objects('car')) FROM v GROUP BY busy "
               "ERROR WITHIN 1")


def test_bad_group_key_and_small_budget_are_refused(db):
    with pytest.raises(QueryError, match="nosuch"):
        db.sql("SELECT AVG(objects('car')) FROM v GROUP BY nosuch ERROR WITHIN 1")
    with pytest.raises(vidql.base.errors.ParameterError, match="too small for 3 groups"):
        db.sql("SELECT floor(ts / 4) AS b, AVG(objects('car')) FROM v GROUP BY b "
               "ORACLE BUDGET 20")


def test_count_star_under_a_budget_is_exact(db):
    """COUNT(*) without a frame predicate needs no oracle under ORACLE BUDGET as under ERROR
    WITHIN (it was sampled, with an interval around the frame count, and spent the budget)."""
    for sql, sizes in (("SELECT COUNT(*) FROM v WHERE frame < 200", [200.0]),
                       ("SELECT frame // 100 AS part, COUNT(*) FROM v GROUP BY part",
                        [100.0] * 3)):
        assert db.sql(f"EXPLAIN {sql} ORACLE BUDGET 40").df()["estimated_oracle_calls"][0] == 0
        df = db.sql(sql + " ORACLE BUDGET 40 SEED 1").df()
        assert df["estimate"].tolist() == df["ci_low"].tolist() == df["ci_high"].tolist() == sizes
        assert db.last_report.oracle_calls == 0 and df["labels_used"].sum() == 0
        assert df["population_frames"].tolist() == sizes
        assert db.last_report.seed is None  # nothing was sampled


def test_frame_function_groups_are_typed_and_stratified_by_their_proxy(db, small_traffic):
    """The keys of a frame-function GROUP BY have the expression's type (a predicate's are
    booleans, a count's integers; they were floats), and COUNT(*) per group stratifies by the
    key's proxy (it had no statistic to stratify by and said 'no index')."""
    db.sql("CREATE INDEX vi ON v USING TASTI WITH (train = 60, reps = 100, triplets = 1000)")
    base = "SELECT objects('car') >= 3 AS busy, COUNT(*) FROM v GROUP BY busy"
    df = db.sql(base + " ORACLE BUDGET 100 SEED 2").df()
    check_rows(df, "busy", exact(small_traffic, base, "busy"))
    assert df["busy"].tolist() == [False, True]
    assert "no index" not in db.last_report.details.get("note", ""), db.last_report.details
    counts = db.sql("SELECT objects('person') AS people, AVG(objects('car')) FROM v "
                    "GROUP BY people ORACLE BUDGET 100 SEED 2").df()
    assert all(type(key) is int for key in counts["people"].tolist())


def test_a_frame_function_group_key_that_may_be_null_is_refused(db):
    with pytest.raises(QueryError, match="may be NULL") as caught:
        db.sql("SELECT CASE WHEN objects('car') > 3 THEN 1 END AS g, COUNT(*) FROM v "
               "GROUP BY g ORACLE BUDGET 100")
    assert "GROUP BY coalesce(" in caught.value.hint
    df = db.sql("SELECT coalesce(CASE WHEN objects('car') > 3 THEN 1 END, -1) AS g, COUNT(*) "
                "FROM v GROUP BY g ORACLE BUDGET 100 SEED 1").df()
    assert sorted(df["g"].tolist()) == [-1, 1]
