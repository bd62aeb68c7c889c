"""The vidql dialect parser: sql.md's examples, clause values and ranges, the kind rule,
error positions, scripts, and a seeded fuzz (every input parses or raises QueryError)."""
import itertools
import os
import json
import re
from pathlib import Path

import duckdb
import numpy as np
import pytest

from vidql.engine.sql.dialect import (Clauses, CreateIndex, CreateOracle, DropIndex, DropVideo,
                                  LoadVideo, PlainSQL, Query, SetOracle, ShowIndexes, ShowOracles,
                                  ShowVideos, describe, parse, parse_script)
from vidql.engine.sql.dialect_lex import tokenize
from vidql.base.errors import QueryError

ROOT = Path(__file__).resolve().parents[1]

# Every statement of docs/sql.md, with what it must parse to.
CATALOG_EXAMPLES = [
    ("LOAD VIDEO 'clips/night.mp4' AS night;", LoadVideo("clips/night.mp4", "night", {})),
    ("LOAD VIDEO 'clips/night.mp4' AS night WITH (rendition = 128);",
     LoadVideo("clips/night.mp4", "night", {"rendition": 128})),
    ("SHOW VIDEOS;", ShowVideos()),
    ("DROP VIDEO night;", DropVideo("night")),
    ("CREATE ORACLE yolox FROM ONNX 'models/yolox_nano.onnx' WITH (score = 0.3);",
     CreateOracle("yolox", "ONNX", "models/yolox_nano.onnx", {"score": 0.3})),
    ("CREATE ORACLE frcnn FROM TORCHVISION 'fasterrcnn_resnet50_fpn' WITH (weights = 'frcnn.pth');",
     CreateOracle("frcnn", "TORCHVISION", "fasterrcnn_resnet50_fpn", {"weights": "frcnn.pth"})),
    ("CREATE ORACLE truth FROM LABELS 'night_labels.parquet' WITH (cost_ms = 40);",
     CreateOracle("truth", "LABELS", "night_labels.parquet", {"cost_ms": 40})),
    ("CREATE ORACLE mine  FROM PYTHON 'mypkg.detect:MyDetector';",
     CreateOracle("mine", "PYTHON", "mypkg.detect:MyDetector", {})),
    ("SET ORACLE night = yolox;", SetOracle("night", "yolox")),
    ("SHOW ORACLES;", ShowOracles()),
    ("CREATE INDEX night_idx ON night USING TASTI WITH (train = 1000, reps = 2000, k = 5);",
     CreateIndex("night_idx", "night", "TASTI", {"train": 1000, "reps": 2000, "k": 5})),
    ("SHOW INDEXES;", ShowIndexes()),
]

# (query, kind, expected attributes; 'clauses' compares the whole Clauses)
QUERY_EXAMPLES = [
    ("SELECT frame, objects('car') AS cars FROM night WHERE frame < 500 "
     "ORDER BY cars DESC LIMIT 5;",
     "exact", dict(tables=("night",), video="night", limit=5,
                   restriction="frame < 500", clauses=Clauses())),
    ("SELECT label, count(*) FROM night.objects GROUP BY label;",
     "exact", dict(tables=("night.objects",), video=None, clauses=Clauses())),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 95%;",
     "aggregate", dict(video="night", predicate=None,
                       clauses=Clauses(error=0.1, confidence=0.95))),
    ("SELECT SUM(objects('car')) FROM night ERROR WITHIN 5% CONFIDENCE 95%;",
     "aggregate", dict(clauses=Clauses(error=0.05, error_relative=True, confidence=0.95))),
    ("SELECT COUNT(*) FROM night WHERE objects('car') >= 5 ERROR WITHIN 2% CONFIDENCE 95%;",
     "aggregate", dict(predicate="objects('car') >= 5",
                       clauses=Clauses(error=0.02, error_relative=True, confidence=0.95))),
    ("SELECT AVG(objects('car')) FROM night WHERE contains('bus') "
     "ORACLE BUDGET 2000 CONFIDENCE 95%;",
     "aggregate_budget", dict(predicate="contains('bus')",
                              clauses=Clauses(budget=2000, confidence=0.95))),
    ("SELECT frame FROM night WHERE objects('car') >= 5 LIMIT 10 GAP 300;",
     "limit", dict(limit=10, predicate="objects('car') >= 5", clauses=Clauses(gap=300),
                   sql="SELECT frame FROM night WHERE objects('car') >= 5 LIMIT 10")),
    ("SELECT frame FROM night WHERE contains('bus') RECALL TARGET 90% CONFIDENCE 95% "
     "ORACLE BUDGET 1000;",
     "select_recall", dict(clauses=Clauses(recall_target=0.9, confidence=0.95, budget=1000))),
    ("SELECT frame FROM night WHERE contains('bus') PRECISION TARGET 95% CONFIDENCE 95% "
     "ORACLE BUDGET 1000;",
     "select_precision", dict(clauses=Clauses(precision_target=0.95, confidence=0.95,
                                              budget=1000))),
    ("SELECT frame FROM night WHERE contains('bus') FIND RARE ORACLE BUDGET 500;",
     "rare", dict(predicate="contains('bus')", clauses=Clauses(find_rare=True, budget=500))),
]


