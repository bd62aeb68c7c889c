"""Frame functions (`objects('car')`, `contains('bus')`, `objects(*)`) and frame statistics.

A frame statistic is SQL text over frame functions. It is defined once and evaluated
wherever detections exist: on the oracle's labels (true values) and on the labels of an
index's representatives (proxy scores). Calls are found with DuckDB's own tokenizer and
replaced by columns of a per-frame table computed from detections.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import duckdb
import numpy as np
import pandas as pd

from vidql.engine.sql.dialect_lex import Token, connection, string_value, tokenize
from vidql.base.detections import DETECTION_COLUMNS, DetectionArrays
from vidql.base.errors import QueryError

FRAME_FUNCTIONS = ("objects", "contains")
# functions that give a value for any values of their arguments (DuckDB's own, in a frame
# statistic); any other may give NULL, and so may NULL, NULLIF, TRY and a CASE without ELSE
NULL_SAFE_FUNCTIONS = frozenset({"abs", "cast", "coalesce", "greatest", "least", "round",
                                 "floor", "ceil", "ceiling", "sign", "if"})
COMPARISONS = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less,
               "=": np.equal, "==": np.equal, "!=": np.not_equal, "<>": np.not_equal}


@dataclass(frozen=True)
class FrameFunction:
    """One call: `kind` is 'objects' (a count) or 'contains' (a truth value)."""

    kind: str
    label: str | None  # None: any class (objects(*))
    min_score: float = 0.0

    @property
    def canonical(self) -> str:
        arg = "*" if self.label is None else "'" + self.label.replace("'", "''") + "'"
        if self.min_score:
            arg += f", {self.min_score:g}"
        return f"{self.kind}({arg})"

    @property
    def column(self) -> str:
        """Quoted identifier of this call's column in the per-frame table.

        DuckDB matches identifiers case-insensitively and `canonical` rounds min_score, so
        a call whose canonical text is not lower-case or not exact gets a suffix hashed
        from (kind, label, min_score): `objects('Car')` and `objects('car')` never share
        a column."""
        name = self.canonical
        exact = self.label is None or self.label == self.label.lower()
        if not exact or float(f"{self.min_score:g}") != self.min_score:
            key = repr((self.kind, self.label, self.min_score)).encode()
            name += " #" + hashlib.sha256(key).hexdigest()[:8]
        return '"' + name.replace('"', '""') + '"'

    def aggregate_sql(self) -> str:
        """DuckDB aggregate over a frame's detection rows giving this call's value."""
        conds = ["label IS NOT NULL"]
        if self.label is not None:
            conds.append("label = '" + self.label.replace("'", "''") + "'")
        if self.min_score:
            conds.append(f"score >= {self.min_score!r}")
        count = f"count(*) FILTER (WHERE {' AND '.join(conds)})"
        return count if self.kind == "objects" else f"({count} >= 1)"


@dataclass(frozen=True)
class FrameExpr:
    """SQL text with its frame-function calls found; `sql` has them replaced by columns."""

    text: str
    sql: str
    functions: tuple[FrameFunction, ...]

    @property
    def is_frame_statistic(self) -> bool:
        return bool(self.functions)

    @property
    def key(self) -> str:
        """One name for the statistic however it was spaced (an index caches proxies by it)."""
        return self.sql.strip()

    def values(self, detections: pd.DataFrame, frames) -> np.ndarray:
        """The statistic's true value on each of `frames` (distinct), given their detections:
        `evaluate`'s values, from per-frame counts (a DuckDB statement only for a statistic
        that is not one count, over its distinct counts)."""
        frames = np.asarray(frames, dtype=np.int64)
        det = DetectionArrays.of(detections)
        rows = det.rows_in(frames)
        keep = (rows >= 0) & (det.codes >= 0)  # of these frames, with a label
        det, rows = det.where(keep), rows[keep]
        stats = FrameStatistics([self])
        counts = np.column_stack([count_detections(k, det, rows, len(frames)) for k in stats.keys])
        return stats(frames, counts)[0]


def frame_statistic(expr: str | FrameExpr) -> FrameExpr:
    """`expr` parsed, or a QueryError when it uses no frame function (e.g. '1 + 1')."""
    parsed = parse_frame_expr(expr) if isinstance(expr, str) else expr
    if not parsed.is_frame_statistic:
        raise QueryError(f"{parsed.text!r} is not a frame statistic: it uses no frame "
                         "function such as objects('car') or contains('bus')")
    return parsed


def parse_frame_expr(text: str, offset: int = 0, full_query: str | None = None) -> FrameExpr:
    """Find frame-function calls in `text`; errors carry positions in `full_query`."""
    query = full_query if full_query is not None else text
    tokens = tokenize(text, query, offset)
    functions: list[FrameFunction] = []
    pieces: list[str] = []
    last = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        is_call = (tok.kind == "identifier" and tok.text.lower() in FRAME_FUNCTIONS
                   and i + 1 < len(tokens) and tokens[i + 1].text == "(")
        if not is_call:
            i += 1
            continue
        fn, end_index = _parse_call(tokens, i, query, offset)
        pieces.append(text[last:tok.start])
        pieces.append(fn.column)
        last = tokens[end_index].end
        if fn not in functions:
            functions.append(fn)
        i = end_index + 1
    pieces.append(text[last:])
    return FrameExpr(text=text, sql="".join(pieces), functions=tuple(functions))


def _parse_call(tokens: list[Token], i: int, query: str, offset: int) -> tuple[FrameFunction, int]:
    """Parse `name ( args )` starting at tokens[i]; return the call and the index of ')'."""
    name = tokens[i].text.lower()
    args: list[list[Token]] = []  # the tokens of each comma-separated argument
    j = i + 2
    while j < len(tokens) and tokens[j].text != ")":
        if tokens[j].text == "," or not args:
            args.append([])
        if tokens[j].text != ",":
            args[-1].append(tokens[j])
        j += 1
    where = offset + tokens[i].start
    usage = ("objects('class'[, min_score]) or objects(*)" if name == "objects"
             else "contains('class'[, min_score])")
    if j >= len(tokens):
        raise QueryError(f"{name}( is not closed", query, where, hint=f"write {usage}")
    if not args or not args[0]:
        raise QueryError(f"{name}() needs a class name", query, where, hint=f"write {usage}")
    label = _label(name, args[0], query, offset, where, usage)
    if len(args) > 2:
        raise QueryError(f"{name}() takes at most two arguments", query, where, hint=f"write {usage}")
    min_score = _min_score(name, args[1], query, offset, where, usage) if len(args) == 2 else 0.0
    return FrameFunction(name, label, min_score), j


def _label(name: str, tokens: list[Token], query: str, offset: int, where: int,
           usage: str) -> str | None:
    """The class a call's first argument names; None for `*` (any class)."""
    arg = tokens[0]
    if len(tokens) > 1:
        raise QueryError(f"{name}() takes a quoted class name, got "
                         f"{query[offset + arg.start:offset + tokens[-1].end]}", query,
                         offset + arg.start, hint=f"write {usage}")
    if arg.text == "*":
        if name != "objects":
            raise QueryError("contains(*) is not a frame function", query, where, hint=f"write {usage}")
        return None
    if arg.kind != "string":
        raise QueryError(f"{name}() takes a quoted class name, got {arg.text}", query,
                         offset + arg.start, hint=f"write {usage}")
    return string_value(arg)


