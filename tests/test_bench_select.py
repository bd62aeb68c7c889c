"""The select scenario's yardsticks: the best cut of a proxy ranking, top-B labelling."""
import numpy as np

from vidql.bench.scenarios_queries import best_cut, top_by_proxy


def test_best_cut_is_the_fewest_top_frames_holding_the_recall():
    proxy = np.array([0.9, 0.8, 0.7, 0.1, 0.05])
    positive = np.array([True, False, True, True, False])
    assert best_cut(proxy, positive, 0.5) == 3   # 1.5 of 3 positives: the top 3 hold 2
    assert best_cut(proxy, positive, 1 / 3) == 1
    assert best_cut(proxy, positive, 1.0) == 4
    assert best_cut(-proxy, positive, 1.0) == 5  # the worst ranking needs every frame


def test_top_by_proxy_labels_the_budget_highest_frames_and_keeps_their_positives():
    proxy = np.array([0.2, 0.9, 0.5, 0.8, 0.1])
    positive = np.array([True, True, True, False, True])
    res = top_by_proxy(proxy, positive.__getitem__, 3, seed=0)
    assert res.frames.tolist() == [1, 2] and res.oracle_calls == 3 and res.verified.all()
