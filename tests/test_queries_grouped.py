"""Aggregates per group known without the oracle (queries/grouped.py): every group's
interval covers its truth SIMULTANEOUSLY, for ERROR WITHIN (mean form with and without a
proxy, ratio form) and ORACLE BUDGET; the confidence and budget splits; call accounting."""
import numpy as np
import pytest

from vidql.base.errors import ParameterError
from vidql.queries import grouped_budget, grouped_error_bound, split_confidence
from vidql.queries.grouped import group_positions, split_budget

TRIALS = 200
SIZES = (300, 700, 1200, 1800)          # four groups of different sizes ...
RATES = (0.1, 0.35, 0.6, 0.85)          # ... and different means (stat ~ Bin(8, rate))
PRED = (0.7, 0.3, 0.5, 0.9)             # predicate rates for AVG(stat) WHERE pred


def population(seed: int, shuffle: bool = True):
    """(groups, stat, pred, proxy) over sum(SIZES) frames, groups interleaved at random."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(len(SIZES)) * 10 + 7, SIZES)  # labels 7, 17, 27, 37
    if shuffle:
        groups = rng.permutation(groups)
    code = (groups - 7) // 10
    stat = rng.binomial(8, np.take(RATES, code)).astype(np.float64)
    pred = rng.random(groups.size) < np.take(PRED, code)
    proxy = stat + rng.normal(0.0, 1.0, groups.size)
    return groups, stat, pred, proxy


def truths(groups, values, pred=None):
    keep = np.ones(values.size, bool) if pred is None else pred
    return {g: values[(groups == g) & keep].mean() for g in np.unique(groups)}


def all_cover(result, truth) -> bool:
    assert result.keys == sorted(truth)
    return all(r.ci_low <= truth[k] <= r.ci_high
               for k, r in zip(result.keys, result.results, strict=True))


def mean_form(seed, proxy_too):
    groups, stat, _, proxy = population(seed)
    res = grouped_error_bound(groups, lambda f: stat[f], proxy=proxy if proxy_too else None,
                              error=0.4, value_range=(0, 8), seed=seed)
    return all_cover(res, truths(groups, stat))


def ratio_form(seed):
    groups, stat, pred, _ = population(seed)
    res = grouped_error_bound(groups, lambda f: (stat[f], pred[f]), ratio=True, error=0.5,
                              value_range=(0, 8), seed=seed)
    return all_cover(res, truths(groups, stat, pred))


def budget_form(seed):
    groups, stat, pred, proxy = population(seed)
    res = grouped_budget(groups, proxy, lambda f: (stat[f], pred[f]), budget=1200,
                         value_range=(0, 8), seed=seed)
    return all_cover(res, truths(groups, stat, pred))


FORMS = {"mean": lambda s: mean_form(s, False), "mean_proxy": lambda s: mean_form(s, True),
         "ratio": ratio_form, "budget": budget_form}


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(FORMS))
def test_all_groups_cover_at_once(form):
    hits = sum(FORMS[form](seed) for seed in range(TRIALS))
    assert hits / TRIALS >= 0.93, (form, hits)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_all_groups_cover_at_once_quick(form):
    """20 trials: a joint 95% interval misses all groups' truths in more than 4 of 20
    with probability below 0.02."""
    assert sum(FORMS[form](1000 + seed) for seed in range(20)) >= 16


def test_confidence_split_is_sidak():
    assert split_confidence(0.95, 1) == 0.95
    each = split_confidence(0.95, 4)
    # less demanding than Bonferroni (1 - 0.05/4), so narrower intervals
    assert each ** 4 == pytest.approx(0.95) and each < 1 - 0.05 / 4
    groups, stat, pred, proxy = population(0)
    res = grouped_error_bound(groups, lambda f: stat[f], error=0.4, value_range=(0, 8))
    assert res.group_confidence == pytest.approx(each) and res.confidence == 0.95
    assert all(r.confidence == pytest.approx(each) for r in res.results)
    assert "Sidak" in res.split and "4 groups" in res.split


def test_each_group_within_its_error_and_frames_are_its_own():
    groups, stat, _, proxy = population(3)
    asked = []

    def oracle(frames):
        asked.extend(frames.tolist())
        return stat[frames]

    res = grouped_error_bound(groups, oracle, proxy=proxy, error=0.3, value_range=(0, 8))
    assert len(asked) == len(set(asked)) == res.oracle_calls == res.frames.size
    for key, r in zip(res.keys, res.results, strict=True):
        assert np.all(groups[r.frames] == key)
        assert r.details["met"] and max(r.ci_high - r.estimate, r.estimate - r.ci_low) <= 0.3
        assert r.method == "control_variate"


def test_ahead_labelling_sees_global_positions():
    groups, stat, _, _ = population(4)
    told = []

    def oracle(frames):
        return stat[frames]

    oracle.ahead = lambda order, now: told.append((np.asarray(order)[:now].copy()))
    res = grouped_error_bound(groups, oracle, error=0.5, value_range=(0, 8))
    labelled = np.concatenate(told)
    assert np.array_equal(np.sort(labelled), res.frames)


def test_sample_cap_split_by_size():
    groups, stat, _, _ = population(5)
    res = grouped_error_bound(groups, lambda f: stat[f], error=0.01, value_range=(0, 8),
                              max_samples=400)
    assert sum(res.budgets) == 400  # by size (4000 frames), after MIN_SAMPLES each
    assert np.allclose(res.budgets, np.array(SIZES) / 10, atol=2)
    assert [r.oracle_calls for r in res.results] == res.budgets
    assert not any(r.details["met"] for r in res.results)
    with pytest.raises(ParameterError, match="too small for 4 groups: at least 2 each, 8"):
        grouped_error_bound(groups, lambda f: stat[f], error=0.1, max_samples=7)


def test_budget_split_floor_spread_and_caps():
    groups, stat, pred, proxy = population(6, shuffle=False)
    _, members = group_positions(groups)
    flat = np.zeros(groups.size)
    # no proxy spread: evenly for AVG, by size for SUM/COUNT
    assert split_budget(400, members, flat, "avg") == [100, 100, 100, 100]
    # 10 each (2 per stratum), then of the 360 left 10% evenly and 90% by size
    by_size = 10 + 0.1 * 360 / 4 + 0.9 * 360 * np.array(SIZES) / sum(SIZES)
    shares = split_budget(400, members, flat, "count")
    assert sum(shares) == 400 and np.allclose(shares, by_size, atol=1)
    # a group with no spread keeps the floor share; the spread one gets most of the rest
    spread = np.where(groups == 37, proxy, 0.0)
    shares = split_budget(400, members, spread, "avg")
    assert sum(shares) == 400 and shares[3] > 300 and min(shares[:3]) >= 10
    # never more than a group's frames
    assert split_budget(10_000, members, proxy, "avg") == list(SIZES)
    with pytest.raises(ParameterError, match="too small for 4 groups"):
        split_budget(30, members, proxy, "avg")


def test_budget_form_spends_the_budget_once():
    groups, stat, pred, proxy = population(7)
    asked = []

    def oracle(frames):
        asked.extend(frames.tolist())
        return stat[frames], pred[frames]

    res = grouped_budget(groups, proxy, oracle, budget=600, agg="sum", value_range=(0, 8))
    assert len(asked) == len(set(asked)) == res.oracle_calls == sum(res.budgets) == 600
    for key, r, share in zip(res.keys, res.results, res.budgets, strict=True):
        assert r.oracle_calls == share and np.all(groups[r.frames] == key)
        truth = stat[(groups == key) & pred].sum()
        assert r.ci_low <= truth <= r.ci_high


def test_tiny_group_is_exact():
    groups = np.array([0] * 50 + [1])
    stat = np.arange(51, dtype=np.float64) % 3
    res = grouped_budget(groups, np.zeros(51), lambda f: (stat[f], np.ones(f.size, bool)),
                         budget=40)
    assert res.budgets[1] == 1 and res.results[1].exact
    assert res.results[1].estimate == stat[50]
    res = grouped_error_bound(groups, lambda f: stat[f], error=0.5, value_range=(0, 2),
                              max_samples=30)
    assert res.results[1].exact and res.budgets[1] is None
