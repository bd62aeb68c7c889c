"""EZMODE rare-event search: many more positives than random, distinct and confirmed,
budget honoured, SEALS pool, proxy seeding, parameter checks."""
import numpy as np
import pytest
from conftest import CountingOracle

from vidql.base.errors import ParameterError
from vidql.queries import find_rare


def rare_events(seed, n=30000, d=32, count=20):
    """Clustered rare positives (runs of 3-24 frames, base rate < 1%) whose embeddings
    are shifted along one direction, plus a noisy proxy."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(n, dtype=bool)
    for start in rng.choice(n - 30, count, replace=False):
        labels[start:start + rng.integers(3, 25)] = True
    direction = rng.normal(0, 1, d)
    direction /= np.linalg.norm(direction)
    emb = rng.normal(0, 1, (n, d)) + np.outer(labels * 2.0, direction)
    proxy = labels + rng.normal(0, 0.8, n)
    return emb.astype(np.float32), labels, proxy


@pytest.mark.parametrize("use_proxy", [False, True])
def test_finds_ten_times_more_than_random(use_proxy):
    emb, labels, proxy = rare_events(0)
    assert labels.mean() <= 0.01
    found = [find_rare(emb, lambda f: labels[f], budget=500, seed=s,
                       proxy=proxy if use_proxy else None).frames.size for s in range(3)]
    random_expected = 500 * labels.mean()
    assert np.mean(found) >= 10 * random_expected


def test_positives_distinct_confirmed_and_budget_respected():
    emb, labels, _ = rare_events(1)
    oracle = CountingOracle(labels)
    res = find_rare(emb, oracle, budget=300, seed=2, batch=25)
    assert len(oracle.asked) == len(set(oracle.asked)) == res.oracle_calls <= 300
    assert np.all(labels[res.frames]) and np.all(np.diff(res.frames) > 0)
    asked = np.array(oracle.asked)
    assert set(res.frames.tolist()) == set(asked[labels[asked]].tolist())
    assert res.rounds >= 2 and len(res.details["positives_after_round"]) == res.rounds


def test_flood_fill_labels_whole_events():
    emb, labels, proxy = rare_events(2)
    # one round with budget to spare: the flood fill is never cut short
    res = find_rare(emb, lambda f: labels[f], budget=5000, seed=0, proxy=proxy, radius=5,
                    max_rounds=1)
    assert res.oracle_calls < 5000 and res.rounds == 1
    starts = np.flatnonzero(np.diff(np.concatenate([[0], labels.astype(int)])) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate([labels.astype(int), [0]])) == -1)
    found = set(res.frames.tolist())
    touched = [(s, e) for s, e in zip(starts, ends, strict=True) if any(f in found for f in range(s, e + 1))]
    assert len(touched) >= 5
    assert all(all(f in found for f in range(s, e + 1)) for s, e in touched)


def test_seals_pool_and_patience():
    emb, labels, proxy = rare_events(3)
    res = find_rare(emb, lambda f: labels[f], budget=400, seed=0, proxy=proxy,
                    candidate_pool="seals", k_seals=20)
    assert res.frames.size >= 10 * 400 * labels.mean()
    none = np.zeros(labels.size, dtype=bool)
    stopped = find_rare(emb, lambda f: none[f], budget=400, seed=0, batch=20, patience=3)
    assert stopped.rounds == 3 and stopped.oracle_calls == 60 and stopped.frames.size == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=0), "budget"), (dict(radius=-1), "radius"), (dict(batch=0), "batch"),
    (dict(candidate_pool="x"), "candidate_pool"), (dict(proxy=np.ones(3)), "proxy"),
])
def test_parameter_errors(kwargs, message):
    with pytest.raises(ParameterError, match=message):
        find_rare(np.zeros((10, 4)), lambda f: np.zeros(f.size, bool), **kwargs)


def test_bad_embeddings_rejected():
    with pytest.raises(ParameterError, match="embeddings"):
        find_rare(np.zeros(10), lambda f: np.zeros(f.size, bool))


def test_the_classifier_runs_on_one_blas_thread(monkeypatch):
    """The classifier's small BLAS calls run on one thread whatever the caller allows (on 2
    cores they ran 2-5x slower on two), so the scores do not depend on the cores."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_info, threadpool_limits

    seen = []
    fit = LogisticRegression.fit
    monkeypatch.setattr(LogisticRegression, "fit", lambda self, x, y: seen.append(
        {d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"}) or fit(self, x, y))
    emb, labels, proxy = rare_events(3)
    with threadpool_limits(limits=2):
        find_rare(emb, lambda f: labels[f], budget=200, seed=0, proxy=proxy)
    assert seen and all(threads == {1} for threads in seen), seen
