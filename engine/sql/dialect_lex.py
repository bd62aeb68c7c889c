"""Tokens of the vidql dialect, found by DuckDB's own tokenizer.

DuckDB reports token starts as UTF-8 byte offsets; everything here is converted to
character offsets of the original text so that error positions and slices agree with
what the user typed. Also: statement splitting, lexical checks (unterminated strings,
quoted names, comments) and a small cursor with readers for names, numbers and
`WITH (key = value, ...)` option lists.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

import duckdb

from vidql.base.errors import QueryError

_KINDS = {
    duckdb.token_type.identifier: "identifier",
    duckdb.token_type.keyword: "keyword",
    duckdb.token_type.numeric_const: "number",
    duckdb.token_type.string_const: "string",
    duckdb.token_type.operator: "operator",
    duckdb.token_type.comment: "comment",
}
OPEN, CLOSE = "([{", ")]}"


@dataclass(frozen=True)
class Token:
    """One token: `start`/`end` are character offsets in the text it came from."""

    start: int
    end: int
    text: str
    kind: str  # identifier | keyword | number | string | operator | comment

    @property
    def word(self) -> str | None:
        """Upper-case text of a bare word (identifier or keyword); None for anything else,
        so a quoted "LIMIT" never reads as the keyword LIMIT."""
        if self.kind in ("identifier", "keyword") and not self.text.startswith('"'):
            return self.text.upper()
        return None


def paren(tok: Token) -> int:
    """+1 for an opening bracket, -1 for a closing one, 0 for any other token."""
    if tok.kind != "operator":
        return 0
    return 1 if tok.text in OPEN else -1 if tok.text in CLOSE else 0


def byte_to_char(text: str):
    """Function mapping a UTF-8 byte offset of `text` to its character offset."""
    if text.isascii():
        return lambda b: b
    table = []
    for i, ch in enumerate(text):
        table.extend([i] * len(ch.encode("utf-8")))
    table.append(len(text))
    return lambda b: table[min(max(b, 0), len(table) - 1)]


def tokenize(text: str, query: str | None = None, offset: int = 0) -> list[Token]:
    """All tokens of `text`, comments included, with character offsets. `text` stands at
    `offset` of `query` (default: itself), where a tokenizer failure is reported."""
    try:
        raw = duckdb.tokenize(text)
    except Exception as exc:  # the tokenizer's own failures are rare; still the user's input
        raise QueryError(f"cannot read query: {exc}", query if query is not None else text,
                         offset) from None
    to_char = byte_to_char(text)
    starts = [to_char(pos) for pos, _ in raw] + [len(text)]
    tokens = []
    for i, (_, kind) in enumerate(raw):
        start = starts[i]
        piece = text[start:starts[i + 1]].rstrip()
        tokens.append(Token(start, start + len(piece), piece, _KINDS.get(kind, "operator")))
    return tokens


MAX_NAME_CHARS = 255  # the longest name (bare or quoted) a statement may hold


def check_lexical(text: str, tokens: list[Token]) -> None:
    """Raise QueryError at the first unterminated string, quoted name or block comment, or
    at a name longer than MAX_NAME_CHARS (checked before DuckDB parses: its suggestions
    for an unknown 100,000-character name took seconds)."""
    for tok in tokens:
        problem = _unterminated(tok)
        if problem:
            raise QueryError(f"unterminated {problem}", text, tok.start,
                             hint="close it with the matching quote" if problem != "comment"
                             else "close it with */")
        if _name_chars(tok) > MAX_NAME_CHARS:
            raise QueryError(f"a name of {_name_chars(tok)} characters; names are at most "
                             f"{MAX_NAME_CHARS} characters long", text, tok.start,
                             hint="use a shorter name")


def _name_chars(tok: Token) -> int:
    """The length of the name a token writes (quotes not counted); 0 for other tokens."""
    if tok.kind not in ("identifier", "keyword"):
        return 0
    return len(tok.text) - 2 if tok.text.startswith('"') else len(tok.text)


def _unterminated(tok: Token) -> str | None:
    t = tok.text
    if tok.kind == "comment":
        return "comment" if t.startswith("/*") and (len(t) < 4 or not t.endswith("*/")) else None
    if tok.kind == "identifier" and t.startswith('"'):
        return None if _closed(t[1:], '"', backslash=False) else "quoted name"
    if tok.kind != "string":
        return None
    if t.startswith("$"):
        close = t.find("$", 1)
        tag = t[:close + 1]
        return None if close > 0 and len(t) >= 2 * len(tag) and t.endswith(tag) else "string"
    quote = t.find("'")
    if quote < 0:
        return None
    return None if _closed(t[quote + 1:], "'", backslash=t[:quote].lower() == "e") else "string"


def _closed(body: str, quote: str, backslash: bool) -> bool:
    i = 0
    while i < len(body):
        ch = body[i]
        if backslash and ch == "\\":
            i += 2
        elif ch == quote:
            if i + 1 < len(body) and body[i + 1] == quote:
                i += 2
            else:
                return True
        else:
            i += 1
    return False


def split_statements(tokens: list[Token]) -> list[list[Token]]:
    """Tokens grouped by statement, split at `;` (comments dropped, empty statements kept
    out). Strings and comments containing `;` are single tokens, so they never split."""
    groups: list[list[Token]] = [[]]
    for tok in tokens:
        if tok.kind == "comment":
            continue
        if tok.kind == "operator" and tok.text == ";":
            groups.append([])
        else:
            groups[-1].append(tok)
    return [g for g in groups if g]


def string_value(tok: Token) -> str:
    """Value of a single-quoted string literal token ('' unescaped)."""
    return tok.text[1:-1].replace("''", "'")


@lru_cache(maxsize=1)
def reserved_words() -> frozenset[str]:
    """DuckDB's reserved keywords (upper case): these cannot name a video, oracle or index."""
    rows = connection().execute(
        "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'").fetchall()
    return frozenset(r[0].upper() for r in rows)