def _error(query: str) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse(query)
    err = info.value
    assert err.query is not None and err.position is not None
    assert 0 <= err.position <= len(err.query)
    return err


@pytest.mark.parametrize("text, expected", CATALOG_EXAMPLES)
def test_catalog_examples(text, expected):
    stmt = parse(text)
    assert stmt == expected
    assert describe(stmt)


@pytest.mark.parametrize("text, kind, attrs", QUERY_EXAMPLES)
def test_query_examples(text, kind, attrs):
    q = parse(text)
    assert isinstance(q, Query) and q.kind == kind and not q.explain
    for name, value in attrs.items():
        assert getattr(q, name) == value, name
    assert describe(q)
    if kind != "exact":
        assert q.video == "night"
        assert "ERROR" not in q.sql and "BUDGET" not in q.sql and "GAP" not in q.sql


def test_examples_of_the_shipped_sql_md_all_parse():
    doc = ROOT / "docs" / "sql.md"
    blocks = re.findall(r"```sql\n(.*?)```", doc.read_text(), flags=re.S)
    statements = [s for b in blocks for s in parse_script(b)]
    known = {text.rstrip(";").strip() for text, _ in CATALOG_EXAMPLES} | {
        text.rstrip(";").strip() for text, _, _ in QUERY_EXAMPLES}
    assert len(statements) >= len(known)
    for stmt in statements:
        assert not isinstance(stmt, PlainSQL), stmt


def test_aggregate_details_and_frame_expressions():
    q = parse("SELECT AVG(objects('car', 0.5)) AS cars FROM night AS n WHERE contains('bus') "
              "AND n.frame BETWEEN 100 AND 200.5 AND ts > 1.5 AND 3 >= ts ERROR WITHIN 0.2")
    assert q.aggregate.func == "avg" and q.aggregate.argument == "objects('car', 0.5)"
    assert q.aggregate.expr.functions[0].min_score == 0.5
    assert q.columns[0].alias == "cars"
    assert q.predicate_expr.functions[0].kind == "contains"
    assert q.restriction == "n.frame BETWEEN 100 AND 200.5 AND ts > 1.5 AND 3 >= ts"
    assert q.confidence == 0.95  # the default for a guarantee
    count = parse("SELECT count(objects(*)) FROM night ERROR WITHIN 1").aggregate
    assert count.func == "count" and count.argument == "objects(*)"
    assert parse("SELECT count(*) FROM night WHERE contains('x') ERROR WITHIN 1").aggregate \
        .argument is None


def test_where_split_keeps_or_groups_and_bounds():
    q = parse("SELECT frame FROM night WHERE frame >= 10 AND (contains('bus') OR frame < 3) "
              "AND ((objects('car') > 2)) AND frame < 20.5 AND frame <> 7 LIMIT 4")
    assert q.kind == "limit"
    assert q.predicate == "(contains('bus') OR frame < 3) AND ((objects('car') > 2))"
    assert q.restriction == "frame >= 10 AND frame < 20.5 AND frame <> 7"
    assert {f.label for f in q.predicate_expr.functions} == {"bus", "car"}
    assert parse("SELECT * FROM night WHERE frame > -5 OR ts < 1 LIMIT 1").restriction == \
        "frame > -5 OR ts < 1"


def test_group_by_for_budgeted_aggregates():
    for text in ("SELECT contains('bus') AS bus, AVG(objects('car')) FROM night GROUP BY bus "
                 "ORACLE BUDGET 500",
                 "SELECT contains('bus'), AVG(objects('car')) FROM night GROUP BY 1 "
                 "ORACLE BUDGET 500",
                 "SELECT AVG(objects('car')) FROM night GROUP BY contains( 'bus' ) "
                 "ORACLE BUDGET 500"):
        q = parse(text)
        assert q.kind == "aggregate_budget"
        assert q.group_by.replace(" ", "") == "contains('bus')"
        assert q.group_expr.functions[0].label == "bus"
    err = _error("SELECT frame, AVG(objects('car')) FROM night GROUP BY contains('bus') "
                 "ORACLE BUDGET 5")
    assert err.position == 7


