"""The vidql clauses at the end of a query (ERROR WITHIN, CONFIDENCE, ORACLE BUDGET
[UP TO], GAP, RECALL/PRECISION TARGET, FIND RARE, USING ORACLE/INDEX, SEED, APPROXIMATE), read on DuckDB's
tokens: where they start, their values and range checks, and the LIMIT/OFFSET mixed in
with them (kept as SQL)."""
from __future__ import annotations

from decimal import Decimal

from vidql.engine.sql.dialect_lex import Cursor, Token, paren
from vidql.engine.sql.dialect_statements import Clauses
from vidql.base.errors import QueryError
from vidql.base.ranges import (ABSOLUTE_ERROR, BUDGET, CONFIDENCE, GAP, PRECISION_TARGET, RECALL_TARGET,
                     RELATIVE_ERROR, SEED, Bounds)

TWO_WORD = {("ERROR", "WITHIN"): "error", ("ORACLE", "BUDGET"): "budget",
            ("RECALL", "TARGET"): "recall", ("PRECISION", "TARGET"): "precision",
            ("FIND", "RARE"): "rare", ("USING", "ORACLE"): "oracle", ("USING", "INDEX"): "index"}
ONE_WORD = {"CONFIDENCE": "confidence", "GAP": "gap", "SEED": "seed"}
NAMES = {"error": "ERROR WITHIN", "budget": "ORACLE BUDGET", "recall": "RECALL TARGET",
         "precision": "PRECISION TARGET", "rare": "FIND RARE", "oracle": "USING ORACLE",
         "index": "USING INDEX", "confidence": "CONFIDENCE", "gap": "GAP", "seed": "SEED",
         "limit": "LIMIT", "offset": "OFFSET", "approximate": "APPROXIMATE"}
SECOND_WORDS = {"ERROR": ["WITHIN"], "ORACLE": ["BUDGET"], "RECALL": ["TARGET"],
                "PRECISION": ["TARGET"], "FIND": ["RARE"], "USING": ["ORACLE", "INDEX"]}
CLAUSE_HINT = ("vidql clauses come after the SQL: ERROR WITHIN x or x%, CONFIDENCE 95%, "
               "ORACLE BUDGET n, ORACLE BUDGET UP TO n, LIMIT n GAP g, RECALL TARGET 90%, "
               "PRECISION TARGET 90%, FIND RARE, USING ORACLE name, USING INDEX name, SEED n, "
               "APPROXIMATE")


def clause_at(tokens: list[Token], j: int, in_tail: bool) -> tuple[str, int] | None:
    """The clause starting at tokens[j], as (key, keyword count), or None. Outside the
    tail, CONFIDENCE/GAP/SEED count only when a number follows (else they are names)."""
    word = tokens[j].word
    if word is None:
        return None
    nxt = tokens[j + 1] if j + 1 < len(tokens) else None
    if nxt is not None and (word, nxt.word) in TWO_WORD:
        return TWO_WORD[(word, nxt.word)], 2
    if word in ONE_WORD and (in_tail or (nxt is not None and nxt.kind == "number")):
        return ONE_WORD[word], 1
    if in_tail and word in ("LIMIT", "OFFSET"):
        return word.lower(), 1
    if word == "APPROXIMATE" and (in_tail or nxt is None or nxt.text == ";"):
        return "approximate", 1
    return None


def tail_start(text: str, tokens: list[Token], i0: int) -> int:
    """Index of the first vidql clause at parenthesis depth 0 (len(tokens) if none)."""
    opened: list[Token] = []
    for j in range(i0, len(tokens)):
        tok = tokens[j]
        if paren(tok) > 0:
            opened.append(tok)
        elif paren(tok) < 0:
            if opened:
                opened.pop()
        elif j > i0:
            hit = clause_at(tokens, j, in_tail=False)
            if hit and not opened:
                return j
            if hit and hit[1] == 2:
                if sum(paren(t) for t in tokens[j:]) + len(opened) > 0:
                    raise QueryError(f"'{opened[-1].text}' is not closed", text, opened[-1].start,
                                     hint="close it before the vidql clauses")
                raise QueryError(f"{NAMES[hit[0]]} inside parentheses", text, tok.start,
                                 hint="vidql clauses go at the end of the outermost query")
    return len(tokens)


def read_tail(text, tokens, i0, tail):
    """Parse the clauses of tokens[tail:]; LIMIT/OFFSET there are kept as SQL spans."""
    values: dict = {}
    positions: dict[str, int] = {}
    limit_spans: list[tuple[int, int]] = []
    in_body = {t.word for t in _depth_zero(tokens[i0:tail])} & {"LIMIT", "OFFSET"}
    j = tail
    while j < len(tokens):
        hit = clause_at(tokens, j, in_tail=True)
        tok = tokens[j]
        if hit is None:
            _unexpected(text, tokens, j)
        key, width = hit
        if key in positions or key.upper() in in_body:
            raise QueryError(f"{NAMES[key]} given twice", text, tok.start, hint=CLAUSE_HINT)
        positions[key] = tok.start
        if key in ("limit", "offset"):
            k = j + 1
            depth = 0
            while k < len(tokens) and not (depth == 0 and clause_at(tokens, k, True)):
                depth += paren(tokens[k])
                k += 1
            if k == j + 1:
                raise QueryError(f"{NAMES[key]} needs a number", text, tok.end,
                                 hint=f"write {NAMES[key]} 10")
            limit_spans.append((tok.start, tokens[k - 1].end))
            j = k
            continue
        cursor = Cursor(text, tokens, j + width)
        values[key] = _READERS[key](cursor)
        j = cursor.i
    return _clauses(values), positions, limit_spans


