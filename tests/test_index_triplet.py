"""Label closeness, triplet sampling, the triplet network and the pretrained embedder."""
import numpy as np
import pandas as pd
import pytest
import torch
from test_index_source import CountingOracle, ToyTraffic

from vidql.base.errors import VidqlError
from vidql.indexes.network import cpu_threads
from vidql.indexes import (TastiIndex, find_pretrained_weights, label_closeness,
                           pretrained_embeddings, sample_triplets, train_triplet_network)


def boxes(rows):
    return pd.DataFrame(rows, columns=["frame", "label", "score", "x1", "y1", "x2", "y2"])


def test_closeness_needs_same_counts_and_matching_boxes():
    labels = boxes([
        (0, "car", 1, 10, 10, 20, 20), (0, "car", 1, 50, 10, 60, 20),
        (1, "car", 1, 52, 11, 62, 21), (1, "car", 1, 12, 9, 22, 19),  # same cars, listed swapped
        (2, "car", 1, 10, 10, 20, 20), (2, "car", 1, 90, 10, 100, 20),  # one car moved far
        (3, "car", 1, 10, 10, 20, 20),  # one car only
        (4, "car", 1, 10, 10, 20, 20), (4, "bus", 1, 50, 10, 60, 20),  # a bus instead
    ])
    frames = np.array([0, 1, 2, 3, 4, 5, 6])  # 5 and 6: labelled, nothing detected
    counts, close = label_closeness(labels, frames, box_tol=1.0)
    assert counts.tolist() == [[0, 2], [0, 2], [0, 2], [0, 1], [1, 1], [0, 0], [0, 0]]
    expected = np.eye(7, dtype=bool)
    expected[0, 1] = expected[1, 0] = expected[5, 6] = expected[6, 5] = True
    assert np.array_equal(close, expected)
    _, loose = label_closeness(labels, frames, box_tol=10.0)
    assert loose[0, 2] and not loose[0, 3]


def test_triplets_pair_close_frames_far_apart_in_time_against_non_close_ones():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 3, size=(60, 2))
    close = (counts[:, None, :] == counts[None, :, :]).all(axis=2)
    times = np.arange(60) * 10
    rows = sample_triplets(close, counts, times, rng)
    assert len(rows) == 60 and len(np.unique(rows[:, 0])) == 60
    a, p, n = rows.T
    assert close[a, p].all() and not close[a, n].any()
    far_exists = np.array([(close[i] & (np.abs(times - times[i]) > 30)).any() for i in a])
    assert (np.abs(times[a] - times[p])[far_exists] > 30).all()
    gap = np.abs(counts[a] - counts[n]).sum(axis=1)
    assert (gap == 1).mean() > 0.5  # near-miss negatives: counts one apart


def test_triplet_training_pulls_close_frames_together():
    toy = ToyTraffic(n_frames=600, seed=5)
    frames = np.arange(0, 600, 3)
    counts, close = label_closeness(toy.labels, frames)
    model, fit = train_triplet_network(toy.read(frames), close, counts, frames, dim=16,
                                       triplets=1500, seed=0, progress=False)
    assert fit["triplets"] >= 1500 and np.isfinite(fit["final_loss"])
    with torch.inference_mode():
        from vidql.indexes.network import to_tensor
        z = model(to_tensor(toy.read(frames))).numpy()
    d = np.linalg.norm(z[:, None] - z[None], axis=2)
    off_diagonal = ~np.eye(len(frames), dtype=bool)
    assert d[close & off_diagonal].mean() < 0.5 * d[~close].mean()


