"""Showing statements' results (shared by the command, the shell and the demo): a table or
Markdown with numbers rounded for reading, or CSV and JSON at full precision.

`table` prints DuckDB's box table, then the report as `-- ` comment lines; `markdown` a pipe
table and the report as `> ` lines; `csv` the rows (the report goes to stderr, so the rows
stay one CSV); `json` one object a line per statement: `statement`, `columns`, `rows` and the
report's fields. Table and Markdown show `max_rows` rows and say how many more there are."""
from __future__ import annotations

import dataclasses
import io
import json
import math
import sys
from contextlib import redirect_stdout

from vidql.engine.sql.sqlnames import quote_name

FORMATS = ("table", "csv", "json", "markdown")
MAX_ROWS = 40
FLOAT_TYPES = ("DOUBLE", "FLOAT", "REAL")


def rounded(relation):
    """`relation` with its floating-point columns rounded for reading: 3 decimals, or 4
    significant digits below 1 (3.755516140110698 -> 3.756, 0.000123456 -> 0.0001235)."""
    floats = [name for name, kind in zip(relation.columns, relation.types, strict=True)
              if str(kind) in FLOAT_TYPES]
    if not floats:
        return relation
    return relation.project("* REPLACE (" + ", ".join(
        f"{_round_sql(quote_name(name))} AS {quote_name(name)}" for name in floats) + ")")


def _round_sql(x: str) -> str:
    small = f"{x} <> 0 AND abs({x}) < 1 AND NOT isnan({x})"
    return (f"CASE WHEN {small} THEN round({x}, 3 - CAST(floor(log10(abs({x}))) AS INTEGER)) "
            f"ELSE round({x}, 3) END")


def _more(total: int, max_rows: int) -> list[str]:
    """The line saying how many rows were left out, if any."""
    left = total - max_rows if max_rows else 0
    return [f"… {left} more row{'s' if left != 1 else ''} ({total} in all; --max-rows N, "
            f"or .maxrows N in the shell, shows more; 0 shows every row)"] if left > 0 else []


def _shown(result, max_rows: int):
    return rounded(result.relation.limit(max_rows) if max_rows else result.relation)


def render_table(result, max_rows: int = MAX_ROWS) -> str:
    """DuckDB's box table of the first `max_rows` rows (0: all), rounded, then the report
    as comment lines."""
    shown = _shown(result, max_rows)
    text = io.StringIO()
    with redirect_stdout(text):
        shown.show(max_width=160, max_rows=max(len(result), 1))
    lines = [text.getvalue().rstrip("\n")] + _more(len(result), max_rows)
    if result.report is not None:
        lines += [f"-- {line}" for line in result.report.summary().splitlines()]
    return "\n".join(lines)


def render_markdown(result, max_rows: int = MAX_ROWS) -> str:
    """A pipe table of the first `max_rows` rows (0: all), rounded; the report as `> ` lines."""
    shown = _shown(result, max_rows)
    cell = lambda v: "" if v is None else str(v).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in shown.fetchall()]
    lines += _more(len(result), max_rows)
    if result.report is not None:
        lines += [""] + [f"> {line}  " for line in result.report.summary().splitlines()]
    return "\n".join(lines)


def render_csv(result) -> str:
    """Every row as CSV with a header, at full precision."""
    return result.relation.df().to_csv(index=False).rstrip("\n")


def json_entry(statement: str, result) -> dict:
    """One statement's result as JSON fields: every row at full precision and the report."""
    entry = {"statement": statement, "columns": [], "rows": []}
    if result is not None:
        columns = entry["columns"] = list(result.relation.columns)
        entry["rows"] = [dict(zip(columns, map(_json_value, row), strict=True))
                         for row in result.relation.fetchall()]
        if result.report is not None:
            entry["report"] = {**dataclasses.asdict(result.report),
                               "summary": result.report.summary()}
    return entry


def _json_value(value):
    """A cell as JSON takes it: NaN and infinities as null (times and decimals as text)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def render(statement: str, result, fmt: str = "table", max_rows: int = MAX_ROWS) -> str:
    """One statement's result in `fmt` ('' for a statement without rows, but in JSON)."""
    if fmt == "json":
        return json.dumps(json_entry(statement, result), default=str, ensure_ascii=False)
    if result is None:
        return ""
    if fmt == "csv":
        return render_csv(result)
    return render_markdown(result, max_rows) if fmt == "markdown" else render_table(result, max_rows)


def print_result(result, fmt: str = "table", max_rows: int = MAX_ROWS, *, out=None,
                 statement: str = "") -> None:
    """Print one statement's result to `out` (stdout) in `fmt`; in CSV its report goes to
    stderr."""
    out = out or sys.stdout
    text = render(statement, result, fmt, max_rows)
    if text:
        print(text, file=out)
    if fmt == "csv" and result is not None and result.report is not None:
        print(result.report.summary(), file=sys.stderr)
