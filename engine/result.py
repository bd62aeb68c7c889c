"""What `db.sql()` and the Python builder return: a statement's rows, read like a DuckDB
relation, with the report of what the statement did and cost."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from vidql.engine.sql.sqlnames import quote_name

if TYPE_CHECKING:
    import duckdb

    from vidql.engine.catalog.catalog import Catalog
    from vidql.engine.labels.cache import LabelStats


@dataclass
class Report:
    """What a query did and cost: operator, oracle calls, cache hits, seconds per stage."""

    operator: str
    video: str | None = None
    oracle: str | None = None
    index: str | None = None
    guarantee: str = ""
    oracle_calls: int = 0
    cache_hits: int = 0
    oracle_seconds: float = 0.0
    seconds: dict = field(default_factory=dict)
    estimated_calls: int | None = None
    estimated_seconds: float | None = None
    seed: int | None = None
    details: dict = field(default_factory=dict)
    simulated_cost_ms: float | None = None  # the oracle's stated cost (LABELS cost_ms), if any

    def add_stats(self, stats: LabelStats) -> None:
        self.oracle_calls += stats.oracle_calls
        self.cache_hits += stats.cache_hits
        self.oracle_seconds += stats.oracle_seconds
        self.seconds["oracle"] = self.seconds.get("oracle", 0.0) + stats.oracle_seconds
        self.seconds["decode"] = self.seconds.get("decode", 0.0) + stats.decode_seconds
        self.seconds["fsync"] = self.seconds.get("fsync", 0.0) + stats.fsync_seconds

    def _stage(self, name: str, seconds: float) -> str:
        if name == "oracle" and self.simulated_cost_ms is not None:
            return (f"oracle {seconds:.2f}s simulated ({self.simulated_cost_ms:g} ms a call "
                    f"stated by cost_ms; not measured, not part of the total)")
        if name == "cracking":  # IndexStore.crack: the index grows on its own thread
            return (f"cracking {seconds:.2f}s (reading the new representatives' labels; the "
                    f"index grows after the answer)")
        return f"{name} {seconds:.2f}s"

    def summary(self) -> str:
        stages = ", ".join(self._stage(k, v) for k, v in self.seconds.items())
        parts = [f"operator: {self.operator}"]
        if self.estimated_calls is not None:  # EXPLAIN: a plan, nothing ran
            parts.append(f"estimated oracle calls: {self.estimated_calls}")
        else:
            parts += [f"guarantee: {self.guarantee}", f"oracle calls: {self.oracle_calls}",
                      f"cache hits: {self.cache_hits}"]
        if self.index:
            parts.append(f"index: {self.index}")
        parts += [self.details[k] for k in ("index_note", "note")
                  if self.details.get(k)]
        if self.seed is not None:
            parts.append(f"seed: {self.seed}")
        return " | ".join(parts) + (f"\nseconds: {stages}" if stages else "")


class Result:
    """A statement's rows (materialised) and its report (None for catalog and plain DuckDB
    statements).

    It reads like a DuckDB relation: `df()`, `arrow()`, `to_arrow_table()`, `fetchall()`,
    `fetchnumpy()`, `show()`, `columns`, `types` ... are those of `.relation`; `fetchone()` and
    `fetchmany()` step through the rows like a cursor; `len()` is the row count. SQL on any
    DuckDB connection, `db.sql()` included, reads it by its Python variable name
    (`SELECT * FROM r`), through the Arrow stream interface.

    A query's result also knows its text (`query`) and its database's catalog (`catalog`),
    so that it can show the frames its rows name: in a notebook (`_repr_html_`: the report,
    thumbnails with the oracle's boxes, or an aggregate's intervals as bars) and as files
    (`export`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: pa.Table, report: Report | None = None,
                 hugeint: tuple[str, ...] = ()):
        """`hugeint`: columns DuckDB typed HUGEINT (integer sums), which Arrow holds as
        decimal128(38, 0); they read as HUGEINT again (Python ints), as DuckDB gives them."""
        self.table = table
        self.relation = con.from_arrow(table)
        if hugeint:
            self.relation = self.relation.project("* REPLACE (" + ", ".join(
                f"CAST({quote_name(name)} AS HUGEINT) AS {quote_name(name)}" for name in hugeint) + ")")
        self._hugeint = [name in hugeint for name in table.column_names]
        self.report = report
        self.query: str | None = None
        self.catalog: Catalog | None = None
        self._next_row = 0

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection, rows, report: Report | None = None) -> "Result":
        """From a pandas DataFrame or a DuckDB relation (which runs once, here)."""
        if hasattr(rows, "iloc"):
            return cls(con, pa.Table.from_pandas(rows, preserve_index=False), report)
        table = rows.to_arrow_table()
        hugeint = tuple(name for name, kind in zip(table.column_names, rows.types, strict=True)
                        if str(kind) == "HUGEINT")
        return cls(con, table, report, hugeint)

    def __getattr__(self, name: str):
        if name in ("relation", "table", "report", "query", "catalog", "_next_row"):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.relation, name)

    def to_arrow_table(self) -> pa.Table:
        return self.table

    def arrow(self) -> pa.RecordBatchReader:
        """The rows as Arrow batches (read from memory: the connection stays free)."""
        return self.table.to_reader()

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)

    def __len__(self) -> int:
        return self.table.num_rows

    def fetchmany(self, size: int = 1) -> list[tuple]:
        """The next `size` rows not fetched yet (an empty list at the end)."""
        part = self.table.slice(self._next_row, max(0, int(size)))
        self._next_row += part.num_rows
        columns = [[None if v is None else int(v) for v in column.to_pylist()] if wide
                   else column.to_pylist() for column, wide in zip(part.columns, self._hugeint, strict=True)]
        return list(zip(*columns, strict=True)) if columns else [()] * part.num_rows

    def fetchone(self) -> tuple | None:
        """The next row not fetched yet, None at the end."""
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    def __repr__(self) -> str:
        text = repr(self.relation)
        return text if self.report is None else f"{text}\n{self.report.summary()}"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        from vidql.engine.result_html import notebook_html

        return notebook_html(self)

    def export(self, out: str | Path, *, boxes: bool = True, clip_seconds: float | None = None,
               image_format: str = "jpeg") -> Path:
        """Write one image per frame the rows name (`image_format` jpeg or png, the oracle's
        boxes drawn with `boxes`), with `clip_seconds` an H.264 MP4 of the seconds around
        each, and an `index.html` showing them with the query and its report, into the
        folder `out`; returns the page's path."""
        from vidql.engine.export import export_result

        return export_result(self, out, boxes=boxes, clip_seconds=clip_seconds,
                             image_format_name=image_format)
