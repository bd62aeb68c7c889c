"""Issue 32 trial: the oracle's own detector (YOLOX-Nano) run at a low input size on every
frame as the proxy, scored against the labels it makes at 416 px on the shared real clips.

Per clip and statistic: the zero-shot quality of the low-res detector's per-class evidence
(sum and max over anchors of objectness x class score, and its detections after NMS at
scores >= 0.5 / 0.3 / 0.2 / 0.1 / 0.05), and with 50 labelled frames (six seeds) a ridge
fit on that evidence and a TASTI index over it built as the default one is (principal
components with the class counts read off them, k = 5, probe + neighbours), beside the
default index (`--default`, EfficientNet-Lite0). Needs ../shared and the `onnx` package
(not a vidql dependency), which resizes the model's input.

    .venv/bin/python scripts/detector_proxy_trial.py --size 224 [--default] [--out trial.json]
    .venv/bin/python scripts/detector_proxy_trial.py --time   # ms per frame at each size
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.linear_model import RidgeCV
from sklearn.metrics import roc_auc_score

from vidql.bench.scenarios_index import CountingLabels, engine_source
from vidql.datasets import read_labels
from vidql.engine.labels.oracle_api import COCO_CLASSES
from vidql.engine.labels.oracle_models import OnnxDetector
from vidql.engine.sql.framestat import evaluate, frame_statistic
from vidql.indexes import TastiIndex, nearest
from vidql.indexes.countspace import class_counts, count_space, map_rows
from vidql.indexes.embedders import Projection
from vidql.indexes.fpf import farthest_point_first, random_representatives
from vidql.indexes.tasti import EMBEDDER_SHORT_SIDE

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODEL = SHARED / "models/yolox_nano.onnx"
CLIPS = {  # the index bench's statistics of each clip (`_clip_statistics`)
    "hangzhou_junction_720p.mp4": ["objects('car')", "objects('truck')", "objects('person')",
                                   "contains('person')"],
    "highway.avi": ["objects('car')", "objects('truck')", "contains('truck')", "objects('bird')",
                    "contains('bird')"],
    "indoor_people.mp4": ["objects('person')", "contains('person')", "objects('tv')",
                          "contains('tv')"],
    "residential_street.mp4": ["objects('car')", "objects('truck')", "contains('truck')"],
    "ua_detrac.mp4": ["objects('car')", "objects('truck')", "contains('truck')", "objects('bus')",
                      "contains('bus')"],
}
THRESHOLDS = (0.5, 0.3, 0.2, 0.1, 0.05)
GROUPS = ("sum", "max", *(f"n>={t}" for t in THRESHOLDS))
SEEDS, LABELS, DIM = range(6), 50, 25


def resized_detector(size: int, folder: Path) -> OnnxDetector:
    """YOLOX-Nano taking size x size images, any batch (its Reshapes copy the batch
    dimension instead of fixing it at 1), keeping detections down to the lowest threshold."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(MODEL)
    graph = model.graph
    for dim, value in zip(graph.input[0].type.tensor_type.shape.dim, ("N", 3, size, size), strict=True):
        dim.Clear()
        setattr(dim, "dim_param" if isinstance(value, str) else "dim_value", value)
    for dim in graph.output[0].type.tensor_type.shape.dim[:2]:
        dim.Clear()
    del graph.value_info[:]
    shapes = {node.input[1] for node in graph.node if node.op_type == "Reshape"}
    for tensor in graph.initializer:
        if tensor.name in shapes:
            shape = numpy_helper.to_array(tensor).copy()
            shape[0] = 0  # 0: the input's batch
            tensor.CopyFrom(numpy_helper.from_array(shape, tensor.name))
    path = folder / f"yolox_nano_{size}.onnx"
    onnx.save(model, path)
    detector = OnnxDetector(f"yolox@{size}", path, score=min(THRESHOLDS), layout="yolox")
    detector.threads_chosen = True  # its default threads: the trial scores, `--time` times
    return detector


def rgb_batches(video: Path, batch: int = 32):
    with av.open(str(video)) as container:
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) == batch:
                yield np.stack(frames)
                frames = []
        if frames:
            yield np.stack(frames)


def evidence(detector: OnnxDetector, video: Path) -> np.ndarray:
    """n_frames x (80 * len(GROUPS)) per-class evidence of the low-res detector."""
    rows, seen = [], 0
    for frames in rgb_batches(video):
        blobs = detector.prepare(frames).blobs
        raw = detector.session.run(None, {detector.input_name: blobs})[0]
        scores = raw[:, :, 4:5] * raw[:, :, 5:]
        found = detector.detect(frames, np.arange(seen, seen + len(frames)))
        counts = [pd.crosstab(found["frame"][found["score"] >= t], found["label"][found["score"] >= t])
                  .reindex(index=range(seen, seen + len(frames)), columns=list(COCO_CLASSES),
                           fill_value=0).to_numpy(np.float32) for t in THRESHOLDS]
        rows.append(np.concatenate([scores.sum(1), scores.max(1), *counts], axis=1))
        seen += len(frames)
    return np.concatenate(rows)


