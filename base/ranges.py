"""Allowed ranges of the numbers a user gives (query clauses, statement options), defined
once: the parser (vidql.engine.sql.dialect_clauses), the operators (vidql.queries) and the
option checks all read them. Light to import: the parser needs it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vidql.base.errors import ParameterError


@dataclass(frozen=True)
class Bounds:
    """The allowed values of a number: low..high (None: unbounded), each end open or
    closed, optionally whole numbers only. The parser and the operators check the same
    Bounds, so a value the parser accepts never fails in the operator."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    whole: bool = False

    def __contains__(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            return False
        try:
            if not math.isfinite(value) or (self.whole and not float(value).is_integer()):
                return False
        except OverflowError:  # an int beyond any float (10**400): beyond every range
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def __str__(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        if self.low is not None and self.high is not None:
            return (f"{kind} in {'(' if self.open_low else '['}{_shown(self.low)}, "
                    f"{_shown(self.high)}{')' if self.open_high else ']'}")
        if not self.whole:
            kind = "a finite number"
        if self.low is not None:
            return f"{kind} {'>' if self.open_low else '>='} {self.low:g}"
        if self.high is not None:
            return f"{kind} {'<' if self.open_high else '<='} {self.high:g}"
        return kind

    def percent(self) -> str:
        """The range of a fraction written as a percentage, e.g. (0%, 100%)."""
        return (f"{'(' if self.open_low else '['}{percent(self.low)}, "
                f"{percent(self.high)}{')' if self.open_high else ']'}")

    def check(self, name: str, value):
        """`value` (int when whole, else float) or a ParameterError naming the range."""
        if value not in self:
            raise ParameterError(f"{name} must be {self}; got {_shown(value)}")
        return int(value) if self.whole else float(value)


def _shown(value) -> str:
    """A bound or a given value as a message shows it: whole numbers in full, floats
    short, anything longer than 40 characters cut."""
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def percent(fraction: float) -> str:
    """A fraction as the percentage a user writes (0.995 -> "99.5%"), to 4 decimals: never
    rounded to whole percents, which would print CONFIDENCE 99.9% as 100%."""
    return f"{round(fraction * 100, 4):g}%"


# Ranges of the query clauses, shared by the parser (vidql.engine.sql.dialect_clauses) and the
# operators. Fractions: CONFIDENCE 95% is 0.95.
CONFIDENCE = Bounds(0.0, 1.0, open_low=True, open_high=True)
ABSOLUTE_ERROR = Bounds(0.0, None, open_low=True)
RELATIVE_ERROR = Bounds(0.0, 1.0, open_low=True, open_high=True)
RECALL_TARGET = Bounds(0.0, 1.0, open_low=True)  # 100%: every frame but the sampled negatives
# 1e-320 made SUPG's candidate prefix (positives / target) infinite; below 1e-6 a
# precision target means "any precision" anyway
PRECISION_TARGET = Bounds(1e-6, 1.0, open_high=True)
MAX_COUNT = 10**15  # the largest count (rows, frames, oracle calls) a user may give
GAP = Bounds(0, MAX_COUNT, whole=True)
SEED = Bounds(0, whole=True)
LIMIT_ROWS = Bounds(1, MAX_COUNT, whole=True)
WHOLE = Bounds(0, MAX_COUNT, whole=True)  # a count the Python builder writes into a statement
FINITE = Bounds()  # a number the Python builder writes into a statement
BATCH_SIZE = Bounds(1, 4096, whole=True)  # frames per oracle call
CLIP_SECONDS = Bounds(0.0, 600.0, open_low=True)  # an exported clip's length around a hit
# ORACLE BUDGET: the fewest oracle calls each operator can work with
MIN_SAMPLES = 2        # aggregate with an error bound (ERROR WITHIN ... ORACLE BUDGET n)
DEFAULT_STRATA = 5     # ABae strata; two labels per stratum at least
MIN_LIMIT_CALLS = 1    # LIMIT n ... ORACLE BUDGET
MIN_SUPG_BUDGET = 10   # RECALL / PRECISION TARGET
MIN_RARE_BUDGET = 1    # FIND RARE
BUDGET = {"aggregate": Bounds(MIN_SAMPLES, whole=True),
          "aggregate_budget": Bounds(2 * DEFAULT_STRATA, whole=True),
          "limit": Bounds(MIN_LIMIT_CALLS, whole=True),
          "select_recall": Bounds(MIN_SUPG_BUDGET, whole=True),
          "select_precision": Bounds(MIN_SUPG_BUDGET, whole=True),
          "rare": Bounds(MIN_RARE_BUDGET, whole=True)}