def test_pretrained_weights_are_never_invented(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(VidqlError, match="never downloads"):
        find_pretrained_weights()
    with pytest.raises(VidqlError, match="does not exist"):
        find_pretrained_weights(tmp_path / "missing.pth")
    toy = ToyTraffic(n_frames=40)
    oracle = CountingOracle(toy.labels)
    with pytest.raises(VidqlError, match="never downloads"):
        TastiIndex.build(toy, oracle, embedder="pretrained", progress=False)
    with pytest.raises(VidqlError, match="does not exist"):
        TastiIndex.build(toy, oracle, weights=tmp_path / "missing.pth", progress=False)
    assert oracle.calls == 0


def test_pretrained_embedder_loads_local_weights_from_the_hub_cache(tmp_path, monkeypatch):
    import torchvision

    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.manual_seed(0)  # a stand-in weights file: what matters here is that it is found
    torch.save(torchvision.models.resnet18(weights=None).state_dict(),
               checkpoints / "resnet18-f37072fd.pth")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    assert find_pretrained_weights().name == "resnet18-f37072fd.pth"
    toy = ToyTraffic(n_frames=30)
    emb = pretrained_embeddings(toy, size=(64, 36), progress=False)
    assert emb.shape == (30, 512) and np.isfinite(emb).all() and emb.std() > 0
    small = ToyTraffic(n_frames=200, seed=1)
    index = TastiIndex.build(small, CountingOracle(small.labels), reps=30, embedder="pretrained",
                             progress=False)
    assert index.embeddings.shape == (200, 512) and index.stats["oracle_calls"] == 30
    mined = TastiIndex.build(small, CountingOracle(small.labels), embedder="triplet", train=20,
                             reps=40, triplets=64, progress=False)
    assert mined.stats["mining_embedding"] == "pretrained ResNet-18"
    assert mined.embeddings.shape == (200, 128)
    (checkpoints / "resnet18-f37072fd.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(VidqlError, match="cannot load"):
        pretrained_embeddings(toy, size=(64, 36), progress=False)


def test_training_is_seeded_without_touching_torch_global_state():
    toy = ToyTraffic(n_frames=300, seed=5)
    frames = np.arange(0, 300, 3)
    counts, close = label_closeness(toy.labels, frames)
    torch.manual_seed(123)
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    runs = [train_triplet_network(toy.read(frames), close, counts, frames, dim=8, triplets=200,
                                  seed=4, progress=False)[0] for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads
    with torch.inference_mode():
        from vidql.indexes.network import to_tensor
        z = [m(to_tensor(toy.read(frames[:10]))) for m in runs]
    assert torch.equal(z[0], z[1])  # the same seed trains the same network


def test_held_out_frames_stop_training_before_the_cap():
    toy = ToyTraffic(n_frames=300, seed=5)
    frames = np.arange(0, 300, 3)
    counts, close = label_closeness(toy.labels, frames)
    with cpu_threads(1):
        _, fit = train_triplet_network(toy.read(frames), close, counts, frames, dim=8, lr=0.05,
                                       triplets=100_000, min_window=300, seed=0,
                                       progress=False)
    assert fit["held_out_frames"] == 15 and fit["triplets"] < 100_000
    assert fit["best_at_triplets"] < fit["triplets"] and np.isfinite(fit["held_out_loss"])


def test_held_out_triplets_are_scored_a_few_at_a_time(monkeypatch):
    """Scoring the held-out triplets 256 at a time (768 images in one forward pass) raised
    the build's peak RSS by 70-115 MB at 1000 training frames: no evaluation pass may see
    more than 64 triplets' images."""
    from vidql.indexes.network import CompactCNN

    toy = ToyTraffic(n_frames=600, seed=5)
    frames = np.arange(0, 600, 2)
    counts, close = label_closeness(toy.labels, frames)
    seen = []
    forward = CompactCNN.forward
    monkeypatch.setattr(CompactCNN, "forward", lambda self, x: seen.append(
        (torch.is_inference_mode_enabled(), len(x))) or forward(self, x))
    with cpu_threads(1):
        train_triplet_network(toy.read(frames), close, counts, frames, dim=8, triplets=600,
                              min_held_out=8, holdout=0.5, seed=0, progress=False)
    scored = [n for inference, n in seen if inference]
    assert scored and sum(scored) > 3 * 64  # more than one part
    assert max(scored) <= 3 * 64