def _min_score(name: str, tokens: list[Token], query: str, offset: int, where: int,
               usage: str) -> float:
    """A call's second argument: a number in [0, 1], perhaps signed."""
    if not tokens:
        raise QueryError(f"{name}() has no min_score after its comma", query, where,
                         hint=f"write {usage}")
    arg, sign = tokens[-1], [t.text for t in tokens[:-1]]
    if arg.kind != "number" or sign not in ([], ["-"], ["+"]):
        raise QueryError(f"{name}() min_score must be a number, got "
                         f"{query[offset + tokens[0].start:offset + arg.end]}", query,
                         offset + tokens[0].start, hint=f"write {usage}")
    min_score = -float(arg.text) if sign == ["-"] else float(arg.text)
    if not 0.0 <= min_score <= 1.0:
        raise QueryError(f"min_score {min_score:g} is outside [0, 1]", query,
                         offset + tokens[0].start)
    return min_score


def frame_table_sql(functions, detections: str, frames: str) -> str:
    """SQL for one row per frame of `frames` (a relation with column `frame`) with a column
    per frame function, computed from `detections` (rows with `frame, label, score, ...`;
    a frame labelled with zero detections has no row, or a row with NULL label)."""
    cols = ", ".join(f"{fn.aggregate_sql()} AS {fn.column}" for fn in functions)
    select_cols = "".join(
        f", coalesce(s.{fn.column}, {'0' if fn.kind == 'objects' else 'false'}) AS {fn.column}"
        for fn in functions)
    if not functions:
        return f"SELECT f.* FROM {frames} f"
    return (f"SELECT f.*{select_cols} FROM {frames} f LEFT JOIN "
            f"(SELECT frame, {cols} FROM {detections} GROUP BY frame) s USING (frame)")


