"""No name reaches DuckDB unquoted: a source scan for SQL f-strings splicing names, and
the injections that worked before (DROP INDEX, the Python builder's USING names)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import vidql

ROOT = Path(__file__).resolve().parents[1]
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|DELETE|DROP|CREATE|FROM|WHERE|UPDATE|ALTER|COPY|"
                       r"ATTACH|DETACH|JOIN|INTO|TABLE|VIEW|SCHEMA|PRAGMA|INDEX|ORACLE|USING)\b")
NAME_WORDS = re.compile(r"(^|_)(name|video|table|index|oracle|schema|clip|model|view|"
                        r"collection)s?$", re.IGNORECASE)
QUOTERS = {"quote_name", "sql_name"}
# SQL fragments vidql builds that a name-like variable holds (not names)
FRAGMENTS = {("engine/sql/framestat.py", "table"),  # frame_table_sql(...): a subquery
             ("engine/exact.py", "table"),  # frame_table_sql(...): a subquery
             ("engine/catalog/upgrade.py", "table")}  # f"main.{quote_name(name)}" / a constant
MESSAGE_CALLS = re.compile(r"(Error|Exception|Warning|warn|_message|print|echo)$")
MESSAGE_VARIABLES = re.compile(r"^(fix|hint|message|note|text)$")
SENTENCE = re.compile(r"^[a-z]+ ")  # "not extended (...); REFRESH INDEX name rebuilds it"


def _final_identifier(expr: ast.expr) -> str | None:
    """The name an expression reads (`name`, `stmt.name`, `row['name']`), None for calls,
    literals and anything computed."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        return str(expr.slice.value)
    return None


def _is_message(node: ast.JoinedStr, parents: dict) -> bool:
    """Whether the f-string is an error or user message (a sentence; raised, warned,
    printed or held in a message variable)."""
    first = node.values[0] if node.values else None
    if isinstance(first, ast.Constant) and SENTENCE.match(str(first.value)):
        return True
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and MESSAGE_CALLS.search(ast.unparse(node.func)):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and
                                                MESSAGE_VARIABLES.match(t.id) for t in node.targets):
            return True
    return False


def _in_quotes(values: list, i: int) -> bool:
    """Whether `values[i]` stands inside a single-quoted SQL string (a value, not a name)."""
    before = values[i - 1] if i else None
    after = values[i + 1] if i + 1 < len(values) else None
    return (isinstance(before, ast.Constant) and str(before.value).endswith("'") and
            isinstance(after, ast.Constant) and str(after.value).startswith("'"))


def unquoted_names(path: Path) -> list[str]:
    """`file:line: {expr}` for each name spliced unquoted into a SQL f-string of `path`."""
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr) or _is_message(node, parents):
            continue
        text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        if not SQL_WORDS.search(text):
            continue
        for i, value in enumerate(node.values):
            if not isinstance(value, ast.FormattedValue) or _in_quotes(node.values, i):
                continue
            ident = _final_identifier(value.value)
            if ident is None or ident.isupper() or (rel, ident) in FRAGMENTS:
                continue  # quoted by a call, a vidql constant, or a fragment vidql built
            if NAME_WORDS.search(ident):
                found.append(f"{rel}:{node.lineno}: {{{ast.unparse(value.value)}}}")
    return found


def test_no_sql_f_string_splices_a_name_unquoted():
    """Every name in SQL text vidql writes goes through quote_name (DuckDB) or sql_name
    (statement text: bare when a plain identifier, else quote_name)."""
    files = [f for d in ("base", "engine", "vidql", "indexes", "datasets", "bench")
             for f in sorted((ROOT / d).rglob("*.py"))]
    found = [hit for f in files for hit in unquoted_names(f)]
    assert not found, "names spliced into SQL without quote_name/sql_name:\n" + "\n".join(found)


def test_the_scan_sees_a_spliced_name(tmp_path):
    """The scan flags what it must (and leaves quoted names and messages alone)."""
    sample = ROOT / "tests" / "_sql_scan_sample.py"
    sample.write_text('def f(con, stmt, q):\n'
                      '    con.sql(f"DROP INDEX {stmt.name}")\n'
                      '    con.sql(f"DROP INDEX {quote_name(stmt.name)}")\n'
                      '    raise ValueError(f"DROP INDEX {stmt.name} first")\n')
    try:
        assert unquoted_names(sample) == ["tests/_sql_scan_sample.py:2: {stmt.name}"]
    finally:
        sample.unlink()


def _tables(db) -> set[str]:
    return {r[0] for r in db.con.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}


@pytest.mark.parametrize("payload", [
    'DROP INDEX IF EXISTS "x; CREATE TABLE pwned AS SELECT 1 AS a; --"',
    'DROP INDEX IF EXISTS "x; COPY (SELECT 1 AS a) TO \'{out}\'; --"',
])
def test_drop_index_name_is_not_sql(payload, tmp_path):
    out = tmp_path / "written.csv"
    with vidql.connect(progress=False) as db:
        db.sql(payload.format(out=out))
        assert "pwned" not in _tables(db)
    assert not out.exists()


def test_builder_names_are_names_not_clauses(traffic_con):
    """`using(index="traffic_idx SEED 5")` names an index (quoted), never adds a clause."""
    q = traffic_con.video("v").using(index="traffic_idx SEED 5", oracle="truth")
    sql = q.to_sql("aggregate", "avg", "objects('car')", error=0.5)
    assert sql.endswith('USING ORACLE truth USING INDEX "traffic_idx SEED 5"')
    with pytest.raises(vidql.CatalogError, match="traffic_idx SEED 5"):
        q.aggregate("avg", "objects('car')", error=0.5)
    with pytest.raises(vidql.ParameterError, match="index's name"):
        traffic_con.video("v").using(index=5)
