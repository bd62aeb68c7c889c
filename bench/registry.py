"""Scenario registry: each scenario measures vidql and its baselines in one run."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass
class BenchContext:
    """What a scenario gets: where to write, how big to run, seeds, and where real data lies."""

    out_dir: Path
    quick: bool = True
    seed: int = 0
    shared_dir: Path | None = None  # ../shared when present
    cache_dir: Path = Path(".vidql-cache")
    tiny: bool = False  # seconds per scenario, for the test suite: the figures mean nothing

    def size(self, quick: T, full: T, tiny: T) -> T:
        """A scenario's size (frames, trials, options, ...) for this run: tiny, quick or full.
        Scenarios read `tiny` through this alone, so a tiny run (the test suite's) takes the
        code path of a quick run with smaller data."""
        return tiny if self.tiny else quick if self.quick else full


@dataclass
class ScenarioResult:
    """Figures for the JSON report, Markdown table rows, and paths of plots written."""

    figures: dict
    table: list[dict] = field(default_factory=list)  # rows with identical keys
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


SCENARIOS: dict[str, tuple[str, Callable[[BenchContext], ScenarioResult]]] = {}


def scenario(name: str, description: str):
    """Register a scenario function `fn(ctx) -> ScenarioResult` under `name`."""

    def register(fn):
        if name in SCENARIOS and SCENARIOS[name][1].__module__ != fn.__module__:
            raise ValueError(f"two bench scenarios are named {name!r}")
        SCENARIOS[name] = (description, fn)
        return fn

    return register


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is missing
    (a scenario then writes no plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
