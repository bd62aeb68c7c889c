"""The label path (oracle -> label cache -> per-frame counts -> statistics) gives exactly the
values of evaluating each statistic on the labels themselves, and labels in whole batches."""
from __future__ import annotations

import numpy as np
import pytest

import vidql
from vidql.engine.labels.cache import MIN_AHEAD
from vidql.datasets import read_labels
from vidql.engine.sql.framestat import evaluate

from conftest import shared_path

EXPRS = ["objects('car')", "contains('bus')", "objects(*)", "objects('car', 0.5)",
         "objects('car') >= 2 AND NOT contains('truck')", "objects('car') + 2 * objects('bus')",
         "CASE WHEN frame % 3 = 0 THEN objects('truck') ELSE 0 END", "contains('Car')",
         "objects('car') >= 3", "(contains('bus'))", "objects('bus') < 1", "objects(*) <> 4",
         "objects('car', 0.5) = 2.0"]


def _check_values(db_path, video: str, labels_path, n: int) -> None:
    truth = read_labels(labels_path)
    rng = np.random.default_rng(7)
    earlier = rng.choice(n, n // 3, replace=False)
    with vidql.connect(db_path, progress=False) as db:  # labelled by an earlier connection
        db.labels(video).ensure(earlier)
    with vidql.connect(db_path, progress=False) as db:
        # these wait in the label journal, counted from there
        db.labels(video).ensure(rng.choice(n, n // 4, replace=False))
        values = db.labels(video).true_values(*EXPRS)
        for size in (1, 2, 17, n // 2):  # unsorted, repeated, cached and new frames
            frames = rng.choice(n, size)
            got = values(frames)
            for expr, value in zip(EXPRS, got, strict=True):
                np.testing.assert_array_equal(value, evaluate(expr, truth, frames), err_msg=expr)


def test_statistic_values_on_detections_equal_evaluate(small_traffic):
    """What an index's representatives are given (`FrameExpr.values`, from counts) equals
    `evaluate` on the same detections: frames in any order, some without detections, a
    row without a label, detections of frames not asked for."""
    from vidql.engine.sql.framestat import parse_frame_expr
    import pandas as pd

    truth = read_labels(small_traffic[1])
    frames = np.random.default_rng(3).choice(300, 80, replace=False)
    blank = pd.DataFrame({"frame": [int(frames[0])], "label": [None], "score": [0.0],
                          "x1": [0.0], "y1": [0.0], "x2": [0.0], "y2": [0.0]})
    detections = pd.concat([truth, blank], ignore_index=True)
    for expr in EXPRS:
        np.testing.assert_array_equal(parse_frame_expr(expr).values(detections, frames),
                                      evaluate(expr, detections, frames), err_msg=expr)


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
    from vidql.engine.sql.dialect import parse
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
    assert answer["labels_used"][0] == len(expected.frames)


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
        detect = oracle.detect_in_clip
        oracle.detect_in_clip = lambda frames, ids, *clip: sizes.append(len(ids)) or detect(
            frames, ids, *clip)
        answer = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2").df()
        assert answer["labels_used"][0] > 32 and sum(sizes) == db.last_report.oracle_calls
        assert sum(sizes) == len(set(db.labels("t").labelled_frames))
        assert all(MIN_AHEAD <= size <= 32 for size in sizes[:-1]), sizes
        assert sum(sizes) <= answer["labels_used"][0] + 32  # labelled ahead: less than a batch


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


def _labels_db(path, video, labels, options: str):
    db = vidql.connect(path, progress=False)
    db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}' "
           f"WITH ({options}); SET ORACLE t = truth")
    return db


def _batch_sizes(db) -> list[int]:
    sizes = []
    oracle = db.labels("t").oracle
    detect = oracle.detect_in_clip
    oracle.detect_in_clip = lambda frames, ids, *clip: sizes.append(len(ids)) or detect(
        frames, ids, *clip)
    return sizes


def test_cheap_oracle_labels_whole_batches_from_the_start(small_traffic, tmp_path):
    """A nearly free oracle (a label table without a stated cost) gets as many frames as
    the query has had labelled (up to a whole batch) from its first requests on, so fewer
    batches; one with a model's cost still gets MIN_AHEAD frames for a request of one or
    two. Nothing measured decides it, so every run labels the same frames."""
    video, labels = small_traffic
    sql = "SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.3 SEED 2"
    with _labels_db(tmp_path / "cheap.db", video, labels, "batch_size = 32") as db:
        sizes = _batch_sizes(db)
        db.sql(sql)
        assert sizes[:2] == [MIN_AHEAD] * 2 and set(sizes[2:-1]) == {32}, sizes
    with _labels_db(tmp_path / "dear.db", video, labels, "batch_size = 32, cost_ms = 1e4") as db:
        sizes = _batch_sizes(db)
        db.sql(sql)
        assert sizes[:3] == [MIN_AHEAD] * 3, sizes


def _count_statements(cache) -> list:
    """The statements `cache` executes from now on, collected in the list returned."""
    statements = []
    con = cache.con
    cache.con = type("Counting", (), {
        "execute": lambda self, *a: statements.append(a[0]) or con.execute(*a),
        "__getattr__": lambda self, name: getattr(con, name)})()
    return statements


def test_earlier_labels_counted_in_one_statement(small_traffic, tmp_path):
    """Frames labelled before the cache counted them (by an index, another connection) are
    counted from the catalog in one statement, not one per callback that meets them."""
    video, labels = small_traffic
    with _labels_db(tmp_path / "e.db", video, labels, "batch_size = 16") as db:
        db.labels("t").ensure(np.arange(0, 300, 3))
    with vidql.connect(tmp_path / "e.db", progress=False) as db:
        cache = db.labels("t")
        values = cache.true_values("objects('car')")
        statements = _count_statements(cache)
        for start in range(0, 300, 30):
            values(np.arange(start, start + 30, 3))
        assert len(statements) == 1, statements
        truth = read_labels(labels)
        np.testing.assert_array_equal(values(np.arange(0, 300, 3))[0],
                                      evaluate("objects('car')", truth, np.arange(0, 300, 3)))


def test_many_earlier_labels_take_few_statements(small_traffic, tmp_path):
    """Earlier labels are counted in one statement, whatever the callbacks ask (a LIMIT
    asks a few frames at a time: one statement per callback took 3.3 s over 10k cached
    frames)."""
    video, labels = small_traffic
    with _labels_db(tmp_path / "c.db", video, labels, "batch_size = 16") as db:
        db.labels("t").ensure(np.arange(300))
    with vidql.connect(tmp_path / "c.db", progress=False) as db:
        cache = db.labels("t")
        values = cache.true_values("objects('car')")
        statements = _count_statements(cache)
        frames = np.random.default_rng(3).permutation(300)
        got = np.concatenate([values(frames[i:i + 5])[0] for i in range(0, 300, 5)])
        assert len(statements) == 1, len(statements)
        np.testing.assert_array_equal(got, evaluate("objects('car')", read_labels(labels), frames))


def test_statistics_need_few_statements(monkeypatch):
    """A statistic that is one frame function, or one count compared with a number, takes
    its values from the counts without a statement; another statistic of one count
    evaluates every count up to twice the largest seen in one statement."""
    from vidql.engine.sql import framestat

    statements = []
    connection = framestat.connection
    monkeypatch.setattr(framestat, "connection", lambda: statements.append(1) or connection())
    stats = framestat.FrameStatistics(["objects('car')", "contains('bus')"])
    frames = np.arange(6)
    counts = np.array([[0, 0], [1, 2], [7, 0], [3, 1], [40, 5], [2, 0]])
    cars, bus = stats(frames, counts)
    assert statements == []
    np.testing.assert_array_equal(cars, [0, 1, 7, 3, 40, 2])
    np.testing.assert_array_equal(bus, [0, 1, 0, 1, 1, 0])
    crowd = framestat.FrameStatistics(["objects('car') >= 3", "objects(*) < 2.5",
                                       "objects('bus') <> 1"])
    got = crowd(frames, counts[:, [0, 0, 1]])
    for value, want in zip(got, [counts[:, 0] >= 3, counts[:, 0] < 2.5, counts[:, 1] != 1],
                           strict=True):
        np.testing.assert_array_equal(value, want.astype(float))
    assert statements == []
    odd = framestat.FrameStatistics(["objects('car') % 2 = 1"])
    for count in (5, 0, 2, 9, 25):
        (value,) = odd(np.array([count]), np.array([[count]]))
        assert value[0] == float(count % 2 == 1)
    assert len(statements) == 1


def test_bad_oracle_output_is_refused_before_caching():
    """An oracle's DataFrame becomes new arrays (label codes, float64 values) that give back
    the standard columns and dtypes; the check refuses missing columns, detections of frames
    not asked about, missing values and label codes without a name, and gives each
    detection's position among the frames asked about."""
    from dataclasses import replace

    import pandas as pd
    import pytest

    from vidql.base.detections import DETECTION_COLUMNS
    from vidql.engine.labels.oracle_api import check_detections, detection_arrays
    from vidql.base.errors import OracleError

    oracle = type("O", (), {"name": "o"})()
    good = pd.DataFrame({"frame": [3, 3, 5], "label": ["car", "bus", "car"],
                         "score": [0.9, 0.8, 0.7], "x1": [1.0] * 3, "y1": [2.0] * 3,
                         "x2": [3.0] * 3, "y2": [4.0] * 3, "extra": [0] * 3}, index=[7, 8, 9])
    checked = detection_arrays(good, oracle)
    assert check_detections(checked, np.array([5, 4, 3]), oracle).tolist() == [2, 2, 0]
    assert checked.names == ("car", "bus") and checked.codes.tolist() == [0, 1, 0]
    assert checked.values.dtype == np.float64 and checked.values[:, 0].tolist() == [0.9, 0.8, 0.7]
    assert not np.shares_memory(checked.frame, good["frame"].to_numpy())
    table = checked.to_frame()
    assert list(table.columns) == DETECTION_COLUMNS and list(table.index) == [0, 1, 2]
    assert table["frame"].dtype == np.int64 and table["label"].tolist() == ["car", "bus", "car"]
    with pytest.raises(OracleError, match="without columns"):
        detection_arrays(good.drop(columns="x2"), oracle)
    with pytest.raises(OracleError, match=r"not asked about: \[5\]"):
        check_detections(checked, np.array([3]), oracle)
    for column, value in (("score", np.nan), ("label", None)):
        bad = good.copy()
        bad.loc[8, column] = value
        with pytest.raises(OracleError, match="missing values"):
            check_detections(detection_arrays(bad, oracle), np.array([3, 5]), oracle)
    with pytest.raises(OracleError, match="beyond its 1 class names"):
        check_detections(replace(checked, names=("car",)), np.array([3, 5]), oracle)


def test_an_index_representatives_are_counted_from_its_labels(small_traffic, tmp_path):
    """A query over an index counts its representatives from the index's labels in memory,
    with no catalog statement for them, and gets exactly the values of the labels."""
    from vidql.engine.sql.dialect import parse
    from vidql.engine.planner import Binding

    video, labels = small_traffic
    with _labels_db(tmp_path / "i.db", video, labels, "batch_size = 16") as db:
        db.sql("CREATE INDEX ti ON t WITH (train = 20, reps = 40, triplets = 100)")
    with vidql.connect(tmp_path / "i.db", progress=False) as db:
        binding = Binding(db, parse("SELECT frame FROM t WHERE objects('car') >= 3 LIMIT 3 "
                                    "USING INDEX ti"))
        reps = binding.index.rep_frames
        values = binding.cache.true_values("objects('car')", "contains('bus')")
        statements = []
        con = binding.cache.con
        binding.cache.con = type("Counting", (), {
            "execute": lambda self, *a: statements.append(a[0]) or con.execute(*a),
            "__getattr__": lambda self, name: getattr(con, name)})()
        cars, buses = values(reps)
        assert statements == [] and binding.cache.stats.oracle_calls == 0
        truth = read_labels(labels)
        np.testing.assert_array_equal(cars, evaluate("objects('car')", truth, reps))
        np.testing.assert_array_equal(buses, evaluate("contains('bus')", truth, reps))


def test_detection_arrays_concatenate_with_their_names_merged():
    """Batches whose label names differ (each oracle batch names only its own labels) join
    into one set whose codes point at the merged names; no parts give no detections."""
    from vidql.base.detections import DetectionArrays

    a = DetectionArrays(np.array([1, 2]), np.array([0, 1], dtype=np.int32), ("car", "bus"),
                        np.ones((2, 5)))
    b = DetectionArrays(np.array([7]), np.array([0], dtype=np.int32), ("person",), np.zeros((1, 5)))
    c = DetectionArrays(np.array([9]), np.array([0], dtype=np.int32), ("bus",), np.zeros((1, 5)))
    joined = DetectionArrays.concat([a, b, c])
    assert joined.names == ("car", "bus", "person")
    assert joined.to_frame()["label"].tolist() == ["car", "bus", "person", "bus"]
    assert joined.frame.tolist() == [1, 2, 7, 9] and joined.values.shape == (4, 5)
    assert len(DetectionArrays.concat([])) == 0


def test_detection_rows_in_frames_any_order():
    """Each detection's position in the frames asked (-1 for a frame not asked) is the same
    whether frames and detections come ascending (an oracle's usual output, found a faster
    way) or not, with strays, frames without detections and a single frame."""
    from vidql.base.detections import DetectionArrays

    rng = np.random.default_rng(5)
    for trial in range(200):
        asked = rng.choice(60, int(rng.integers(1, 20)), replace=False)
        ascending = trial % 2 == 0
        if ascending:
            asked = np.sort(asked)
        det_frames = rng.choice(asked if trial % 3 else np.arange(60), int(rng.integers(0, 40)))
        if ascending:
            det_frames = np.sort(det_frames)
        det = DetectionArrays(det_frames.astype(np.int64), np.zeros(len(det_frames), np.int32),
                              ("car",), np.zeros((len(det_frames), 5)))
        where = {int(f): i for i, f in enumerate(asked)}
        expected = [where.get(int(f), -1) for f in det_frames]
        assert det.rows_in(asked).tolist() == expected, trial


@pytest.mark.parametrize("text, nullable", [
    ("objects('car')", False), ("objects('car') * 2 + contains('bus')::INT", False),
    ("CASE WHEN objects('car') > 3 THEN 1 ELSE 0 END", False), ("abs(objects('car') - 3)", False),
    ("coalesce(CASE WHEN objects('car') > 3 THEN 1 END, -1)", False),
    ("CASE WHEN objects('car') > 3 THEN 1 END", True), ("sqrt(objects('car'))", True),
    ("objects('car') / NULLIF(objects('person'), 0)", True),
    ("CASE WHEN objects('car') > 3 THEN NULL ELSE 1 END", True),
])
def test_may_be_null_reads_the_text(text, nullable):
    from vidql.engine.sql.framestat import may_be_null, parse_frame_expr

    assert may_be_null(parse_frame_expr(text)) is nullable


def test_a_null_statistic_is_not_a_zero():
    """DuckDB hands NULLs back masked, and the mask was dropped: a NULL became 0. A NULL
    predicate is false; a NULL statistic is an error (the planner leaves such frames out)."""
    from vidql.engine.sql import framestat

    stats = framestat.FrameStatistics(["CASE WHEN objects('car') > 3 THEN true END"])
    np.testing.assert_array_equal(stats(np.arange(3), np.array([[1], [5], [0]]))[0], [0, 1, 0])
    with pytest.raises(vidql.QueryError, match="no finite value"):
        framestat.FrameStatistics(["CASE WHEN objects('car') > 3 THEN 1 END"])(
            np.arange(3), np.array([[1], [5], [0]]))
