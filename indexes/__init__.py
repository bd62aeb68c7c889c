"""Frame embedders and the TASTI index: representatives, FAISS k-NN, score propagation.

Names load with their modules on first use, so reading an index's proxies does not load
torch (only building, extending or encoding does)."""
from importlib import import_module

from .propagate import propagate as propagate  # numpy only; its module has its name

_LAZY = {
    "embed_source": "embedders", "find_pretrained_weights": "embedders",
    "fit_pixel_embeddings": "embedders", "pixel_embeddings": "embedders",
    "pretrained_backbone": "embedders", "pretrained_embeddings": "embedders",
    "FrameEncoder": "encoder", "farthest_point_first": "fpf", "random_representatives": "fpf",
    "merge_nearest": "neighbours", "nearest": "neighbours", "CompactCNN": "network",
    "EMBEDDERS": "tasti", "IndexMismatchError": "tasti",
    "TastiIndex": "tasti", "label_closeness": "triplet", "sample_triplets": "triplet",
    "train_triplet_network": "triplet",
}

__all__ = sorted([*_LAZY, "propagate"])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'vidql.indexes' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
