"""Growing a TASTI index with a clip appended to a collection (`TastiIndex.extend`): only
the new clip is embedded and labelled, the proxy on it is about as good as a rebuild's,
and the grown index saves, loads and cracks like any other."""
import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from test_index_source import CountingOracle

import vidql.indexes.tasti as tasti
import vidql.indexes.triplet as triplet
from vidql.datasets import ensure_traffic, read_labels
from vidql.engine.sql.framestat import evaluate, frame_statistic
from vidql.base.errors import ParameterError, VidqlError
from vidql.indexes import TastiIndex
from vidql.preprocess import probe_video
from vidql.preprocess.concat import ConcatSource, LowResSource

CAR = "objects('car')"


def traffic_clips(cache, n_frames, seeds=(1, 7)):
    """LowResSources of synthetic traffic clips (different streets and traffic) and their
    labels at collection positions (each clip's frames after the clips before it)."""
    sources, parts, offset = [], [], 0
    for seed in seeds:
        video, labels = ensure_traffic(cache, n_frames, seed=seed, width=160, height=90)
        sources.append(LowResSource(probe_video(video)))
        parts.append(read_labels(labels).assign(frame=lambda d, o=offset: d["frame"] + o))
        offset += n_frames
    return sources, pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return traffic_clips(tmp_path_factory.mktemp("clips"), 2000)


def pixel_build(source, oracle, **options):
    return TastiIndex.build(source, oracle, embedder="pixel", size=source.proxy_size(),
                            progress=False, **options)


@pytest.fixture(scope="module")
def extended(clips):
    """A pixel index built on clip A, then extended with clip B; its oracle."""
    (a, b), labels = clips
    oracle = CountingOracle(labels)
    index = pixel_build(ConcatSource([a]), oracle)
    built_calls = oracle.calls
    index.extend(ConcatSource([a, b]), oracle, progress=False)
    return index, oracle, built_calls


def car_rho(index, labels, frames):
    truth = evaluate(CAR, labels, frames)
    return spearmanr(index.proxy(frame_statistic(CAR))[frames], truth)[0]


def test_concat_source_places_each_clip_after_the_last_at_one_size(clips):
    (a, b), _ = clips
    both = ConcatSource([a, b])
    assert both.n_frames == a.n_frames + b.n_frames and both.proxy_size() == a.proxy_size()
    w, h = both.proxy_size(24)
    positions = [0, a.n_frames - 1, a.n_frames, both.n_frames - 1]
    frames = both.read(positions[::-1], size=(w, h))
    assert frames.shape == (4, h, w, 3) and frames.dtype == np.uint8
    assert np.array_equal(frames[0], b.read([b.n_frames - 1], size=(w, h))[0])
    assert np.array_equal(frames[1], b.read([0], size=(w, h))[0])
    assert np.array_equal(frames[3], a.read([0], size=(w, h))[0])
    batches = list(both.iter_batches(300, a.n_frames - 10, a.n_frames + 5, size=(w, h)))
    assert [list(p) for p, _ in batches] == [list(range(a.n_frames - 10, a.n_frames)),
                                             list(range(a.n_frames, a.n_frames + 5))]
    assert np.array_equal(batches[1][1][0], frames[1])
    with pytest.raises(ParameterError, match="out of range"):
        both.read([both.n_frames])


def test_extend_labels_only_frames_of_the_new_clip(extended, clips):
    index, oracle, built_calls = extended
    (a, b), _ = clips
    n_a = a.n_frames
    added = index.stats["extensions"][0]
    assert index.n_frames == n_a + b.n_frames and len(index.positions) == index.n_frames
    assert oracle.calls - built_calls == added["oracle_calls"] == added["reps"] == 50
    new_reps = index.rep_frames[index.rep_frames >= n_a]
    assert len(new_reps) == 50 and len(index.rep_frames) == built_calls + 50
    assert set(oracle.asked) - set(index.rep_frames[:built_calls].tolist()) == set(new_reps.tolist())
    assert added["frames"] == [n_a, n_a + b.n_frames] and added["seconds"]["total"] > 0
    assert index.extend(ConcatSource([a, b]), oracle, progress=False) == 0  # nothing new
    with pytest.raises(ParameterError, match="fewer than"):
        index.extend(ConcatSource([a]), oracle, progress=False)


