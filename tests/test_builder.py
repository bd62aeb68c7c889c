"""The Python builder writes SQL literals (numpy scalars, quotes), has the SQL defaults (no
budget of its own), and every call round-trips through to_sql() and the parser; a fuzz of
its arguments sees only VidqlErrors."""
from __future__ import annotations

import numpy as np
import pytest

import vidql
from vidql import contains, objects
from vidql.api import VideoQuery
from vidql.engine.sql.dialect import parse
from vidql.base.errors import ParameterError, QueryError, VidqlError

V = VideoQuery(db=None, video="t")
SEEDED = V.using(oracle="truth", index="t_idx", seed=np.int64(7))

# (kind, positional args, keyword args, checks on the parsed Query)
CALLS = [
    ("aggregate", ("avg", objects("car")), {"error": 0.5},
     lambda q: (q.kind, q.aggregate.func, q.clauses.error, q.clauses.error_relative)
     == ("aggregate", "avg", 0.5, False)),
    ("aggregate", ("sum", objects("car", 0.5)), {"error": 0.05, "relative": True,
                                                 "confidence": 0.9},
     lambda q: (q.kind, q.clauses.error, q.clauses.error_relative, q.clauses.confidence)
     == ("aggregate", 0.05, True, 0.9)),
    ("aggregate", ("count",), {"budget": 300},
     lambda q: (q.kind, q.aggregate.func, q.clauses.budget) == ("aggregate_budget", "count", 300)),
    ("aggregate", ("avg", objects("car")), {"budget": 200, "group_by": contains("bus")},
     lambda q: q.kind == "aggregate_budget" and q.group_by == "contains('bus')"),
    ("limit", (5,), {"gap": 30, "budget": 100},
     lambda q: (q.kind, q.limit, q.clauses.gap, q.clauses.budget) == ("limit", 5, 30, 100)),
    ("limit", (2,), {}, lambda q: (q.kind, q.limit, q.clauses.gap) == ("limit", 2, None)),
    ("select", (), {"recall": 0.9, "budget": 500},
     lambda q: (q.kind, q.clauses.recall_target, q.clauses.budget) == ("select_recall", 0.9, 500)),
    ("select", (), {"precision": 0.8, "confidence": 0.99, "budget": 400},
     lambda q: (q.kind, q.clauses.precision_target, q.clauses.confidence)
     == ("select_precision", 0.8, 0.99)),
    ("rare", (), {"budget": 50}, lambda q: (q.kind, q.clauses.budget) == ("rare", 50)),
    ("exact", (objects("car"), "frame"), {}, lambda q: q.kind == "exact"),
]


