"""The Python query API, mirroring the SQL dialect.

    db.video("night").where(contains("bus")).select(recall=0.9, confidence=0.95, budget=1000)
    db.video("night").aggregate("avg", objects("car"), error=0.1, confidence=0.95)

Each call builds the equivalent dialect statement and runs it through the same parser and
planner as `db.sql`, so both front ends have one meaning. Results carry `.df()`,
`.relation` and `.report`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from vidql.engine.errors import ParameterError


def _sql_string(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


@dataclass(frozen=True)
class Expr:
    """A frame statistic or predicate as SQL text; operators build bigger expressions."""

    sql: str

    def _bin(self, op: str, other) -> "Expr":
        rhs = other.sql if isinstance(other, Expr) else repr(other)
        return Expr(f"({self.sql} {op} {rhs})")

    def __ge__(self, o): return self._bin(">=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __le__(self, o): return self._bin("<=", o)
    def __lt__(self, o): return self._bin("<", o)
    def __eq__(self, o): return self._bin("=", o)  # type: ignore[override]
    def __ne__(self, o): return self._bin("<>", o)  # type: ignore[override]
    def __add__(self, o): return self._bin("+", o)
    def __sub__(self, o): return self._bin("-", o)
    def __mul__(self, o): return self._bin("*", o)
    def __and__(self, o): return self._bin("AND", o)
    def __or__(self, o): return self._bin("OR", o)
    def __invert__(self): return Expr(f"(NOT {self.sql})")
    __hash__ = object.__hash__

    def __str__(self) -> str:
        return self.sql


def objects(label: str | None = None, min_score: float | None = None) -> Expr:
    """Number of detections of `label` (any class when None) with score >= min_score."""
    arg = "*" if label is None else _sql_string(label)
    return Expr(f"objects({arg}{'' if min_score is None else f', {min_score!r}'})")


def contains(label: str, min_score: float | None = None) -> Expr:
    """Whether the frame has at least one `label` detection."""
    return Expr(f"contains({_sql_string(label)}{'' if min_score is None else f', {min_score!r}'})")


def _pct(value: float) -> str:
    return repr(float(value))


@dataclass(frozen=True)
class VideoQuery:
    """A query over one video table being built: `where`, then one terminal call."""

    db: object
    video: str
    predicates: tuple[str, ...] = ()
    oracle: str | None = None
    index: str | None = None
    seed: int | None = None

    def where(self, condition: Expr | str) -> "VideoQuery":
        """Add a frame predicate or a frame/ts restriction (ANDed with earlier ones)."""
        return replace(self, predicates=self.predicates + (str(condition),))

    def using(self, *, oracle: str | None = None, index: str | None = None,
              seed: int | None = None) -> "VideoQuery":
        return replace(self, oracle=oracle or self.oracle, index=index or self.index,
                       seed=self.seed if seed is None else seed)

    def _tail(self, *clauses: str) -> str:
        parts = [c for c in clauses if c]
        if self.oracle:
            parts.append(f"USING ORACLE {self.oracle}")
        if self.index:
            parts.append(f"USING INDEX {self.index}")
        if self.seed is not None:
            parts.append(f"SEED {int(self.seed)}")
        return " ".join(parts)

    def _where(self) -> str:
        return " WHERE " + " AND ".join(f"({p})" for p in self.predicates) if self.predicates else ""

    def _run(self, sql: str):
        from vidql.engine.dialect import parse
        from vidql.engine.executor import _query_result

        return _query_result(self.db, parse(sql))

    def to_sql(self, kind: str, **kw) -> str:
        """The dialect statement a terminal call runs (for display and tests)."""
        return getattr(self, f"_{kind}_sql")(**kw)

    def _aggregate_sql(self, func, statistic=None, *, error=None, relative=False,
                       confidence=0.95, budget=None, group_by=None) -> str:
        func = func.lower()
        if func not in ("avg", "sum", "count"):
            raise ParameterError(f"aggregate must be avg, sum or count, not {func!r}")
        arg = "*" if statistic is None else str(statistic)
        select = f"{func.upper()}({arg})"
        group = ""
        if group_by is not None:
            select = f"{group_by} AS grp, {select}"
            group = f" GROUP BY {group_by}"
        clauses = []
        if error is not None:
            clauses.append(f"ERROR WITHIN {error * 100!r}%" if relative else f"ERROR WITHIN {error!r}")
        if budget is not None:
            clauses.append(f"ORACLE BUDGET {int(budget)}")
        clauses.append(f"CONFIDENCE {_pct(confidence)}")
        return f"SELECT {select} FROM {self.video}{self._where()}{group} {self._tail(*clauses)}"

    def aggregate(self, func: str, statistic: Expr | str | None = None, *, error: float | None = None,
                  relative: bool = False, confidence: float = 0.95, budget: int | None = None,
                  group_by: Expr | str | None = None):
        """AVG/SUM/COUNT with `error` (ERROR WITHIN) or under `budget` (ORACLE BUDGET)."""
        return self._run(self._aggregate_sql(func, statistic, error=error, relative=relative,
                                             confidence=confidence, budget=budget,
                                             group_by=group_by))

    def _limit_sql(self, n, gap=0, budget=None) -> str:
        tail = self._tail(f"GAP {int(gap)}", f"ORACLE BUDGET {int(budget)}" if budget else "")
        return f"SELECT frame, ts FROM {self.video}{self._where()} LIMIT {int(n)} {tail}"

    def limit(self, n: int, *, gap: int = 0, budget: int | None = None):
        """Up to `n` oracle-confirmed frames matching the predicate, `gap` frames apart."""
        return self._run(self._limit_sql(n, gap, budget))

    def _select_sql(self, recall=None, precision=None, confidence=0.95, budget=None,
                    max_budget=None, approximate=False) -> str:
        if (recall is None) == (precision is None):
            raise ParameterError("select() takes exactly one of recall= or precision=")
        if budget is not None and max_budget is not None:
            raise ParameterError("select() takes budget= (a fixed budget) or max_budget= "
                                 "(adaptive, up to a cap), not both")
        target = f"RECALL TARGET {_pct(recall)}" if recall is not None else \
            f"PRECISION TARGET {_pct(precision)}"
        spend = f"ORACLE BUDGET UP TO {int(max_budget)}" if max_budget is not None else \
            f"ORACLE BUDGET {int(budget if budget is not None else 1000)}"
        tail = self._tail(target, f"CONFIDENCE {_pct(confidence)}", spend,
                          "APPROXIMATE" if approximate else "")
        return f"SELECT frame, ts FROM {self.video}{self._where()} {tail}"

    def select(self, *, recall: float | None = None, precision: float | None = None,
               confidence: float = 0.95, budget: int | None = None,
               max_budget: int | None = None, approximate: bool = False):
        """Frames matching the predicate with a recall or precision guarantee. `max_budget`
        (recall only) samples in rounds and stops early once the set is small enough;
        `approximate` uses SUPG's normal-approximation bounds (not finite-sample)."""
        return self._run(self._select_sql(recall, precision, confidence, budget, max_budget,
                                          approximate))

    def _rare_sql(self, budget=500) -> str:
        tail = self._tail("FIND RARE", f"ORACLE BUDGET {int(budget)}")
        return f"SELECT frame, ts FROM {self.video}{self._where()} {tail}"

    def find_rare(self, *, budget: int = 500):
        """As many distinct frames matching a rare predicate as `budget` labels find."""
        return self._run(self._rare_sql(budget))

    def exact(self, *columns: Expr | str):
        """Run exactly (every needed frame through the oracle) and return the rows."""
        cols = ", ".join(str(c) for c in columns) or "frame, ts"
        return self._run(f"SELECT {cols} FROM {self.video}{self._where()} "
                         f"{self._tail()}".rstrip())
