"""ABae budgeted aggregation: finite-sample interval coverage, allocation rules, call accounting,
GROUP BY, and parameter checks."""
import numpy as np
import pytest
from conftest import CountingOracle

from vidql.base.errors import OracleError, ParameterError
from vidql.queries import abae_budget, aggregate_budget_grouped
from vidql.queries.stratified import _allocate

TRIALS = 200


def beta_population(seed, n=20000, a=0.1, b=0.5):
    """Proxy ~ Beta(a, b); the predicate holds with probability = proxy."""
    rng = np.random.default_rng(seed)
    proxy = rng.beta(a, b, n)
    pred = rng.random(n) < proxy
    stat = np.where(pred, rng.normal(5.0, 2.0, n) + 3.0 * proxy, rng.normal(0, 1, n))
    return proxy, stat, pred


def rare_population(seed, n=20000):
    """About 3% of frames satisfy the predicate; the statistic is skewed (lognormal)."""
    rng = np.random.default_rng(seed)
    proxy = rng.beta(0.05, 1.5, n)
    pred = rng.random(n) < np.clip(proxy * 1.5, 0, 1)
    stat = rng.lognormal(1.0, 0.6, n)
    return proxy, stat, pred


def _truth(stat, pred, agg):
    return {"avg": stat[pred].mean(), "sum": stat[pred].sum(), "count": pred.sum()}[agg]


@pytest.mark.parametrize("agg", ["avg", "sum", "count"])
@pytest.mark.slow
def test_interval_covers_truth(agg):
    proxy, stat, pred = beta_population(0)
    truth = _truth(stat, pred, agg)
    hits = 0
    for seed in range(TRIALS):
        res = abae_budget(proxy, lambda f: (stat[f], pred[f]), budget=1000, agg=agg,
                               seed=seed)
        hits += res.ci_low <= truth <= res.ci_high
    assert hits / TRIALS >= 0.93


@pytest.mark.slow
def test_interval_covers_rare_skewed_avg():
    proxy, stat, pred = rare_population(1)
    truth = stat[pred].mean()
    hits = sum(
        (r := abae_budget(proxy, lambda f: (stat[f], pred[f]), budget=1500, seed=s)).ci_low <= truth <= r.ci_high
        for s in range(TRIALS))
    assert hits / TRIALS >= 0.93


@pytest.mark.slow
def test_lower_mse_than_uniform_sampling():
    proxy, stat, pred = beta_population(2)
    truth = stat[pred].mean()
    f = lambda fr: (stat[fr], pred[fr])  # noqa: E731
    abae = [abae_budget(proxy, f, budget=1000, seed=s).estimate
            for s in range(TRIALS)]
    uniform = [abae_budget(proxy, f, budget=1000, seed=s, strata=1).estimate for s in range(TRIALS)]
    ratio = np.mean((np.array(uniform) - truth) ** 2) / np.mean((np.array(abae) - truth) ** 2)
    assert ratio >= 1.4


def test_budget_respected_no_frame_twice_and_stage_caps():
    proxy, stat, pred = beta_population(3, n=400)
    oracle = CountingOracle(stat, pred)
    res = abae_budget(proxy, oracle, budget=300, seed=1, strata=5)
    assert res.oracle_calls == 300 == len(oracle.asked) == len(set(oracle.asked))
    assert np.array_equal(np.sort(oracle.asked), res.frames)
    sizes = np.array(res.details["stratum_sizes"])
    taken = np.array(res.details["pilot"]) + np.array(res.details["stage2"])
    assert np.all(taken <= sizes) and np.all(np.array(res.details["stage2"]) >= 1)
    assert res.method == "abae" and res.error_kind is None


def test_zero_variance_strata_still_get_stage_two_samples():
    rng = np.random.default_rng(4)
    proxy = rng.random(5000)
    pred = proxy > 0.8  # predicate only in the top stratum: others have sd 0 in the pilot
    stat = np.full(5000, 2.0)
    res = abae_budget(proxy, lambda f: (stat[f], pred[f]), budget=500, agg="count",
                           seed=0)
    assert min(res.details["stage2"]) >= 1