@pytest.mark.parametrize("clauses", [
    ["ERROR WITHIN 5%", "CONFIDENCE 0.9", "USING ORACLE yolox", "USING INDEX idx", "SEED 7"],
    ["RECALL TARGET 0.8", "ORACLE BUDGET 300", "CONFIDENCE 99%", "SEED 1"],
    ["LIMIT 10", "GAP 30", "ORACLE BUDGET 50", "USING INDEX \"My Idx\""],
])
def test_clauses_in_any_order_give_the_same_query(clauses):
    body = ("SELECT AVG(objects('car')) FROM night WHERE contains('bus')" if "ERROR" in clauses[0]
            else "SELECT frame FROM night WHERE contains('bus')")
    results = set()
    for order in itertools.permutations(clauses):
        q = parse(body + " " + " ".join(order))
        results.add((q.kind, q.clauses, q.sql, q.limit))
    assert len(results) == 1
    kind, got, _, _ = results.pop()
    assert kind in ("aggregate", "select_recall", "limit")
    if kind == "limit":
        assert got.index == "My Idx" and got.gap == 30 and got.budget == 50


@pytest.mark.parametrize("text, kind", [
    ("SELECT frame FROM night WHERE contains('bus') LIMIT 5", "limit"),
    ("SELECT n.clip, frame, ts, * FROM night n WHERE contains('bus') LIMIT 5", "limit"),
    ("SELECT frame, objects('car') FROM night WHERE contains('bus') ORDER BY frame LIMIT 5",
     "exact"),
    ("select frame from night where contains('bus') limit 5 gap 0 seed 3", "limit"),
    ("SELECT frame FROM night WHERE contains('bus') ORDER BY frame LIMIT 5", "exact"),
    ("SELECT frame FROM night WHERE frame < 100 LIMIT 5", "exact"),
    ("SELECT frame FROM night WHERE contains('bus') LIMIT 5 OFFSET 2", "exact"),
    ("SELECT DISTINCT frame FROM night WHERE contains('bus') LIMIT 5", "exact"),
    ("SELECT count(*) FROM night WHERE contains('bus') LIMIT 5", "exact"),
    ("SELECT frame FROM night JOIN t USING (frame) WHERE contains('bus') LIMIT 5", "exact"),
    ("SELECT frame FROM night WHERE contains('bus') LIMIT 5 ORACLE BUDGET 100", "limit"),
    ("SELECT avg(objects('car')) FROM night ERROR WITHIN 1 ORACLE BUDGET 100", "aggregate"),
    ("SELECT * FROM night WHERE contains('bus') USING ORACLE yolox", "exact"),
    ("SELECT seed, gap, confidence FROM t", "exact"),
    ("SELECT name FROM people WHERE contains(name, 'x') LIMIT 5", "exact"),  # DuckDB's contains
])
def test_kind_rule(text, kind):
    assert parse(text).kind == kind


def test_explain_and_plain_sql():
    q = parse("EXPLAIN SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1")
    assert q.explain and q.kind == "aggregate" and not q.sql.upper().startswith("EXPLAIN")
    assert describe(q).startswith("EXPLAIN ")
    for text in ("CREATE TABLE t (a INT)", "INSERT INTO t VALUES (1)", "SET threads = 2",
                 "LOAD httpfs", "CREATE INDEX i ON t (a)", "CREATE INDEX i ON t USING ART (a)"):
        assert parse(text + ";") == PlainSQL(text)
    assert parse("DROP INDEX IF EXISTS night_idx") == DropIndex("night_idx", True)
    assert parse('drop video "My Video"') == DropVideo("My Video")
    assert parse("CREATE INDEX i ON night") == CreateIndex("i", "night", "TASTI", {})


def test_script_splits_on_tokens_not_text():
    stmts = parse_script("LOAD VIDEO 'a;b.mp4' AS v; -- comment; here\n"
                         "SELECT ';' AS s FROM v /* ; */ ;;\nSHOW VIDEOS")
    assert stmts[0] == LoadVideo("a;b.mp4", "v", {})
    assert stmts[1].kind == "exact" and stmts[1].sql == "SELECT ';' AS s FROM v"
    assert stmts[2] == ShowVideos()
    assert parse_script("  ;  ") == []
    text = "SHOW VIDEOS; SELECT avg(x) FROM v CONFIDENCE 2"
    with pytest.raises(QueryError) as info:
        parse_script(text)
    assert info.value.position == text.index("2")
    err = _error("SHOW VIDEOS; SHOW ORACLES")
    assert err.position == 13 and "parse_script" in err.hint


