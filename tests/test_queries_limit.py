"""LIMIT ranked by proxy: GAP suppression, early stop, call accounting, degradation to
random order with a useless proxy."""
import numpy as np
import pytest

from vidql.base.errors import ParameterError
from vidql.queries import limit_query


def events(seed, n=50000, count=25):
    """A rare predicate made of short runs (events) of positive frames."""
    rng = np.random.default_rng(seed)
    pred = np.zeros(n, dtype=bool)
    for start in rng.choice(n - 40, count, replace=False):
        pred[start:start + rng.integers(3, 30)] = True
    return pred, rng


class Counting:
    def __init__(self, pred):
        self.pred = pred
        self.asked = []
        self.calls_per_batch = []

    def __call__(self, frames):
        self.asked.extend(frames.tolist())
        self.calls_per_batch.append(frames.size)
        return self.pred[frames]


def test_good_proxy_finds_k_confirmed_frames_gap_apart():
    pred, rng = events(0)
    assert pred.mean() <= 0.01
    proxy = pred + rng.normal(0, 0.4, pred.size)
    oracle = Counting(pred)
    res = limit_query(proxy, oracle, k=10, gap=300, seed=1)
    assert res.frames.size == 10 and np.all(pred[res.frames]) and np.all(res.verified)
    assert np.all(np.diff(res.frames) >= 300)
    assert res.oracle_calls == len(oracle.asked) == len(set(oracle.asked))
    random_order_calls = 10 / pred.mean()
    assert res.oracle_calls * 20 <= random_order_calls


def test_gap_frames_are_never_labelled():
    pred, rng = events(1)
    proxy = pred + rng.normal(0, 0.4, pred.size)
    oracle = Counting(pred)
    res = limit_query(proxy, oracle, k=5, gap=50, seed=0)
    asked = np.array(oracle.asked)
    for hit in res.details["hits_in_call_order"]:
        later = asked[asked.tolist().index(hit) + 1:]
        assert not np.any(np.abs(later - hit) < 50)


def test_useless_proxy_degrades_to_random_order_not_a_scan():
    n = 20000
    pred = np.zeros(n, dtype=bool)
    pred[-200:] = True  # all positives at the end: a sequential scan would need ~19800 calls
    calls = [limit_query(np.zeros(n), lambda f: pred[f], k=5, seed=s).oracle_calls
             for s in range(20)]
    random_order_calls = 5 / pred.mean()
    assert np.mean(calls) <= 3 * random_order_calls


def test_batches_stop_promptly():
    pred, rng = events(2)
    proxy = pred + rng.normal(0, 0.2, pred.size)
    oracle = Counting(pred)
    res = limit_query(proxy, oracle, k=3, gap=10, seed=0, batch=64)
    assert res.frames.size == 3
    assert max(oracle.calls_per_batch) <= 3  # never more frames than hits still needed
    assert np.all(np.diff(res.frames) >= 10)


def test_batch_frames_are_gap_apart():
    pred = np.ones(1000, dtype=bool)
    oracle = Counting(pred)
    res = limit_query(np.linspace(1, 0, 1000), oracle, k=4, gap=100, batch=4)
    assert np.all(np.diff(res.frames) >= 100) and res.oracle_calls == 4


def test_max_calls_and_exhaustion():
    pred = np.zeros(1000, dtype=bool)
    res = limit_query(np.random.default_rng(0).random(1000), lambda f: pred[f], k=2,
                      max_calls=100)
    assert res.oracle_calls == 100 and res.frames.size == 0 and res.details["budget_reached"]
    res = limit_query(np.zeros(50), lambda f: pred[:50][f], k=1)
    assert res.oracle_calls == 50 and res.details["exhausted"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=0), "k"), (dict(k=1, gap=-1), "gap"), (dict(k=1, max_calls=0), "max_calls"),
    (dict(k=1, batch=0), "batch"),
])
def test_parameter_errors(kwargs, message):
    with pytest.raises(ParameterError, match=message):
        limit_query(np.zeros(10), lambda f: np.zeros(f.size, bool), **kwargs)


def test_nan_proxy_rejected():
    with pytest.raises(ParameterError, match="proxy"):
        limit_query(np.array([0.1, np.nan]), lambda f: np.zeros(f.size, bool), k=1)


def test_proxy_order_ranks_by_score_with_ties_in_random_order():
    """Decreasing scores; tied frames in every order equally often over seeds; one order per
    seed (the sort's keys are distinct, so no sort algorithm can reorder them)."""
    from collections import Counter

    from vidql.queries.limit import proxy_order

    scores = np.array([0.5, 2.0, 0.5, -1.0, 0.5, 2.0])
    orders = Counter(tuple(proxy_order(scores, np.random.default_rng(s))) for s in range(3000))
    assert all(o[:2] in ((1, 5), (5, 1)) and o[-1] == 3 for o in orders)
    assert len(orders) == 2 * 6 and min(orders.values()) > 3000 / 12 * 0.7  # 2! x 3!, uniform
    rng = np.random.default_rng(1)
    big = np.round(rng.random(100_000), 2)
    order = proxy_order(big, np.random.default_rng(7))
    assert np.all(np.diff(big[order]) <= 0) and np.array_equal(np.sort(order), np.arange(big.size))
    np.testing.assert_array_equal(order, proxy_order(big, np.random.default_rng(7)))