def test_allocation_caps_and_totals():
    weights = np.array([[10.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    caps = np.array([3, 100, 100])
    alloc = _allocate(50, weights, caps, 0.1)
    assert np.all(alloc.sum(axis=1) == 50) and np.all(alloc <= caps) and np.all(alloc >= 1)
    assert _allocate(1000, weights[:1], caps, 0.1).sum() == caps.sum()


def test_exact_when_budget_covers_all_frames():
    proxy, stat, pred = beta_population(5, n=300)
    for agg in ("avg", "sum", "count"):
        res = abae_budget(proxy, lambda f: (stat[f], pred[f]), budget=300, agg=agg)
        assert res.exact and res.ci_low == res.ci_high
        assert res.estimate == pytest.approx(_truth(stat, pred, agg))


def test_grouped_results_per_group():
    proxy, stat, pred = beta_population(6)
    group = np.where(np.arange(proxy.size) % 3 == 0, "a", "b")
    oracle = CountingOracle(stat, pred, group)
    results = aggregate_budget_grouped(proxy, oracle, budget=1500, agg="avg", seed=2)
    assert set(results) == {"a", "b"}
    assert len(oracle.asked) == len(set(oracle.asked)) == 1500
    for key, res in results.items():
        truth = stat[pred & (group == key)].mean()
        assert res.ci_low <= truth <= res.ci_high
        assert res.oracle_calls == 1500 and res.details["group"] == key


@pytest.mark.parametrize("agg", ["count", "avg"])
@pytest.mark.slow
def test_grouped_coverage_all_groups_at_once(agg):
    proxy, stat, pred = beta_population(7, n=10000)
    group = np.where(np.random.default_rng(0).random(proxy.size) < 0.3, 1, 2)
    truth = {g: _truth(stat[group == g], pred[group == g], agg) for g in (1, 2)}
    hits = 0
    for seed in range(TRIALS):
        res = aggregate_budget_grouped(proxy, lambda f: (stat[f], pred[f], group[f]),
                                       budget=1000, agg=agg, seed=seed)
        hits += all(r.ci_low <= truth[g] <= r.ci_high for g, r in res.items())
    assert hits / TRIALS >= 0.93  # the confidence is split across the groups


def test_no_positive_sampled_gives_null_and_the_supported_interval():
    proxy = np.random.default_rng(8).random(2000)
    none = lambda f: (np.full(f.size, 3.0), np.zeros(f.size, bool))  # noqa: E731
    res = abae_budget(proxy, none, budget=100, value_range=(0.0, 10.0))
    assert np.isnan(res.estimate) and "NULL" in res.details["note"]
    assert (res.ci_low, res.ci_high) == (0.0, 10.0)  # any mean in the range is possible
    res = abae_budget(proxy, none, budget=100, agg="count")
    # up to a few hundred unseen frames could satisfy it: never a claim of certainty
    assert res.estimate == 0.0 and res.ci_low == 0.0 and 50 < res.ci_high < 2000
    assert "note" in res.details and res.details["positives_sampled"] == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=9), "budget"), (dict(budget=100, agg="median"), "agg"),
    (dict(budget=100, confidence=1.5), "confidence"), (dict(budget=100, strata=0), "strata"),
    (dict(budget=100, value_range=(2, 1)), "value_range"),
    (dict(budget=100, pilot_fraction=1.0), "pilot_fraction"),
])
def test_parameter_errors(kwargs, message):
    proxy = np.linspace(0, 1, 1000)
    with pytest.raises(ParameterError, match=message):
        abae_budget(proxy, lambda f: (np.ones(f.size), np.ones(f.size, bool)), **kwargs)


def test_callback_must_return_pairs():
    with pytest.raises(OracleError):
        abae_budget(np.linspace(0, 1, 100), lambda f: np.ones(f.size), budget=20)


def test_each_stage_asks_the_oracle_once_for_every_stratum():
    """Both stages ask for all their strata's frames in one call (full oracle batches, one
    decoding pass) instead of a call per stratum."""
    proxy, stat, pred = beta_population(3)
    calls = []

    def oracle(frames):
        calls.append(len(frames))
        return stat[frames], pred[frames]

    res = abae_budget(proxy, oracle, budget=300, seed=1, strata=5)
    assert len(calls) == 2 and sum(calls) == res.oracle_calls == 300
    assert len(np.unique(res.frames)) == 300 and res.ci_low <= res.estimate <= res.ci_high