def budget_problem(kind: str, budget: int | None) -> str | None:
    """Why ORACLE BUDGET `budget` is too small for a query of `kind`, or None."""
    bounds = BUDGET.get(kind)
    if budget is None or bounds is None or budget in bounds:
        return None
    return f"ORACLE BUDGET {budget} is too small for this query: it needs {bounds}"


def _depth_zero(tokens: list[Token]):
    depth = 0
    for tok in tokens:
        depth += paren(tok)
        if depth == 0 and not paren(tok):
            yield tok


def _unexpected(text: str, tokens: list[Token], j: int):
    tok = tokens[j]
    if tok.word in SECOND_WORDS:
        options = " or ".join(f"{tok.word} {w}" for w in SECOND_WORDS[tok.word])
        nxt = tokens[j + 1] if j + 1 < len(tokens) else None
        shown = repr(nxt.text) if nxt else "the end of the query"
        raise QueryError(f"expected {options}, got {tok.text} {shown}", text,
                         nxt.start if nxt else tok.end, hint=CLAUSE_HINT)
    raise QueryError(f"unexpected {tok.text!r} after the vidql clauses", text, tok.start,
                     hint=CLAUSE_HINT)


def _clauses(values: dict) -> Clauses:
    error = values.get("error")
    budget = values.get("budget")
    return Clauses(error=error[0] if error else None, error_relative=bool(error and error[1]),
                   confidence=values.get("confidence"), budget=budget[0] if budget else None,
                   budget_up_to=bool(budget and budget[1]),
                   approximate="approximate" in values,
                   gap=values.get("gap"), recall_target=values.get("recall"),
                   precision_target=values.get("precision"), find_rare="rare" in values,
                   oracle=values.get("oracle"), index=values.get("index"),
                   seed=values.get("seed"))


def _read_error(c: Cursor) -> tuple[float, bool]:
    hint = (f"write ERROR WITHIN 0.1 (absolute, on the per-frame mean: {ABSOLUTE_ERROR}) "
            f"or ERROR WITHIN 5% (relative: a percentage in {RELATIVE_ERROR.percent()})")
    value, num, percent = c.number("ERROR WITHIN", hint)
    if percent:
        if _hundredths(value) not in RELATIVE_ERROR:
            raise c.error(f"ERROR WITHIN {num.text}% is outside {RELATIVE_ERROR.percent()}",
                          hint, num.start)
        return _hundredths(value), True
    if value not in ABSOLUTE_ERROR:
        raise c.error(f"ERROR WITHIN {num.text} must be positive: {ABSOLUTE_ERROR}", hint,
                      num.start)
    return value, False


def _hundredths(value: float) -> float:
    """A percentage as a fraction, divided in decimal on the number's shortest digits:
    99.9% is 0.999, where the float division gives 0.9990000000000001 (and the result's
    confidence column showed it)."""
    return float(Decimal(repr(value)) / 100)


def _fraction_reader(name: str, bounds: Bounds):
    def read(c: Cursor) -> float:
        hint = f"{name} is a percentage in {bounds.percent()}: write e.g. 95% or 0.95"
        value, num, percent = c.number(name, hint)
        if not percent and value > 1.0:
            raise c.error(f"{name} {num.text} is not a fraction", hint=(
                f"write {num.text}% or {value / 100:g}" if value <= 100 else hint),
                position=num.start)
        fraction = _hundredths(value) if percent else value
        shown = num.text + ("%" if percent else "")
        if fraction not in bounds:
            raise c.error(f"{name} {shown} is outside {bounds.percent()}", hint, num.start)
        return fraction
    return read


def _count_reader(name: str, bounds: Bounds, what: str):
    def read(c: Cursor) -> int:
        hint = f"{name} takes {what} ({bounds})"
        value, num, percent = c.number(name, hint)
        if percent:
            raise c.error(f"{name} takes a whole number, not a percentage", hint, num.start)
        if not num.text.lstrip("+- ").replace("_", "").isdigit():
            raise c.error(f"{name} {num.text} is not a whole number", hint, num.start)
        if value not in bounds:
            side = f"below {bounds.low:g}" if value < bounds.low else f"above {bounds.high}"
            raise c.error(f"{name} {num.text} is {side}: {name} takes {bounds}", hint, num.start)
        return int(num.text.replace("_", "").replace(" ", ""))
    return read


def _read_budget(c: Cursor) -> tuple[int, bool]:
    """ORACLE BUDGET n, or ORACLE BUDGET UP TO n (a cap the adaptive mode may stop short of)."""
    up_to = c.accept("UP", "TO")
    name = "ORACLE BUDGET UP TO" if up_to else "ORACLE BUDGET"
    lowest = Bounds(min(b.low for b in BUDGET.values()), whole=True)
    return _count_reader(name, lowest, "a number of oracle calls")(c), up_to


def _name_reader(name: str):
    def read(c: Cursor) -> str:
        return c.name(f"a name after {name}", hint=f"write {name} name")
    return read


_READERS = {
    "error": _read_error,
    "confidence": _fraction_reader("CONFIDENCE", CONFIDENCE),
    "recall": _fraction_reader("RECALL TARGET", RECALL_TARGET),
    "precision": _fraction_reader("PRECISION TARGET", PRECISION_TARGET),
    # each operator's own minimum is checked once the query's kind is known (budget_problem)
    "budget": _read_budget,
    "gap": _count_reader("GAP", GAP, "a number of frames"),
    "seed": _count_reader("SEED", SEED, "a seed"),
    "rare": lambda _: True,
    "approximate": lambda _: True,
    "oracle": _name_reader("USING ORACLE"),
    "index": _name_reader("USING INDEX"),
}

