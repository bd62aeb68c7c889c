"""The select scenario's yardsticks: the best cut of a proxy ranking, top-B labelling."""
import numpy as np
import pytest

from vidql.bench.scenarios_queries import best_cut, top_by_proxy


def test_best_cut_is_the_fewest_top_frames_holding_the_recall():
    proxy = np.array([0.9, 0.8, 0.7, 0.1, 0.05])
    positive = np.array([True, False, True, True, False])
    assert best_cut(proxy, positive, 0.5) == 3   # 1.5 of 3 positives: the top 3 hold 2
    assert best_cut(proxy, positive, 1 / 3) == 1
    assert best_cut(proxy, positive, 1.0) == 4
    assert best_cut(-proxy, positive, 1.0) == 5  # the worst ranking needs every frame


def test_bargain_baseline_returns_its_set_within_the_budget():
    pytest.importorskip("BARGAIN", reason="the BARGAIN baseline needs `pip install bargain` "
                                          "(the bench extra)")
    from vidql.bench.bargain_baseline import bargain_recall

    rng = np.random.default_rng(0)
    positive = rng.random(3000) < 0.1
    proxy = np.clip(positive * 0.5 + rng.normal(0.3, 0.2, 3000), 0, 1)
    res = bargain_recall(proxy, positive.__getitem__, target=0.9, budget=400, seed=1)
    assert 0 < res.oracle_calls <= 400
    assert positive[res.frames].sum() >= 0.9 * positive.sum()
    assert res.verified.any() and positive[res.frames[res.verified]].all()


def test_top_by_proxy_labels_the_budget_highest_frames_and_keeps_their_positives():
    proxy = np.array([0.2, 0.9, 0.5, 0.8, 0.1])
    positive = np.array([True, True, True, False, True])
    res = top_by_proxy(proxy, positive.__getitem__, 3, seed=0)
    assert res.frames.tolist() == [1, 2] and res.oracle_calls == 3 and res.verified.all()
