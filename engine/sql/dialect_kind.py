"""The kind rule of the dialect (documented on `vidql.engine.sql.dialect`): which operator
answers a query, decided from its vidql clauses and its SQL shape, and the errors for
shapes a kind cannot answer."""
from __future__ import annotations

from vidql.engine.sql.dialect_ast import NO_LOCATION, and_parts, expressions, numeric_constant, \
    uses_frame_functions, aggregate_names
from vidql.engine.sql.dialect_clauses import CLAUSE_HINT, NAMES
from vidql.engine.sql.dialect_spans import QuerySpans
from vidql.engine.sql.dialect_statements import Clauses
from vidql.engine.sql.framestat import parse_frame_expr
from vidql.base.errors import QueryError

TARGETS = {"recall": "select_recall", "precision": "select_precision", "rare": "rare"}
SELECTION_COLUMNS = ("clip", "frame", "ts")  # a selection's columns a select list may name
SELECT_LIST_HINT = ("select frame (or clip, frame, ts, or *) and join the result with the video "
                    "table for more columns{exact}")


class QueryShape(QuerySpans):
    """One query's syntax tree with its vidql clauses (and where they were written): the
    parts of the SELECT the kind rule reads, and why a shape does not fit a kind."""

    def __init__(self, text, tokens, sql, pieces, node, clauses: Clauses, positions: dict):
        super().__init__(text, tokens, sql, pieces, node)
        self.clauses, self.positions = clauses, positions

    # ---- parts of the SELECT

    def has_aggregate(self) -> bool:
        s = self.select
        if s is None:
            return False
        return bool(self.aggregates() or s.get("group_expressions") or s.get("having")
                    or s.get("aggregate_handling") == "FORCE_AGGREGATES")

    def aggregates(self) -> list[tuple[int, dict, bool]]:
        """(select item index, aggregate call, nested inside the item) for each aggregate."""
        names = aggregate_names()
        found = []
        for index, item in enumerate(self.select.get("select_list", [])):
            for expr in expressions(item):
                if (expr.get("class") == "FUNCTION" and not expr.get("schema")
                        and expr.get("function_name", "").lower() in names):
                    found.append((index, expr, expr is not item))
        return found

    def modifiers(self) -> dict:
        mods = {}
        for mod in (self.select or self.node).get("modifiers", []):
            if mod["type"] == "ORDER_MODIFIER" and mod.get("orders"):
                mods["order"] = mod
            elif mod["type"] == "DISTINCT_MODIFIER":
                mods["distinct"] = mod
            elif "LIMIT" in mod["type"]:
                mods["limit"] = mod
        return mods

    def limit(self) -> tuple[int | None, dict | None]:
        """(LIMIT n when a constant integer row count, the LIMIT modifier)."""
        mod = self.modifiers().get("limit")
        if mod is None:
            return None, None
        limit = mod.get("limit")
        value = numeric_constant(limit)
        literal = (limit or {}).get("literal") or {}
        if (value is None or mod.get("limit_type", "ROW_COUNT") != "ROW_COUNT"
                or not str(literal.get("text", "")).lstrip("-").isdigit()):
            return None, mod
        return int(value), mod

    def split_where(self):
        """(predicate parts, restriction parts) of the WHERE clause's top-level ANDs."""
        parts = and_parts(self.select.get("where_clause"))
        predicate = [p for p in parts if uses_frame_functions(p)]
        restriction = [p for p in parts if not uses_frame_functions(p)]
        return predicate, restriction

    def frame_calls_are_valid(self) -> bool:
        """False when a WHERE call named like a frame function is not one (e.g. DuckDB's
        own contains(name, 'x')): such a query stays plain, exact SQL."""
        predicate, _ = self.split_where()
        try:
            for part in predicate:
                parse_frame_expr(self.text_of(part))
        except QueryError:
            return False
        return True

    # ---- why a shape does not fit

    def video_problem(self, clause: str) -> tuple[str, int] | None:
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

    def shape_problem(self, clause: str) -> tuple[str, int] | None:
        """Problems shared by all approximate kinds."""
        problem = self.video_problem(clause)
        if problem:
            return problem
        s = self.select
        mods = self.modifiers()
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

    def selection_problem(self, require_limit: bool, clause: str,
                          at: int) -> tuple[str, int] | None:
        """Why this is not a frame selection for `clause` (written at `at`), or None."""
        problem = self.shape_problem(clause)
        if problem:
            return problem
        if self.has_aggregate():
            aggregates = self.aggregates()
            where = self.pos(aggregates[0][1]) if aggregates else at
            return f"{clause} selects frames: it does not take aggregates or GROUP BY", where
        problem = self._limit_problem(require_limit, clause, at)
        if problem:
            return problem
        if not any(uses_frame_functions(p) for p in and_parts(self.select.get("where_clause"))):
            return (f"{clause} needs a WHERE condition on frame functions, "
                    "e.g. WHERE contains('bus')"), at
        return None

    def select_list_problem(self, clause: str) -> tuple[str, int] | None:
        """Why the select list asks for more than a frame selection returns (clip, frame,
        ts and verified for each frame), or None: it may name those columns, or *."""
        for item in self.select.get("select_list", []):
            names = [n.lower() for n in item.get("column_names", [])]
            column = item.get("class") == "COLUMN_REF" and names[-1] in SELECTION_COLUMNS
            if item.get("class") == "STAR" or (column and not item.get("alias")):
                continue
            what = (f"{self.text_of(item)} renamed {item['alias']}" if column
                    else self.text_of(item))
            return (f"{clause} returns clip, frame, ts and verified for each frame it "
                    f"selects, not {what}"), self.pos(item)
        return None

    def _limit_problem(self, require_limit: bool, clause: str,
                       at: int) -> tuple[str, int] | None:
        value, mod = self.limit()
        limit_at = self.limit_position(mod, at)
        if not require_limit:
            return None if mod is None else (f"LIMIT does not combine with {clause}", limit_at)
        if mod is None:
            return f"{clause} needs LIMIT n", at
        if mod.get("offset"):
            return f"{clause} does not support OFFSET", self.pos(mod["offset"])
        if value is None or value < 1:
            return "LIMIT needs a positive whole number here", limit_at
        return None

    def limit_position(self, mod: dict | None, default: int) -> int:
        """Where LIMIT's row count was written (`default` when nowhere)."""
        return self.positions.get("limit", self.pos(mod["limit"]) if mod and mod.get("limit")
                                  else default)