@pytest.mark.parametrize("text, at, words", [
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN CONFIDENCE 95%", "CONFIDENCE",
     "needs a number"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 120%", "120", "(0%, 100%)"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 0", "0", "outside"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 95", "95", "95%"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 0.1 CONFIDENCE 1", "1", "outside"),
    ("SELECT frame FROM night WHERE contains('bus') RECALL TARGET 150% ORACLE BUDGET 9", "150",
     "(0%, 100%]"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 100%", "100", "(0%, 100%)"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN -1", "-1", "positive"),
    ("SELECT AVG(objects('car')) FROM night ORACLE BUDGET 2.5", "2.5", "whole number"),
    ("SELECT AVG(objects('car')) FROM night ORACLE BUDGET 0", "0", "below 1"),
    ("SELECT frame FROM night WHERE contains('bus') LIMIT 3 GAP 10%", "10", "percentage"),
    ("LOAD VIDEO AS x", "AS", "path"),
    ("LOAD VIDEO 'a.mp4' night", "night", "AS name"),
    ("LOAD VIDEO \"a.mp4\" AS night", '"a.mp4"', "single quotes"),
    ("LOAD VIDEO 'a.mp4' AS v WITH (rendition 128)", "128", "'='"),
    ("LOAD VIDEO 'a.mp4' AS v WITH (rendition = 128", None, "')'"),
    ("LOAD VIDEO 'a.mp4' AS v WITH (a = 1 b = 2)", "b", "','"),
    ("LOAD VIDEO 'a.mp4' AS v WITH (a = 1, a = 2)", "a = 2", "twice"),
    ("LOAD VIDEO 'a.mp4' AS v WITH ()", ")", "option name"),
    ("LOAD VIDEO 'a.mp4' AS v extra", "extra", "unexpected"),
    ("LOAD VIDEO 'a.mp4", "'a.mp4", "unterminated"),
    ("SELECT \"abc FROM night", '"abc', "unterminated"),
    ("SELECT 1 /* open", "/*", "unterminated"),
    ("CREATE ORACLE o FROM KERAS 'm'", "KERAS", "oracle kind"),
    ("CREATE INDEX i ON night USING FAISS", "FAISS", "TASTI"),
    ("SET ORACLE night yolox", "yolox", "'='"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 1 trailing", "trailing", "unexpected"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 1 ERROR WITHIN 2", "ERROR WITHIN 2",
     "twice"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 1 ERROR 2", "2", "ERROR WITHIN"),
    ("SELECT AVG(objects('car')) FROM night WHERE ERROR WITHIN 1", "WHERE", "syntax"),
    ("SELECT AVG(objects('car')) FRM night", "night", "syntax"),
    ("SELECT frame FROM night WHERE contains('bus') RECALL TARGET 90% PRECISION TARGET 90% "
     "ORACLE BUDGET 5", "PRECISION", "cannot be combined"),
    ("SELECT frame FROM night WHERE contains('bus') FIND RARE", "FIND", "ORACLE BUDGET"),
    ("SELECT frame FROM night WHERE contains('bus') RECALL TARGET 0.9", "RECALL", "ORACLE BUDGET"),
    ("SELECT frame FROM night ERROR WITHIN 1", "ERROR", "aggregate"),
    ("SELECT AVG(objects('car')) FROM night CONFIDENCE 95%", "CONFIDENCE", "CONFIDENCE needs"),
    ("SELECT frame FROM night WHERE contains('bus') LIMIT 3 CONFIDENCE 95%", "CONFIDENCE",
     "CONFIDENCE needs"),
    ("SELECT frame FROM night WHERE frame < 3 SEED 4", "SEED", "approximate"),
    ("SELECT frame FROM night GAP 3", "GAP", "LIMIT"),
    ("SELECT frame FROM night LIMIT 3 GAP 3", "GAP", "WHERE"),
    ("SELECT frame FROM night ORACLE BUDGET 3", "ORACLE", "ORACLE BUDGET needs"),
    ("SELECT MEDIAN(objects('car')) FROM night ERROR WITHIN 1", "MEDIAN", "cannot be approximated"),
    ("SELECT AVG(objects('car')), SUM(objects('car')) FROM night ERROR WITHIN 1", "SUM",
     "one aggregate"),
    ("SELECT AVG(objects('car')) * 2 FROM night ERROR WITHIN 1", "AVG", "by itself"),
    ("SELECT AVG(DISTINCT objects('car')) FROM night ERROR WITHIN 1", "AVG", "DISTINCT"),
    ("SELECT AVG(objects('car')) FROM night, t ERROR WITHIN 1", "FROM", "one video"),
    ("SELECT AVG(x) FROM night.objects ERROR WITHIN 1", "night.objects", "video table"),
    ("SELECT AVG(objects('car')) FROM night ERROR WITHIN 1 LIMIT 3", "LIMIT", "LIMIT"),
    ("SELECT AVG(objects('car')) FROM night ORDER BY 1 ERROR WITHIN 1", "1 ERROR", "ORDER BY"),
    ("SELECT 1 UNION SELECT AVG(objects('car')) FROM night ERROR WITHIN 1", "SELECT 1", "UNION"),
    ("SELECT frame FROM night WHERE contains('bus') ORDER BY frame LIMIT 3 GAP 2", "frame LIMIT",
     "ORDER BY"),
    ("SELECT frame FROM night WHERE contains(bus) FIND RARE ORACLE BUDGET 5", "bus", "quoted"),
    # a frame function's arguments are read one by one (a signed or computed one was taken
    # for more arguments)
    ("SELECT AVG(objects('car', -1)) FROM night ERROR WITHIN 1", "-1", "min_score -1 is outside"),
    ("SELECT AVG(objects('car', 0.5 + 1)) FROM night ERROR WITHIN 1", "0.5 +",
     "min_score must be a number, got 0.5 + 1"),
    ("SELECT AVG(objects('car',)) FROM night ERROR WITHIN 1", "objects", "no min_score"),
    ("SELECT AVG(objects('car' || 'x')) FROM night ERROR WITHIN 1", "'car' ||",
     "quoted class name, got 'car' || 'x'"),
    # a selection returns clip, frame, ts and verified: other columns were dropped silently
    ("SELECT frame, objects('car') FROM night WHERE objects('car') > 2 LIMIT 3", "objects('car') FROM",
     "LIMIT returns clip, frame, ts and verified for each frame it selects, not objects('car')"),
    ("SELECT frame AS f FROM night WHERE contains('bus') RECALL TARGET 90% ORACLE BUDGET 5",
     "frame AS", "not frame renamed f"),
    ("SELECT frame, ts + 1 FROM night WHERE contains('bus') LIMIT 3 GAP 2", "ts + 1",
     "LIMIT ... GAP returns"),
    ("SELECT start_ts FROM night WHERE contains('bus') FIND RARE ORACLE BUDGET 5", "start_ts",
     "FIND RARE returns"),
    ("SELECT (SELECT 1 ORACLE BUDGET 3)", "ORACLE", "parentheses"),
    ("SELECT AVG(objects('car') FROM night ERROR WITHIN 1", "(objects", "not closed"),
    ("INSERT INTO t SELECT 1 CONFIDENCE 95%", "CONFIDENCE", "SELECT queries only"),
    ("EXPLAIN", None, "needs a query"),
    ("EXPLAIN SHOW VIDEOS", "SHOW", "plan of a query"),
    ("EXPLAIN CREATE TABLE t (a INT)", "CREATE", "plan of a query"),
    ("", None, "empty"),
    ("-- only a comment", None, "empty"),
])
def test_errors_say_what_and_where(text, at, words):
    err = _error(text)
    assert words.lower() in (str(err)).lower()
    if at is None:
        assert err.position == len(text) or err.position == 0 or text.strip() == "EXPLAIN"
    else:
        assert err.position == text.rindex(at), (err.position, str(err))


