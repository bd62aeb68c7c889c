"""Statements of the vidql dialect: what `vidql.engine.sql.dialect.parse` returns.

Pure data: names are as written (double quotes removed), option keys lower-case,
percentages already turned into fractions (95% -> 0.95).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vidql.engine.sql.framestat import FrameExpr

INDEX_METHODS = ("TASTI",)
QUERY_KINDS = ("exact", "aggregate", "aggregate_budget", "limit", "select_recall",
               "select_precision", "rare")
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class LoadVideo:
    """`LOAD VIDEO 'path' | ('a', 'b', ...) AS name | INTO name [WITH (...)]`: a file, glob
    or folder (or a list of files) as a new video, or appended `into` an existing one."""

    path: str | tuple[str, ...]
    name: str
    options: dict = field(default_factory=dict)
    into: bool = False


@dataclass(frozen=True)
class ShowClips:
    """`SHOW CLIPS name`."""

    name: str


@dataclass(frozen=True)
class ShowVideos:
    """`SHOW VIDEOS`."""


@dataclass(frozen=True)
class DropVideo:
    """`DROP VIDEO [IF EXISTS] name` (drops its labels and index too)."""

    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class CreateOracle:
    """`CREATE [OR REPLACE] ORACLE name FROM kind 'source' [WITH (...)]`; kind is one of
    ORACLE_KINDS. `replace`: adopt a new version of an existing oracle."""

    name: str
    kind: str
    source: str
    options: dict = field(default_factory=dict)
    replace: bool = False


@dataclass(frozen=True)
class DropOracle:
    """`DROP ORACLE [IF EXISTS] name` (its cached labels stay, keyed by its identity)."""

    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class AlterVideoPath:
    """`ALTER VIDEO name SET PATH ['clip' =] 'path'`: the same clip's file at a new place
    (`clip` None: the video's only clip)."""

    name: str
    path: str
    clip: str | None = None


@dataclass(frozen=True)
class AlterVideoStart:
    """`ALTER VIDEO name SET START 'clip' = TIMESTAMP '...'` (or NULL): a clip's start time."""

    name: str
    clip: str
    start: str | None


@dataclass(frozen=True)
class SetExecutor:
    """`SET EXECUTOR = 'ray'`: where labelling and index embedding run ('local', 'ray',
    'ray://host:port')."""

    executor: str


@dataclass(frozen=True)
class SetSampling:
    """`SET SAMPLING = 'cheaper'`: an approximate aggregate runs the exact scan instead when
    EXPLAIN prices the scan below sampling (the default); 'always' keeps sampling."""

    mode: str


SAMPLING_MODES = ("cheaper", "always")


@dataclass(frozen=True)
class SetOracle:
    """`SET ORACLE video = oracle`: the default oracle of a video."""

    video: str
    oracle: str


@dataclass(frozen=True)
class ShowOracles:
    """`SHOW ORACLES`."""


@dataclass(frozen=True)
class CreateIndex:
    """`CREATE INDEX name ON video [USING TASTI] [WITH (...)]`."""

    name: str
    video: str
    method: str = "TASTI"
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RefreshIndex:
    """`REFRESH INDEX name`: rebuild (retrain) it with its options over all frames loaded now."""

    name: str


@dataclass(frozen=True)
class ShowIndexes:
    """`SHOW INDEXES`."""


@dataclass(frozen=True)
class DropIndex:
    """`DROP INDEX [IF EXISTS] name`. DuckDB has the same statement for its own indexes:
    the catalog passes it on to DuckDB when no vidql index has that name."""

    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class PlainSQL:
    """Any other statement (CREATE TABLE, INSERT, SET, PRAGMA, ...): run by DuckDB as is."""

    sql: str


@dataclass(frozen=True)
class Clauses:
    """The dialect clauses as the user wrote them (None / False: not given)."""

    error: float | None = None          # ERROR WITHIN: absolute, or a fraction if relative
    error_relative: bool = False        # ERROR WITHIN x% (relative to the answer)
    confidence: float | None = None     # CONFIDENCE, in (0, 1)
    budget: int | None = None           # ORACLE BUDGET, oracle calls
    budget_up_to: bool = False          # ORACLE BUDGET UP TO n: adaptive, n is a cap
    gap: int | None = None              # GAP, frames between results
    recall_target: float | None = None  # RECALL TARGET, in (0, 1]
    precision_target: float | None = None
    find_rare: bool = False             # FIND RARE
    oracle: str | None = None           # USING ORACLE name
    index: str | None = None            # USING INDEX name
    seed: int | None = None             # SEED n
    approximate: bool = False           # APPROXIMATE: asymptotic (normal) bounds


@dataclass(frozen=True)
class Aggregate:
    """The aggregate of an approximate aggregate query: `func` is avg, sum or count;
    `argument` is its SQL text (None for COUNT(*)) and `expr` its frame functions."""

    func: str
    argument: str | None
    expr: FrameExpr | None


@dataclass(frozen=True)
class OutputColumn:
    """One select-list item: its SQL text and its alias (None when not given)."""

    text: str
    alias: str | None = None


@dataclass(frozen=True)
class Query:
    """A SELECT query, exact or approximate (see `vidql.engine.sql.dialect` for `kind`).

    `sql` is the DuckDB SQL left after removing EXPLAIN and the dialect clauses (LIMIT
    stays). The WHERE clause is split at its top-level ANDs into `predicate` (the parts
    using frame functions; approximate kinds only) and `restriction_parts` (the other
    parts, as written, e.g. `frame < 500`), set when the FROM clause is a single table (for
    an exact query, one it reads nowhere else: a second read of the video is not bounded by
    this WHERE)."""

    sql: str
    kind: str
    clauses: Clauses = field(default_factory=Clauses)
    explain: bool = False
    text: str = ""                      # the statement as written (EXPLAIN included)
    tables: tuple[str, ...] = ()        # tables read (BASE_TABLEs; 'night.objects' qualified)
    video: str | None = None            # the single table of FROM (the video table)
    video_alias: str | None = None      # its alias in FROM (`FROM night n`), if any
    columns: tuple[OutputColumn, ...] = ()
    aggregate: Aggregate | None = None
    predicate: str | None = None
    predicate_expr: FrameExpr | None = None
    restriction_parts: tuple[str, ...] = ()
    group_by: str | None = None
    group_expr: FrameExpr | None = None
    limit: int | None = None            # LIMIT n when n is a constant integer

    @property
    def restriction(self) -> str | None:
        """The parts of the WHERE without frame functions, joined by AND; None if none."""
        return " AND ".join(self.restriction_parts) or None

    @property
    def confidence(self) -> float | None:
        """CONFIDENCE as given, DEFAULT_CONFIDENCE for kinds with a guarantee, else None."""
        if self.kind in ("aggregate", "aggregate_budget", "select_recall", "select_precision"):
            return self.clauses.confidence if self.clauses.confidence is not None \
                else DEFAULT_CONFIDENCE
        return None


@dataclass(frozen=True)
class WriteResult:
    """`COPY (query) TO 'file' ...` or `CREATE [OR REPLACE] [TEMP] TABLE name AS query` around
    a vidql query: the query runs, then DuckDB runs `before` + a read of its rows + `after`.
    `sql` is the statement as written (DuckDB runs it as is when the query needs no video)."""

    query: Query
    before: str
    after: str
    sql: str


Statement = (LoadVideo | ShowVideos | ShowClips | DropVideo | CreateOracle | SetOracle
             | SetExecutor | SetSampling | ShowOracles | DropOracle | AlterVideoPath | AlterVideoStart
             | CreateIndex | RefreshIndex | ShowIndexes | DropIndex | PlainSQL | Query
             | WriteResult)
