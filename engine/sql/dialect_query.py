"""Queries of the dialect: strip the vidql clauses with DuckDB's tokenizer, read the rest
with DuckDB's parser, and extract what the planner needs (video table, aggregate, frame
predicate, restriction, GROUP BY).

The kind rule and its shape errors are in `dialect_kind`, the clauses are read by
`dialect_clauses`, DuckDB's syntax tree by `dialect_ast`, positions by `dialect_spans`.
"""
from __future__ import annotations

from vidql.engine.sql.dialect_clauses import budget_problem, read_tail, tail_start
from vidql.engine.sql.dialect_ast import (NO_LOCATION, assemble_sql, children, duckdb_ast,
                          numeric_constant)
from vidql.engine.sql.dialect_kind import QueryShape, query_kind
from vidql.engine.sql.dialect_lex import Token
from vidql.engine.sql.dialect_statements import Aggregate, OutputColumn, Query
from vidql.base.errors import QueryError
from vidql.engine.sql.framestat import parse_frame_expr

APPROX_AGGREGATES = {"avg": "avg", "mean": "avg", "sum": "sum", "count": "count",
                     "count_star": "count"}


def parse_query(text: str, tokens: list[Token], i0: int, explain: bool) -> Query | None:
    """Parse the statement `tokens[i0:]` of `text`; None when DuckDB reads it as a
    statement other than a query (and it has no vidql clause): plain SQL."""
    tail = tail_start(text, tokens, i0)
    clauses, positions, limit_spans = read_tail(text, tokens, i0, tail)
    body = (tokens[i0].start, tokens[tail - 1].end)
    pieces, sql = assemble_sql(text, body, limit_spans)
    node = duckdb_ast(text, sql, pieces, tokens)
    if node is None:
        if positions:
            first = min(positions.values())
            raise QueryError("vidql clauses apply to SELECT queries only", text, first,
                             hint="remove them, or put them on a SELECT")
        return None
    shape = QueryShape(text, tokens[i0:], sql, pieces, node, clauses, positions)
    return _query(shape, explain, text[tokens[0].start:tokens[-1].end])


def _query(q: QueryShape, explain: bool, statement: str) -> Query:
    kind = query_kind(q)
    fields = dict(sql=q.sql, kind=kind, clauses=q.clauses, explain=explain, text=statement,
                  tables=_tables(q), columns=_columns(q))
    if q.select is not None:
        fields["limit"] = q.limit()[0]
    if kind == "exact":
        fields.update(_exact_where(q))
    else:
        fields.update(_approximate(q, kind))
    problem = budget_problem(kind, q.clauses.budget)
    if problem:
        q.fail(problem, q.positions["budget"], "raise ORACLE BUDGET")
    return Query(**fields)


def _base_tables(q: QueryShape):
    """Every table read in the query (subqueries and CTEs included), as syntax-tree nodes."""
    return (d for d in children(q.node) if d.get("type") == "BASE_TABLE" and "table_name" in d)


def _tables(q: QueryShape) -> tuple[str, ...]:
    names = []
    for d in _base_tables(q):
        parts = [p for p in (d.get("catalog_name"), d.get("schema_name"), d.get("table_name"))
                 if p]
        name = ".".join(parts)
        if len(parts) == 1 and name.lower() in q.cte_names:
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


def _columns(q: QueryShape) -> tuple[OutputColumn, ...]:
    if q.select is None:
        return ()
    columns = []
    for item in q.select.get("select_list", []):
        located = item.get("query_location", NO_LOCATION) < NO_LOCATION
        if item.get("class") == "STAR" and not located:
            text = (item.get("relation_name") + ".*") if item.get("relation_name") else "*"
        else:
            text = q.text_of(item)
        columns.append(OutputColumn(text, item.get("alias") or None))
    return tuple(columns)


def _joined(q: QueryShape, parts) -> str | None:
    return " AND ".join(_texts(q, parts)) or None


def _texts(q: QueryShape, parts) -> tuple[str, ...]:
    """Each of a WHERE clause's top-level AND parts as written (a lone one without the
    parentheses around it), to be joined by AND."""
    if len(parts) == 1:
        return (q.text_of(parts[0]),)
    return tuple(q.text_of(p, grouped=True) for p in parts)


# ---- WHERE: the frame predicate, the restriction and its frame/ts ranges

def _exact_where(q: QueryShape) -> dict:
    table = (q.select.get("from_table") or {}) if q.select is not None else {}
    if table.get("type") != "BASE_TABLE":
        return {}
    qualified = table.get("schema_name") or table.get("catalog_name")
    if not qualified and table["table_name"].lower() in q.cte_names:
        return {}
    video = None if qualified else table["table_name"]
    if _reads(q, table.get("schema_name") or table["table_name"]) > 1:
        # the video read again elsewhere (a subquery over all its frames, `video.objects`):
        # the WHERE bounds only this read, so every frame may need labels
        return dict(video=video)
    _, restriction = q.split_where()
    return dict(restriction_parts=_texts(q, restriction), video=video,
                video_alias=table.get("alias") or None)


def _reads(q: QueryShape, video: str) -> int:
    """How many of the query's table reads name `video`, as the table or as its schema: the
    video table itself and its detections (`video.objects`)."""
    name = video.lower()
    return sum(1 for d in _base_tables(q) if name in (
        str(d["table_name"]).lower(), str(d.get("schema_name") or "").lower()))