def test_errors_on_later_lines_point_into_the_whole_text():
    text = "SELECT AVG(objects('car'))\nFROM night\nERROR WITHIN 0.1\nCONFIDENCE 120%"
    err = _error(text)
    assert err.position == text.index("120") and "\n  CONFIDENCE 120%\n" in str(err)
    with pytest.raises(QueryError):
        parse(None)


def test_error_positions_count_characters_not_bytes():
    text = "SELECT 'café', 'ü' FROM night WHERE frame = = 1"
    assert _error(text).position == text.rindex("=")
    text = "LOAD VIDEO 'vidéo.mp4' AS v WITH (x = )"
    assert _error(text).position == text.index(")")
    assert parse("LOAD VIDEO 'vidéo.mp4' AS v").path == "vidéo.mp4"
    text = "SELECT 'é' AS e, frame FROM night WHERE frame < 5 AND ts >= 2 ORDER BY frame"
    q = parse(text)
    assert q.restriction == "frame < 5 AND ts >= 2" and q.columns[0].text == "'é'"


# ------------------------------------------------------------------ fuzz

GARBAGE = ["ERROR", "WITHIN", "CONFIDENCE", "ORACLE", "BUDGET", "LIMIT", "GAP", "RECALL",
           "PRECISION", "TARGET", "FIND", "RARE", "USING", "INDEX", "SEED", "EXPLAIN", "SELECT",
           "FROM", "WHERE", "GROUP", "BY", "AND", "OR", "NOT", "AS", "WITH", "(", ")", ",", ";",
           "%", "-", "+", "*", "=", "'", '"', "/*", "--", "$$", "0", "-1", "1e309", "95%", "1.5",
           "0.95", "2000", "'str'", '"q"', "é", "night", "objects('car')", "contains('bus')",
           "objects(", "frame", "ts", "BETWEEN", "::", "[", "]", "{", "}", "LOAD", "VIDEO",
           "CREATE", "SHOW", "VIDEOS", "DROP", "SET", "TO", "IF", "EXISTS", "TASTI", "ON",
           "OFFSET", "ORDER", "UNION", "\\", "?", "$1", "NULL", "true"]