def evaluate(expr: FrameExpr | str, detections: pd.DataFrame, frames) -> np.ndarray:
    """Value of a frame statistic (float64; predicates give 0/1) for each of `frames`.

    `detections` holds the labels of those frames (DETECTION_COLUMNS); frames without rows
    count as labelled with no detections."""
    if isinstance(expr, str):
        expr = parse_frame_expr(expr)
    frames = np.asarray(frames, dtype=np.int64)
    con = connection()
    con.register("__det", detections[DETECTION_COLUMNS] if len(detections) else
                 pd.DataFrame({c: pd.Series(dtype="float64" if c not in ("frame", "label")
                                            else ("int64" if c == "frame" else "str"))
                               for c in DETECTION_COLUMNS}))
    con.register("__frames", pd.DataFrame({"frame": frames, "__pos": np.arange(len(frames))}))
    try:
        table = frame_table_sql(expr.functions, "__det", "__frames")
        sql = f"SELECT {_as_double(expr)} FROM ({table}) ORDER BY __pos"
        try:
            values = con.execute(sql).fetchnumpy()
        except duckdb.Error as exc:
            raise QueryError(f"cannot evaluate frame statistic {expr.text!r}: {exc}") from None
        return _finite(expr, next(iter(values.values())))
    finally:
        con.unregister("__det")
        con.unregister("__frames")


def is_predicate(expr: FrameExpr | str) -> bool:
    """Whether a frame expression is a truth value (so its values lie in [0, 1])."""
    return expr_type(parse_frame_expr(expr) if isinstance(expr, str) else expr) == "BOOLEAN"


def expr_type(expr: FrameExpr) -> str | None:
    """The DuckDB type of a frame expression's values (its `objects` calls BIGINT counts,
    its `contains` calls BOOLEAN), None where DuckDB refuses it."""
    cols = ", ".join(f"{'0::BIGINT' if fn.kind == 'objects' else 'false'} AS {fn.column}"
                     for fn in expr.functions) or "0 AS __none"
    return sql_type(f"SELECT ({expr.sql}) AS v FROM (SELECT {cols})")


@lru_cache(maxsize=256)
def sql_type(select: str) -> str | None:
    """The DuckDB type of the first column of `select` (None where DuckDB refuses it),
    remembered: asking costs 0.4 ms a query."""
    try:
        return connection().execute(f"DESCRIBE {select}").fetchall()[0][1]
    except duckdb.Error:
        return None


def may_be_null(expr: FrameExpr) -> bool:
    """Whether a frame statistic may be NULL on some frame, read (conservatively) off its
    text: a NULL other than in IS [NOT] NULL, NULLIF, TRY, a subquery, a CASE without ELSE,
    or a function not in NULL_SAFE_FUNCTIONS. SQL aggregates skip such frames."""
    tokens = [t for t in tokenize(expr.sql) if t.kind != "comment"]
    words = [t.text.lower() if t.kind in ("keyword", "identifier") else t.text for t in tokens]
    if _coalesced_to_a_number(tokens, words):
        return False
    for i, word in enumerate(words):
        if word == "null" and not (words[i - 1:i] == ["is"] or words[i - 2:i] == ["is", "not"]):
            return True
        if word in ("nullif", "try", "try_cast", "select"):
            return True
        called = i + 1 < len(words) and words[i + 1] == "("
        if called and tokens[i].kind in ("keyword", "identifier") and word not in NULL_SAFE_FUNCTIONS:
            return True
    return words.count("case") > words.count("else")


