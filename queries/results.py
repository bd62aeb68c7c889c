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
