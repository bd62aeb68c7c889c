"""Names in SQL text: quoted identifiers and the oracle kinds the dialect accepts."""

ORACLE_KINDS = ("ONNX", "TORCHVISION", "LABELS", "PYTHON")  # engine/labels/oracle_kinds.py builds each


def quote_name(name: str) -> str:
    """`name` as a DuckDB identifier (double-quoted, inner quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'
