"""Queries of the dialect: strip the vidql clauses with DuckDB's tokenizer, read the rest
with DuckDB's parser, decide the query kind (and refuse shapes it cannot answer), and
extract what the planner needs (video table, aggregate, frame predicate, frame/ts range,
GROUP BY).

The kind rule is documented on `vidql.engine.dialect`; the clauses are read by
`dialect_clauses`, DuckDB's syntax tree by `dialect_ast`, positions by `dialect_spans`.
"""
from __future__ import annotations

import math

from .dialect_clauses import CLAUSE_HINT, NAMES, budget_problem, read_tail, tail_start
from .dialect_ast import (COMPARISONS, FLIPPED, NO_LOCATION, aggregate_names, and_parts,
                          assemble_sql, children, duckdb_ast, expressions, numeric_constant,
                          uses_frame_functions)
from .dialect_lex import Token
from .dialect_spans import QuerySpans
from .dialect_statements import Aggregate, Clauses, OutputColumn, Query
from vidql.errors import QueryError
from .framestat import parse_frame_expr

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
    analysis = _Analysis(text, tokens[i0:], sql, pieces, node)
    return analysis.query(clauses, positions, explain, text[tokens[0].start:tokens[-1].end])


class _Analysis(QuerySpans):
    """One query's AST with the original text: spans, shape checks, the kind rule."""

    # ---- the query

    def query(self, clauses: Clauses, positions: dict, explain: bool, statement: str) -> Query:
        self.clauses, self.positions = clauses, positions
        kind = self._kind()
        self._check_clause_use(kind)
        fields = dict(sql=self.sql, kind=kind, clauses=clauses, explain=explain, text=statement,
                      tables=self._tables(), columns=self._columns())
        if self.select is not None:
            fields["limit"] = self._limit()[0]
        if kind == "exact":
            fields.update(self._exact_where())
        else:
            fields.update(self._approximate(kind))
        problem = budget_problem(kind, clauses.budget)
        if problem:
            self.fail(problem, positions["budget"], "raise ORACLE BUDGET")
        return Query(**fields)

    def _kind(self) -> str:
        c, at = self.clauses, self.positions
        chosen = [k for k in ("recall", "precision", "rare") if k in at]
        if len(chosen) > 1:
            first, second = sorted(chosen, key=at.get)[:2]
            self.fail(f"{NAMES[first]} and {NAMES[second]} cannot be combined", at[second],
                      "a query asks for one guarantee; run two queries")
        if chosen:
            key = chosen[0]
            for other in ("error", "gap", "limit"):
                if other in at:
                    self.fail(f"{NAMES[other]} does not combine with {NAMES[key]}", at[other],
                              f"{NAMES[key]} returns every frame it finds; drop {NAMES[other]}")
            if c.budget is None:
                self.fail(f"{NAMES[key]} needs ORACLE BUDGET n", at[key],
                          f"add e.g. ORACLE BUDGET 1000: the oracle calls {NAMES[key]} may spend")
            self._selection_shape(key, require_limit=False)
            return {"recall": "select_recall", "precision": "select_precision", "rare": "rare"}[key]
        if c.error is not None:
            if "gap" in at:
                self.fail("GAP does not combine with ERROR WITHIN", at["gap"],
                          "GAP spaces the frames of a LIMIT query")
            self._aggregate_shape("error")
            return "aggregate"
        if c.gap is not None:
            self._selection_shape("gap", require_limit=True)
            return "limit"
        if c.budget is not None:
            if self._has_aggregate():
                self._aggregate_shape("budget")
                return "aggregate_budget"
            if self._limit()[1] is not None:
                self._selection_shape("budget", require_limit=True)
                return "limit"
            self.fail("ORACLE BUDGET needs an aggregate (AVG, SUM, COUNT), LIMIT n, "
                      "RECALL TARGET, PRECISION TARGET or FIND RARE", at["budget"], CLAUSE_HINT)
        if (self._limit()[1] is not None
                and self._selection_problem(True, "LIMIT", self.tokens[0].start) is None
                and self._frame_calls_are_valid()):
            return "limit"
        return "exact"

    def _frame_calls_are_valid(self) -> bool:
        """False when a WHERE call named like a frame function is not one (e.g. DuckDB's
        own contains(name, 'x')): such a query stays plain, exact SQL."""
        predicate, _ = self._split_where()
        try:
            for part in predicate:
                parse_frame_expr(self.text_of(part))
        except QueryError:
            return False
        return True

    def _check_clause_use(self, kind: str) -> None:
        at = self.positions
        if "confidence" in at and kind not in ("aggregate", "aggregate_budget", "select_recall",
                                               "select_precision"):
            self.fail("CONFIDENCE needs ERROR WITHIN, ORACLE BUDGET on an aggregate, "
                      "RECALL TARGET or PRECISION TARGET", at["confidence"],
                      "CONFIDENCE states how sure an interval or target is; this query has none")
        for key, words in (("approximate", "APPROXIMATE"), ("budget", "ORACLE BUDGET UP TO")):
            if key in at and kind != "select_recall" and (
                    key == "approximate" or self.clauses.budget_up_to):
                self.fail(f"{words} applies to RECALL TARGET only", at[key],
                          "write ... RECALL TARGET 90% ORACLE BUDGET UP TO 5000, or "
                          "... RECALL TARGET 90% ORACLE BUDGET 1000 APPROXIMATE")
        if "seed" in at and kind == "exact":
            self.fail("SEED applies to approximate queries only", at["seed"],
                      "an exact query has no randomness; drop SEED")

    # ---- shapes

    def _has_aggregate(self) -> bool:
        s = self.select
        if s is None:
            return False
        return bool(self._aggregates() or s.get("group_expressions") or s.get("having")
                    or s.get("aggregate_handling") == "FORCE_AGGREGATES")

    def _aggregates(self) -> list[tuple[int, dict, bool]]:
        """(select item index, aggregate call, nested inside the item) for each aggregate."""
        names = aggregate_names()
        found = []
        for index, item in enumerate(self.select.get("select_list", [])):
            for expr in expressions(item):
                if (expr.get("class") == "FUNCTION" and not expr.get("schema")
                        and expr.get("function_name", "").lower() in names):
                    found.append((index, expr, expr is not item))
        return found

    def _modifiers(self) -> dict:
        mods = {}
        for mod in (self.select or self.node).get("modifiers", []):
            if mod["type"] == "ORDER_MODIFIER" and mod.get("orders"):
                mods["order"] = mod
            elif mod["type"] == "DISTINCT_MODIFIER":
                mods["distinct"] = mod
            elif "LIMIT" in mod["type"]:
                mods["limit"] = mod
        return mods

    def _limit(self) -> tuple[int | None, dict | None]:
        """(LIMIT n when a constant integer row count, the LIMIT modifier)."""
        mod = self._modifiers().get("limit")
        if mod is None:
            return None, None
        limit = mod.get("limit")
        value = numeric_constant(limit)
        literal = (limit or {}).get("literal") or {}
        if (value is None or mod.get("limit_type", "ROW_COUNT") != "ROW_COUNT"
                or not str(literal.get("text", "")).lstrip("-").isdigit()):
            return None, mod
        return int(value), mod

    def _video_problem(self, clause: str) -> tuple[str, int] | None:
        s = self.select
        start = self.tokens[0].start
        if s is None:
            return f"{clause} needs a single SELECT (no UNION, INTERSECT or EXCEPT)", start
        if self.cte_names:
            return f"{clause} does not support WITH (common table expressions)", start
        table = s.get("from_table") or {}
        if table.get("type") != "BASE_TABLE":
            where = self.pos(table) if table.get("query_location", NO_LOCATION) < NO_LOCATION \
                else start
            return f"{clause} reads one video table: FROM must name a single video", where
        if table.get("schema_name") or table.get("catalog_name"):
            return (f"{clause} reads a video table, not "
                    f"{'.'.join(table['qualified_name']['path'])}", self.pos(table))
        if table.get("sample"):
            return f"{clause} does its own sampling: drop USING SAMPLE", self.pos(table)
        return None

    def _shape_problem(self, clause: str) -> tuple[str, int] | None:
        """Problems shared by all approximate kinds."""
        problem = self._video_problem(clause)
        if problem:
            return problem
        s = self.select
        mods = self._modifiers()
        for key, what in (("having", "HAVING"), ("qualify", "QUALIFY"), ("sample", "USING SAMPLE")):
            if s.get(key):
                return f"{clause} does not support {what}", self.pos(s[key]) \
                    if key != "sample" else self.tokens[0].start
        for expr in expressions(s.get("select_list", [])):
            if expr.get("class") == "WINDOW":
                return f"{clause} does not support window functions", self.pos(expr)
        if "distinct" in mods:
            return f"{clause} does not support SELECT DISTINCT", self.tokens[0].start
        if "order" in mods:
            return (f"{clause} does not support ORDER BY; order the result instead",
                    self.pos(mods["order"]["orders"][0]["expression"]))
        return None

    def _selection_problem(self, require_limit: bool, clause: str,
                           at: int) -> tuple[str, int] | None:
        """Why this is not a frame selection for `clause` (written at `at`), or None."""
        problem = self._shape_problem(clause)
        if problem:
            return problem
        if self._has_aggregate():
            aggregates = self._aggregates()
            where = self.pos(aggregates[0][1]) if aggregates else at
            return f"{clause} selects frames: it does not take aggregates or GROUP BY", where
        value, mod = self._limit()
        limit_at = self.positions.get("limit", self.pos(mod["limit"]) if mod and mod.get("limit")
                                      else at)
        if require_limit:
            if mod is None:
                return f"{clause} needs LIMIT n", at
            if mod.get("offset"):
                return f"{clause} does not support OFFSET", self.pos(mod["offset"])
            if value is None or value < 1:
                return "LIMIT needs a positive whole number here", limit_at
        elif mod is not None:
            return f"LIMIT does not combine with {clause}", limit_at
        if not any(uses_frame_functions(p) for p in and_parts(self.select.get("where_clause"))):
            return (f"{clause} needs a WHERE condition on frame functions, "
                    "e.g. WHERE contains('bus')"), at
        return None

    def _selection_shape(self, key: str, require_limit: bool) -> None:
        problem = self._selection_problem(require_limit, NAMES[key], self.positions[key])
        if problem:
            message, where = problem
            hint = ("write e.g. LIMIT 10 GAP 300" if "LIMIT" in message and key == "gap"
                    else "write LIMIT n with a whole number n >= 1" if "LIMIT needs" in message
                    else None)
            self.fail(message, where, hint)

    def _aggregate_shape(self, key: str) -> None:
        clause, at = NAMES[key], self.positions[key]
        problem = self._shape_problem(clause)
        if problem:
            self.fail(*problem)
        value, mod = self._limit()
        if mod is not None:
            self.fail(f"LIMIT does not combine with {clause}",
                      self.positions.get("limit", self.pos(mod["limit"]) if mod.get("limit")
                                         else at))
        if not self._aggregates():
            self.fail(f"{clause} needs an aggregate in the select list", at,
                      "e.g. SELECT AVG(objects('car')) FROM night " + clause + " ...")

    # ---- extraction

    def _tables(self) -> tuple[str, ...]:
        names = []
        for d in children(self.node):
            if d.get("type") == "BASE_TABLE" and "table_name" in d:
                parts = [p for p in (d.get("catalog_name"), d.get("schema_name"),
                                     d.get("table_name")) if p]
                name = ".".join(parts)
                if len(parts) == 1 and name.lower() in self.cte_names:
                    continue
                if name not in names:
                    names.append(name)
        return tuple(names)

    def _columns(self) -> tuple[OutputColumn, ...]:
        if self.select is None:
            return ()
        columns = []
        for item in self.select.get("select_list", []):
            located = item.get("query_location", NO_LOCATION) < NO_LOCATION
            if item.get("class") == "STAR" and not located:
                text = (item.get("relation_name") + ".*") if item.get("relation_name") else "*"
            else:
                text = self.text_of(item)
            columns.append(OutputColumn(text, item.get("alias") or None))
        return tuple(columns)

    def _single_table(self) -> dict | None:
        if self.select is None:
            return None
        table = self.select.get("from_table") or {}
        return table if table.get("type") == "BASE_TABLE" else None

    def _split_where(self):
        """(predicate parts, restriction parts) of the WHERE clause's top-level ANDs."""
        parts = and_parts(self.select.get("where_clause"))
        predicate = [p for p in parts if uses_frame_functions(p)]
        restriction = [p for p in parts if not uses_frame_functions(p)]
        return predicate, restriction

    def _joined(self, parts) -> str | None:
        if not parts:
            return None
        if len(parts) == 1:
            return self.text_of(parts[0])
        return " AND ".join(self.text_of(p, grouped=True) for p in parts)

    def _exact_where(self) -> dict:
        table = self._single_table()
        qualified = table is not None and (table.get("schema_name") or table.get("catalog_name"))
        if table is None or (not qualified and table["table_name"].lower() in self.cte_names):
            return {}
        _, restriction = self._split_where()
        frame_range, ts_range = self._ranges(restriction, table)
        return dict(video=None if qualified else table["table_name"],
                    restriction=self._joined(restriction), frame_range=frame_range,
                    ts_range=ts_range)

    def _ranges(self, parts, table):
        qualifiers = {table["table_name"].lower()} | ({table["alias"].lower()}
                                                      if table.get("alias") else set())
        bounds = {"frame": [], "ts": []}
        for part in parts:
            for column, op, value in self._simple_bounds(part, qualifiers):
                bounds[column].append((op, value))
        return _frame_range(bounds["frame"]), _ts_range(bounds["ts"])

    @staticmethod
    def _simple_bounds(node, qualifiers) -> list[tuple[str, str, float]]:
        def column(ref):
            if not isinstance(ref, dict) or ref.get("class") != "COLUMN_REF":
                return None
            names = [n.lower() for n in ref.get("column_names", [])]
            if len(names) == 2 and names[0] in qualifiers:
                names = names[1:]
            return names[0] if len(names) == 1 and names[0] in ("frame", "ts") else None

        if node.get("class") == "COMPARISON" and node.get("type") in COMPARISONS:
            op = COMPARISONS[node["type"]]
            left, right = node.get("left"), node.get("right")
            if column(left) and numeric_constant(right) is not None:
                return [(column(left), op, numeric_constant(right))]
            if column(right) and numeric_constant(left) is not None:
                return [(column(right), FLIPPED[op], numeric_constant(left))]
        if node.get("class") == "BETWEEN" and column(node.get("input")):
            lo, hi = numeric_constant(node.get("lower")), numeric_constant(node.get("upper"))
            if lo is not None and hi is not None:
                name = column(node["input"])
                return [(name, ">=", lo), (name, "<=", hi)]
        return []

    def _approximate(self, kind: str) -> dict:
        table = self.select["from_table"]
        predicate, restriction = self._split_where()
        frame_range, ts_range = self._ranges(restriction, table)
        fields = dict(video=table["table_name"], restriction=self._joined(restriction),
                      frame_range=frame_range, ts_range=ts_range)
        if predicate:
            for part in predicate:  # one by one, so that errors point at the right place
                start, end = self.span(part)
                parse_frame_expr(self.text[start:end], start, self.text)
            fields["predicate"] = self._joined(predicate)
            fields["predicate_expr"] = parse_frame_expr(fields["predicate"])
        if kind in ("aggregate", "aggregate_budget"):
            fields.update(self._aggregate_fields())
        return fields

    def _aggregate_fields(self) -> dict:
        aggregates = self._aggregates()
        if len(aggregates) > 1:
            self.fail("an approximate query computes one aggregate", self.pos(aggregates[1][1]),
                      "run one query per aggregate")
        index, call, nested = aggregates[0]
        items = self.select["select_list"]
        if nested:
            self.fail("the aggregate must be a select item by itself", self.pos(items[index]),
                      "e.g. SELECT AVG(objects('car')) AS cars; compute on the result instead")
        name = call["function_name"].lower()
        func = APPROX_AGGREGATES.get(name)
        if func is None:
            self.fail(f"{name.upper()} cannot be approximated", self.pos(call),
                      "use AVG, SUM or COUNT")
        ordered = (call.get("order_bys") or {}).get("orders")
        if call.get("distinct") or call.get("filter") or ordered:
            self.fail(f"{name.upper()} with DISTINCT, FILTER or ORDER BY cannot be approximated",
                      self.pos(call), "use a WHERE condition instead of FILTER")
        args = [a["expression"] if "expression" in a else a for a in call.get("arguments", [])]
        if len(args) > 1 or (func != "count" and len(args) != 1):
            self.fail(f"{name.upper()} takes one argument", self.pos(call))
        argument = expr = None
        if args and not (args[0].get("class") == "STAR"):
            start, end = self.span(args[0])
            argument = self.text[start:end]
            expr = parse_frame_expr(argument, start, self.text)
        fields = dict(aggregate=Aggregate(func, argument, expr))
        fields.update(self._group_fields(index))
        return fields

    def _group_fields(self, aggregate_index: int) -> dict:
        s = self.select
        items = s["select_list"]
        groups = s.get("group_expressions") or []
        if s.get("aggregate_handling") == "FORCE_AGGREGATES":
            self.fail("GROUP BY ALL is not supported in approximate queries", self.tokens[0].start,
                      "write the GROUP BY expression, e.g. GROUP BY contains('bus')")
        if len(groups) > 1:
            self.fail("an approximate aggregate groups by at most one expression",
                      self.pos(groups[1]))
        group_item = None
        group_node = groups[0] if groups else None
        if group_node is not None:
            ordinal = numeric_constant(group_node)
            if ordinal is not None and float(ordinal).is_integer() and 1 <= ordinal <= len(items):
                group_item = int(ordinal) - 1
            elif group_node.get("class") == "COLUMN_REF" and len(group_node["column_names"]) == 1:
                name = group_node["column_names"][0].lower()
                group_item = next((k for k, it in enumerate(items)
                                   if (it.get("alias") or "").lower() == name), None)
            if group_item == aggregate_index:
                self.fail("GROUP BY cannot name the aggregate", self.pos(group_node))
            if group_item is not None:
                group_node = items[group_item]
        group_text = self.text_of(group_node) if group_node is not None else None
        for k, item in enumerate(items):
            if k in (aggregate_index, group_item):
                continue
            if group_text is None or _normal(self.text_of(item)) != _normal(group_text):
                self.fail("an approximate aggregate returns the aggregate and the GROUP BY "
                          "expression only", self.pos(item),
                          "remove this column or GROUP BY it")
        if group_node is None:
            return {}
        start = self.span(group_node)[0]
        return dict(group_by=group_text, group_expr=parse_frame_expr(group_text, start, self.text))


def _normal(sql: str) -> str:
    return "".join(sql.split()).lower()


def _frame_range(bounds) -> tuple[int, int | None] | None:
    if not bounds:
        return None
    lo, hi = 0, None
    for op, v in bounds:
        if op in (">", ">=", "="):
            lo = max(lo, math.floor(v) + 1 if op == ">" else math.ceil(v))
        if op in ("<", "<=", "="):
            top = math.ceil(v) - 1 if op == "<" else math.floor(v)
            hi = top if hi is None else min(hi, top)
    return lo, hi


def _ts_range(bounds) -> tuple[float | None, float | None] | None:
    if not bounds:
        return None
    lo = hi = None
    for op, v in bounds:
        if op in (">", ">=", "="):
            lo = v if lo is None else max(lo, v)
        if op in ("<", "<=", "="):
            hi = v if hi is None else min(hi, v)
    return lo, hi
