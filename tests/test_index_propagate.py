"""k-NN to representatives, the merge used by cracking, and score propagation."""
import numpy as np

from vidql.indexes import merge_nearest, nearest, propagate


def naive_propagate(rep_values, positions, distances, exact_frames, eps):
    out = []
    for i in range(len(positions)):
        num = den = 0.0
        for j, d in zip(positions[i], distances[i], strict=True):
            w = 1.0 / (max(float(d), 0.0) + eps)
            num += w * rep_values[j]
            den += w
        out.append(num / den)
    out = np.array(out)
    for j, f in enumerate(exact_frames):
        out[f] = rep_values[j]
    return out


def test_nearest_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    base = rng.normal(size=(30, 16)).astype(np.float32)
    dist, pos = nearest(x, base, 4, chunk=64)
    full = np.linalg.norm(x[:, None] - base[None], axis=2)
    assert np.array_equal(pos, np.argsort(full, axis=1)[:, :4])
    assert np.allclose(dist, np.sort(full, axis=1)[:, :4], atol=1e-4)
    assert nearest(x, base[:2], 5)[1].shape == (400, 2)  # k capped at the number of reps


def test_propagation_matches_naive_loop_and_is_exact_at_labelled_frames():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    reps = rng.choice(200, size=20, replace=False)
    values = rng.poisson(3, size=20).astype(float)
    dist, pos = nearest(x, x[reps], 5)
    got = propagate(values, pos, dist, exact_frames=reps, eps=1e-6)
    assert np.allclose(got, naive_propagate(values, pos, dist, reps, 1e-6))
    assert np.array_equal(got[reps], values)
    assert got.min() >= values.min() and got.max() <= values.max()


def test_no_nan_with_k1_zero_distances_and_duplicates():
    x = np.zeros((50, 3), dtype=np.float32)  # every frame identical: all distances 0
    reps = np.array([3, 9])
    values = np.array([2.0, 4.0])
    for k in (1, 2):
        dist, pos = nearest(x, x[reps], k)
        got = propagate(values, pos, dist, exact_frames=reps)
        assert np.isfinite(got).all()
        assert got[3] == 2.0 and got[9] == 4.0
        assert np.all((got >= 2.0) & (got <= 4.0))
    # negative rounding noise in distances does not break the weights
    got = propagate(values, np.array([[0, 1]]), np.array([[-1e-7, 0.0]], dtype=np.float32))
    assert np.isfinite(got).all() and 2.0 <= got[0] <= 4.0


def test_propagation_in_chunks_equals_one_pass():
    rng = np.random.default_rng(2)
    pos = rng.integers(0, 10, size=(1000, 3)).astype(np.int32)
    dist = rng.random((1000, 3)).astype(np.float32)
    values = rng.random(10)
    assert np.allclose(propagate(values, pos, dist, chunk=77), propagate(values, pos, dist))


def test_merge_equals_search_over_the_union():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    old, new = x[:12], x[100:105]
    d1, p1 = nearest(x, old, 5)
    d2, p2 = nearest(x, new, 5)
    d, p = merge_nearest(d1, p1, d2, p2 + 12, 5)
    dd, pp = nearest(x, np.concatenate([old, new]), 5)
    assert np.allclose(d, dd, atol=1e-5)
    assert (p == pp).mean() > 0.99  # equal up to ties between exact duplicates
