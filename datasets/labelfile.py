"""Detection label files: `frame,label,score,x1,y1,x2,y2`, as CSV or Parquet by suffix.

The same format as `../shared/data/*.labels.csv`: one row per detection, frames numbered
from 0, boxes in pixels; frames without detections have no rows. Labels of a collection
have a `clip` column too (the clip's name; frames numbered within the clip).
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from vidql.detections import DETECTION_COLUMNS, FLOAT_COLUMNS
from vidql.errors import VidqlError
from vidql.files import atomic_path

LABEL_COLUMNS = DETECTION_COLUMNS
_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def _format(path: Path) -> str:
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise VidqlError(f"label file '{path}': unknown suffix '{path.suffix}'; "
                         f"use one of {', '.join(_FORMATS)}")
    return fmt


def _validated(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The label columns in order with their dtypes; VidqlError naming what is wrong."""
    missing = [c for c in LABEL_COLUMNS if c not in df.columns]
    if missing:
        raise VidqlError(f"label file '{path}' lacks column(s) {', '.join(missing)}; "
                         f"expected {','.join(LABEL_COLUMNS)}")
    out = {}
    for col in ["frame"] + FLOAT_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna()
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise VidqlError(f"label file '{path}': column '{col}' has a missing or non-numeric "
                             f"value {df[col].iloc[row]!r} in data row {row + 1}")
        out[col] = values.astype("float64")
    frame = out["frame"]
    if ((frame % 1 != 0) | (frame < 0)).any():
        raise VidqlError(f"label file '{path}': column 'frame' must hold non-negative integers")
    out["frame"] = frame.astype("int64")
    if df["label"].isna().any():
        raise VidqlError(f"label file '{path}': column 'label' has a missing value")
    out["label"] = df["label"].astype("str")
    columns = LABEL_COLUMNS
    if "clip" in df.columns:
        if df["clip"].isna().any():
            raise VidqlError(f"label file '{path}': column 'clip' has a missing value")
        out["clip"] = df["clip"].astype("str")
        columns = ["clip"] + LABEL_COLUMNS
    return pd.DataFrame({c: out[c] for c in columns}).reset_index(drop=True)


def write_labels(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write detections to `path` (.csv, or .parquet/.pq); the file appears only when complete."""
    path = Path(path)
    data = _validated(df, path)
    fmt = _format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if fmt == "csv":
            data.to_csv(tmp, index=False)
        else:
            data.to_parquet(tmp, index=False)
    return path


def read_labels(path: str | os.PathLike) -> pd.DataFrame:
    """Read a label file written by `write_labels` or in the shared CSV format: columns
    frame (int64), label (str), score and x1, y1, x2, y2 (float64), and clip (str) when
    present; others are dropped."""
    path = Path(path)
    fmt = _format(path)
    if not path.is_file():
        raise VidqlError(f"label file '{path}' does not exist")
    try:
        if fmt == "csv":
            df = pd.read_csv(path, dtype={"label": "str"}, keep_default_na=False,
                             na_values={c: [""] for c in ["frame"] + FLOAT_COLUMNS})
        else:
            df = pd.read_parquet(path)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise VidqlError(f"label file '{path}' cannot be read as {fmt}: {exc}") from exc
    return _validated(df, path)
