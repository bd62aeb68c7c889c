"""A query that cannot run fails before the first oracle call: the whole query is bound
against the video table's schema (with its frame-function columns) first, and EXPLAIN
catches the same errors (issue 9, item 10)."""
from __future__ import annotations

import pytest

import vidql
from vidql.errors import QueryError

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
