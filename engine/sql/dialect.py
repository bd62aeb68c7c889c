"""The vidql SQL dialect (docs/sql.md): text in, statement dataclasses out.

No general SQL parser lives here: DuckDB's tokenizer finds the catalog statements and
strips the vidql clauses; DuckDB's parser reads the SQL that is left. Every malformed
input raises `QueryError` with a character position in the original text.

Query kinds, decided in this order:

1. RECALL TARGET / PRECISION TARGET / FIND RARE -> 'select_recall' / 'select_precision' /
   'rare'. At most one of them; each needs ORACLE BUDGET n (no default: the budget is
   what the user spends) and takes no ERROR WITHIN, GAP or LIMIT.
2. ERROR WITHIN -> 'aggregate'. An ORACLE BUDGET with it caps the calls.
3. GAP -> 'limit' (GAP needs LIMIT n).
4. ORACLE BUDGET -> 'aggregate_budget' when the select list has an aggregate; 'limit'
   when the query has LIMIT n (the budget caps the calls); an error otherwise.
5. No clause, but LIMIT n on a frame selection -> 'limit': SQL lets LIMIT without ORDER
   BY return any n matching rows, so frames ranked by proxy and confirmed by the oracle
   are a correct answer. "Frame selection" means: one video table in FROM, a WHERE with a
   conjunct over frame functions, no aggregate, GROUP BY, HAVING, DISTINCT, window,
   ORDER BY or OFFSET, a constant LIMIT >= 1, and well-formed frame-function calls (so
   DuckDB's own `contains(name, 'x')` stays plain SQL). `... ORDER BY cars DESC LIMIT 5`
   or a LIMIT without a frame-function WHERE is exact SQL.
6. Otherwise 'exact'.

Approximate aggregates read one video table, compute one AVG/SUM/COUNT that is a select
item by itself, and may group by one expression (also allowed in the select list).
Selections (kinds 'limit', 'select_*', 'rare') return clip, frame, ts and verified: their
select list may name clip, frame and ts (not renamed) or *, and anything else is an error
rather than a column silently dropped (for rule 5 too; its hint offers ORDER BY, which makes
the query exact). CONFIDENCE (default
95%) goes with 'aggregate', 'aggregate_budget' and 'select_*' only; SEED with approximate
kinds only; USING ORACLE / USING INDEX with any query.
"""
from __future__ import annotations

from vidql.engine.sql.dialect_catalog import is_catalog_statement, parse_catalog
from vidql.engine.sql.dialect_lex import Token, check_lexical, paren, split_statements, tokenize
from vidql.engine.sql.dialect_query import parse_query
from vidql.engine.sql.sqlnames import ORACLE_KINDS
from vidql.engine.sql.dialect_statements import (DEFAULT_CONFIDENCE, INDEX_METHODS, QUERY_KINDS,
                                 Aggregate, Clauses, CreateIndex, CreateOracle, DropIndex,
                                 DropVideo, LoadVideo, OutputColumn, PlainSQL, Query, SetExecutor,
                                 SetOracle, SetSampling,
                                 ShowIndexes, ShowOracles, ShowVideos, Statement,
                                 AlterVideoPath, AlterVideoStart, DropOracle, RefreshIndex,
                                 ShowClips, WriteResult)
from vidql.base.errors import QueryError
from vidql.base.ranges import percent

__all__ = [
    "parse", "parse_script", "script_statements", "describe", "Statement", "Query", "Clauses", "Aggregate",
    "OutputColumn", "PlainSQL", "LoadVideo", "ShowVideos", "DropVideo", "CreateOracle",
    "SetOracle", "SetExecutor", "SetSampling", "ShowOracles", "DropOracle", "AlterVideoPath", "AlterVideoStart",
    "ShowClips", "CreateIndex", "RefreshIndex", "ShowIndexes", "DropIndex", "WriteResult",
    "QUERY_KINDS",
    "ORACLE_KINDS", "INDEX_METHODS", "DEFAULT_CONFIDENCE",
]


def parse(query: str) -> Statement:
    """Parse one statement (a trailing `;` is fine); several raise QueryError."""
    statements = _statements(query)
    if not statements:
        raise QueryError("empty query", query, 0, hint="write a statement, e.g. SHOW VIDEOS")
    if len(statements) > 1:
        raise QueryError(f"expected one statement, found {len(statements)}", query,
                         statements[1][0].start, hint="use parse_script for several statements")
    return _parse_statement(query, statements[0])


