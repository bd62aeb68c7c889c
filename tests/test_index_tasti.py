"""The TASTI index on an in-memory toy video: proxy quality, oracle use, persistence,
invalidation and cracking."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from test_index_source import CountingOracle, ToyTraffic

import vidql.indexes.tasti as tasti
from vidql.base.errors import ParameterError, QueryError, VidqlError
from vidql.engine.sql.framestat import frame_statistic
from vidql.indexes import IndexMismatchError, TastiIndex, nearest

N_FRAMES = 3000
CAR = "objects('car')"


@pytest.fixture(scope="module")
def toy():
    return ToyTraffic(n_frames=N_FRAMES, seed=0)


@pytest.fixture(scope="module")
def built(toy):
    """A triplet index and the oracle it used."""
    oracle = CountingOracle(toy.labels)
    index = TastiIndex.build(toy, oracle, embedder="triplet", train=150, reps=300, k=5, seed=0,
                             triplets=3000,
                             progress=False, identity={"video": "toy-0", "oracle": "truth"})
    return index, oracle


def fresh_pixel_index(toy, reps=200, seed=0):
    return TastiIndex.build(toy, CountingOracle(toy.labels), reps=reps, embedder="pixel",
                            seed=seed, progress=False)


def unlabelled(index):
    mask = np.ones(index.n_frames, dtype=bool)
    mask[index.rep_frames] = False
    return mask


def test_triplet_index_ranks_car_counts_far_better_than_random(built, toy):
    index, oracle = built
    truth = toy.truth(CAR)
    proxy = index.proxy(frame_statistic(CAR))
    mask = unlabelled(index)
    rho = spearmanr(proxy[mask], truth[mask])[0]
    assert rho >= 0.6, rho  # random order gives |rho| < 0.05 at this size
    assert index.stats["embedding"] == "triplet CNN" and index.stats["triplets"] >= 3000


def test_oracle_called_once_per_representative_and_nothing_else(built):
    index, oracle = built  # CountingOracle fails on a repeated frame
    assert index.stats["oracle_calls"] == oracle.calls == len(index.rep_frames) == 300
    assert set(index.rep_frames.tolist()) == oracle.asked
    assert np.array_equal(index.labelled_frames, np.sort(index.rep_frames))
    assert index.embeddings.shape == (N_FRAMES, 128) and index.embeddings.dtype == np.float32
    assert set(index.stats["seconds"]) >= {"mining_embedding", "train", "embedding", "knn"}


def test_proxies_are_exact_at_labelled_frames_finite_and_cached(built, toy):
    index, _ = built
    for expr in (CAR, "contains('bus')", "objects('car') >= 3", "objects(*) + objects('person')"):
        proxy = index.proxy(frame_statistic(expr))
        assert proxy.dtype == np.float64 and proxy.shape == (N_FRAMES,)
        assert np.isfinite(proxy).all()
        assert np.array_equal(proxy[index.rep_frames], toy.truth(expr)[index.rep_frames])
    assert index.proxy(frame_statistic(CAR)) is index.proxy(frame_statistic("objects( 'car' )"))  # same statistic, one cache entry
    with pytest.raises(ValueError):
        index.proxy(frame_statistic(CAR))[0] = 1.0  # cached arrays are read-only
    with pytest.raises(QueryError):
        index.proxy(frame_statistic("1 + 1"))


def test_rare_class_predicate_separates_positives(built, toy):
    index, _ = built
    truth = toy.truth("contains('bus')")
    proxy = index.proxy(frame_statistic("contains('bus')"))
    mask = unlabelled(index)
    assert truth[mask].any()
    top = np.argsort(-proxy[mask])[: int(truth[mask].sum())]
    precision_at_k = truth[mask][top].mean()
    assert precision_at_k > 10 * truth[mask].mean()


def test_save_load_gives_identical_proxies_without_recomputing(built, tmp_path, monkeypatch):
    index, _ = built
    before = index.proxy(frame_statistic(CAR)).copy()
    index.save(tmp_path / "idx")
    loaded = TastiIndex.load(tmp_path / "idx", expect={"video": "toy-0"})

    def fail(*args, **kwargs):
        raise AssertionError("recomputed after load")

    monkeypatch.setattr(tasti, "propagate", fail)
    monkeypatch.setattr(tasti, "nearest", fail)
    assert np.array_equal(loaded.proxy(frame_statistic(CAR)), before)
    assert isinstance(loaded.embeddings, np.memmap)
    assert np.array_equal(loaded.embeddings, index.embeddings)
    assert np.array_equal(loaded.rep_frames, index.rep_frames)
    assert loaded.stats == index.stats and loaded.identity == index.identity
    monkeypatch.undo()
    files = sorted((tmp_path / "idx").rglob("*"))
    new = loaded.proxy(frame_statistic("contains('person')"))  # computed from stored neighbours, in memory only
    assert np.array_equal(new, index.proxy(frame_statistic("contains('person')")))
    assert sorted((tmp_path / "idx").rglob("*")) == files  # proxy() never writes
    stamp = (tmp_path / "idx" / "distances.npy").stat().st_mtime_ns
    loaded.save(tmp_path / "idx")  # adds the new proxy file, rewrites nothing else
    assert (tmp_path / "idx" / "distances.npy").stat().st_mtime_ns == stamp
    monkeypatch.setattr(tasti, "propagate", fail)
    assert np.array_equal(TastiIndex.load(tmp_path / "idx").proxy(frame_statistic("contains('person')")), new)


def test_load_with_mismatched_identity_or_missing_index_raises(built, tmp_path):
    index, _ = built
    index.save(tmp_path / "idx")
    TastiIndex.load(tmp_path / "idx", expect={"video": "toy-0", "oracle": "truth"})
    with pytest.raises(IndexMismatchError, match="video.*toy-1.*rebuilt"):
        TastiIndex.load(tmp_path / "idx", expect={"video": "toy-1"})
    with pytest.raises(IndexMismatchError, match="oracle"):
        TastiIndex.load(tmp_path / "idx", expect={"oracle": "yolox:abc"})
    assert issubclass(IndexMismatchError, VidqlError)
    with pytest.raises(VidqlError, match="no readable TASTI index"):
        TastiIndex.load(tmp_path / "nothing")
    (tmp_path / "idx" / "positions.npy").unlink()
    with pytest.raises(VidqlError, match="rebuild"):
        TastiIndex.load(tmp_path / "idx")


def test_cracking_makes_new_frames_exact_and_equals_a_full_search(toy):
    index = fresh_pixel_index(toy)
    truth = toy.truth(CAR)
    before = index.proxy(frame_statistic(CAR)).copy()
    rng = np.random.default_rng(7)
    frames = rng.choice(np.flatnonzero(unlabelled(index)), size=300, replace=False)
    detections = toy.labels[toy.labels["frame"].isin(frames)]
    assert index.add_labels(detections, frames) == 300
    after = index.proxy(frame_statistic(CAR))
    assert np.array_equal(after[frames], truth[frames])
    assert np.abs(after - truth).mean() < np.abs(before - truth).mean()
    dist, pos = nearest(index.embeddings, index.embeddings[index.rep_frames], index.k)
    # faiss computes |x|^2 + |y|^2 - 2xy in float32: squared distances agree up to that rounding
    scale = float((index.embeddings.astype(np.float64) ** 2).sum(axis=1).max())
    assert np.allclose(index.distances ** 2, dist ** 2, rtol=1e-4, atol=1e-5 * scale)
    assert (index.positions == pos).mean() > 0.99  # up to ties
    assert index.add_labels(detections, frames) == 0  # already representatives
    with pytest.raises(ParameterError):
        index.add_labels(detections, [N_FRAMES])


def test_cracking_a_saved_index_appends_to_it_and_replaces_its_proxies(toy, tmp_path):
    index = fresh_pixel_index(toy, reps=100)
    d = index.save(tmp_path / "idx")
    old = index.proxy(frame_statistic(CAR)).copy()
    index.save(d)
    assert len(list((d / "proxies").glob("*.npy"))) == 1
    frames = np.flatnonzero(unlabelled(index))[:50]
    files = {p: p.stat().st_mtime_ns for p in d.rglob("*")}
    index.add_labels(toy.labels[toy.labels["frame"].isin(frames)], frames)
    assert {p: p.stat().st_mtime_ns for p in d.rglob("*")} == files  # no disk I/O
    new = index.proxy(frame_statistic(CAR))
    assert not np.array_equal(new, old)
    index.save(d)
    for name in ("distances.npy", "positions.npy", "rep_frames.npy", "labels.parquet",
                 "embeddings.npy"):
        assert (d / name).stat().st_mtime_ns == files[d / name]  # appended, not rewritten
    assert sorted(p.name for p in (d / "cracks").iterdir()) == ["1.npz", "1.parquet"]
    assert len(list((d / "proxies").glob("*.npy"))) == 1  # the stale proxy is gone
    reloaded = TastiIndex.load(d)
    assert len(reloaded.rep_frames) == 150
    assert np.array_equal(reloaded.proxy(frame_statistic(CAR)), new)
    assert np.array_equal(reloaded.positions, index.positions)
    assert np.array_equal(reloaded.distances, index.distances)
    pd.testing.assert_frame_equal(reloaded.labels, index.labels)


def test_incremental_cracking_equals_a_full_recompute(toy, tmp_path):
    index = fresh_pixel_index(toy, reps=100)
    d = index.save(tmp_path / "idx")
    rng = np.random.default_rng(3)
    for _ in range(3):  # cracks saved one after another, then reloaded
        frames = rng.choice(np.flatnonzero(unlabelled(index)), size=40, replace=False)
        index.add_labels(toy.labels[toy.labels["frame"].isin(frames)], frames)
        index.save(d)
        index = TastiIndex.load(d)
    dist, pos = nearest(index.embeddings, index.embeddings[index.rep_frames], index.k)
    full = TastiIndex(embeddings=index.embeddings, rep_frames=index.rep_frames,
                      labels=index.labels, distances=dist, positions=pos, k=index.k)
    scale = float((np.asarray(index.embeddings, dtype=np.float64) ** 2).sum(axis=1).max())
    assert np.allclose(index.distances ** 2, dist ** 2, rtol=1e-4, atol=1e-5 * scale)
    for expr in (CAR, "contains('bus')"):
        assert np.allclose(index.proxy(frame_statistic(expr)), full.proxy(frame_statistic(expr)), rtol=1e-4, atol=1e-6)


def test_pixel_index_uses_reps_labels_and_seeds_reproduce(toy):
    a = fresh_pixel_index(toy, reps=120, seed=3)
    b = fresh_pixel_index(toy, reps=120, seed=3)
    assert a.stats["oracle_calls"] == 120
    assert np.array_equal(a.rep_frames, b.rep_frames)
    assert np.array_equal(a.proxy(frame_statistic(CAR)), b.proxy(frame_statistic(CAR)))


def test_labels_that_are_all_alike_fall_back_to_the_mining_embedding():
    toy = ToyTraffic(n_frames=400, seed=2, rates={"car": 0.0})
    oracle = CountingOracle(toy.labels.iloc[:0])  # the oracle sees nothing anywhere
    index = TastiIndex.build(toy, oracle, embedder="triplet", train=40, reps=60, progress=False)
    assert index.stats["triplets"] == 0 and "no triplets" in index.stats["embedding"]
    assert np.array_equal(index.proxy(frame_statistic(CAR)), np.zeros(400))


def test_bad_parameters_raise_before_any_oracle_call(toy):
    oracle = CountingOracle(toy.labels)
    with pytest.raises(ParameterError):
        TastiIndex.build(toy, oracle, embedder="resnet", progress=False)
    with pytest.raises(ParameterError):
        TastiIndex.build(toy, oracle, k=0, progress=False)
    assert oracle.calls == 0


def test_label_fn_columns_are_checked(toy):
    def bad_oracle(frames):
        return pd.DataFrame({"frame": frames})

    with pytest.raises(VidqlError, match="lack column"):
        TastiIndex.build(toy, bad_oracle, reps=20, embedder="pixel", progress=False)


CRACKER = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_index_source import ToyTraffic
from vidql.indexes import TastiIndex
from vidql.engine.sql.framestat import frame_statistic
toy = ToyTraffic(n_frames={n}, seed=0)
index = TastiIndex.load({d!r})
rng = np.random.default_rng(0)
for step in range(1, 10_000):
    free = np.setdiff1d(np.arange(index.n_frames), index.rep_frames)
    frames = rng.choice(free, size=5, replace=False)
    index.add_labels(toy.labels[toy.labels["frame"].isin(frames)], frames)
    index.proxy(frame_statistic("objects('car')"))
    index.save({d!r})
    with open({marker!r}, "a") as fh:
        fh.write(f"{{step}}\\n")
"""