def quality(expr: str, proxy: np.ndarray, truth: np.ndarray) -> float:
    if expr.startswith("contains"):
        return float(roc_auc_score(truth > 0, proxy))
    return float(spearmanr(proxy, truth)[0]) if np.ptp(proxy) else float("nan")


def embedding(features: np.ndarray) -> np.ndarray:
    """The square-rooted evidence, standardised, on its top DIM principal components."""
    x = np.sqrt(features[:, features.std(0) > 1e-3])
    x = (x - x.mean(0)) / x.std(0)
    return np.ascontiguousarray(Projection.fit(x, DIM, 0).project(x))


def index_proxies(emb: np.ndarray, detections: pd.DataFrame, stats: list[str], seed: int):
    """(labelled frames, proxies) of a TASTI index over `emb` built as the default one:
    a quarter of LABELS random, the rest by FPF, class counts read off the embedding."""
    n = len(emb)
    rep = random_representatives(n, LABELS, seed=seed + 1)
    rep = np.concatenate([rep, farthest_point_first(emb, LABELS - len(rep), initial=rep,
                                                    seed=seed + 1)])
    labels = detections[detections["frame"].isin(rep)].reset_index(drop=True)
    matrix = count_space(emb[rep], class_counts(labels, rep)[0])
    emb = emb if matrix is None else np.ascontiguousarray(map_rows(emb, matrix))
    distances, positions = nearest(emb, emb[rep], 5)
    index = TastiIndex(embeddings=emb, rep_frames=rep, labels=labels, distances=distances,
                       positions=positions, k=5, config={"embedder": "efficientnet"})
    return rep, {e: index.proxy(frame_statistic(e)) for e in stats}


def default_index(video: Path, detections: pd.DataFrame, stats: list[str], seed: int):
    source = engine_source(video)
    size = source.proxy_size(EMBEDDER_SHORT_SIDE["efficientnet"])
    index = TastiIndex.build(source, CountingLabels(detections), seed=seed, size=size,
                             progress=False, threads=1)
    return index.rep_frames, {e: index.proxy(frame_statistic(e)) for e in stats}


def score_clip(video: Path, features: np.ndarray, with_default: bool) -> dict:
    stats = CLIPS[video.name]
    detections = read_labels(video.with_suffix(".labels.csv"))
    n = len(features)
    every = np.arange(n)
    truths = {e: evaluate(e, detections, every) for e in stats}
    out = {"zero_shot": {}}
    for e in stats:
        cls = COCO_CLASSES.index(e.split("'")[1])
        out["zero_shot"][e] = {g: round(quality(e, features[:, i * 80 + cls], truths[e]), 4)
                               for i, g in enumerate(GROUPS)}
    x = np.sqrt(features[:, features.std(0) > 1e-3])
    x = (x - x.mean(0)) / x.std(0)
    emb = embedding(features)
    methods = {"ridge50": [], "index50": [], **({"default index": []} if with_default else {})}
    for seed in SEEDS:
        picked = np.sort(np.random.default_rng(seed).choice(n, LABELS, replace=False))
        fits = {e: RidgeCV(alphas=np.logspace(-2, 4, 13)).fit(x[picked], truths[e][picked]).predict(x)
                for e in stats}
        methods["ridge50"].append((picked, fits))
        methods["index50"].append(index_proxies(emb, detections, stats, seed))
        if with_default:
            methods["default index"].append(default_index(video, detections, stats, seed))
    for method, runs in methods.items():
        out[method] = {e: round(float(np.nanmean([quality(e, p[e][np.setdiff1d(every, f)],
                                                          truths[e][np.setdiff1d(every, f)])
                                                  for f, p in runs])), 4) for e in stats}
    return out


def time_sizes(folder: Path, sizes=(160, 224, 256, 320, 416), batch: int = 8) -> dict:
    """Best-of-5 ms per frame of the network alone at each size, one intra-op thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    frames = np.random.default_rng(0).integers(0, 256, (batch, 720, 1280, 3), dtype=np.uint8)
    best = {}
    for _ in range(5):
        for size in sizes:
            detector = resized_detector(size, folder)
            session = ort.InferenceSession(str(detector.path), options,
                                           providers=["CPUExecutionProvider"])
            blobs = detector.prepare(frames).blobs
            session.run(None, {detector.input_name: blobs})
            start = time.perf_counter()
            session.run(None, {detector.input_name: blobs})
            ms = 1000 * (time.perf_counter() - start) / batch
            best[size] = round(min(best.get(size, ms), ms), 2)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--default", action="store_true", help="score the default index too")
    parser.add_argument("--time", action="store_true", help="only time the network per size")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.time:
            result = time_sizes(Path(folder))
        else:
            detector = resized_detector(args.size, Path(folder))
            result = {name: score_clip(SHARED / "data" / name,
                                       evidence(detector, SHARED / "data" / name), args.default)
                      for name in CLIPS}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
