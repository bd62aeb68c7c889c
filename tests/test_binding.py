"""A query that cannot run fails before the first oracle call: the whole query is bound
against the video table's schema (with its frame-function columns) first, and EXPLAIN
catches the same errors (issue 9, item 10)."""
from __future__ import annotations

import pytest

import vidql
from vidql.base.errors import QueryError

BAD = [
    "SELECT nosuch, objects('car') FROM v",
    "SELECT frame, objects('car') FROM v WHERE nosuchfn(frame) > 1",
    "SELECT frame FROM v WHERE objects('car') >= nosuchfn(3) LIMIT 2",
    "SELECT frame FROM v WHERE objects('car') >= nosuch LIMIT 2 GAP 3",
    "SELECT AVG(objects('car') + nosuch) FROM v ERROR WITHIN 0.5",
    "SELECT COUNT(*) FROM v WHERE contains('car') AND nosuchfn(1) ERROR WITHIN 5%",
    "SELECT AVG(objects('car')) FROM v WHERE contains('car', 'x') ORACLE BUDGET 20",
    "SELECT frame FROM v WHERE contains('car') AND objects('bus') > 'a' || nosuch "
    "RECALL TARGET 90% ORACLE BUDGET 20",
]


@pytest.fixture()
def db(tmp_path, counter_clip, oracle_module):
    with vidql.connect(tmp_path / "b.db", progress=False) as con:
        con.sql(f"LOAD VIDEO '{counter_clip}' AS v;")
        con.sql("CREATE ORACLE p FROM PYTHON 'vq_test_oracle:BrightnessOracle';")
        con.sql("SET ORACLE v = p;")
        yield con


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("query", BAD)
def test_a_query_that_cannot_bind_calls_no_oracle(db, oracle_module, query, explain):
    with pytest.raises(QueryError) as err:
        db.sql(("EXPLAIN " if explain else "") + query)
    assert oracle_module.CALLS == [], str(err.value)
    assert "nosuch" in str(err.value) or "contains" in str(err.value)


def test_a_good_query_still_runs_after_binding(db, oracle_module):
    df = db.sql("SELECT frame, objects('car') AS cars FROM v WHERE frame < 5 ORDER BY frame").df()
    assert df["frame"].tolist() == [0, 1, 2, 3, 4] and sum(oracle_module.CALLS) == 5


def test_a_query_under_another_oracle_says_why_the_index_does_not_serve_it(traffic_db,
                                                                          small_traffic):
    """An index answers only for the oracle that built it: under USING ORACLE another one,
    an aggregate runs without it and says so, and a query that needs an index names the
    index it cannot use (it used to say only CREATE INDEX, the index being there)."""
    _, labels = small_traffic
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql("CREATE INDEX ti ON t WITH (train = 20, reps = 40, triplets = 100, size = 24); "
               f"CREATE ORACLE other FROM LABELS '{labels}'")
        db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1 USING ORACLE other")
        note = db.last_report.details["index_note"]
        assert "index ti was built with another oracle" in note
        for query in ("SELECT frame FROM t WHERE contains('bus') RECALL TARGET 90% "
                      "ORACLE BUDGET 100 USING ORACLE other",
                      "SELECT frame FROM t WHERE contains('bus') FIND RARE ORACLE BUDGET 50 "
                      "USING ORACLE other"):
            with pytest.raises(QueryError, match="needs an index") as err:
                db.sql(query)
            assert err.value.hint == note


def test_a_video_table_alias_serves_the_restriction_and_group_key(traffic_con):
    """`FROM v AS t ... WHERE t.ts < 4` keeps the same frames as `WHERE ts < 4` (the
    restriction ran over the table without its alias: 'table t not found'); in a condition
    with frame functions a qualified column is refused with the fix."""
    db = traffic_con
    plain = db.sql("SELECT AVG(objects('car')) FROM v WHERE ts < 4 AND frame % 2 = 1 "
                   "ERROR WITHIN 0.5 SEED 1").fetchall()
    aliased = db.sql("SELECT AVG(objects('car')) FROM v AS t WHERE t.ts < 4 AND t.frame % 2 = 1 "
                     "ERROR WITHIN 0.5 SEED 1").fetchall()
    assert aliased[0][:4] == plain[0][:4] and aliased[0][5] == plain[0][5] <= 60
    groups = db.sql("SELECT t.frame // 150 AS g, AVG(objects('car')) FROM v t GROUP BY g "
                    "ERROR WITHIN 1 SEED 1").df()
    assert groups["g"].tolist() == [0, 1]
    with pytest.raises(QueryError, match="write frame, not t.frame"):
        db.sql("SELECT AVG(objects('car')) FROM v t WHERE contains('bus') OR t.frame < 9 "
               "ERROR WITHIN 0.5")


def test_the_operators_seconds_leave_out_binding_its_seed(traffic_con, monkeypatch):
    """A query's `seconds['total']` is its operator's (through the label cache), as the
    scale bench's baseline on arrays is: the sampling seed, drawn from the index while
    binding, is computed before that clock starts."""
    import time

    from vidql.engine import planner

    traffic_con.sql("CREATE INDEX ti ON v USING TASTI WITH (embedder = 'pixel', reps = 40, "
                    "seed = 0)")
    query = "SELECT frame FROM v WHERE objects('car') >= 3 LIMIT 2 GAP 5 SEED 3"
    traffic_con.sql(query).df()  # the first query propagates the index's proxy
    seed = planner.Binding.sampling_seed
    monkeypatch.setattr(planner.Binding, "sampling_seed",
                        lambda self, s: time.sleep(0.5) or seed(self, s))
    traffic_con.sql(query).df()
    report = traffic_con.last_report
    assert report.index is not None and report.seconds["total"] < 0.5
