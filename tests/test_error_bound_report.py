"""An ERROR WITHIN aggregate's report states what it delivered: an ORACLE BUDGET cap that
ran out before the bound held, or a predicate no frame satisfies, is said, never hidden
behind the guarantee that was asked for."""
from __future__ import annotations

import pytest



@pytest.fixture()
def db(traffic_con):
    return traffic_con


def test_a_cap_that_runs_out_says_the_bound_was_not_reached(db):
    row = db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.001 ORACLE BUDGET 40 "
                 "SEED 1").df().iloc[0]
    report = db.last_report
    assert row["ci_high"] - row["ci_low"] > 0.002 and row["frames"] == 40
    assert row["oracle_calls"] == report.oracle_calls <= 40  # labelling ahead stops at the cap
    assert "not reached" in report.guarantee and "40 oracle calls" in report.guarantee
    assert "ORACLE BUDGET of 40" in report.details["note"]
    assert "not reached" in report.summary()


def test_a_bound_that_holds_claims_it(db):
    db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 ORACLE BUDGET 300 SEED 1")
    report = db.last_report
    assert report.guarantee == "AVG within ±2 (absolute error) at 95% confidence"
    assert "note" not in report.details


def test_each_group_whose_share_of_the_cap_runs_out_is_named(db):
    df = db.sql("SELECT frame // 150 AS g, AVG(objects('car')) FROM v GROUP BY g "
                "ERROR WITHIN 0.001 ORACLE BUDGET 60 SEED 1").df()
    report = db.last_report
    assert len(df) == 2 and "not reached" in report.guarantee
    assert df["oracle_calls"].sum() == report.oracle_calls <= 60
    assert "group 0: the ORACLE BUDGET" in report.details["note"]
    assert "group 1: the ORACLE BUDGET" in report.details["note"]


def test_a_predicate_no_frame_satisfies_gives_null_and_says_why(db):
    result = db.sql("SELECT AVG(objects('car')) FROM v WHERE objects('car') > 1000 "
                    "ERROR WITHIN 0.1 SEED 1")
    assert result.fetchone()[:3] == (None, None, None)
    assert db.sql("SELECT AVG(objects('car')) FROM v WHERE objects('car') > 1000"
                  ).fetchone() == (None,)
    report = db.last_report  # of the approximate query, before the exact one ran
    assert "no frame satisfies the predicate" in result.report.details["note"]
    assert "not reached" not in result.report.guarantee
    assert report.operator == "exact"
