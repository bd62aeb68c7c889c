"""Aggregation with an error bound: coverage over seeded trials, exactness, call counting,
absolute vs relative error, the AVG-with-predicate ratio, and parameter checks."""
import numpy as np
import pytest
from conftest import CountingOracle

from vidql.base.errors import OracleError, ParameterError
from vidql.queries import aggregate_error_bound, aggregate_ratio_error_bound

TRIALS = 200


def counts_population(seed, n=5000, noise=0.75):
    """Per-frame counts with a proxy of correlation about 0.9 (noise=0.75)."""
    rng = np.random.default_rng(seed)
    latent = rng.gamma(2.0, 1.5, n)
    values = np.round(latent) + (rng.random(n) < 0.1)
    proxy = latent + rng.normal(0.0, noise, n)
    return values.astype(np.float64), proxy


def skewed_population(seed, n=5000):
    """Rare large values: 2% of frames carry almost all the mass."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(n) < 0.02, rng.integers(5, 30, n), 0).astype(np.float64)
    proxy = values + rng.normal(0.0, 3.0, n)
    return values, proxy


def _coverage(values, proxy, error, bound, value_range):
    truth = values.mean()
    hits, within, calls = 0, 0, []
    for seed in range(TRIALS):
        res = aggregate_error_bound(values.size, lambda f: values[f], proxy=proxy, error=error,
                                    seed=seed, value_range=value_range, bound=bound)
        hits += res.ci_low - 1e-12 <= truth <= res.ci_high + 1e-12
        within += abs(res.estimate - truth) <= error + 1e-12
        calls.append(res.oracle_calls)
    return hits / TRIALS, within / TRIALS, float(np.mean(calls))


@pytest.mark.parametrize("bound", ["bernstein", "betting"])
@pytest.mark.parametrize("use_proxy", [False, True])
@pytest.mark.slow
def test_interval_covers_mean(bound, use_proxy):
    # the Bernstein bound needs more frames than betting to stop before labelling all
    values, proxy = counts_population(0, n=20000 if bound == "bernstein" else 5000)
    assert np.corrcoef(values, proxy)[0, 1] == pytest.approx(0.9, abs=0.04)
    error = 0.15 if bound == "betting" else 0.4
    coverage, within, calls = _coverage(values, proxy if use_proxy else None, error, bound,
                                        (0.0, values.max()))
    assert coverage >= 0.93
    assert within >= 0.93
    assert calls < values.size  # the bound was reached by sampling, not by labelling all


@pytest.mark.parametrize("bound", ["bernstein", "betting"])
@pytest.mark.slow
def test_interval_covers_skewed_mean(bound):
    values, proxy = skewed_population(1, n=20000 if bound == "bernstein" else 5000)
    error = 0.3 if bound == "bernstein" else 0.15
    coverage, within, calls = _coverage(values, proxy, error, bound, (0.0, 30.0))
    assert coverage >= 0.93 and within >= 0.93
    assert calls < values.size


def test_control_variates_need_fewer_calls_with_betting():
    values, proxy = counts_population(2, n=20000, noise=0.5)
    kwargs = dict(error=0.05, value_range=(0.0, values.max()), bound="betting")
    uniform = np.mean([aggregate_error_bound(values.size, lambda f: values[f], seed=s,
                                             **kwargs).oracle_calls for s in range(5)])
    cv = np.mean([aggregate_error_bound(values.size, lambda f: values[f], proxy=proxy, seed=s,
                                        **kwargs).oracle_calls for s in range(5)])
    assert uniform / cv >= 2.5


def test_exact_when_every_frame_is_sampled():
    values, proxy = counts_population(3, n=300)
    oracle = CountingOracle(values)
    res = aggregate_error_bound(values.size, oracle, proxy=proxy, error=1e-6, seed=1,
                                value_range=(0.0, values.max()))
    assert res.exact and res.oracle_calls == values.size
    assert res.estimate == pytest.approx(values.mean(), rel=1e-12)
    assert res.ci_low == res.ci_high == res.estimate
    assert np.array_equal(res.frames, np.arange(values.size))
    assert sorted(oracle.asked) == list(range(values.size))  # frame 0 included, none twice


@pytest.mark.parametrize("bound", ["bernstein", "betting"])
def test_each_frame_labelled_once_and_counted(bound):
    values, proxy = counts_population(4)
    oracle = CountingOracle(values)
    res = aggregate_error_bound(values.size, oracle, proxy=proxy, error=0.3, seed=5,
                                value_range=(0.0, values.max()), batch=37, bound=bound)
    assert len(oracle.asked) == len(set(oracle.asked)) == res.oracle_calls
    assert np.array_equal(np.sort(oracle.asked), res.frames)
    assert res.method == "control_variate" and res.error_kind == "absolute"


@pytest.mark.parametrize("bound", ["bernstein", "betting"])
def test_relative_error_is_relative_to_the_answer(bound):
    rng = np.random.default_rng(6)
    values = (rng.random(20000) < 0.3).astype(np.float64)  # mean about 0.3
    truth = values.mean()
    absolute = aggregate_error_bound(values.size, lambda f: values[f], error=0.05, seed=1,
                                     value_range=(0, 1), bound=bound)
    relative = aggregate_error_bound(values.size, lambda f: values[f], error=0.05,
                                     relative=True, seed=1, value_range=(0, 1), bound=bound)
    assert absolute.error_kind == "absolute" and relative.error_kind == "relative"
    # 5% of 0.3 is a tighter target than 0.05 absolute: more calls
    assert relative.oracle_calls > absolute.oracle_calls
    assert abs(relative.estimate - truth) <= 0.05 * truth
    assert relative.details["met"]
    assert relative.ci_high - relative.ci_low <= 2 * 0.05 * relative.ci_high


def test_max_samples_stops_without_meeting_the_bound():
    values, _ = counts_population(7)
    res = aggregate_error_bound(values.size, lambda f: values[f], error=0.001, seed=0,
                                value_range=(0.0, values.max()), max_samples=200)
    assert res.oracle_calls == 200 and not res.exact and not res.details["met"]
    assert res.ci_low <= res.estimate <= res.ci_high


def _capped_half_widths(values, proxy, error, trials, cap=150):
    halves, hits = [], 0
    for seed in range(trials):
        res = aggregate_error_bound(values.size, lambda f: values[f], proxy=proxy, error=error,
                                    seed=seed, value_range=(0.0, values.max()), max_samples=cap)
        halves.append((res.ci_high - res.ci_low) / 2)
        hits += res.ci_low - 1e-12 <= values.mean() <= res.ci_high + 1e-12
    return np.array(halves), hits / trials


def test_a_cap_gives_the_interval_its_draws_allow_however_fine_the_error_asked():
    """Under a cap the bound is not reached, and the interval is about what the capped
    draws can resolve (a CLT interval's width is the yardstick): bets aimed at the error
    asked had almost no power, so ERROR WITHIN 0.001 gave ten times the width of 0.5."""
    values, _ = counts_population(4)
    clt = 1.96 * values.std() / np.sqrt(150)
    fine, _ = _capped_half_widths(values, None, 0.001, 5)
    assert np.median(fine) <= 1.6 * clt, (np.median(fine), clt)


@pytest.mark.parametrize("use_proxy", [False, True])
@pytest.mark.slow
def test_a_capped_interval_covers(use_proxy):
    values, proxy = counts_population(5)
    halves, coverage = _capped_half_widths(values, proxy if use_proxy else None, 0.001, TRIALS)
    assert coverage >= 0.93
    assert np.median(halves) <= 1.6 * 1.96 * values.std() / np.sqrt(150)


@pytest.mark.slow
def test_a_capped_ratio_interval_covers():
    stat, pred = ratio_population(11)
    truth, hits = stat[pred].mean(), 0
    for seed in range(TRIALS):
        res = aggregate_ratio_error_bound(stat.size, lambda f: (stat[f], pred[f]), error=0.001,
                                          seed=seed, value_range=(0.0, 20.0), max_samples=400)
        hits += res.ci_low <= truth <= res.ci_high
        assert not res.details["met"] and res.ci_high - res.ci_low < 4
    assert hits / TRIALS >= 0.93


def test_without_value_range_the_sample_range_is_used_and_said():
    values, _ = counts_population(8)
    res = aggregate_error_bound(values.size, lambda f: values[f], error=0.5, seed=0)
    assert res.details["range_source"] == "sample" and res.oracle_calls >= 30


def test_values_outside_declared_range_are_rejected():
    values, _ = counts_population(9)
    with pytest.raises(ParameterError, match="value_range"):
        aggregate_error_bound(values.size, lambda f: values[f], error=0.1, value_range=(0, 1))


def ratio_population(seed, n=5000):
    rng = np.random.default_rng(seed)
    pred = rng.random(n) < 0.2
    stat = np.where(pred, rng.gamma(3.0, 1.0, n).clip(0, 20), rng.gamma(1.0, 1.0, n).clip(0, 20))
    return stat, pred


@pytest.mark.parametrize("bound", ["bernstein", "betting"])
@pytest.mark.slow
def test_ratio_interval_covers_avg_with_predicate(bound):
    stat, pred = ratio_population(10, n=20000 if bound == "bernstein" else 5000)
    truth = stat[pred].mean()
    error = 0.6 if bound == "bernstein" else 0.3
    hits = within = 0
    for seed in range(TRIALS):
        res = aggregate_ratio_error_bound(stat.size, lambda f: (stat[f], pred[f]), error=error,
                                          seed=seed, value_range=(0.0, 20.0), bound=bound)
        hits += res.ci_low <= truth <= res.ci_high
        within += abs(res.estimate - truth) <= error
        assert res.oracle_calls < stat.size
    assert hits / TRIALS >= 0.93 and within / TRIALS >= 0.93


def test_ratio_exact_and_empty_predicate():
    stat, pred = ratio_population(11, n=200)
    res = aggregate_ratio_error_bound(200, lambda f: (stat[f], pred[f]), error=1e-9,
                                      value_range=(0, 20))
    assert res.exact and res.estimate == pytest.approx(stat[pred].mean())
    none = aggregate_ratio_error_bound(200, lambda f: (stat[f], np.zeros(f.size, bool)),
                                       error=0.1, value_range=(0, 20))
    assert none.exact and np.isnan(none.estimate) and not none.details["met"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(error=0), "error"), (dict(error=-1), "error"),
    (dict(error=0.1, confidence=1.0), "confidence"), (dict(error=0.1, confidence=0), "confidence"),
    (dict(error=0.1, batch=0), "batch"), (dict(error=0.1, max_samples=1), "max_samples"),
    (dict(error=0.1, value_range=(2, 1)), "value_range"), (dict(error=0.1, bound="x"), "bound"),
    (dict(error=0.1, proxy=np.ones(3)), "proxy"), (dict(error=0.1, seed=-1), "seed"),
])
def test_parameter_errors(kwargs, message):
    with pytest.raises(ParameterError, match=message):
        aggregate_error_bound(10, lambda f: np.zeros(f.size), **kwargs)


def test_bad_callback_output_is_an_oracle_error():
    with pytest.raises(OracleError):
        aggregate_error_bound(10, lambda f: np.zeros(f.size + 1), error=0.1, value_range=(0, 1))
    with pytest.raises(OracleError):
        aggregate_ratio_error_bound(10, lambda f: np.zeros(f.size), error=0.1)


@pytest.mark.parametrize("error", [1e6, 1e300])
@pytest.mark.parametrize("proxy_kind", ["none", "proxy", "range", "ratio"])
def test_a_huge_error_still_gives_a_valid_interval(error, proxy_kind):
    """An error far wider than the values (ERROR WITHIN 1e6) once gave a zero-width interval
    beside the truth: interval edges were located to within 1e-4 * error."""
    values, proxy = counts_population(3, n=4000)
    pred = values >= 3
    hits = 0
    for seed in range(TRIALS):
        if proxy_kind == "ratio":
            truth = values[pred].mean()
            res = aggregate_ratio_error_bound(values.size, lambda f: (values[f], pred[f]),
                                              error=error, seed=seed, bound="betting")
        else:
            truth = values.mean()
            res = aggregate_error_bound(
                values.size, lambda f: values[f], error=error, seed=seed, bound="betting",
                proxy=proxy if proxy_kind == "proxy" else None,
                value_range=(0.0, 30.0) if proxy_kind == "range" else None)
        assert res.ci_high > res.ci_low and np.isfinite([res.ci_low, res.ci_high]).all()
        hits += res.ci_low <= truth <= res.ci_high
    assert hits / TRIALS >= 0.93


@pytest.mark.slow
def test_a_huge_error_through_sql_on_a_real_clip(tmp_path):
    """The issue's case: ERROR WITHIN 1e6 on ua_detrac answered 11.968 [11.968, 11.968]
    while the truth is 11.504. Coverage itself is checked above with 200 trials."""
    import vidql
    from conftest import shared_path
    from vidql.datasets import read_labels

    video = shared_path("data", "ua_detrac.mp4")
    labels = shared_path("data", "ua_detrac.labels.csv")
    truth = (read_labels(labels).query("label == 'car'").groupby("frame").size()
             .reindex(range(252), fill_value=0).mean())
    covered = 0
    with vidql.connect(tmp_path / "a.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS v; CREATE ORACLE t FROM LABELS '{labels}'; "
               "SET ORACLE v = t;")
        for seed in range(10):
            row = db.sql(f"SELECT AVG(objects('car')) FROM v ERROR WITHIN 1e6 "
                         f"SEED {seed}").df().iloc[0]
            assert row["ci_low"] < row["estimate"] < row["ci_high"]
            covered += row["ci_low"] <= truth <= row["ci_high"]
    assert covered >= 8


@pytest.mark.slow
@pytest.mark.parametrize("cap", [45, 300])
def test_capped_ratio_covers_with_few_positives(cap):
    """AVG(x) WHERE p ERROR WITHIN e ORACLE BUDGET n (issue 33, item 2): a cap that stops the
    sample with a positive or two left a point interval read off them ([2, 2] for 5.24),
    covering 44% here; the interval is unbounded until 30 positives give a range, and covers
    in >= 93% of 200 seeds. Positives carry more of the statistic than other frames."""
    rng = np.random.default_rng(5)
    n = 909
    pred = np.zeros(n, bool)
    pred[rng.choice(n, 90 if cap == 300 else 40, replace=False)] = True
    stat = rng.poisson(3, n).astype(float)
    stat[pred] = rng.poisson(5.2, pred.sum()) + rng.integers(0, 4, pred.sum())
    truth = stat[pred].mean()
    covered = []
    for seed in range(200):
        r = aggregate_ratio_error_bound(n, lambda f: (stat[f], pred[f]), error=0.3, seed=seed,
                                        max_samples=cap)
        covered.append(np.isnan(r.estimate) or r.ci_low <= truth <= r.ci_high)
    assert np.mean(covered) >= 0.93