def _approximate(q: QueryShape, kind: str) -> dict:
    table = q.select["from_table"]
    predicate, restriction = q.split_where()
    fields = dict(restriction_parts=_texts(q, restriction), video=table["table_name"],
                  video_alias=table.get("alias") or None)
    if predicate:
        for part in predicate:  # one by one, so that errors point at the right place
            start, end = q.span(part)
            parse_frame_expr(q.text[start:end], start, q.text)
            _check_unqualified(q, part, table)
        fields["predicate"] = _joined(q, predicate)
        fields["predicate_expr"] = parse_frame_expr(fields["predicate"])
    if kind in ("aggregate", "aggregate_budget"):
        fields.update(_aggregate_fields(q))
    return fields


def _check_unqualified(q: QueryShape, part, table: dict) -> None:
    """A condition with frame functions is evaluated on each frame's values, where the
    video's columns have no table name: `t.frame` there is an error that says so."""
    qualifiers = _qualifiers(table)
    for node in children(part):
        names = node.get("column_names", []) if node.get("class") == "COLUMN_REF" else []
        if len(names) == 2 and names[0].lower() in qualifiers:
            q.fail(f"write {names[1]}, not {q.text_of(node)}, in a condition with frame "
                   "functions", q.pos(node), "such a condition reads each frame's own "
                   "columns, which take no table name")


def _qualifiers(table: dict) -> set[str]:
    """The names that qualify the FROM table's columns (`night.frame`, `n.frame`), lower case."""
    return {table["table_name"].lower()} | ({table["alias"].lower()} if table.get("alias")
                                            else set())


# ---- the aggregate and its GROUP BY

def _aggregate_fields(q: QueryShape) -> dict:
    aggregates = q.aggregates()
    if len(aggregates) > 1:
        q.fail("an approximate query computes one aggregate", q.pos(aggregates[1][1]),
               "run one query per aggregate")
    index, call, nested = aggregates[0]
    if nested:
        q.fail("the aggregate must be a select item by itself", q.pos(q.select["select_list"][index]),
               "e.g. SELECT AVG(objects('car')) AS cars; compute on the result instead")
    fields = dict(aggregate=_aggregate(q, call))
    fields.update(_group_fields(q, index))
    return fields


def _aggregate(q: QueryShape, call: dict) -> Aggregate:
    name = call["function_name"].lower()
    func = APPROX_AGGREGATES.get(name)
    if func is None:
        q.fail(f"{name.upper()} cannot be approximated", q.pos(call), "use AVG, SUM or COUNT")
    ordered = (call.get("order_bys") or {}).get("orders")
    if call.get("distinct") or call.get("filter") or ordered:
        q.fail(f"{name.upper()} with DISTINCT, FILTER or ORDER BY cannot be approximated",
               q.pos(call), "use a WHERE condition instead of FILTER")
    args = [a["expression"] if "expression" in a else a for a in call.get("arguments", [])]
    if len(args) > 1 or (func != "count" and len(args) != 1):
        q.fail(f"{name.upper()} takes one argument", q.pos(call))
    if not args or args[0].get("class") == "STAR":
        return Aggregate(func, None, None)
    start, end = q.span(args[0])
    argument = q.text[start:end]
    return Aggregate(func, argument, parse_frame_expr(argument, start, q.text))


def _group_fields(q: QueryShape, aggregate_index: int) -> dict:
    s = q.select
    groups = s.get("group_expressions") or []
    if s.get("aggregate_handling") == "FORCE_AGGREGATES":
        q.fail("GROUP BY ALL is not supported in approximate queries", q.tokens[0].start,
               "write the GROUP BY expression, e.g. GROUP BY contains('bus')")
    if len(groups) > 1:
        q.fail("an approximate aggregate groups by at most one expression", q.pos(groups[1]))
    group_item, group_node = _group_item(q, groups[0] if groups else None, aggregate_index)
    group_text = q.text_of(group_node) if group_node is not None else None
    for k, item in enumerate(s["select_list"]):
        if k in (aggregate_index, group_item):
            continue
        if group_text is None or _normal(q.text_of(item)) != _normal(group_text):
            q.fail("an approximate aggregate returns the aggregate and the GROUP BY "
                   "expression only", q.pos(item), "remove this column or GROUP BY it")
    if group_node is None:
        return {}
    start = q.span(group_node)[0]
    return dict(group_by=group_text, group_expr=parse_frame_expr(group_text, start, q.text))


def _group_item(q: QueryShape, group_node: dict | None,
                aggregate_index: int) -> tuple[int | None, dict | None]:
    """(index of the select item GROUP BY names by ordinal or alias, the grouped node)."""
    if group_node is None:
        return None, None
    items = q.select["select_list"]
    group_item = None
    ordinal = numeric_constant(group_node)
    if ordinal is not None and float(ordinal).is_integer() and 1 <= ordinal <= len(items):
        group_item = int(ordinal) - 1
    elif group_node.get("class") == "COLUMN_REF" and len(group_node["column_names"]) == 1:
        name = group_node["column_names"][0].lower()
        group_item = next((k for k, it in enumerate(items)
                           if (it.get("alias") or "").lower() == name), None)
    if group_item == aggregate_index:
        q.fail("GROUP BY cannot name the aggregate", q.pos(group_node))
    return group_item, (items[group_item] if group_item is not None else group_node)


def _normal(sql: str) -> str:
    return "".join(sql.split()).lower()
