"""bench/plots.py: a titled panel per population, runs as points, a line at the reference."""
from __future__ import annotations

from pathlib import Path

from vidql.bench import plots


def test_comparison_plot_draws_a_titled_panel_per_population(tmp_path, monkeypatch):
    drawn = {}
    save = plots.save

    def keep(plt, fig, out_dir, name):
        drawn["axes"] = [ax for ax in fig.axes if ax.get_visible()]
        drawn["title"] = fig._suptitle.get_text()
        return save(plt, fig, out_dir, name)

    monkeypatch.setattr(plots, "save", keep)
    panels = {f"population {i}": {"": {"random": [3.0, 4.0, 5.0], "scan": [9.0]}}
              for i in range(4)}
    paths = plots.comparison_plot(tmp_path, "limit", "oracle calls, baseline ÷ vidql",
                                  "calls, baseline ÷ vidql", panels,
                                  targets={"target 20×": 20.0}, log=True)
    assert [Path(p).name for p in paths] == ["limit.png"] and Path(paths[0]).exists()
    axes = drawn["axes"]
    assert drawn["title"] == "oracle calls, baseline ÷ vidql"
    assert [ax.get_title() for ax in axes] == list(panels)  # 4 panels (a 3-column grid)
    assert axes[0].get_ylabel() == "calls, baseline ÷ vidql"
    first = axes[0]
    levels = {tuple(line.get_ydata()) for line in first.get_lines()}
    assert (1, 1) in levels and (20.0, 20.0) in levels  # the reference and the target
    runs = [line for line in first.get_lines() if len(line.get_ydata()) == 3]
    assert sorted(runs[0].get_ydata()) == [3.0, 4.0, 5.0]  # every run a point
    assert [t.get_text() for t in first.get_xticklabels()] == ["random", "scan"]