def parse_script(text: str) -> list[Statement]:
    """Parse statements separated by `;` (split on DuckDB tokens, so `;` inside strings
    and comments is kept). Error positions refer to the whole script."""
    return [stmt for _, stmt in script_statements(text)]


def script_statements(text: str) -> list[tuple[str, Statement]]:
    """`parse_script`, each statement with its text as written."""
    return [(text[tokens[0].start:tokens[-1].end], _parse_statement(text, tokens))
            for tokens in _statements(text)]


def _statements(text: str) -> list[list[Token]]:
    if not isinstance(text, str):
        raise QueryError(f"a query is text, got {type(text).__name__}")
    tokens = tokenize(text)
    check_lexical(text, tokens)
    return split_statements(tokens)


def _parse_statement(text: str, tokens: list[Token]) -> Statement:
    explain = tokens[0].word == "EXPLAIN"
    if explain:
        hint = "EXPLAIN takes a query: EXPLAIN SELECT ..."
        if len(tokens) == 1:
            raise QueryError("EXPLAIN needs a query", text, tokens[0].end, hint)
        if tokens[1].word == "ANALYZE" or is_catalog_statement(tokens[1:]):
            raise QueryError("EXPLAIN shows the plan of a query only", text, tokens[1].start, hint)
    elif is_catalog_statement(tokens):
        return parse_catalog(text, tokens)
    elif (written := _write_result(text, tokens)) is not None:
        return written
    query = parse_query(text, tokens, 1 if explain else 0, explain)
    if query is not None:
        return query
    if explain:
        raise QueryError("EXPLAIN shows the plan of a query only", text, tokens[1].start,
                         "EXPLAIN takes a query: EXPLAIN SELECT ...")
    return PlainSQL(text[tokens[0].start:tokens[-1].end])


def _write_result(text: str, tokens: list[Token]) -> WriteResult | None:
    """`COPY (query) TO ...` or `CREATE ... TABLE name AS query` whose query is a query
    (exact or approximate); None for any other statement."""
    span = _copy_span(tokens) or _create_as_span(tokens)
    if span is None:
        return None
    i, j = span
    query = parse_query(text, tokens[i:j], 0, False)
    if query is None:
        return None
    end = tokens[-1].end
    return WriteResult(query, text[tokens[0].start:tokens[i].start],
                       text[tokens[j - 1].end:end], text[tokens[0].start:end])


def _closing(tokens: list[Token], i: int) -> int | None:
    """Index of the `)` closing the `(` at tokens[i]."""
    depth = 0
    for k in range(i, len(tokens)):
        depth += paren(tokens[k])
        if depth == 0:
            return k
    return None


def _copy_span(tokens: list[Token]) -> tuple[int, int] | None:
    """Token span of the query in `COPY (query) TO ...`."""
    if len(tokens) < 4 or tokens[0].word != "COPY" or tokens[1].text != "(":
        return None
    close = _closing(tokens, 1)
    return (2, close) if close and close > 2 else None


def _create_as_span(tokens: list[Token]) -> tuple[int, int] | None:
    """Token span of the query in `CREATE [OR REPLACE] [TEMP] TABLE [IF NOT EXISTS] name AS
    query` (parentheses around the query left out)."""
    if tokens[0].word != "CREATE":
        return None
    at = next((k for k, t in enumerate(tokens) if t.word == "AS" or paren(t)), None)
    if at is None or tokens[at].word != "AS" or "TABLE" not in {t.word for t in tokens[:at]} \
            or at + 1 >= len(tokens):
        return None
    if tokens[at + 1].text == "(" and _closing(tokens, at + 1) == len(tokens) - 1:
        return at + 2, len(tokens) - 1
    return at + 1, len(tokens)


def _describe_load(stmt: LoadVideo) -> str:
    paths = stmt.path if isinstance(stmt.path, str) else ", ".join(stmt.path)
    return f"load video '{paths}' {'into' if stmt.into else 'as'} {stmt.name}{_options(stmt.options)}"


def _describe_move(stmt: AlterVideoPath) -> str:
    what = f"clip '{stmt.clip}' of video {stmt.name}" if stmt.clip else f"video {stmt.name}"
    return f"move {what} to '{stmt.path}' (same content)"


