"""Result records returned by the statistical operators."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class AggregateResult:
    """An estimate with its confidence interval and what it cost.

    `frames` are the frame indices the oracle labelled (each once); `exact` is True when
    every frame was labelled, so the interval has zero width. `error_kind` says which
    error bound was asked for ('absolute' on the per-frame mean, 'relative' to the
    answer) and is None for budgeted queries, which ask for no error.
    """

    estimate: float
    ci_low: float
    ci_high: float
    confidence: float
    oracle_calls: int
    frames: np.ndarray
    exact: bool
    method: str
    error_kind: str | None
    details: dict = field(default_factory=dict)


@dataclass
class SelectionResult:
    """Frames returned by a selection (sorted), oracle calls spent, and which frames the
    oracle confirmed (`verified[i]` belongs to `frames[i]`)."""

    frames: np.ndarray
    oracle_calls: int
    verified: np.ndarray
    details: dict = field(default_factory=dict)


@dataclass
class RareResult:
    """Distinct positive frames found (sorted, all oracle-confirmed), the calls spent and
    the number of rounds run."""

    frames: np.ndarray
    oracle_calls: int
    rounds: int
    details: dict = field(default_factory=dict)


@dataclass
class GroupedResult:
    """Per-group results of an aggregate whose groups are known without the oracle.

    `results[i]` belongs to group `keys[i]` (its `frames` are positions in the whole
    population); each interval holds at `group_confidence`, all of them together with
    probability >= `confidence`. `budgets[i]` is the group's share of the oracle calls
    (None: uncapped); `split` says in words how confidence and budget were split.
    """

    keys: list
    results: list[AggregateResult]
    confidence: float
    group_confidence: float
    budgets: list
    split: str

    @property
    def oracle_calls(self) -> int:
        return sum(r.oracle_calls for r in self.results)

    @property
    def frames(self) -> np.ndarray:
        return np.sort(np.concatenate([r.frames for r in self.results]))
