"""Farthest-point-first and the random + FPF choice of representatives."""
import numpy as np

from vidql.indexes import farthest_point_first, random_representatives


def naive_fpf(x, n, initial):
    """Recomputes every distance to every chosen point at each step."""
    chosen = list(initial)
    picks = []
    for _ in range(n):
        d = np.linalg.norm(x[:, None, :] - x[chosen][None, :, :], axis=2).min(axis=1)
        d[chosen] = -1
        pick = int(np.argmax(d))
        picks.append(pick)
        chosen.append(pick)
    return np.array(picks)


def test_fpf_picks_the_farthest_point_each_step():
    x = np.random.default_rng(3).normal(size=(300, 5)).astype(np.float32)
    picks = farthest_point_first(x, 25, initial=[7])
    assert np.array_equal(picks, naive_fpf(x, 25, [7]))


def test_fpf_is_deterministic_and_seeded_start():
    x = np.random.default_rng(0).normal(size=(500, 8)).astype(np.float32)
    a = farthest_point_first(x, 40, seed=1)
    assert np.array_equal(a, farthest_point_first(x, 40, seed=1))
    assert len(np.unique(a)) == 40
    # after the seeded first pick, each next one is the farthest
    assert np.array_equal(a[1:], naive_fpf(x, 39, [a[0]]))


def test_fpf_finds_outliers_and_never_repeats_duplicates():
    x = np.zeros((100, 2), dtype=np.float32)
    x[[13, 77]] = [[50, 0], [0, -40]]
    picks = farthest_point_first(x, 5, initial=[0])
    assert list(picks[:2]) == [13, 77]
    assert len(np.unique(picks)) == 5 and 0 not in picks
    assert len(farthest_point_first(x, 500, initial=[0])) == 99  # capped at what is left


def test_random_quarter_of_representatives_excludes_labelled_frames():
    already = np.arange(0, 2000, 40)  # 50 training frames
    picks = random_representatives(2000, 200, already=already, seed=4)
    assert len(picks) == 50 and len(np.unique(picks)) == 50
    assert not np.isin(picks, already).any() and np.all(np.diff(picks) > 0)
    assert np.array_equal(picks, random_representatives(2000, 200, already=already, seed=4))
    assert not np.array_equal(picks, random_representatives(2000, 200, already=already, seed=5))
    assert len(random_representatives(2000, 60, already=already)) == 10  # budget left: 10
    assert len(random_representatives(2000, 30, already=already)) == 0
