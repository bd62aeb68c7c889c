"""How an index embeds frames, kept with it so that frames added later (a clip appended to a
collection) embed exactly as the frames it was built on: the trained triplet network, the
pixel embedding's PCA projection, or a pretrained network's weights file (and for
EfficientNet-Lite0 the projection of its features)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vidql.base.errors import VidqlError
from vidql.base.files import atomic_path

from .embedders import (IMAGENET_MEAN, IMAGENET_STD, PixelPCA, Projection, efficientnet_embedder,
                        embed_source, network_embedder, pretrained_backbone)
from .network import CompactCNN

KINDS = ("network", "pixel", "pretrained", "efficientnet")
FILES = {"network": "network.pt", "pixel": "pixel_pca.npz", "efficientnet": "efficientnet_pca.npz"}


class FrameEncoder:
    """One of KINDS: 'network' (`model`, a CompactCNN with `dim` outputs), 'pixel'
    (`model`, a PixelPCA), 'pretrained' (`weights`, the ResNet-18 file) or 'efficientnet'
    (`weights`, EfficientNet-Lite0's file, None for the packaged one, and `model`, the
    Projection of its grid features: principal components fitted on the video's frames,
    with the class counts read off them appended, or for indexes saved before there was
    one, seeded Gaussian directions)."""

    def __init__(self, kind: str, model=None, *, weights: str | Path | None = None):
        if kind not in KINDS:
            raise ValueError(f"encoder kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.model = kind, model
        self.weights = None if weights is None else str(weights)

    def __repr__(self) -> str:
        return f"FrameEncoder({self.kind!r})"

    def embed(self, source, start: int, stop: int, *, size: tuple[int, int],
              progress: bool = True) -> np.ndarray:
        """float32 embeddings of frames [start, stop) of `source`, read at `size`."""
        if self.kind == "pixel":
            fn, dim, batch = self.model, self.model.dim, 256
        elif self.kind == "network":
            fn, dim, batch = network_embedder(self.model), self.model.head.out_features, 256
        elif self.kind == "efficientnet":
            fn, dim, batch = efficientnet_embedder(self.weights, self.model), self.model.dim, 64
        else:
            fn = network_embedder(pretrained_backbone(self.weights), mean=IMAGENET_MEAN,
                                  std=IMAGENET_STD)
            dim, batch = 512, 128
        return embed_source(source, fn, dim, size=size, batch_size=batch, start=start,
                            stop=stop, desc=f"{self.kind} embedding", progress=progress,
                            network=self.kind != "pixel")

    def save(self, directory: Path) -> dict:
        """Write the encoder's file into `directory`; returns its metadata entry."""
        entry = {"kind": self.kind}
        if self.kind == "network":
            state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            with atomic_path(directory / FILES["network"], ".pt") as tmp:
                torch.save({"dim": self.model.head.out_features, "state": state}, tmp)
        elif self.kind in ("pixel", "efficientnet"):
            extra = {"thumb": np.asarray(self.model.thumb)} if self.kind == "pixel" else {}
            with atomic_path(directory / FILES[self.kind], ".npz") as tmp, open(tmp, "wb") as fh:
                np.savez(fh, mean=self.model.mean, components=self.model.components, **extra)
        if self.kind in ("pretrained", "efficientnet"):
            entry["weights"] = self.weights
        return entry

    @classmethod
    def load(cls, directory: Path, entry: dict | None) -> "FrameEncoder":
        """The encoder saved in `directory` under metadata `entry`; a VidqlError says to
        refresh the index when it has none (saved by an older vidql) or it is unreadable."""
        if not entry:
            raise VidqlError(f"the index in '{directory}' was saved without its embedding network "
                             "(an older vidql), so new frames cannot be embedded like the old "
                             "ones: REFRESH INDEX to rebuild it")
        kind = entry["kind"]
        try:
            if kind == "network":
                saved = torch.load(directory / FILES["network"], map_location="cpu",
                                   weights_only=True)
                model = CompactCNN(out_dim=int(saved["dim"]))
                model.load_state_dict(saved["state"])
                return cls(kind, model.eval())
            if kind == "pixel":
                with np.load(directory / FILES["pixel"]) as z:
                    return cls(kind, PixelPCA(tuple(z["thumb"]), z["mean"], z["components"]))
            if kind == "efficientnet":
                return cls(kind, efficientnet_projection(directory, entry),
                           weights=entry.get("weights"))
        except (OSError, KeyError, RuntimeError, ValueError) as exc:
            raise VidqlError(f"the embedding network of the index in '{directory}' is unreadable "
                             f"({exc}): REFRESH INDEX to rebuild it") from None
        return cls(kind, weights=entry.get("weights"))


def efficientnet_projection(directory: Path, entry: dict) -> Projection:
    """The projection saved in `directory`; for an entry saved before projections were
    fitted (it names the Gaussian one's `dim` and `seed`), those seeded directions."""
    from .efficientnet_lite import GRID_FEATURES, seeded_directions

    if "seed" in entry:
        return Projection(np.zeros(GRID_FEATURES, np.float32),
                          seeded_directions(int(entry["dim"]), int(entry["seed"])))
    with np.load(directory / FILES["efficientnet"]) as z:
        return Projection(z["mean"], z["components"])
