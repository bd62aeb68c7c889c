"""The Python query API, mirroring the SQL dialect.

    db.video("night").where(contains("bus")).select(recall=0.9, confidence=0.95, budget=1000)
    db.video("night").aggregate("avg", objects("car"), error=0.1, confidence=0.95)

Each call builds the equivalent dialect statement and runs it through the same parser and
planner as `db.sql`, so both front ends have one meaning and return the same Result
(engine/result.py): it reads like a DuckDB relation and carries `.report`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from vidql.base.errors import ParameterError
from vidql.base.ranges import FINITE, WHOLE
from vidql.engine.sql.sqlnames import sql_name
from vidql.engine.executor import run_query
from vidql.engine.sql.dialect import parse


def sql_literal(value) -> str:
    """A Python value (numpy scalars included) as a SQL literal: numbers, strings, booleans,
    None; an Expr is its SQL text."""
    if isinstance(value, Expr):
        return value.sql
    if value is None:
        return "NULL"
    if isinstance(value, (bool, np.bool_)):
        return "TRUE" if value else "FALSE"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ParameterError(f"{value!r} has no SQL literal: give a finite number")
        return repr(float(value))
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise ParameterError(f"{value!r} ({type(value).__name__}) cannot be written as a SQL value: "
                         f"give a number, a string, a boolean or an expression such as objects('car')")


def _number(name: str, value) -> str:
    """A numeric argument as a SQL literal, or a ParameterError naming it and its range."""
    return repr(FINITE.check(name, value))


def _integer(name: str, value) -> str:
    """A count (numpy integers and integral floats too) as a SQL literal, or a
    ParameterError naming it and its range."""
    return str(WHOLE.check(name, value))


@dataclass(frozen=True)
class Expr:
    """A frame statistic or predicate as SQL text; operators build bigger expressions."""

    sql: str

    def _bin(self, op: str, other) -> "Expr":
        return Expr(f"({self.sql} {op} {sql_literal(other)})")

    def __ge__(self, o): return self._bin(">=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __le__(self, o): return self._bin("<=", o)
    def __lt__(self, o): return self._bin("<", o)
    def __eq__(self, o): return self._bin("=", o)  # type: ignore[override]
    def __ne__(self, o): return self._bin("<>", o)  # type: ignore[override]
    def __add__(self, o): return self._bin("+", o)
    def __sub__(self, o): return self._bin("-", o)
    def __mul__(self, o): return self._bin("*", o)
    def __radd__(self, o): return Expr(f"({sql_literal(o)} + {self.sql})")
    def __rsub__(self, o): return Expr(f"({sql_literal(o)} - {self.sql})")
    def __rmul__(self, o): return Expr(f"({sql_literal(o)} * {self.sql})")
    def __and__(self, o): return self._bin("AND", o)
    def __or__(self, o): return self._bin("OR", o)
    def __invert__(self): return Expr(f"(NOT {self.sql})")
    __hash__ = object.__hash__

    def __str__(self) -> str:
        return self.sql


def _call(kind: str, label: str | None, min_score) -> Expr:
    if label is not None and not isinstance(label, str):
        raise ParameterError(f"{kind}() takes a class name string, got {label!r}")
    arg = "*" if label is None else sql_literal(label)
    score = "" if min_score is None else ", " + _number("min_score", min_score)
    return Expr(f"{kind}({arg}{score})")


def objects(label: str | None = None, min_score: float | None = None) -> Expr:
    """Number of detections of `label` (any class when None) with score >= min_score."""
    return _call("objects", label, min_score)


def contains(label: str, min_score: float | None = None) -> Expr:
    """Whether the frame has at least one `label` detection."""
    if label is None:
        raise ParameterError("contains() takes a class name, e.g. contains('bus')")
    return _call("contains", label, min_score)


def clip_in(*clips: str) -> Expr:
    """Restrict a collection to some of its clips: `clip IN ('a', 'b')`."""
    if not clips or not all(isinstance(c, str) for c in clips):
        raise ParameterError("clip_in() takes one or more clip names, e.g. clip_in('cam3_0800')")
    return Expr(f"clip IN ({', '.join(sql_literal(c) for c in clips)})")


def _optional(clause: str, name: str, value) -> str:
    """`CLAUSE n` for an integer argument given, nothing for None (the SQL default)."""
    return "" if value is None else f"{clause} {_integer(name, value)}"


def _confidence(value) -> str:
    return "" if value is None else f"CONFIDENCE {_number('confidence', value)}"


@dataclass(frozen=True)
class VideoQuery:
    """A query over one video table being built: `where`, then one terminal call."""

    db: object
    video: str
    predicates: tuple[str, ...] = ()
    oracle: str | None = None
    index: str | None = None
    seed: int | None = None
    group: str | None = None

    def where(self, condition: Expr | str) -> "VideoQuery":
        """Add a frame predicate or a frame/ts restriction (ANDed with earlier ones)."""
        if not isinstance(condition, (Expr, str)):
            raise ParameterError(f"where() takes an expression such as objects('car') >= 3 or "
                                 f"SQL text, not {condition!r}")
        return replace(self, predicates=self.predicates + (str(condition),))

    def group_by(self, key: Expr | str) -> "VideoQuery":
        """Group an approximate aggregate: by `clip`, or any expression of the table's
        columns (e.g. "hour(start_ts + to_seconds(ts))"); every group's interval holds at
        once."""
        if not isinstance(key, (Expr, str)) or not str(key).strip():
            raise ParameterError(f"group_by() takes a column or expression, not {key!r}")
        return replace(self, group=str(key))

    def using(self, *, oracle: str | None = None, index: str | None = None,
              seed: int | None = None) -> "VideoQuery":
        """Name the oracle (USING ORACLE), the index (USING INDEX) or the SEED to use."""
        for what, name in (("oracle", oracle), ("index", index)):
            if name is not None and (not isinstance(name, str) or not name):
                raise ParameterError(f"using({what}=...) takes the {what}'s name, got {name!r}")
        return replace(self, oracle=oracle or self.oracle, index=index or self.index,
                       seed=self.seed if seed is None else seed)

    def _tail(self, *clauses: str) -> str:
        parts = [c for c in clauses if c]
        if self.oracle:
            parts.append(f"USING ORACLE {sql_name(self.oracle)}")
        if self.index:
            parts.append(f"USING INDEX {sql_name(self.index)}")
        if self.seed is not None:
            parts.append(f"SEED {_integer('seed', self.seed)}")
        return " ".join(parts)

    def _where(self) -> str:
        return " WHERE " + " AND ".join(f"({p})" for p in self.predicates) if self.predicates else ""

    def _run(self, sql: str):
        return run_query(self.db, parse(sql))

    def to_sql(self, kind: str, *args, **kw) -> str:
        """The dialect statement a terminal call runs: kind is aggregate, limit, select,
        rare or exact, with that call's arguments (for display and tests)."""
        return getattr(self, f"_{kind}_sql")(*args, **kw)

    def _aggregate_sql(self, func, statistic=None, *, error=None, relative=False,
                       confidence=None, budget=None, group_by=None) -> str:
        func = func.lower() if isinstance(func, str) else func
        if func not in ("avg", "sum", "count"):
            raise ParameterError(f"aggregate must be avg, sum or count, not {func!r}")
        arg = "*" if statistic is None else str(statistic)
        select = f"{func.upper()}({arg})"
        group = ""
        group_by = self.group if group_by is None else str(group_by)
        if group_by is not None:
            named = group_by if group_by.isidentifier() else f"{group_by} AS grp"
            select = f"{named}, {select}"
            group = f" GROUP BY {group_by}"
        clauses = []
        if error is not None:
            value = _number("error", error)
            clauses.append(f"ERROR WITHIN {sql_literal(round(float(error) * 100, 12))}%"
                           if relative else f"ERROR WITHIN {value}")
        if budget is not None:
            clauses.append(f"ORACLE BUDGET {_integer('budget', budget)}")
        clauses.append(_confidence(confidence))
        return f"SELECT {select} FROM {sql_name(self.video)}{self._where()}{group} {self._tail(*clauses)}"

    def aggregate(self, func: str, statistic: Expr | str | None = None, *, error: float | None = None,
                  relative: bool = False, confidence: float | None = None, budget: int | None = None,
                  group_by: Expr | str | None = None):
        """AVG/SUM/COUNT with `error` (ERROR WITHIN) or under `budget` (ORACLE BUDGET)."""
        return self._run(self._aggregate_sql(func, statistic, error=error, relative=relative,
                                             confidence=confidence, budget=budget,
                                             group_by=group_by))

    def _limit_sql(self, n, gap=None, budget=None) -> str:
        tail = self._tail(_optional("GAP", "gap", gap), _optional("ORACLE BUDGET", "budget", budget))
        return f"SELECT clip, frame, ts FROM {sql_name(self.video)}{self._where()} LIMIT {_integer('n', n)} {tail}"

    def limit(self, n: int, *, gap: int | None = None, budget: int | None = None):
        """Up to `n` oracle-confirmed frames matching the predicate, `gap` frames apart."""
        return self._run(self._limit_sql(n, gap, budget))

    def _select_sql(self, recall=None, precision=None, confidence=None, budget=None,
                    max_budget=None, approximate=False) -> str:
        if (recall is None) == (precision is None):
            raise ParameterError("select() takes exactly one of recall= or precision=")
        if budget is not None and max_budget is not None:
            raise ParameterError("select() takes budget= (a fixed budget) or max_budget= "
                                 "(adaptive, up to a cap), not both")
        target = f"RECALL TARGET {_number('recall', recall)}" if recall is not None else \
            f"PRECISION TARGET {_number('precision', precision)}"
        spend = _optional("ORACLE BUDGET UP TO", "max_budget", max_budget) or \
            _optional("ORACLE BUDGET", "budget", budget)
        tail = self._tail(target, _confidence(confidence), spend,
                          "APPROXIMATE" if approximate else "")
        return f"SELECT clip, frame, ts FROM {sql_name(self.video)}{self._where()} {tail}"

    def select(self, *, recall: float | None = None, precision: float | None = None,
               confidence: float | None = None, budget: int | None = None,
               max_budget: int | None = None, approximate: bool = False):
        """Frames matching the predicate with a recall or precision guarantee. `max_budget`
        (recall only) samples in rounds and stops early once the set is small enough;
        `approximate` uses SUPG's normal-approximation bounds (not finite-sample)."""
        return self._run(self._select_sql(recall, precision, confidence, budget, max_budget,
                                          approximate))

    def _rare_sql(self, budget=None) -> str:
        tail = self._tail("FIND RARE", _optional("ORACLE BUDGET", "budget", budget))
        return f"SELECT clip, frame, ts FROM {sql_name(self.video)}{self._where()} {tail}"

    def find_rare(self, *, budget: int | None = None):
        """As many distinct frames matching a rare predicate as `budget` labels find."""
        return self._run(self._rare_sql(budget))

    def _exact_sql(self, *columns) -> str:
        cols = ", ".join(str(c) for c in columns) or "clip, frame, ts"
        return f"SELECT {cols} FROM {sql_name(self.video)}{self._where()} {self._tail()}".rstrip()

    def exact(self, *columns: Expr | str):
        """Run exactly (every needed frame through the oracle) and return the rows."""
        return self._run(self._exact_sql(*columns))
