"""Catalog statements of the dialect: LOAD/SHOW/DROP/ALTER VIDEO, SHOW CLIPS, CREATE [OR REPLACE]/SET/
SHOW/DROP ORACLE, CREATE/REFRESH/SHOW/DROP INDEX. Statements DuckDB also knows (DROP INDEX aside) keep their
DuckDB meaning: `LOAD httpfs`, `SET threads = 2`, `CREATE INDEX i ON t (col)`."""
from __future__ import annotations

from vidql.engine.sql.dialect_lex import Cursor, Token
from vidql.engine.sql.sqlnames import ORACLE_KINDS
from vidql.engine.sql.dialect_statements import (AlterVideoPath, AlterVideoStart, CreateIndex, CreateOracle,
                                 DropIndex, DropOracle, DropVideo, INDEX_METHODS, LoadVideo,
                                 RefreshIndex, SetExecutor, SetOracle, SAMPLING_MODES, SetSampling, ShowClips,
                                 ShowIndexes, ShowOracles, ShowVideos)

USAGE = {
    "LOAD VIDEO": ("write LOAD VIDEO 'path/to/video.mp4' AS name [WITH (rendition = 128)]; a "
                   "glob 'clips/*.mp4', a folder or ('a.mp4', 'b.mp4') loads a collection, "
                   "INTO name appends to one"),
    "DROP VIDEO": "write DROP VIDEO [IF EXISTS] name",
    "CREATE ORACLE": ("write CREATE [OR REPLACE] ORACLE name FROM ONNX|TORCHVISION|LABELS|PYTHON "
                      "'source' [WITH (key = value, ...)]"),
    "DROP ORACLE": "write DROP ORACLE [IF EXISTS] name",
    "ALTER VIDEO": ("write ALTER VIDEO name SET PATH ['clip' =] 'new/place.mp4' or ALTER VIDEO "
                    "name SET START 'clip' = TIMESTAMP '2026-11-02 08:00:00'"),
    "SET ORACLE": "write SET ORACLE video = oracle",
    "SET EXECUTOR": "write SET EXECUTOR = 'local' | 'ray' | 'ray://host:port'",
    "SET SAMPLING": "write SET SAMPLING = 'cheaper' | 'always'",
    "CREATE INDEX": ("write CREATE INDEX name ON video USING TASTI "
                     "[WITH (train = 1000, reps = 2000, k = 5)]"),
    "DROP INDEX": "write DROP INDEX [IF EXISTS] name",
    "REFRESH INDEX": "write REFRESH INDEX name",
    "SHOW": "write SHOW VIDEOS, SHOW CLIPS video, SHOW ORACLES or SHOW INDEXES",
}


def is_catalog_statement(tokens: list[Token]) -> bool:
    """True when the statement's first words make it a vidql catalog statement."""
    words = [t.word for t in tokens[:4]]
    head = tuple(words[:2])
    if head in (("LOAD", "VIDEO"), ("DROP", "VIDEO"), ("DROP", "INDEX"), ("CREATE", "ORACLE"),
                ("SET", "ORACLE"), ("SET", "EXECUTOR"), ("SET", "SAMPLING"), ("DROP", "ORACLE"), ("ALTER", "VIDEO"),
                ("REFRESH", "INDEX")):
        return True
    if words[:4] == ["CREATE", "OR", "REPLACE", "ORACLE"]:
        return True
    if head in (("SHOW", "VIDEOS"), ("SHOW", "ORACLES"), ("SHOW", "INDEXES"), ("SHOW", "CLIPS")):
        return True
    if head == ("CREATE", "INDEX"):
        # DuckDB's own index has a column list: CREATE INDEX i ON t [USING ART] (col)
        return not any(t.kind == "operator" and t.text == "(" and tokens[k - 1].word != "WITH"
                       for k, t in enumerate(tokens))
    return False


def parse_catalog(text: str, tokens: list[Token]):
    """Parse a statement for which `is_catalog_statement` is true."""
    c = Cursor(text, tokens)
    first, second = c.next().word, c.next().word
    replace = (first, second) == ("CREATE", "OR")
    if replace:
        c.next()
        second = c.next().word
    if first == "SHOW":
        if second == "CLIPS":
            stmt = ShowClips(c.name("the video's name", USAGE["SHOW"]))
        else:
            stmt = {"VIDEOS": ShowVideos, "ORACLES": ShowOracles, "INDEXES": ShowIndexes}[second]()
        _end(c, USAGE["SHOW"])
        return stmt
    key = f"{first} {second}"
    hint = USAGE[key]
    stmt = {"LOAD VIDEO": _load_video, "DROP VIDEO": _drop_video, "CREATE ORACLE": _create_oracle,
            "SET ORACLE": _set_oracle, "SET EXECUTOR": _set_executor, "SET SAMPLING": _set_sampling,
            "CREATE INDEX": _create_index,
            "DROP INDEX": _drop_index, "DROP ORACLE": _drop_oracle,
            "ALTER VIDEO": _alter_video, "REFRESH INDEX": _refresh_index}[key](c, hint)
    _end(c, hint)
    return CreateOracle(stmt.name, stmt.kind, stmt.source, stmt.options, True) if replace else stmt