_DESCRIBE = {
    Query: lambda q: ("EXPLAIN " if q.explain else "") + _describe_query(q),
    LoadVideo: _describe_load,
    ShowVideos: lambda s: "list the videos",
    ShowClips: lambda s: f"list the clips of video {s.name}",
    DropVideo: lambda s: f"drop video {s.name} with its labels and index" + _if_exists(s.if_exists),
    CreateOracle: lambda s: (f"create {'or replace ' if s.replace else ''}oracle {s.name} from "
                             f"{s.kind} '{s.source}'{_options(s.options)}"),
    SetOracle: lambda s: f"make {s.oracle} the default oracle of video {s.video}",
    SetExecutor: lambda s: f"run labelling and index embedding on the {s.executor!r} executor",
    SetSampling: lambda s: ("sample approximate queries always" if s.mode == "always" else
                            "scan exactly instead of sampling where the scan is priced cheaper"),
    ShowOracles: lambda s: "list the oracles",
    DropOracle: lambda s: f"drop oracle {s.name} (its cached labels stay)" + _if_exists(s.if_exists),
    AlterVideoPath: _describe_move,
    AlterVideoStart: lambda s: (f"set the start time of clip '{s.clip}' of video {s.name} to "
                                f"{s.start}"),
    CreateIndex: lambda s: (f"build {s.method} index {s.name} on video {s.video}"
                            f"{_options(s.options)}"),
    RefreshIndex: lambda s: f"rebuild index {s.name} over every frame loaded now (retraining)",
    ShowIndexes: lambda s: "list the indexes",
    DropIndex: lambda s: f"drop index {s.name}" + _if_exists(s.if_exists),
    PlainSQL: lambda s: "DuckDB statement: " + _short(s.sql),
    WriteResult: lambda s: (f"{_describe_query(s.query)}, written by DuckDB: "
                            f"{_short(s.before + '...' + s.after)}"),
}


def describe(stmt: Statement) -> str:
    """One line saying what a statement does (EXPLAIN and the shell show it)."""
    how = _DESCRIBE.get(type(stmt))
    if how is None:
        raise TypeError(f"not a statement: {stmt!r}")
    return how(stmt)


def _describe_query(q: Query) -> str:
    c = q.clauses
    frames = f"frames of {q.video}"
    if q.restriction and q.kind != "exact":
        frames += f" ({q.restriction})"
    if q.predicate:
        frames += f" where {q.predicate}"
    budget = f", at most {c.budget} oracle calls" if c.budget is not None else ""
    conf = f" at {percent(q.confidence)} confidence" if q.confidence is not None else ""
    if q.kind == "exact":
        text = "exact query: " + _short(q.sql)
        if q.restriction:
            text += f" (labels the frames where {q.restriction})"
    elif q.kind in ("aggregate", "aggregate_budget"):
        agg = q.aggregate
        target = f"{agg.func.upper()}({agg.argument or '*'}) over {frames}"
        if q.group_by:
            target += f" per {q.group_by}"
        if q.kind == "aggregate":
            bound = f"{percent(c.error)} relative" if c.error_relative else f"{c.error:g} absolute"
            text = f"estimate {target} within {bound} error{conf}{budget}"
        else:
            text = f"estimate {target}{budget}{conf}"
    elif q.kind == "limit":
        gap = f", at least {c.gap} frames apart" if c.gap else ""
        text = f"find {q.limit} {frames}{gap}, ranked by proxy{budget}"
    elif q.kind == "rare":
        text = f"find rare {frames}{budget}"
    else:
        which, target = (("recall", c.recall_target) if q.kind == "select_recall"
                         else ("precision", c.precision_target))
        text = f"select {frames} with {which} >= {percent(target)}{conf}{budget}"
    extras = [f"oracle {c.oracle}" if c.oracle else "", f"index {c.index}" if c.index else "",
              f"seed {c.seed}" if c.seed is not None else ""]
    extras = [e for e in extras if e]
    return text + (f" ({', '.join(extras)})" if extras else "")


def _options(options: dict) -> str:
    return " (" + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")" if options else ""


def _if_exists(flag: bool) -> str:
    return " if it exists" if flag else ""


def _short(sql: str, width: int = 80) -> str:
    one_line = " ".join(sql.split())
    return one_line if len(one_line) <= width else one_line[:width - 3] + "..."