_local = threading.local()


def connection() -> duckdb.DuckDBPyConnection:
    """A scratch in-memory DuckDB connection of this thread (parsing SQL text, evaluating
    frame statistics); it holds no data between calls."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect()
    return con


class Cursor:
    """Walks a statement's tokens; its errors point into the original `text`."""

    def __init__(self, text: str, tokens: list[Token], i: int = 0):
        self.text = text
        self.tokens = tokens
        self.i = i

    def peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else None

    def at_end(self) -> bool:
        return self.i >= len(self.tokens)

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def here(self) -> int:
        """Position of the next token, or the end of the previous one at the end."""
        tok = self.peek()
        if tok is not None:
            return tok.start
        return self.tokens[-1].end if self.tokens else 0

    def shown(self) -> str:
        tok = self.peek()
        return "the end of the statement" if tok is None else repr(tok.text)

    def error(self, message: str, hint: str | None = None, position: int | None = None):
        return QueryError(message, self.text, self.here() if position is None else position, hint)

    def is_word(self, *words: str) -> bool:
        """True when the next tokens are the bare words `words` (case-insensitive)."""
        return all((tok := self.peek(k)) is not None and tok.word == w.upper()
                   for k, w in enumerate(words))

    def accept(self, *words: str) -> bool:
        if self.is_word(*words):
            self.i += len(words)
            return True
        return False

    def expect(self, word: str, hint: str | None = None) -> Token:
        if not self.is_word(word):
            raise self.error(f"expected {word}, got {self.shown()}", hint)
        return self.next()

    def accept_op(self, op: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.kind == "operator" and tok.text == op:
            self.i += 1
            return True
        return False

    def expect_op(self, op: str, hint: str | None = None) -> Token:
        if not self.accept_op(op):
            raise self.error(f"expected '{op}', got {self.shown()}", hint)
        return self.tokens[self.i - 1]

    def name(self, what: str, hint: str | None = None) -> str:
        """An identifier (bare or double-quoted) naming a video, oracle, index or option."""
        tok = self.peek()
        if tok is not None and tok.kind in ("identifier", "keyword"):
            if tok.text.startswith('"'):
                self.i += 1
                return tok.text[1:-1].replace('""', '"')
            if tok.kind == "identifier" or tok.word not in reserved_words():
                self.i += 1
                return tok.text
        raise self.error(f"expected {what}, got {self.shown()}", hint)

    def string(self, what: str, hint: str | None = None) -> str:
        """A single-quoted string literal."""
        tok = self.peek()
        if tok is None or tok.kind != "string" or not tok.text.startswith("'"):
            quoted = tok is not None and tok.text.startswith('"')
            extra = " (strings take single quotes)" if quoted else ""
            raise self.error(f"expected {what} in single quotes, got {self.shown()}{extra}", hint)
        self.i += 1
        return string_value(tok)

    def number(self, what: str, hint: str | None = None) -> tuple[float, Token, bool]:
        """A number with an optional sign and `%`: (value, number token, had percent).
        Percent values are returned as written (95% -> 95.0)."""
        sign = 1.0
        start = self.here()
        if self.accept_op("-"):
            sign = -1.0
        elif self.accept_op("+"):
            pass
        tok = self.peek()
        if tok is None or tok.kind != "number":
            raise self.error(f"{what} needs a number, got {self.shown()}", hint)
        self.i += 1
        try:
            value = sign * float(tok.text.replace("_", ""))
        except ValueError:
            raise self.error(f"{what}: {tok.text!r} is not a number", hint, start) from None
        percent = self.accept_op("%")
        return value, Token(start, tok.end, self.text[start:tok.end], "number"), percent

    def options(self, hint: str) -> dict:
        """`WITH (key = value, ...)`, already past WITH: keys lower-cased; values int,
        float, str (quoted string or bare identifier) or bool (true/false)."""
        self.expect_op("(", hint)
        options: dict = {}
        while True:
            key_pos = self.here()
            key = self.name("an option name", hint).lower()
            if key in options:
                raise self.error(f"option {key} given twice", hint, key_pos)
            self.expect_op("=", hint)
            options[key] = self._option_value(key, hint)
            if self.accept_op(")"):
                return options
            self.expect_op(",", hint + " (separate options with commas, close with ')')")

    def _option_value(self, key: str, hint: str):
        tok = self.peek()
        if tok is None:
            raise self.error(f"option {key} needs a value", hint)
        if tok.kind == "string":
            return self.string(f"option {key}", hint)
        if tok.word in ("TRUE", "FALSE"):
            self.i += 1
            return tok.word == "TRUE"
        if tok.kind == "number" or (tok.kind == "operator" and tok.text in "+-"):
            value, num, percent = self.number(f"option {key}", hint)
            if percent:
                raise self.error(f"option {key} takes a plain number, not a percentage", hint,
                                 num.start)
            digits = num.text.lstrip("+- ").replace("_", "")
            return int(value) if digits.isdigit() else value
        if tok.kind in ("identifier", "keyword"):
            return self.name(f"a value for option {key}", hint)
        raise self.error(f"option {key} needs a number, a quoted string, true/false or a name, "
                         f"got {self.shown()}", hint)
