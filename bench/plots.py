"""The bench's one plotting helper: panels of points comparing vidql with its baselines.

`comparison_plot` draws one panel per population (or scenario dimension), each x label a method or
setting, each run a small point and the runs' mean a marker with an error bar, a solid line
at the reference (1 for a ratio to the baseline) and dashed lines at targets. `figure` and
`save` are the pieces, for line plots against a size."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .registry import pyplot

MAX_COLUMNS = 3
MARKERS = "os^Dv<>"


def figure(title: str, panels: int, *, width: float = 4.4, height: float = 3.4):
    """(pyplot, figure, axes list) with `panels` subplots in up to MAX_COLUMNS columns, the
    figure titled `title`; None when matplotlib is missing (the scenario writes no plot)."""
    plt = pyplot()
    if plt is None or panels == 0:
        return None
    columns = min(MAX_COLUMNS, panels)
    rows = math.ceil(panels / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.6),
                             squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return plt, fig, list(axes.flat[:panels])


def save(plt, fig, out_dir, name: str) -> list[str]:
    """Write `fig` as `name`.png into `out_dir`; the list of paths a ScenarioResult holds."""
    path = Path(out_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def comparison_plot(out_dir, name: str, title: str, ylabel: str, panels: dict[str, dict], *,
            reference: float | None = 1.0, reference_label: str = "= baseline",
            targets: dict[str, float] | None = None, log: bool = False) -> list[str]:
    """Write `name`.png: `panels` maps a panel title to {series: {x label: the runs' values}}
    (one series: points per x; several: side by side, with a legend). NaN runs are left
    out. `targets` maps a label to a dashed line (a nominal rate, a goal ratio)."""
    drawn = figure(title, len(panels))
    if drawn is None:
        return []
    plt, fig, axes = drawn
    for i, (ax, (panel, series)) in enumerate(zip(axes, panels.items(), strict=True)):
        _points(ax, series)
        if reference is not None:
            ax.axhline(reference, color="k", linewidth=0.9, label=reference_label)
        for (label, y), style in zip((targets or {}).items(), ("--", ":", "-."), strict=False):
            ax.axhline(y, color="tab:red", linestyle=style, linewidth=0.9, label=label)
        ax.set_title(panel, fontsize=9)
        if log:
            ax.set_yscale("log")
        if i % MAX_COLUMNS == 0:
            ax.set_ylabel(ylabel, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return save(plt, fig, out_dir, name)


def _points(ax, series: dict[str, dict[str, list]]) -> None:
    """Each series' runs as points beside its x labels, the mean with a standard-deviation
    bar over them."""
    labels = list(dict.fromkeys(x for runs in series.values() for x in runs))
    width = 0.7 / len(series)
    rng = np.random.default_rng(0)  # the same jitter on every run of the bench
    for s, (name, runs) in enumerate(series.items()):
        offset = (s - (len(series) - 1) / 2) * width
        color, named = f"C{s}", len(series) > 1
        for x, label in enumerate(labels):
            values = np.asarray(runs.get(label, []), dtype=float)
            values = values[np.isfinite(values)]
            if not values.size:
                continue
            jitter = rng.uniform(-width / 4, width / 4, values.size) if values.size > 1 else 0
            ax.plot(x + offset + jitter, values, ".", color=color, alpha=0.35, markersize=4)
            ax.errorbar(x + offset, values.mean(), yerr=values.std() if values.size > 1 else None,
                        fmt=MARKERS[s % len(MARKERS)], color=color, capsize=3, markersize=6,
                        label=name if named else None)
            named = False
    tilt = len(labels) > 4 or max(map(len, labels), default=0) > 16
    ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=30 if tilt else 0,
                  ha="right" if tilt else "center")
    ax.set_xlim(-0.6, len(labels) - 0.4)