def test_extend_labels_as_many_new_representatives_as_asked(clips):
    (a, b), labels = clips
    oracle = CountingOracle(labels)
    index = pixel_build(ConcatSource([a]), oracle)
    with pytest.raises(ParameterError, match=r"reps \(new representatives\) must lie in \[1, 2000\]"):
        index.extend(ConcatSource([a, b]), oracle, reps=0, progress=False)
    assert index.n_frames == a.n_frames and oracle.calls == 50  # refused before any work
    index.extend(ConcatSource([a, b]), oracle, reps=120, progress=False)
    assert index.stats["extensions"][0]["oracle_calls"] == oracle.calls - 50 == 120
    assert (index.rep_frames >= a.n_frames).sum() == 120


def test_extended_neighbours_are_the_nearest_among_all_representatives(extended):
    index, _, _ = extended
    dist, pos = tasti.nearest(index.embeddings, index.embeddings[index.rep_frames], index.k)
    same = (np.sort(index.positions, axis=1) == np.sort(pos, axis=1)).all(axis=1)
    assert same.mean() > 0.99  # float rounding in near ties aside
    assert np.allclose(index.distances[same], dist[same], rtol=1e-3, atol=1.0)


def test_extended_proxy_on_the_new_clip_is_close_to_a_rebuild(extended, clips):
    index, _, _ = extended
    (a, b), labels = clips
    rebuilt = pixel_build(ConcatSource([a, b]), CountingOracle(labels))
    frames = np.setdiff1d(np.arange(a.n_frames, index.n_frames),
                          np.concatenate([index.rep_frames, rebuilt.rep_frames]))
    rho_extended, rho_rebuilt = car_rho(index, labels, frames), car_rho(rebuilt, labels, frames)
    assert rho_extended >= rho_rebuilt - 0.05, (rho_extended, rho_rebuilt)
    assert rho_extended > 0.5


def test_extended_index_saves_by_appending_and_loads_the_same(clips, tmp_path):
    (a, b), labels = clips
    oracle = CountingOracle(labels)
    index = pixel_build(ConcatSource([a]), oracle)
    index.save(tmp_path / "idx")
    distances_stamp = (tmp_path / "idx" / "distances.npy").stat().st_mtime_ns
    embeddings_file = (tmp_path / "idx" / "embeddings.npy").stat().st_ino
    loaded = TastiIndex.load(tmp_path / "idx")
    assert loaded.extend(ConcatSource([a, b]), oracle, progress=False) == b.n_frames
    before = loaded.proxy(frame_statistic(CAR)).copy()
    loaded.save(tmp_path / "idx")
    assert (tmp_path / "idx" / "distances.npy").stat().st_mtime_ns == distances_stamp
    assert (tmp_path / "idx" / "cracks" / "1.npz").is_file()  # the growth, appended
    assert (tmp_path / "idx" / "embeddings.npy").stat().st_ino == embeddings_file  # in place
    assert isinstance(loaded.embeddings, np.memmap)  # mapped again, not kept in memory
    again = TastiIndex.load(tmp_path / "idx")
    assert again.n_frames == index.n_frames + b.n_frames
    assert np.array_equal(np.asarray(again.embeddings), loaded.embeddings)
    assert np.array_equal(again.proxy(frame_statistic(CAR)), before)  # saved with it
    fresh = again.proxy(frame_statistic(f"{CAR} * 1"))  # not saved: from loaded neighbours
    assert np.array_equal(fresh, before)
    assert again.stats["extensions"] == loaded.stats["extensions"]
    elsewhere = TastiIndex.load(loaded.save(tmp_path / "copy"))  # rewritten whole
    assert np.array_equal(elsewhere.proxy(frame_statistic(CAR)), before)


def test_interrupted_append_leaves_the_saved_index_readable(clips, tmp_path, monkeypatch):
    (a, b), labels = clips
    oracle = CountingOracle(labels)
    index = pixel_build(ConcatSource([a]), oracle)
    index.save(tmp_path / "idx")
    size = (tmp_path / "idx" / "embeddings.npy").stat().st_size
    index.extend(ConcatSource([a, b]), oracle, progress=False)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tasti.np, "savez", crash)  # the crack file, after the embeddings
    with pytest.raises(OSError):
        index.save(tmp_path / "idx")
    monkeypatch.undo()
    assert (tmp_path / "idx" / "embeddings.npy").stat().st_size > size  # rows appended
    reread = TastiIndex.load(tmp_path / "idx")
    assert reread.n_frames == a.n_frames and np.array_equal(reread.rep_frames,
                                                            index.rep_frames[:len(reread.rep_frames)])
    index.save(tmp_path / "idx")
    assert TastiIndex.load(tmp_path / "idx").n_frames == index.n_frames