def query_kind(shape: QueryShape) -> str:
    """The query's kind (see `vidql.engine.sql.dialect`); QueryError for a shape it refuses or
    a clause its kind does not take."""
    kind = _kind(shape)
    _check_clause_use(shape, kind)
    return kind


def _kind(shape: QueryShape) -> str:
    c, at = shape.clauses, shape.positions
    chosen = [k for k in TARGETS if k in at]
    if chosen:
        return _target_kind(shape, chosen)
    if c.error is not None:
        if "gap" in at:
            shape.fail("GAP does not combine with ERROR WITHIN", at["gap"],
                       "GAP spaces the frames of a LIMIT query")
        _aggregate_shape(shape, "error")
        return "aggregate"
    if c.gap is not None:
        _selection_shape(shape, "gap", require_limit=True)
        return "limit"
    if c.budget is not None:
        return _budget_kind(shape)
    if (shape.limit()[1] is not None
            and shape.selection_problem(True, "LIMIT", shape.tokens[0].start) is None
            and shape.frame_calls_are_valid()):
        _select_list_shape(shape, "LIMIT", ", or add ORDER BY to label every frame exactly")
        return "limit"
    return "exact"


def _target_kind(shape: QueryShape, chosen: list[str]) -> str:
    """Kind of a RECALL TARGET, PRECISION TARGET or FIND RARE query."""
    at = shape.positions
    if len(chosen) > 1:
        first, second = sorted(chosen, key=at.get)[:2]
        shape.fail(f"{NAMES[first]} and {NAMES[second]} cannot be combined", at[second],
                   "a query asks for one guarantee; run two queries")
    key = chosen[0]
    for other in ("error", "gap", "limit"):
        if other in at:
            shape.fail(f"{NAMES[other]} does not combine with {NAMES[key]}", at[other],
                       f"{NAMES[key]} returns every frame it finds; drop {NAMES[other]}")
    if shape.clauses.budget is None:
        shape.fail(f"{NAMES[key]} needs ORACLE BUDGET n", at[key],
                   f"add e.g. ORACLE BUDGET 1000: the oracle calls {NAMES[key]} may spend")
    _selection_shape(shape, key, require_limit=False)
    return TARGETS[key]


