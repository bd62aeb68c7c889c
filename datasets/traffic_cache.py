"""On-disk cache of synthetic traffic videos and their truth, generated once per parameters."""
from __future__ import annotations

import os
from pathlib import Path

from .labelfile import write_labels
from .synthetic import TrafficScene
from .traffic_model import GENERATOR_VERSION
from .traffic_writer import generate_traffic


def traffic_cache_stem(n_frames: int, *, seed: int = 0, width: int = 320, height: int = 180) -> str:
    """File name stem that encodes the parameters and the generator version."""
    return f"traffic-v{GENERATOR_VERSION}-n{int(n_frames)}-s{int(seed)}-{int(width)}x{int(height)}"


def ensure_traffic(cache_dir: str | os.PathLike, n_frames: int, *, seed: int = 0,
                   width: int = 320, height: int = 180, progress: bool = False
                   ) -> tuple[Path, Path]:
    """(video, labels) paths of a synthetic traffic video in `cache_dir`, generating them
    on first use. Each file is renamed into place only when complete, the labels (Parquet)
    last, so existing labels mean a complete pair; an interrupted run is redone."""
    TrafficScene(n_frames, width, height, seed)  # validates the parameters before any I/O
    cache_dir = Path(cache_dir)
    stem = traffic_cache_stem(n_frames, seed=seed, width=width, height=height)
    video = cache_dir / f"{stem}.mp4"
    labels = cache_dir / f"{stem}.labels.parquet"
    if not (video.is_file() and labels.is_file()):
        labels.unlink(missing_ok=True)
        truth = generate_traffic(video, n_frames, width=width, height=height, seed=seed,
                                 progress=progress)
        write_labels(truth, labels)
    return video, labels
