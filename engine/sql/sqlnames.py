"""Names in SQL text: quoted identifiers and the oracle kinds the dialect accepts."""
import re

ORACLE_KINDS = ("ONNX", "TORCHVISION", "LABELS", "PYTHON")  # engine/labels/oracle_kinds.py builds each

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote_name(name: str) -> str:
    """`name` as a DuckDB identifier (double-quoted, inner quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def sql_name(name: str) -> str:
    """`name` as written in statement text: bare when it is a plain identifier and no
    reserved word (what a user would type), else `quote_name(name)`."""
    from vidql.engine.sql.dialect_lex import reserved_words

    if _PLAIN.fullmatch(name or "") and name.upper() not in reserved_words():
        return name
    return quote_name(name)
