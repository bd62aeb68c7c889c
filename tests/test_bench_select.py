"""The select scenario's yardstick: the best cut of a proxy ranking."""
import numpy as np

from vidql.bench.scenarios_queries import best_cut


def test_best_cut_is_the_fewest_top_frames_holding_the_recall():
    proxy = np.array([0.9, 0.8, 0.7, 0.1, 0.05])
    positive = np.array([True, False, True, True, False])
    assert best_cut(proxy, positive, 0.5) == 3   # 1.5 of 3 positives: the top 3 hold 2
    assert best_cut(proxy, positive, 1 / 3) == 1
    assert best_cut(proxy, positive, 1.0) == 4
    assert best_cut(-proxy, positive, 1.0) == 5  # the worst ranking needs every frame