def _coalesced_to_a_number(tokens: list[Token], words: list[str]) -> bool:
    """Whether the whole expression is coalesce(..., n) with n a number literal."""
    if words[:2] != ["coalesce", "("] or words[-1] != ")" or tokens[-2].kind != "number":
        return False
    depth = 0
    for i, word in enumerate(words[1:], start=1):
        depth += (word == "(") - (word == ")")
        if depth == 0:  # the parenthesis opened after coalesce closes here
            return i == len(words) - 1 and (words[i - 2] == "," or (
                words[i - 2] in ("-", "+") and words[i - 3] == ","))
    return False


def count_key(fn: FrameFunction) -> tuple[str | None, float]:
    """What a call counts: detections of `label` (None: any) scoring at least `min_score`;
    `objects` and `contains` of the same arguments share it."""
    return fn.label, fn.min_score


def count_sql(key: tuple[str | None, float]) -> str:
    """DuckDB aggregate over a frame's detection rows counting the detections of `key`."""
    return FrameFunction("objects", *key).aggregate_sql()


def count_detections(key: tuple[str | None, float], det: DetectionArrays, rows: np.ndarray,
                     n: int) -> np.ndarray:
    """Per-frame counts of `key` in `det`; `rows` gives each detection's frame position in
    0..n-1. Matches `count_sql` (labels are never NULL in the cache)."""
    label, min_score = key
    keep = np.ones(len(rows), dtype=bool) if label is None else det.codes == det.label_code(label)
    if min_score:
        keep &= det.values[:, 0] >= min_score
    return np.bincount(rows[keep], minlength=n)


