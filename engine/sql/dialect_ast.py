"""DuckDB's side of the dialect: the SQL text without the vidql clauses, its JSON syntax
tree (`json_serialize_sql`), walks over that tree, and positions mapped back to the
original query text."""
from __future__ import annotations

import json
import math

from vidql.base.errors import QueryError

from vidql.engine.sql.dialect_clauses import CLAUSE_HINT, ONE_WORD, SECOND_WORDS
from vidql.engine.sql.dialect_lex import byte_to_char, connection
from vidql.engine.sql.framestat import FRAME_FUNCTIONS

NO_LOCATION = 1 << 62


def assemble_sql(text: str, body: tuple[int, int], limit_spans):
    """The SQL (body + LIMIT/OFFSET moved from the tail) and its pieces: (sql offset,
    original offset, length) for mapping positions back to the original text."""
    pieces = [(0, body[0], body[1] - body[0])]
    sql = text[body[0]:body[1]]
    for start, end in limit_spans:
        sql += " "
        pieces.append((len(sql), start, end - start))
        sql += text[start:end]
    return pieces, sql


def to_original(pieces, sql_char: int) -> int:
    for sql_start, orig_start, length in reversed(pieces):
        if sql_char >= sql_start:
            return orig_start + min(sql_char - sql_start, length)
    return pieces[0][1]


def duckdb_ast(text, sql, pieces, tokens) -> dict | None:
    """DuckDB's AST of the one SELECT in `sql`; None for a statement of another type."""
    try:
        raw = connection().execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0]
        result = json.loads(raw)
    except Exception as exc:  # duckdb.Error or a malformed serialization: still user input
        raise QueryError(f"DuckDB cannot parse the query: {exc}", text, pieces[0][1]) from None
    if not result.get("error"):
        statements = result.get("statements", [])
        if len(statements) != 1:
            raise QueryError("expected one query", text, pieces[0][1])
        return statements[0]["node"]
    message = result.get("error_message", "syntax error")
    if result.get("error_type") == "not implemented" and "Only SELECT" in message:
        return None
    try:
        position = to_original(pieces, byte_to_char(sql)(int(result.get("position", 0))))
    except ValueError:
        position = pieces[0][1]
    at = [t for t in tokens if t.start <= position < max(t.end, t.start + 1)]
    hint = CLAUSE_HINT if at and at[0].word in set(ONE_WORD) | set(SECOND_WORDS) else None
    raise QueryError(f"SQL syntax error: {message}", text, position, hint)


def children(node):
    """Every dict directly or indirectly inside `node` (lists followed), depth-first."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def expressions(node, into_subqueries: bool = False):
    """Expression nodes in `node`; subqueries are not entered unless asked."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "class" in item:
                yield item
                if item["class"] == "SUBQUERY" and not into_subqueries:
                    continue
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def is_frame_call(expr: dict) -> bool:
    return (expr.get("class") == "FUNCTION" and not expr.get("schema")
            and expr.get("function_name", "").lower() in FRAME_FUNCTIONS)


def uses_frame_functions(node) -> bool:
    return any(is_frame_call(e) for e in expressions(node, into_subqueries=True))


def and_parts(node) -> list[dict]:
    if node is None:
        return []
    if node.get("class") == "CONJUNCTION" and node.get("type") == "CONJUNCTION_AND":
        return [part for child in node["children"] for part in and_parts(child)]
    return [node]


def numeric_constant(node) -> float | None:
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return None
    literal = node.get("literal") or {}
    if literal.get("kind") in ("STRING", "VARCHAR", "BOOLEAN", "NULL", "BLOB"):
        return None
    try:
        value = float(literal.get("text", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def aggregate_names() -> frozenset[str]:
    global _AGGREGATES
    if _AGGREGATES is None:
        rows = connection().execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                                    "WHERE function_type = 'aggregate'").fetchall()
        _AGGREGATES = frozenset(r[0].lower() for r in rows) | {"count_star"}
    return _AGGREGATES


_AGGREGATES: frozenset[str] | None = None
