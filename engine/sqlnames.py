"""Names in SQL text."""


def quote_name(name: str) -> str:
    """`name` as a DuckDB identifier (double-quoted, inner quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'
