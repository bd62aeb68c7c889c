"""The label path (oracle -> label cache -> per-frame counts -> statistics) gives exactly the
values of evaluating each statistic on the labels themselves, and labels in whole batches."""
from __future__ import annotations

import numpy as np

import vidql
from vidql.engine.labelcache import MIN_AHEAD
from vidql.datasets import read_labels
from vidql.engine.framestat import evaluate

from conftest import shared_path

EXPRS = ["objects('car')", "contains('bus')", "objects(*)", "objects('car', 0.5)",
         "objects('car') >= 2 AND NOT contains('truck')", "objects('car') + 2 * objects('bus')",
         "CASE WHEN frame % 3 = 0 THEN objects('truck') ELSE 0 END", "contains('Car')"]


def _check_values(db_path, video: str, labels_path, n: int) -> None:
    truth = read_labels(labels_path)
    rng = np.random.default_rng(7)
    earlier = rng.choice(n, n // 3, replace=False)
    with vidql.connect(db_path, progress=False) as db:  # labelled by an earlier connection
        db.labels(video).ensure(earlier)
    with vidql.connect(db_path, progress=False) as db:
        values = db.labels(video).true_values(*EXPRS)
        for size in (1, 2, 17, n // 2):  # unsorted, repeated, cached and new frames
            frames = rng.choice(n, size)
            got = values(frames)
            for expr, value in zip(EXPRS, got, strict=True):
                np.testing.assert_array_equal(value, evaluate(expr, truth, frames), err_msg=expr)


def test_values_equal_old_path_synthetic(small_traffic, tmp_path):
    video, labels = small_traffic
    path = tmp_path / "t.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}' "
               "WITH (batch_size = 16); SET ORACLE t = truth")
    _check_values(path, "t", labels, 300)


def test_values_equal_old_path_real_clip(tmp_path):
    clip = shared_path("data", "ua_detrac.mp4")
    labels = shared_path("data", "ua_detrac.labels.csv")
    path = tmp_path / "u.db"
    with vidql.connect(path, progress=False) as db:
        db.sql(f"LOAD VIDEO '{clip}' AS u; CREATE ORACLE gt FROM LABELS '{labels}' "
               "WITH (batch_size = 16); SET ORACLE u = gt")
    _check_values(path, "u", labels, 252)


def test_aggregate_same_answer_as_operator_on_arrays(traffic_db, small_traffic):
    """Same seed, same answer: the SQL aggregate equals its operator fed the label file."""
    from vidql import queries
    from vidql.engine.dialect import parse
    from vidql.engine.planner import Binding

    sql = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 CONFIDENCE 0.9 SEED 5"
    truth = evaluate("objects('car')", read_labels(small_traffic[1]), np.arange(300))
    with vidql.connect(traffic_db, progress=False) as db:
        q = parse(sql)
        seed = Binding(db, q).sampling_seed(q.clauses.seed)
        answer = db.sql(sql).df()
    expected = queries.aggregate_error_bound(300, lambda f: truth[f], error=0.3, confidence=0.9,
                                             seed=seed, bound="betting")
    assert answer["estimate"][0] == expected.estimate
    assert (answer["ci_low"][0], answer["ci_high"][0]) == (expected.ci_low, expected.ci_high)
    assert answer["frames"][0] == len(expected.frames)


def test_error_within_labels_whole_batches(small_traffic, tmp_path):
    """ERROR WITHIN asks a frame or two at a time at first; the oracle still gets batches
    of the sample order (at least MIN_AHEAD frames, whole batches once the operator asks
    for more), never a frame twice, and never more than twice what the operator asks."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "b.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}' "
               "WITH (batch_size = 32); SET ORACLE t = truth")
        sizes = []
        oracle = db.labels("t").oracle
        detect = oracle.detect
        oracle.detect = lambda frames, ids: sizes.append(len(ids)) or detect(frames, ids)
        answer = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2").df()
        assert answer["frames"][0] > 32 and sum(sizes) == db.last_report.oracle_calls
        assert sum(sizes) == len(set(db.labels("t").labelled_frames))
        assert all(MIN_AHEAD <= size <= 32 for size in sizes[:-1]), sizes
        assert sum(sizes) <= answer["frames"][0] + 32  # labelled ahead: less than a batch


def test_callback_values_come_from_memory(small_traffic, tmp_path):
    """Once the oracle's batches are committed, a callback reads no labels back from the
    catalog: its values come from the counts of those batches."""
    video, labels = small_traffic
    with vidql.connect(tmp_path / "m.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'; "
               "SET ORACLE t = truth")
        cache = db.labels("t")
        values = cache.true_values("objects('car')", "contains('bus')")
        values(np.arange(0, 300, 7))  # labels these frames: one batch, committed
        statements = []
        con = cache.con

        class Counting:
            def __getattr__(self, name):
                statements.append(name)
                return getattr(con, name)

        cache.con = Counting()
        try:
            for start in range(0, 280, 7):
                cars, bus = values(np.arange(start, 300, 7)[:3])
        finally:
            cache.con = con
        assert statements == []
        truth = read_labels(labels)
        np.testing.assert_array_equal(cars, evaluate("objects('car')", truth, [273, 280, 287]))