def test_sigkill_while_cracking_leaves_a_loadable_consistent_index(toy, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    index = fresh_pixel_index(toy, reps=100)
    d, marker = index.save(tmp_path / "idx"), tmp_path / "saves.txt"
    script = CRACKER.format(tests=str(Path(__file__).parent), n=N_FRAMES, d=str(d),
                            marker=str(marker))
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not (marker.exists() and len(marker.read_text().split()) >= 8):
        if child.poll() is not None:
            pytest.fail(f"child ended early: {child.stderr.read().decode()}")
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    saved = len(marker.read_text().split())
    loaded = TastiIndex.load(d)
    assert len(loaded.rep_frames) - 100 in (5 * saved, 5 * saved + 5)
    assert set(loaded.labels["frame"]) <= set(loaded.rep_frames.tolist())
    dist, _ = nearest(loaded.embeddings, loaded.embeddings[loaded.rep_frames], loaded.k)
    scale = float((np.asarray(loaded.embeddings, dtype=np.float64) ** 2).sum(axis=1).max())
    assert np.allclose(loaded.distances ** 2, dist ** 2, rtol=1e-4, atol=1e-5 * scale)
    truth = toy.truth(CAR)
    assert np.array_equal(loaded.proxy(frame_statistic(CAR))[loaded.rep_frames], truth[loaded.rep_frames])