def _end(c: Cursor, hint: str) -> None:
    if not c.at_end():
        raise c.error(f"unexpected {c.shown()} at the end of the statement", hint)


def _load_video(c: Cursor, hint: str) -> LoadVideo:
    if c.accept_op("("):
        path = [_path(c, hint)]
        while c.accept_op(","):
            path.append(_path(c, hint))
        c.expect_op(")", hint)
        path = tuple(path)
    else:
        path = _path(c, hint)
    into = c.is_word("INTO")
    if not (into or c.is_word("AS")):
        raise c.error(f"LOAD VIDEO needs AS name (or INTO name) after the path, got {c.shown()}",
                      hint)
    c.next()
    name = c.name("the video's name" if into else "a name for the video", hint)
    options = c.options(hint) if c.accept("WITH") else {}
    return LoadVideo(path, name, options, into)


def _path(c: Cursor, hint: str) -> str:
    path = c.string("the video's path", hint)
    if not path:
        raise c.error("the video's path is empty", hint, c.tokens[c.i - 1].start)
    return path


def _if_exists(c: Cursor) -> bool:
    return c.accept("IF", "EXISTS")


def _drop_video(c: Cursor, hint: str) -> DropVideo:
    if_exists = _if_exists(c)
    return DropVideo(c.name("the video's name", hint), if_exists)


def _drop_index(c: Cursor, hint: str) -> DropIndex:
    if_exists = _if_exists(c)
    return DropIndex(c.name("the index's name", hint), if_exists)


def _refresh_index(c: Cursor, hint: str) -> RefreshIndex:
    return RefreshIndex(c.name("the index's name", hint))


def _drop_oracle(c: Cursor, hint: str) -> DropOracle:
    if_exists = _if_exists(c)
    return DropOracle(c.name("the oracle's name", hint), if_exists)


def _alter_video(c: Cursor, hint: str) -> AlterVideoPath | AlterVideoStart:
    name = c.name("the video's name", hint)
    if c.accept("SET", "START"):
        clip = c.string("the clip's name", hint)
        c.expect_op("=", hint)
        if c.accept("NULL"):
            return AlterVideoStart(name, clip, None)
        c.accept("TIMESTAMP")
        return AlterVideoStart(name, clip, c.string("the clip's start time", hint))
    if not c.accept("SET", "PATH"):
        raise c.error(f"expected SET PATH or SET START after ALTER VIDEO {name}, got "
                      f"{c.shown()}", hint)
    path = _path(c, hint)
    if c.accept_op("="):
        return AlterVideoPath(name, _path(c, hint), clip=path)
    return AlterVideoPath(name, path)


def _create_oracle(c: Cursor, hint: str) -> CreateOracle:
    name = c.name("a name for the oracle", hint)
    c.expect("FROM", hint)
    kind_pos = c.here()
    kind = c.name("the oracle kind (ONNX, TORCHVISION, LABELS or PYTHON)", hint).upper()
    if kind not in ORACLE_KINDS:
        raise c.error(f"unknown oracle kind {kind}", f"kinds: {', '.join(ORACLE_KINDS)}", kind_pos)
    source = c.string("the oracle's source (a file, model name or module:Class)", hint)
    options = c.options(hint) if c.accept("WITH") else {}
    return CreateOracle(name, kind, source, options)


def _set_oracle(c: Cursor, hint: str) -> SetOracle:
    video = c.name("the video's name", hint)
    if not (c.accept_op("=") or c.accept("TO")):
        raise c.error(f"expected '=' after SET ORACLE {video}, got {c.shown()}", hint)
    return SetOracle(video, c.name("the oracle's name", hint))


def _set_executor(c: Cursor, hint: str) -> SetExecutor:
    if not (c.accept_op("=") or c.accept("TO")):
        raise c.error(f"expected '=' after SET EXECUTOR, got {c.shown()}", hint)
    pos = c.here()
    value = c.string("the executor ('local', 'ray' or 'ray://host:port')", hint)
    if value not in ("local", "ray") and not value.startswith("ray://"):
        raise c.error(f"unknown executor {value!r}", hint, pos)
    return SetExecutor(value)


def _set_sampling(c: Cursor, hint: str) -> SetSampling:
    if not (c.accept_op("=") or c.accept("TO")):
        raise c.error(f"expected '=' after SET SAMPLING, got {c.shown()}", hint)
    pos = c.here()
    value = c.string("'cheaper' or 'always'", hint)
    if value not in SAMPLING_MODES:
        raise c.error(f"unknown sampling mode {value!r}", hint, pos)
    return SetSampling(value)


def _create_index(c: Cursor, hint: str) -> CreateIndex:
    name = c.name("a name for the index", hint)
    c.expect("ON", hint)
    video = c.name("the video's name", hint)
    method = "TASTI"
    if c.accept("USING"):
        method_pos = c.here()
        method = c.name("the index method", hint).upper()
        if method not in INDEX_METHODS:
            methods = ", ".join(INDEX_METHODS)
            raise c.error(f"unknown index method {method}",
                          f"vidql builds {methods} indexes: {hint}", method_pos)
    options = c.options(hint) if c.accept("WITH") else {}
    return CreateIndex(name, video, method, options)
