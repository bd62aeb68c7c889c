"""Oracle work shows progress on stderr when it is a terminal, and nothing otherwise."""
from __future__ import annotations

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
