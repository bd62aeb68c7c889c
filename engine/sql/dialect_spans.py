"""Where a node of DuckDB's syntax tree stands in the original query text: spans widened
to whole tokens and balanced parentheses, and errors that point there."""
from __future__ import annotations

from bisect import bisect_left

from vidql.base.errors import QueryError

from vidql.engine.sql.dialect_ast import NO_LOCATION, children, to_original
from vidql.engine.sql.dialect_lex import byte_to_char, paren


class QuerySpans:
    """One query's syntax tree with the original text and its tokens."""

    def __init__(self, text, tokens, sql, pieces, node):
        self.text = text
        self.tokens = tokens
        self.starts = [t.start for t in tokens]
        self.sql = sql
        self.pieces = pieces
        self.to_char = byte_to_char(sql)
        self.node = node
        self.select = node if node.get("type") == "SELECT_NODE" else None
        self.cte_names = {entry["key"].lower() for d in children(node)
                          if isinstance(d.get("cte_map"), dict)
                          for entry in d["cte_map"].get("map", [])}


    def span(self, node) -> tuple[int, int]:
        """Character span of `node` in the original text: the union of the locations of
        the node and its sub-nodes, widened to whole tokens and balanced parentheses."""
        lo, hi = None, None
        for d in children(node):
            loc = d.get("query_location")
            if loc is None or loc >= NO_LOCATION:
                continue
            start = self.to_char(loc)
            end = self.to_char(loc + (d.get("query_location_length") or 0))
            lo = start if lo is None else min(lo, start)
            hi = end if hi is None else max(hi, end)
        if lo is None:
            return self.tokens[0].start, self.tokens[0].start
        return self._balanced(to_original(self.pieces, lo), to_original(self.pieces, hi))

    def _balanced(self, start: int, end: int) -> tuple[int, int]:
        toks = self.tokens
        a = bisect_left(self.starts, start)
        b = bisect_left(self.starts, max(end, start + 1)) - 1
        if a >= len(toks) or b < a:
            return start, end
        depth = low = 0
        for k in range(a, b + 1):
            depth += paren(toks[k])
            low = min(low, depth)
        need = -low
        while need > 0 and a > 0:
            a -= 1
            need -= paren(toks[a])
        need = depth - low
        while need > 0 and b + 1 < len(toks):
            b += 1
            need += paren(toks[b])
        return toks[a].start, max(end, toks[b].end)

    def grouped_span(self, node) -> tuple[int, int]:
        """span() plus any parentheses written around the whole node."""
        start, end = self.span(node)
        toks = self.tokens
        a = bisect_left(self.starts, start)
        b = bisect_left(self.starts, end) - 1
        while (0 < a and b + 1 < len(toks) and toks[a - 1].text == "("
               and toks[b + 1].text == ")" and toks[a - 1].kind == toks[b + 1].kind == "operator"):
            a, b = a - 1, b + 1
        return toks[a].start, toks[b].end

    def text_of(self, node, grouped: bool = False) -> str:
        start, end = self.grouped_span(node) if grouped else self.span(node)
        return self.text[start:end]

    def pos(self, node) -> int:
        return self.span(node)[0]

    def fail(self, message: str, position: int, hint: str | None = None):
        raise QueryError(message, self.text, position, hint)