def _numpy(value):
    """The same argument as a numpy scalar."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return np.int64(value) if isinstance(value, int) else np.float64(value)


@pytest.mark.parametrize("kind, args, kwargs, check", CALLS)
def test_every_builder_call_round_trips_through_the_parser(kind, args, kwargs, check):
    query = V.where(objects("car") >= np.float64(3)).where(contains("it's") | (objects("bus") == "b'q"))
    # an exact query takes no SEED or index, in SQL as in the builder
    using = V.using(oracle="truth") if kind == "exact" else SEEDED
    for builder in (query, using.where(contains("bus")).where("frame < 100")):
        sql = builder.to_sql(kind, *args, **kwargs)
        q = parse(sql)
        assert check(q), sql
        numpy_sql = builder.to_sql(kind, *map(_numpy, args),
                                   **{k: _numpy(v) for k, v in kwargs.items()})
        assert numpy_sql == sql  # numpy scalars write the same literals
    q = parse(query.to_sql(kind, *args, **kwargs))
    labels = {fn.label for fn in q.predicate_expr.functions} if q.predicate_expr else set()
    assert kind == "exact" or labels == {"car", "it's", "bus"}
    assert "'b''q'" in (q.predicate or q.sql)
    seeded = parse(using.where(contains("bus")).to_sql(kind, *args, **kwargs)).clauses
    assert (seeded.oracle, seeded.index, seeded.seed) == (
        ("truth", None, None) if kind == "exact" else ("truth", "t_idx", 7))


def test_builder_has_the_sql_defaults():
    """No budget of its own: a missing budget fails as in SQL, with the same message."""
    for kind, sql in (("select", "SELECT clip, frame, ts FROM t WHERE (contains('bus')) RECALL TARGET 0.9"),
                      ("rare", "SELECT clip, frame, ts FROM t WHERE (contains('bus')) FIND RARE")):
        built = V.where(contains("bus")).to_sql(kind, **({"recall": 0.9} if kind == "select" else {}))
        assert built == sql
        with pytest.raises(QueryError) as by_builder:
            parse(built)
        assert "ORACLE BUDGET" in str(by_builder.value)
    assert parse(V.to_sql("aggregate", "avg", objects("car"), error=0.1)).confidence == 0.95


@pytest.mark.parametrize("bad", [np.nan, np.inf, "3", [1], 2.5, np.float64(1.5), True])
def test_a_bad_budget_is_a_parameter_error(bad):
    with pytest.raises(ParameterError, match="budget"):
        V.where(contains("bus")).to_sql("select", recall=0.9, budget=bad)


@pytest.mark.parametrize("bad", [np.nan, -np.inf, [1], {"a": 1}, b"x", 1j, object()])
def test_a_value_without_a_sql_literal_is_a_parameter_error(bad):
    with pytest.raises(ParameterError):
        _ = objects("car") >= bad
    with pytest.raises(ParameterError, match="min_score"):
        objects("car", min_score=bad)
    with pytest.raises(ParameterError, match="where"):
        V.where(bad)


def test_numpy_scalars_and_quotes_run(traffic_db, small_traffic, tmp_path):
    from vidql.datasets import read_labels

    quoted = read_labels(small_traffic[1]).replace({"label": {"person": "it's"}})
    quoted.to_csv(tmp_path / "quoted.csv", index=False)
    with vidql.connect(traffic_db, progress=False) as db:
        t = db.video("t").using(seed=np.int64(2))
        hits = t.where(objects("car") >= np.float64(3)).limit(np.int64(2), budget=np.int32(50))
        assert len(hits) == 2 and hits.fetchnumpy()["verified"].all()
        avg = t.aggregate("avg", objects("car"), error=np.float64(0.5), confidence=np.float32(0.9))
        assert avg.report.guarantee.startswith("AVG within ±0.5")
        db.sql(f"CREATE ORACLE q FROM LABELS '{tmp_path / 'quoted.csv'}'")
        got = db.video("t").using(oracle="q").where("frame < 5").exact(contains("it's"))
        people = set(quoted.loc[quoted["label"] == "it's", "frame"])
        assert got.fetchall() == [(f in people,) for f in range(5)]  # quotes, as literals
        with pytest.raises(QueryError, match="oracle 'q' has no class \"b'q\""):
            db.video("t").using(oracle="q").exact(objects("b'q") == 0)


# ------------------------------------------------------------------ fuzz

ARGUMENTS = [0, 1, -1, 3, 0.5, 0.95, 1.5, 1e309, -0.0, np.float64(0.3), np.float32(0.9),
             np.int64(4), np.int32(-2), np.uint8(200), np.bool_(True), True, np.nan, np.inf,
             "car", "it's", "'; DROP TABLE t; --", '"q"', "", "é'", None, [1], (2,), {"a": 1},
             b"x", 1 + 2j, object(), 10**400, -10**400, 1e-320, 5e-324, np.uint64(2**64 - 1),
             np.float64("nan"), -np.inf, 2**63]
# names with quotes and semicolons, for every name the builder writes (USING ORACLE/INDEX)
NAMES = ["idx", "x; CREATE TABLE pwned AS SELECT 1 AS a; --", 'q"uote', "it's", "a b", ";",
         '"', "SEED 5", "select", "é", "-- c", "/* c */"]
VALID = {"error": 0.5, "relative": False, "confidence": 0.9, "budget": 100, "group_by": None,
         "gap": 10, "recall": 0.9, "precision": 0.8, "n": 5, "label": "car", "min_score": 0.5,
         "seed": 3, "value": 2}
KWARGS = {"aggregate": ["error", "relative", "confidence", "budget", "group_by"],
          "limit": ["gap", "budget"], "select": ["recall", "precision", "confidence", "budget"],
          "rare": ["budget"]}


def _fuzz_call(rng: np.random.Generator):
    """A random terminal call: each argument valid, its numpy twin, or any of ARGUMENTS."""
    def arg(name):
        roll = rng.random()
        if roll < 0.5:
            return VALID[name]
        return _numpy(VALID[name]) if roll < 0.75 else ARGUMENTS[rng.integers(len(ARGUMENTS))]

    kind = list(KWARGS)[rng.integers(len(KWARGS))]
    names = rng.choice(KWARGS[kind], size=rng.integers(1, len(KWARGS[kind]) + 1), replace=False)
    kwargs = {str(name): arg(str(name)) for name in names}
    args = {"aggregate": (["avg", "sum", "count", arg("n")][rng.integers(4)],
                          objects(arg("label"), arg("min_score") if rng.random() < 0.5 else None)),
            "limit": (arg("n"),)}.get(kind, ())
    where = [objects("car") >= arg("value"), contains(arg("label")), objects("bus") == arg("label"),
             arg("value") + objects("car") * arg("value")][rng.integers(4)]
    names = {k: NAMES[rng.integers(len(NAMES))] for k in ("oracle", "index") if rng.random() < 0.5}
    builder = V.where(where).using(seed=arg("seed"), **names)
    return builder, kind, args, kwargs


def test_fuzz_builder_arguments_give_only_vidql_errors():
    rng = np.random.default_rng(99)
    counts = {"ok": 0, "error": 0}
    for _ in range(3000):
        try:
            builder, kind, args, kwargs = _fuzz_call(rng)
            stmt = parse(builder.to_sql(kind, *args, **kwargs))
            counts["ok"] += 1
            # a name stays one name: never a clause or a statement of its own
            assert (stmt.clauses.oracle, stmt.clauses.index) == (builder.oracle, builder.index)
        except VidqlError:
            counts["error"] += 1
    assert counts["ok"] > 100 and counts["error"] > 500, counts
