"""Exact SQL: frame functions over oracle labels, frame ranges, plain DuckDB, catalog SQL."""
from __future__ import annotations

import numpy as np
import pytest

from vidql.base.errors import CatalogError, QueryError


@pytest.fixture()
def db(clip_db):
    return clip_db


def _brightness_counts(counter_clip, frames):
    from vidql.preprocess.frames import FrameReader

    with FrameReader(counter_clip) as reader:
        return np.array([int(f.mean() // 64) for f in reader.read(frames)])


def test_frame_functions_match_the_oracle(db, counter_clip, oracle_module):
    df = db.sql("SELECT frame, objects('car') AS cars, contains('car') AS any_car, "
                "objects('car', 0.95) AS sure FROM clip WHERE frame < 40 ORDER BY frame").df()
    expected = _brightness_counts(counter_clip, np.arange(40))
    assert list(df["frame"]) == list(range(40))
    assert np.array_equal(df["cars"].to_numpy(), expected)
    assert np.array_equal(df["any_car"].to_numpy(), expected >= 1)
    assert (df["sure"] == 0).all()  # the oracle's scores are 0.9
    assert db.last_report.oracle_calls == 40  # only the restricted range was labelled
    db.sql("SELECT count(*) FROM clip WHERE frame < 40 AND objects('car') >= 1")
    assert db.last_report.oracle_calls == 0 and db.last_report.cache_hits == 40


def test_a_ts_bound_limits_the_frames_labelled(db, counter_clip):
    """`ts` bounds the frames an exact query labels as `frame` does; the restriction itself
    is evaluated, so a strict bound labels no frame at its edge."""
    sql = "SELECT frame, objects('car') AS cars FROM clip WHERE ts < 1 ORDER BY frame"
    # 30 frames at 30 fps, two of which the first EXPLAIN labelled to time the oracle
    assert db.sql("EXPLAIN " + sql).df()["estimated_oracle_calls"][0] == 28
    df = db.sql(sql).df()
    assert list(df["frame"]) == list(range(30))
    assert np.array_equal(df["cars"].to_numpy(), _brightness_counts(counter_clip, np.arange(30)))
    assert db.last_report.oracle_calls + db.last_report.cache_hits == 30
    assert db.last_report.cache_hits == 2
    both = ("SELECT count(*) FROM clip WHERE ts BETWEEN 2 AND 3 AND frame >= 70 "
            "AND objects('car') >= 0")
    assert db.sql("EXPLAIN " + both).df()["estimated_oracle_calls"][0] == 21
    assert db.sql(both).df().iloc[0, 0] == 21 and db.last_report.oracle_calls == 21


def test_objects_table_and_whole_video(db, counter_clip):
    n = db.sql("SELECT count(*) AS n FROM clip.objects").df()["n"][0]
    assert n == _brightness_counts(counter_clip, np.arange(120)).sum()
    assert db.last_report.oracle_calls == 120
    avg = db.sql("SELECT avg(objects(*)) AS a FROM clip").df()["a"][0]
    assert avg == pytest.approx(n / 120)


def test_plain_sql_and_catalog_statements(db):
    db.sql("CREATE TABLE notes AS SELECT 1 AS x")
    assert db.sql("SELECT x FROM notes").df()["x"].tolist() == [1]
    assert db.sql("SHOW VIDEOS").df()["name"].tolist() == ["clip"]
    assert db.sql("SHOW ORACLES").df()["name"].tolist() == ["bright"]
    plan = db.sql("EXPLAIN SELECT count(*) FROM clip WHERE objects('car') >= 2").df()
    assert plan["estimated_oracle_calls"][0] == 118  # two labelled to time the oracle
    assert db.labels("clip").stats.oracle_calls == 2  # and called no more
    db.sql("DROP VIDEO clip")
    assert db.sql("SHOW VIDEOS").df().empty


@pytest.mark.parametrize("query, error", [
    ("SELECT objects(car) FROM clip", QueryError),
    ("SELECT objects('car') FROM nothere", QueryError),
    ("SELECT objects('car' FROM clip", QueryError),
    ("LOAD VIDEO 'x.mp4' AS", QueryError),
    ("SET ORACLE clip = nope", CatalogError),
    ("SELECT AVG(objects('car')) FROM clip ERROR WITHIN 0.1 CONFIDENCE 120%", QueryError),
])
def test_malformed_queries_raise_vidql_errors(db, query, error):
    with pytest.raises(error):
        db.sql(query)
    assert db.sql("SHOW VIDEOS").df()["name"].tolist() == ["clip"]


def test_a_query_binds_over_the_column_types_it_runs_over(db):
    """Queries are bound (before any oracle call) over an empty table built without the
    labels join; its columns must have the types of the table they then run over."""
    from vidql.engine.exact import _empty_shadow, _shadow_video
    from vidql.engine.sql.framestat import parse_frame_expr

    functions = parse_frame_expr("objects('car') + objects(*, 0.5) + contains('car')").functions
    identity = db.catalog.label_cache("clip").oracle.identity
    types = []
    for make in (lambda: _empty_shadow(db.catalog, "clip", functions),
                 lambda: _shadow_video(db.catalog, "clip", identity, functions)):
        make()
        types.append(db.catalog.con.execute("DESCRIBE temp.clip").df()[["column_name",
                                                                        "column_type"]])
        db.catalog.con.execute("DROP TABLE temp.clip")
    assert types[0].equals(types[1]) and len(types[0]) == 4 + len(functions)


@pytest.mark.parametrize("query, whole", [
    ("SELECT (SELECT sum(objects('car')) FROM clip) AS total FROM clip WHERE frame < 40 LIMIT 1",
     True),
    ("SELECT count(*) AS total FROM clip WHERE frame < 40 AND frame IN "
     "(SELECT frame - 40 FROM clip WHERE objects('car') >= 0)", False),  # frames 40..79
    ("SELECT (SELECT count(*) FROM clip.objects) AS total FROM clip WHERE frame < 40 LIMIT 1",
     True),
    ("SELECT (SELECT count(*) FROM clip.objects) AS total FROM clip.objects WHERE frame < 40 "
     "LIMIT 1", True),
    ("WITH every AS (SELECT sum(objects('car')) AS s FROM clip) "
     "SELECT (SELECT s FROM every) AS total FROM clip WHERE frame < 40 LIMIT 1", True),
])
def test_a_frame_range_does_not_bound_another_read_of_the_video(db, counter_clip, query, whole):
    """The WHERE of the outer query bounds only its own read: a subquery over the whole
    video (or its detections) still sees every frame labelled, not only those in the
    range (it used to see the labelled frames alone, NULL elsewhere)."""
    total = _brightness_counts(counter_clip, np.arange(120)).sum() if whole else 40
    assert db.sql(query).df()["total"][0] == total
    assert db.last_report.oracle_calls == 120


def test_a_frame_function_column_is_named_as_written(db):
    """A call whose column carries a suffix (a class name with capitals, a score the text
    rounds) is named as written in the result, unless another column already has that name
    in some case; the values stay each call's own."""
    got = db.sql("SELECT objects('Car'), objects('car', 0.123456789) FROM clip WHERE frame = 100")
    assert got.columns == ["objects('Car')", "objects('car', 0.123457)"]
    assert got.fetchall() == [(0, 2)]
    both = db.sql("SELECT objects('car'), objects('CAR') FROM clip WHERE frame = 100")
    assert both.columns[0] == "objects('car')" and both.columns[1].startswith("objects('CAR') #")
    assert both.fetchall() == [(2, 0)]
