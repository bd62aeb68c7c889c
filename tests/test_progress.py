"""Oracle work shows progress on stderr when it is a terminal, and nothing otherwise."""
from __future__ import annotations

import functools
import io
import re
import sys

import vidql


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stderr_of(monkeypatch, stream, db_path, query) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    with vidql.connect(db_path) as db:  # progress on, as the CLI and shell have it
        db.sql(query)
    return stream.getvalue()


def test_approximate_query_shows_its_oracle_calls_on_a_terminal(traffic_db, monkeypatch):
    query = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1"
    shown = _stderr_of(monkeypatch, Terminal(), traffic_db, query)
    assert "aggregate on t, calling the oracle" in shown and "frame" in shown


def test_exact_scan_shows_progress_on_a_terminal_only(traffic_db, monkeypatch):
    quiet = _stderr_of(monkeypatch, io.StringIO(), traffic_db,
                       "SELECT sum(objects('car')) FROM t WHERE frame < 150")
    assert quiet == ""
    shown = _stderr_of(monkeypatch, Terminal(), traffic_db,
                       "SELECT sum(objects('car')) FROM t WHERE frame >= 150")
    assert "exact query: labelling t" in shown


def test_an_approximate_querys_bar_has_a_total(traffic_db, monkeypatch):
    """The budget where the query has one, else EXPLAIN's forecast, marked as an estimate."""
    budget = _stderr_of(monkeypatch, Terminal(), traffic_db,
                        "SELECT AVG(objects('car')) FROM t WHERE contains('car') "
                        "ORACLE BUDGET 50 SEED 1")
    assert re.search(r"calling the oracle: +\d+%.*\| *\d+/50 ", budget)
    with vidql.connect(traffic_db, progress=False) as db:
        forecast = db.sql("EXPLAIN SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.4 "
                          "SEED 2").fetchone()[4]
    shown = _stderr_of(monkeypatch, Terminal(), traffic_db,
                       "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.4 SEED 2")
    assert "calling the oracle (total: EXPLAIN's estimate)" in shown
    assert re.search(rf"\d+/{forecast} ", shown)


def test_a_bar_has_a_total_when_the_oracle_was_never_timed(counter_clip, oracle_module,
                                                             tmp_path, monkeypatch):
    """EXPLAIN's estimate of the calls needs no timing of the oracle: a PYTHON oracle with no
    stated cost, never timed, still gives the bar its total (it had none: `36frame [00:21]`),
    and the forecast labels nothing the query does not."""
    path = tmp_path / "clip.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{counter_clip}' AS clip; CREATE ORACLE bright FROM PYTHON "
               "'vq_test_oracle:BrightnessOracle'; SET ORACLE clip = bright")
    query = "SELECT AVG(objects('car')) FROM clip ERROR WITHIN 0.5 SEED 1"
    monkeypatch.setattr(sys, "stderr", Terminal())
    with vidql.connect(path) as db:
        result = db.sql(query)
        shown = sys.stderr.getvalue()
        assert "calling the oracle (total: EXPLAIN's estimate)" in shown
        assert re.search(r"\d+/\d+ ", shown)
        assert result.report.oracle_calls == db.catalog.label_cache("clip").labelled_frames.size


def test_index_builds_labelling_bar_counts_frames_as_they_are_labelled(traffic_db, monkeypatch):
    """CREATE INDEX labels its representatives in chunks under one bar over their frames (it
    sat at 0/1 batch while the oracle labelled every frame in one call), and the label
    cache draws no second bar beneath it."""
    import tqdm.auto

    import vidql.indexes.tasti

    # every update drawn (tqdm skips those within 0.1 s of the last; this oracle is fast)
    monkeypatch.setattr(vidql.indexes.tasti, "tqdm", functools.partial(tqdm.auto.tqdm,
                                                                       mininterval=0))
    shown = _stderr_of(monkeypatch, Terminal(), traffic_db,
                       "CREATE INDEX ti ON t USING TASTI WITH (embedder = 'pixel', train = 20, "
                       "reps = 150)")
    steps = re.findall(r"labelling FPF representatives: +\d+%.*?\| *(\d+)/(\d+) \[", shown)
    done = sorted({int(n) for n, _ in steps})
    total = int(steps[-1][1])
    assert total > 64 and done[0] == 0 and done[-1] == total and len(done) >= 3, steps
    assert "batch" not in shown and "labelling t with truth" not in shown
