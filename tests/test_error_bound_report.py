"""An approximate aggregate answers what SQL means and says what it delivered: an ORACLE
BUDGET cap that ran out before the bound held, or a predicate no frame satisfies, is said,
never hidden behind the guarantee asked for; NULL values are left out as SQL leaves them."""
from __future__ import annotations

import pytest

import vidql


@pytest.fixture()
def db(traffic_con):
    return traffic_con


def test_a_cap_that_runs_out_says_the_bound_was_not_reached(db):
    row = db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.001 ORACLE BUDGET 40 "
                 "SEED 1").df().iloc[0]
    report = db.last_report
    assert row["ci_high"] - row["ci_low"] > 0.002 and row["labels_used"] == 40
    assert row["oracle_calls"] == report.oracle_calls <= 40  # labelling ahead stops at the cap
    assert "not reached" in report.guarantee and "40 oracle calls" in report.guarantee
    assert "ORACLE BUDGET of 40" in report.details["note"]
    assert "not reached" in report.summary()


def test_a_bound_that_holds_claims_it(db):
    db.sql("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 ORACLE BUDGET 300 SEED 1")
    report = db.last_report
    assert report.guarantee == "AVG within ±2 (absolute error) at 95% confidence"
    assert "note" not in report.details


@pytest.mark.parametrize("query, stated", [
    ("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2 CONFIDENCE 99.9%",
     "AVG within ±2 (absolute error) at 99.9% confidence"),
    ("SELECT AVG(objects('car')) FROM v ERROR WITHIN 2.5% CONFIDENCE 97.5%",
     "AVG within ±2.5% (relative error) at 97.5% confidence"),
    ("SELECT SUM(objects('car')) FROM v ORACLE BUDGET 50 CONFIDENCE 99.5%",
     "SUM with ≤ 50 oracle calls, 99.5% finite-sample interval"),
])
def test_the_guarantee_states_the_confidence_asked(db, query, stated):
    """A confidence is stated as written: 99.9% was printed as "100%", a promise of
    certainty no interval makes."""
    db.sql(query + " SEED 1")
    assert db.last_report.guarantee == stated


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
    report = db.last_report  # the exact query's, which ran last
    assert "no frame satisfies the predicate" in result.report.details["note"]
    assert "not reached" not in result.report.guarantee
    assert report.operator == "exact"


@pytest.mark.parametrize("query", [
    "SELECT AVG(CASE WHEN objects('car') > 3 THEN objects('car') END) FROM v",
    "SELECT COUNT(CASE WHEN objects('car') > 3 THEN 1 END) FROM v",
    "SELECT AVG(objects('car') / NULLIF(objects('person'), 0)) FROM v WHERE frame < 200",
    "SELECT SUM(CASE WHEN contains('person') THEN objects('car') END) FROM v",
])
@pytest.mark.parametrize("clause", ["ERROR WITHIN 0.2 SEED 1", "ORACLE BUDGET 150 SEED 1"])
def test_aggregates_skip_null_values_as_sql_does(db, query, clause):
    """AVG and COUNT leave out the frames where their argument is NULL, as the exact query
    does; those NULLs were counted as 0 (an AVG of 3.9 for an exact 8.9 on 10k frames, a
    COUNT of every frame)."""
    exact = db.sql(query).fetchone()[0]
    row = db.sql(f"{query} {clause}").df().iloc[0]
    assert row["ci_low"] - 1e-9 <= float(exact) <= row["ci_high"] + 1e-9, (exact, row)


def test_a_statistic_without_a_finite_value_is_refused(db):
    with pytest.raises(vidql.QueryError, match="no finite value on some frames"):
        db.sql("SELECT AVG(objects('car') / objects('person')) FROM v ERROR WITHIN 0.5 SEED 1")
    with pytest.raises(vidql.QueryError, match="needs no oracle"):
        db.sql("SELECT COUNT(CASE WHEN frame > 5 THEN 1 END) FROM v ERROR WITHIN 0.5")
