"""Cracking runs on a thread of its own after a query's answer is ready; whatever uses the
index next waits for it, a failed crack leaves the index as it was, and closing the
database finishes and saves it."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import vidql
from vidql.indexes import TastiIndex

QUERY = "SELECT frame FROM t WHERE objects('car') >= 3 LIMIT 3 GAP 20 SEED 3"
TINY = "WITH (embedder = 'triplet', train = 20, reps = 40, triplets = 100, size = 24)"


@pytest.fixture()
def indexed_db(traffic_db) -> str:
    with vidql.connect(traffic_db, progress=False) as db:
        db.sql(f"CREATE INDEX ti ON t {TINY}")
    return traffic_db


def test_the_answer_returns_while_the_index_cracks(indexed_db, monkeypatch):
    release, done = threading.Event(), threading.Event()
    real = TastiIndex.add_labels

    def held(self, detections, frames):
        release.wait(timeout=20)  # a crack on the query's own thread would hold it 20 s
        try:
            return real(self, detections, frames)
        finally:
            done.set()

    monkeypatch.setattr(TastiIndex, "add_labels", held)
    with vidql.connect(indexed_db, progress=False) as db:
        reps = len(db.indexes.get("ti").rep_frames)
        answer = db.sql(QUERY).df()
        cracked = db.last_report.details["cracked_frames"]
        assert len(answer) and cracked > 0
        assert not done.is_set()  # the answer came back before the crack ran
        release.set()
        assert len(db.indexes.get("ti").rep_frames) == reps + cracked  # get waits for it
        assert done.is_set()
    with vidql.connect(indexed_db, progress=False) as db:  # and it was saved
        assert len(db.indexes.get("ti").rep_frames) == reps + cracked


def test_closing_finishes_and_saves_the_crack(indexed_db):
    with vidql.connect(indexed_db, progress=False) as db:
        reps = len(db.indexes.get("ti").rep_frames)
        db.sql(QUERY).df()
        cracked = db.last_report.details["cracked_frames"]
    with vidql.connect(indexed_db, progress=False) as db:
        assert len(db.indexes.get("ti").rep_frames) == reps + cracked > reps


def test_a_failed_crack_leaves_the_index_as_it_was(indexed_db, monkeypatch):
    def broken(self, detections, frames):
        self.rep_frames = np.concatenate([self.rep_frames, frames])  # half done, then fails
        raise OSError("disk full")

    with vidql.connect(indexed_db, progress=False) as db:
        before = db.indexes.get("ti").rep_frames.copy()
        monkeypatch.setattr(TastiIndex, "add_labels", broken)
        db.sql(QUERY).df()
        with pytest.warns(RuntimeWarning, match="cracking index 'ti'.*disk full"):
            index = db.indexes.get("ti")
        np.testing.assert_array_equal(index.rep_frames, before)  # reloaded from its files
        monkeypatch.undo()
        db.sql("SELECT frame FROM t WHERE contains('bus') LIMIT 2 SEED 4").df()
        assert db.last_report.index == "ti"