def _budget_kind(shape: QueryShape) -> str:
    """Kind of a query whose only kind-deciding clause is ORACLE BUDGET."""
    if shape.has_aggregate():
        _aggregate_shape(shape, "budget")
        return "aggregate_budget"
    if shape.limit()[1] is not None:
        _selection_shape(shape, "budget", require_limit=True)
        return "limit"
    shape.fail("ORACLE BUDGET needs an aggregate (AVG, SUM, COUNT), LIMIT n, "
               "RECALL TARGET, PRECISION TARGET or FIND RARE", shape.positions["budget"],
               CLAUSE_HINT)


def _check_clause_use(shape: QueryShape, kind: str) -> None:
    at = shape.positions
    if "confidence" in at and kind not in ("aggregate", "aggregate_budget", "select_recall",
                                           "select_precision"):
        shape.fail("CONFIDENCE needs ERROR WITHIN, ORACLE BUDGET on an aggregate, "
                   "RECALL TARGET or PRECISION TARGET", at["confidence"],
                   "CONFIDENCE states how sure an interval or target is; this query has none")
    for key, words in (("approximate", "APPROXIMATE"), ("budget", "ORACLE BUDGET UP TO")):
        if key in at and kind != "select_recall" and (
                key == "approximate" or shape.clauses.budget_up_to):
            shape.fail(f"{words} applies to RECALL TARGET only", at[key],
                       "write ... RECALL TARGET 90% ORACLE BUDGET UP TO 5000, or "
                       "... RECALL TARGET 90% ORACLE BUDGET 1000 APPROXIMATE")
    if "seed" in at and kind == "exact":
        shape.fail("SEED applies to approximate queries only", at["seed"],
                   "an exact query has no randomness; drop SEED")


def _selection_shape(shape: QueryShape, key: str, require_limit: bool) -> None:
    problem = shape.selection_problem(require_limit, NAMES[key], shape.positions[key])
    if problem:
        message, where = problem
        hint = ("write e.g. LIMIT 10 GAP 300" if "LIMIT" in message and key == "gap"
                else "write LIMIT n with a whole number n >= 1" if "LIMIT needs" in message
                else None)
        shape.fail(message, where, hint)
    _select_list_shape(shape, "LIMIT ... GAP" if key == "gap" else NAMES[key], "")


def _select_list_shape(shape: QueryShape, clause: str, exact: str) -> None:
    problem = shape.select_list_problem(clause)
    if problem:
        shape.fail(*problem, SELECT_LIST_HINT.format(exact=exact))


def _aggregate_shape(shape: QueryShape, key: str) -> None:
    clause, at = NAMES[key], shape.positions[key]
    problem = shape.shape_problem(clause)
    if problem:
        shape.fail(*problem)
    _, mod = shape.limit()
    if mod is not None:
        shape.fail(f"LIMIT does not combine with {clause}", shape.limit_position(mod, at))
    if not shape.aggregates():
        shape.fail(f"{clause} needs an aggregate in the select list", at,
                   "e.g. SELECT AVG(objects('car')) FROM night " + clause + " ...")