class FrameStatistics:
    """Evaluates frame statistics from per-frame counts (one column per `keys` entry), the
    same values `evaluate` gives. A statistic that is one frame function is its count
    (`objects`) or count >= 1 (`contains`); the others are evaluated once per distinct row
    of counts, all in one statement, and remembered: a callback costs array operations only."""

    def __init__(self, exprs):
        self.exprs = [parse_frame_expr(e) if isinstance(e, str) else e for e in exprs]
        self.keys = list(dict.fromkeys(count_key(fn) for e in self.exprs for fn in e.functions))
        self.direct = [_on_counts(e, self.keys) for e in self.exprs]
        self.others = [e for e, d in zip(self.exprs, self.direct, strict=True) if d is None]
        self.functions = list(dict.fromkeys(fn for e in self.others for fn in e.functions))
        self.by_frame = any(_mentions_frame(e) for e in self.others)  # e.g. frame % 2 = 0
        self._memo: dict[tuple, np.ndarray] = {}

    def __call__(self, frames: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Values (float64, one array per statistic) of `frames` whose counts of `keys` are
        the columns of `counts` (len(frames) × len(keys))."""
        frames = np.asarray(frames, dtype=np.int64)
        counts = counts.reshape(len(frames), len(self.keys))
        others = iter(self._others(frames, counts) if self.others else ())
        return tuple(next(others) if d is None else d[1](counts[:, d[0]]).astype(np.float64)
                     for d in self.direct)

    def _others(self, frames: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        """Values of the statistics that are not one frame function, through the memo."""
        rows = np.column_stack([counts, frames]) if self.by_frame else counts
        distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
        todo = [row for row in map(tuple, distinct.tolist()) if row not in self._memo]
        if todo and len(self.keys) == 1 and not self.by_frame:
            # one count: every count up to twice the largest seen, in the same statement
            todo = [(c,) for c in range(2 * max(todo)[0] + 16) if (c,) not in self._memo]
        if todo:
            self._memo.update(zip(todo, self._evaluate(np.array(todo, dtype=np.int64)), strict=True))
        table = np.array([self._memo[row] for row in map(tuple, distinct.tolist())],
                         dtype=np.float64).reshape(len(distinct), len(self.others))
        values = table[np.asarray(inverse).ravel()]
        return [values[:, i].copy() for i in range(len(self.others))]

    def _evaluate(self, rows: np.ndarray) -> list[np.ndarray]:
        """Each statistic on each row of counts (plus frame), in one DuckDB statement over
        list parameters (a registered DataFrame costs three times as much)."""
        columns, params = [], []
        for fn in self.functions:
            count = rows[:, self.keys.index(count_key(fn))]
            columns.append(fn.column)
            params.append((count if fn.kind == "objects" else count >= 1).tolist())
        if self.by_frame:
            columns.append("frame")
            params.append(rows[:, -1].tolist())
        params.append(list(range(len(rows))))
        source = ", ".join(f"unnest(${i + 1}) AS {c}" for i, c in enumerate(columns + ["__pos"]))
        con = connection()
        try:
            values = _select(con, self.others, source, params)
        except duckdb.Error:
            for expr in self.others:  # name the statistic that fails
                try:
                    _select(con, [expr], source, params)
                except duckdb.Error as exc:
                    raise QueryError(f"cannot evaluate frame statistic {expr.text!r}: "
                                     f"{exc}") from None
            raise
        return list(np.column_stack(values))


def _on_counts(expr: FrameExpr, keys: list[tuple]) -> tuple[int, Callable] | None:
    """(column of its count in `keys`, the statistic as a function of that count) for a
    statistic that is one frame function, or one `objects` call compared with a number
    (`objects('car') >= 5`, the usual predicate); None for any other (DuckDB evaluates it)."""
    if len(expr.functions) != 1:
        return None
    fn = expr.functions[0]
    column = keys.index(count_key(fn))
    if expr.sql.strip() == fn.column:
        return column, (lambda count: count >= 1) if fn.kind == "contains" else (lambda count: count)
    tokens = [t for t in tokenize(expr.sql) if t.kind != "comment"]
    if fn.kind != "objects" or len(tokens) != 3 or tokens[0].text != fn.column or (
            tokens[1].text not in COMPARISONS or tokens[2].kind != "number"):
        return None
    try:
        number = float(tokens[2].text)
    except ValueError:
        return None
    compare = COMPARISONS[tokens[1].text]
    return column, lambda count: compare(count, number)


def _select(con, exprs: list[FrameExpr], source: str, params: list) -> list[np.ndarray]:
    """`exprs` over the rows of `SELECT {source}` (with `params`), in `__pos` order."""
    cols = ", ".join(f"{_as_double(e)} AS v{i}" for i, e in enumerate(exprs))
    values = con.execute(f"SELECT {cols} FROM (SELECT {source}) ORDER BY __pos",
                         params).fetchnumpy()
    return [_finite(e, values[f"v{i}"]) for i, e in enumerate(exprs)]


def _as_double(expr: FrameExpr) -> str:
    """SQL for a statistic's value as a DOUBLE; a predicate that is NULL is false (as in
    WHERE), another statistic stays NULL."""
    return (f"coalesce(CAST(({expr.sql}) AS DOUBLE), "
            f"CASE WHEN typeof(({expr.sql})) = 'BOOLEAN' THEN 0 END)")


def _finite(expr: FrameExpr, values) -> np.ndarray:
    """`values` (as DuckDB fetched them: NULLs masked) of a frame statistic as float64, or a
    QueryError where one is NULL, NaN or infinite: counted as 0 before, such a frame moved
    AVG (the planner leaves NULLs out, as SQL does, for a statistic `may_be_null` flags)."""
    values = np.ma.filled(np.ma.asarray(values, dtype=np.float64), np.nan)
    if not np.isfinite(values).all():
        raise QueryError(f"frame statistic {expr.text!r} has no finite value on some frames "
                         "(NULL, NaN or infinite: a division by zero, say); write it so "
                         "that every frame has a number, e.g. with NULLIF(..., 0) inside "
                         "AVG, which then leaves those frames out")
    return values


def _mentions_frame(expr: FrameExpr) -> bool:
    """Whether a statistic reads the frame number as well as frame functions."""
    return any(tok.kind == "identifier" and tok.text.strip('"').lower() == "frame"
               for tok in tokenize(expr.sql))
