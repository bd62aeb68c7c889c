"""Detections, the one currency of labels: a DataFrame with DETECTION_COLUMNS (`frame, label,
score, x1, y1, x2, y2`), one row per detected object, boxes in original pixels; a frame
without detections has no row. Oracles return them, label files and indexes store them."""
from __future__ import annotations

import numpy as np
import pandas as pd

DETECTION_COLUMNS = ["frame", "label", "score", "x1", "y1", "x2", "y2"]
FLOAT_COLUMNS = DETECTION_COLUMNS[2:]


def empty_detections() -> pd.DataFrame:
    """No detections, with the standard dtypes."""
    return pd.DataFrame({"frame": pd.Series(dtype="int64"), "label": pd.Series(dtype="str"),
                         **{c: pd.Series(dtype="float64") for c in FLOAT_COLUMNS}})


def detections_frame(rows: list[tuple]) -> pd.DataFrame:
    """DataFrame from (frame, label, score, x1, y1, x2, y2) tuples, with the standard dtypes."""
    if not rows:
        return empty_detections()
    return with_dtypes(pd.DataFrame(rows, columns=DETECTION_COLUMNS))


def missing_columns(df: pd.DataFrame) -> list[str]:
    """The DETECTION_COLUMNS `df` lacks."""
    return [c for c in DETECTION_COLUMNS if c not in df.columns]


def with_dtypes(df) -> pd.DataFrame:
    """A new DataFrame of the DETECTION_COLUMNS of `df` (a DataFrame, keeping its index, or
    a mapping of column arrays) in the standard dtypes, built at once: a column assigned at
    a time costs three times as much."""
    return pd.DataFrame({"frame": np.asarray(df["frame"]).astype("int64", copy=False),
                         "label": pd.array(np.asarray(df["label"]), dtype="str"),
                         **{c: np.asarray(df[c]).astype("float64", copy=False)
                            for c in FLOAT_COLUMNS}},
                        index=df.index if isinstance(df, pd.DataFrame) else None)
