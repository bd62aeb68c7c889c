"""Frame embedders and the TASTI index: representatives, FAISS k-NN, score propagation."""
from .embedders import (embed_source, find_pretrained_weights, fit_pixel_embeddings,
                        pixel_embeddings, pretrained_backbone, pretrained_embeddings)
from .encoder import FrameEncoder
from .fpf import farthest_point_first, random_representatives
from .neighbours import merge_nearest, nearest
from .network import CompactCNN
from .propagate import propagate
from .tasti import EMBEDDERS, IndexMismatchError, TastiIndex
from .triplet import label_closeness, sample_triplets, train_triplet_network

__all__ = [
    "CompactCNN", "EMBEDDERS", "FrameEncoder", "IndexMismatchError", "TastiIndex",
    "random_representatives", "embed_source", "farthest_point_first", "find_pretrained_weights",
    "fit_pixel_embeddings", "label_closeness",
    "merge_nearest", "nearest", "pixel_embeddings", "pretrained_backbone",
    "pretrained_embeddings", "propagate", "sample_triplets", "train_triplet_network",
]