def test_cracking_after_extend_updates_the_grown_index(clips, tmp_path):
    (a, b), labels = clips
    oracle = CountingOracle(labels)
    index = pixel_build(ConcatSource([a]), oracle)
    index.save(tmp_path / "idx")
    index.extend(ConcatSource([a, b]), oracle, progress=False)
    index.save(tmp_path / "idx")
    frames = np.setdiff1d(np.arange(a.n_frames + 100, a.n_frames + 140), index.rep_frames)[:20]
    assert index.add_labels(oracle(frames), frames) == 20
    truth = evaluate(CAR, labels, frames)
    assert np.array_equal(index.proxy(frame_statistic(CAR))[frames], truth)
    index.save(tmp_path / "idx")
    loaded = TastiIndex.load(tmp_path / "idx")
    assert np.isin(frames, loaded.labelled_frames).all()
    assert np.array_equal(loaded.proxy(frame_statistic(CAR)), index.proxy(frame_statistic(CAR)))


def test_triplet_network_is_saved_and_embeds_the_new_clip_without_retraining(tmp_path,
                                                                              monkeypatch):
    (a, b), labels = traffic_clips(tmp_path, 600)
    index = TastiIndex.build(ConcatSource([a]), CountingOracle(labels), size=a.proxy_size(),
                             embedder="triplet", train=60, reps=60, triplets=1500, progress=False,
                             threads=1)
    assert index.stats["embedding"] == "triplet CNN" and index.encoder.kind == "network"
    index.save(tmp_path / "idx")
    loaded = TastiIndex.load(tmp_path / "idx")
    assert loaded.encoder is None  # read only when needed

    def no_training(*args, **kwargs):
        raise AssertionError("extend retrained the network")

    monkeypatch.setattr(triplet, "train_triplet_network", no_training)
    both = ConcatSource([a, b])
    for grown in (index, loaded):
        grown.extend(both, CountingOracle(labels), progress=False)
    assert np.allclose(loaded.embeddings, index.embeddings, atol=1e-5)
    assert np.array_equal(loaded.rep_frames, index.rep_frames)
    assert loaded.extension_reps(600) == 60 == index.stats["extensions"][0]["reps"]


def test_index_saved_without_its_encoder_cannot_extend(clips, tmp_path):
    (a, b), labels = clips
    index = pixel_build(ConcatSource([a]), CountingOracle(labels), reps=40)
    index.save(tmp_path / "idx")
    (tmp_path / "idx" / "pixel_pca.npz").unlink()
    with pytest.raises(VidqlError, match="unreadable.*REFRESH INDEX"):
        TastiIndex.load(tmp_path / "idx").extend(ConcatSource([a, b]), CountingOracle(labels))
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    del meta["encoder"]  # as an older vidql saved it
    (tmp_path / "idx" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VidqlError, match="without its embedding network.*REFRESH INDEX"):
        TastiIndex.load(tmp_path / "idx").extend(ConcatSource([a, b]), CountingOracle(labels))


@pytest.mark.slow
def test_triplet_extension_rho_is_close_to_a_rebuild(tmp_path):
    (a, b), labels = traffic_clips(tmp_path, 4000)
    oracle = CountingOracle(labels)
    index = TastiIndex.build(ConcatSource([a]), oracle, size=a.proxy_size(), embedder="triplet",
                             progress=False)
    index.extend(ConcatSource([a, b]), oracle, progress=False)
    assert index.stats["extensions"][0]["oracle_calls"] == 80
    rebuilt = TastiIndex.build(ConcatSource([a, b]), CountingOracle(labels), size=a.proxy_size(),
                               embedder="triplet", progress=False)
    frames = np.setdiff1d(np.arange(a.n_frames, index.n_frames),
                          np.concatenate([index.rep_frames, rebuilt.rep_frames]))
    rho_extended, rho_rebuilt = car_rho(index, labels, frames), car_rho(rebuilt, labels, frames)
    assert rho_extended >= rho_rebuilt - 0.05, (rho_extended, rho_rebuilt)
