"""Class counts read off an embedding and appended to it, so that distances see counts."""
import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from vidql.indexes import nearest, propagate
from vidql.indexes.countspace import class_counts, count_space, map_rows
from vidql.indexes.rowfile import RowFile


def test_class_counts_are_per_frame_and_class_zero_where_nothing_was_seen():
    labels = pd.DataFrame({"frame": [3, 3, 3, 7], "label": ["car", "car", "bus", "car"]})
    counts, classes = class_counts(labels, np.array([7, 5, 3]))
    assert classes == ["bus", "car"]
    assert counts.tolist() == [[0, 1], [0, 0], [1, 2]]
    empty, none = class_counts(labels.iloc[:0], np.array([1, 2]))
    assert empty.shape == (2, 0) and none == []


def test_appended_counts_bring_frames_with_like_counts_together():
    # the count lives on a weak direction of a 32-d embedding whose distances are mostly noise
    rng = np.random.default_rng(0)
    n = 3000
    cars = rng.integers(0, 6, n).astype(np.float64)
    emb = np.column_stack([cars * 0.3, rng.normal(0, 1, (n, 31))]).astype(np.float32)
    reps = np.sort(rng.choice(n, 60, replace=False))
    matrix = count_space(emb[reps], cars[reps, None])
    assert matrix.shape == (32, 33) and np.array_equal(matrix[:, :32], np.eye(32))
    rest = np.setdiff1d(np.arange(n), reps)

    def rho(space):
        dist, pos = nearest(space, space[reps], 5)
        return spearmanr(propagate(cars[reps], pos, dist)[rest], cars[rest])[0]

    counted = map_rows(emb, matrix)
    assert rho(emb) < 0.3 and rho(counted) > 0.8, (rho(emb), rho(counted))
    on_disk = RowFile(n, 32)
    on_disk[:] = emb
    assert np.allclose(map_rows(on_disk, matrix).array(), counted)


def test_no_counts_are_appended_without_enough_labels_or_with_counts_all_alike():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(40, 8)).astype(np.float32)
    assert count_space(emb[:9], rng.integers(0, 3, (9, 2)).astype(float)) is None
    assert count_space(emb, np.ones((40, 2))) is None
    assert count_space(emb, np.empty((40, 0))) is None
