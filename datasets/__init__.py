"""Synthetic video with ground truth, label importers and named benchmark datasets."""
from .labelfile import LABEL_COLUMNS, read_label_columns, read_labels, write_labels
from .synthetic import TrafficScene
from .traffic_model import GENERATOR_VERSION, LABELS
from .traffic_writer import generate_traffic
from .traffic_cache import ensure_traffic, traffic_cache_stem

__all__ = ["GENERATOR_VERSION", "LABELS", "LABEL_COLUMNS", "TrafficScene", "ensure_traffic",
           "generate_traffic", "read_label_columns", "read_labels", "traffic_cache_stem",
           "write_labels"]