def _fuzz_bases() -> list[str]:
    bases = [t.rstrip(";") for t, _ in CATALOG_EXAMPLES] + [t.rstrip(";") for t, _, _ in
                                                               QUERY_EXAMPLES]
    bases += ["SELECT AVG(objects('car')) FROM night n WHERE contains('bus') AND frame < 9 "
              "GROUP BY contains('truck') ORACLE BUDGET 10 SEED 2 USING INDEX i",
              "EXPLAIN SELECT frame FROM night WHERE contains('bus') LIMIT 3 GAP 2 USING ORACLE o",
              "SELECT frame, ts, n.clip, * FROM night AS n WHERE "
              "(objects('car') + objects('truck') >= 5 OR NOT contains('bus')) AND n.frame "
              "BETWEEN 10 AND 900 AND ts IN (1, 2) AND frame % 2 = 0 AND CASE WHEN ts > 3 THEN "
              "true ELSE false END RECALL TARGET 0.9 ORACLE BUDGET 10",
              "SELECT SUM(objects('car', 0.5) * 2) FROM night WHERE frame::INT > 4 AND "
              "(contains('bus')) AND ts < (SELECT max(ts) FROM night) ERROR WITHIN 3 SEED 1"]
    return bases


def _variants(rng: np.random.Generator, bases: list[str]):
    """Token-level mutations of the base queries: permute, duplicate, drop, insert garbage,
    truncate at every token boundary."""
    for base in bases:
        toks = [t.text for t in tokenize(base) if t.text]
        for cut in range(len(toks)):
            yield " ".join(toks[:cut])
        yield base[: len(base) // 2]
    for _ in range(2200):
        toks = [t.text for t in tokenize(bases[rng.integers(len(bases))]) if t.text]
        for _ in range(rng.integers(1, 4)):
            op = rng.integers(5)
            i = int(rng.integers(len(toks))) if toks else 0
            if op == 0 and len(toks) > 1:
                j = int(rng.integers(len(toks)))
                toks[i], toks[j] = toks[j], toks[i]
            elif op == 1 and toks:
                toks.insert(i, toks[i])
            elif op == 2 and toks:
                del toks[i]
            elif op == 3:
                toks.insert(i, GARBAGE[rng.integers(len(GARBAGE))])
            else:
                k = int(rng.integers(i, len(toks) + 1))
                seg = toks[i:k]
                rng.shuffle(seg)
                toks[i:k] = seg
        yield " ".join(toks)


def _assert_valid_sql(sql: str) -> None:
    """The extracted SQL text must be something DuckDB parses."""
    result = json.loads(duckdb.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    assert not result["error"] or "Only SELECT" in result["error_message"], (sql, result)


def test_fuzz_parse_succeeds_or_raises_query_error_with_a_position():
    rng = np.random.default_rng(20240521)
    counts = {"ok": 0, "error": 0}
    variants = list(_variants(rng, _fuzz_bases()))
    assert len(variants) >= 2000
    for text in variants:
        try:
            stmt = parse(text)
        except QueryError as err:
            counts["error"] += 1
            assert err.query == text, text
            assert isinstance(err.position, int) and 0 <= err.position <= len(text), (text, err)
            continue
        counts["ok"] += 1
        assert describe(stmt)
        if isinstance(stmt, Query):
            assert stmt.kind in ("exact", "aggregate", "aggregate_budget", "limit",
                                 "select_recall", "select_precision", "rare")
            _assert_valid_sql(stmt.sql)
            pieces = [stmt.predicate, stmt.restriction, stmt.group_by,
                      stmt.aggregate and stmt.aggregate.argument]
            for piece in [p for p in pieces if p] + [c.text for c in stmt.columns]:
                _assert_valid_sql("SELECT " + piece)
    # the fuzz must exercise both outcomes
    assert counts["ok"] > 100 and counts["error"] > 500, counts


def test_fuzz_scripts_keep_positions_in_the_whole_script():
    rng = np.random.default_rng(7)
    bases = _fuzz_bases()
    for _ in range(200):
        picks = [bases[i].rstrip(";") for i in rng.integers(len(bases), size=3)]
        k = int(rng.integers(3))
        toks = [t.text for t in tokenize(picks[k])]
        del toks[int(rng.integers(len(toks)))]
        picks[k] = " ".join(toks)
        script = ";\n".join(picks)
        try:
            stmts = parse_script(script)
        except QueryError as err:
            assert 0 <= err.position <= len(script)
            start = sum(len(p) + 2 for p in picks[:k])
            # the error lies in the mutated statement (or, for an unterminated quote, later)
            assert err.position >= start, (script, err)
            continue
        assert len(stmts) == 3


# ---- clause ranges: the parser and the operators agree (issue 9, item 6)

AGG = "SELECT AVG(objects('car')) FROM night "
SEL = "SELECT frame FROM night WHERE contains('bus') "


def _run_operator(q) -> None:
    """Run the operator a query of this kind uses, with the parsed clause values, on a
    small synthetic population: a value the parser accepts must not fail there."""
    from vidql import queries

    n, c = 400, q.clauses
    rng = np.random.default_rng(0)
    values = rng.poisson(2.0, n).astype(float)
    proxy = values + rng.normal(0, 1, n)
    flags = lambda f: values[f] >= 3
    conf = c.confidence if c.confidence is not None else 0.95
    seed = c.seed if c.seed is not None else 0
    if q.kind == "aggregate":
        queries.aggregate_error_bound(n, lambda f: values[f], error=c.error,
                                      relative=c.error_relative, confidence=conf, seed=seed,
                                      max_samples=c.budget, bound="betting")
    elif q.kind == "aggregate_budget":
        queries.aggregate_budget(proxy, lambda f: (values[f], np.ones(f.size, bool)),
                                 budget=c.budget, confidence=conf, seed=seed)
    elif q.kind == "limit":
        queries.limit_query(proxy, flags, k=q.limit, gap=c.gap or 0, seed=seed,
                            max_calls=c.budget)
    elif q.kind in ("select_recall", "select_precision"):
        op = queries.recall_randomized if q.kind == "select_recall" else queries.supg_precision
        target = c.recall_target if q.kind == "select_recall" else c.precision_target
        op(proxy, flags, target=target, confidence=conf, budget=c.budget, seed=seed)
    else:
        queries.find_rare(proxy[:, None], flags, budget=c.budget, seed=seed)


@pytest.mark.parametrize("accepted, rejected", [
    (AGG + "ERROR WITHIN 0.1 CONFIDENCE 99.9%", AGG + "ERROR WITHIN 0.1 CONFIDENCE 100%"),
    (AGG + "ERROR WITHIN 0.1 CONFIDENCE 0.1%", AGG + "ERROR WITHIN 0.1 CONFIDENCE 0%"),
    (AGG + "ERROR WITHIN 0.1 CONFIDENCE 0.999", AGG + "ERROR WITHIN 0.1 CONFIDENCE 1.0"),
    (AGG + "ERROR WITHIN 0.000001", AGG + "ERROR WITHIN 0"),
    (AGG + "ERROR WITHIN 1e308", AGG + "ERROR WITHIN 1e400"),
    (AGG + "ERROR WITHIN 99.9%", AGG + "ERROR WITHIN 100%"),
    (AGG + "ERROR WITHIN 0.1%", AGG + "ERROR WITHIN 0%"),
    (AGG + "ERROR WITHIN 0.5 ORACLE BUDGET 2", AGG + "ERROR WITHIN 0.5 ORACLE BUDGET 1"),
    (AGG + "ORACLE BUDGET 10", AGG + "ORACLE BUDGET 9"),
    (SEL + "LIMIT 2 ORACLE BUDGET 1", SEL + "LIMIT 2 ORACLE BUDGET 0"),
    (SEL + "LIMIT 2 GAP 0", SEL + "LIMIT 2 ORACLE BUDGET 5 GAP -1"),
    (SEL + "LIMIT 2 SEED 0", SEL + "LIMIT 2 ORACLE BUDGET 5 SEED -1"),
    (SEL + "RECALL TARGET 100% ORACLE BUDGET 10", SEL + "RECALL TARGET 100.1% ORACLE BUDGET 10"),
    (SEL + "RECALL TARGET 0.1% ORACLE BUDGET 10", SEL + "RECALL TARGET 0% ORACLE BUDGET 10"),
    (SEL + "RECALL TARGET 90% ORACLE BUDGET 10", SEL + "RECALL TARGET 90% ORACLE BUDGET 9"),
    (SEL + "PRECISION TARGET 0.999 ORACLE BUDGET 10",
     SEL + "PRECISION TARGET 1 ORACLE BUDGET 10"),
    (SEL + "PRECISION TARGET 90% ORACLE BUDGET 10", SEL + "PRECISION TARGET 90% ORACLE BUDGET 9"),
    (SEL + "FIND RARE ORACLE BUDGET 1", SEL + "FIND RARE ORACLE BUDGET 0"),
])
def test_each_clause_at_and_beyond_its_bounds(accepted, rejected):
    """A value at a bound parses and runs in the operator; one just beyond it gets one
    positioned QueryError that names the allowed range."""
    _run_operator(parse(accepted))
    err = _error(rejected)
    shared = len(os.path.commonprefix([accepted, rejected]))
    assert err.position is not None and err.position >= shared - 16, (err.position, str(err))
    assert re.search(r"[\[(][\d.]+%?, |>= ?\d|> 0", str(err)), str(err)


def test_a_percentage_is_the_fraction_written():
    """99.9% is 0.999, not the float division's 0.9990000000000001 (which the result's
    confidence column showed)."""
    q = parse("SELECT AVG(objects('car')) FROM v ERROR WITHIN 0.7% CONFIDENCE 99.9%")
    assert (q.confidence, q.clauses.error) == (0.999, 0.007)
    sel = parse("SELECT frame FROM v WHERE contains('bus') PRECISION TARGET 90.3% "
                "ORACLE BUDGET 100")
    assert sel.clauses.precision_target == 0.903


@pytest.mark.parametrize("text,chars", [("SELECT {}(1)", 100_000), ('SELECT 1 AS "{}"', 300),
                                        ("SELECT * FROM {}", 256)])
def test_a_name_too_long_is_refused_before_duckdb_parses(text, chars):
    """A 100,000-character function name took seconds in DuckDB's suggestions; names are
    checked first (at most 255 characters)."""
    import time

    t0 = time.perf_counter()
    err = _error(text.format("f" * chars))
    assert time.perf_counter() - t0 < 1.0
    assert f"a name of {chars} characters; names are at most 255 characters long" in str(err)
    parse("SELECT 1 AS " + "x" * 255)


# values a user might give in every number and name position of a statement
FUZZ_NUMBERS = ["1e400", "-1e400", "1e-320", "5e-324", "nan", "inf", "-0", "0", "1e300",
                "99999999999999999999999999", "18446744073709551615", "0.0000001", "2.5", "-3",
                "95%", "1e-320%", "3"]
FUZZ_NAMES = ['"x; CREATE TABLE pwned AS SELECT 1 AS a; --"', '"it\'s"', '"a""b"', '";"',
              '"x\'); CREATE TABLE pwned AS SELECT 1 AS a; --"', "truth", "nope", "V2",
              '"v; DROP TABLE v; --"', '"' + "n" * 300 + '"']
FUZZ_STRINGS = ["'x''; CREATE TABLE pwned AS SELECT 1 AS a; --'", "'car'", "'it''s'", "';'",
                "'/proc/self/mem'", "'x'", "'2026-11-02 08:00:00'", "''"]
FUZZ_TEMPLATES = [
    "SELECT AVG(objects('car')) FROM {name} ERROR WITHIN {n} CONFIDENCE {n}",
    "SELECT SUM(objects({s})) FROM v ORACLE BUDGET {n} SEED {n}",
    "SELECT frame FROM v WHERE objects('car') >= {n} LIMIT {n} GAP {n}",
    "SELECT frame FROM v WHERE contains('car') RECALL TARGET {n} ORACLE BUDGET {n} USING INDEX {name}",
    "SELECT frame FROM v WHERE contains('car') PRECISION TARGET {n} ORACLE BUDGET {n} "
    "USING ORACLE {name}",
    "SELECT frame FROM v WHERE contains({s}) FIND RARE ORACLE BUDGET {n} USING ORACLE {name}",
    "SELECT count(*) FROM v WHERE frame < {n} AND objects('car', {n}) >= 0 USING ORACLE {name}",
    "EXPLAIN SELECT AVG(objects('car')) FROM v ERROR WITHIN {n} ORACLE BUDGET {n}",
    "SELECT {n} AS {name}", "DROP INDEX IF EXISTS {name}", "DROP INDEX {name}",
    "DROP ORACLE IF EXISTS {name}", "DROP VIDEO IF EXISTS {name}", "SHOW CLIPS {name}",
    "SET ORACLE {name} = {name}", "CREATE ORACLE {name} FROM LABELS {s} WITH (cost_ms = {n})",
    "CREATE INDEX {name} ON {name} USING TASTI WITH (train = {n})", "REFRESH INDEX {name}",
    "ALTER VIDEO {name} SET START {s} = TIMESTAMP {s}", "ALTER VIDEO v SET PATH {s}",
    "LOAD VIDEO {s} AS {name}", "SET EXECUTOR = {s}",
]


def _fuzz_value_statements(rng: np.random.Generator, n: int):
    """Statements with huge, tiny and NaN numbers, and quotes and semicolons in every name
    and string position."""
    for _ in range(n):
        text = FUZZ_TEMPLATES[rng.integers(len(FUZZ_TEMPLATES))]
        while any(slot in text for slot in ("{n}", "{name}", "{s}")):
            text = (text.replace("{n}", FUZZ_NUMBERS[rng.integers(len(FUZZ_NUMBERS))], 1)
                    .replace("{name}", FUZZ_NAMES[rng.integers(len(FUZZ_NAMES))], 1)
                    .replace("{s}", FUZZ_STRINGS[rng.integers(len(FUZZ_STRINGS))], 1))
        yield text


def test_fuzz_values_run_into_vidql_or_duckdb_errors_only(traffic_con):
    """Run value-mutated statements on a database: each runs, or raises a VidqlError or
    DuckDB's own error; none raises anything else, and no name or string becomes SQL (no
    table pwned, v intact)."""
    from vidql.base.errors import VidqlError

    db = traffic_con
    rng = np.random.default_rng(30)
    counts = {"ok": 0, "error": 0}
    for text in _fuzz_value_statements(rng, 400):
        try:
            db.sql(text)
            counts["ok"] += 1
        except (VidqlError, duckdb.Error):
            counts["error"] += 1
        except Exception as exc:  # noqa: BLE001  the point of the test
            pytest.fail(f"{text!r} raised {type(exc).__name__}: {exc}")
    tables = {r[0] for r in db.con.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}
    assert "pwned" not in tables and "v" in tables
    assert counts["ok"] > 20 and counts["error"] > 100, counts
