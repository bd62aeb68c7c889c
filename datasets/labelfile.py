"""Detection label files: `frame,label,score,x1,y1,x2,y2`, as CSV or Parquet by suffix.

The same format as `../shared/data/*.labels.csv`: one row per detection, frames numbered
from 0, boxes in pixels; frames without detections have no rows. Labels of a collection
have a `clip` column too (the clip's name; frames numbered within the clip), and a clip
that was labelled but has no detection at all is named by a row with an empty label (its
other columns may be empty): such a row is no detection (`write_labels(..., clips=...)`
writes them).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from vidql.base.detections import DETECTION_COLUMNS, FLOAT_COLUMNS
from vidql.base.errors import VidqlError
from vidql.base.files import atomic_path

LABEL_COLUMNS = DETECTION_COLUMNS
TEXT_COLUMNS = ("clip", "label")
_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def _format(path: Path) -> str:
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise VidqlError(f"label file '{path}': unknown suffix '{path.suffix}'; "
                         f"use one of {', '.join(_FORMATS)}")
    return fmt


def _check_present(names, path: Path) -> list[str]:
    """The columns to read, in order (clip first when present); VidqlError naming missing ones."""
    missing = [c for c in LABEL_COLUMNS if c not in names]
    if missing:
        raise VidqlError(f"label file '{path}' lacks column(s) {', '.join(missing)}; "
                         f"expected {','.join(LABEL_COLUMNS)}")
    return (["clip"] if "clip" in names else []) + LABEL_COLUMNS


def _numbers(name: str, column: pd.Series, path: Path) -> np.ndarray:
    """Column `name` as float64 (frame: int64); VidqlError naming a bad value's row."""
    values = pd.to_numeric(column, errors="coerce")
    bad = values.isna()
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise VidqlError(f"label file '{path}': column '{name}' has a missing or non-numeric "
                         f"value {column.iloc[row]!r} in data row {row + 1}")
    values = values.to_numpy(dtype=np.float64)
    if name != "frame":
        return values
    if ((values % 1 != 0) | (values < 0)).any():
        raise VidqlError(f"label file '{path}': column 'frame' must hold non-negative integers")
    return values.astype(np.int64)


def _categories(name: str, column: pd.Series, path: Path) -> pd.Categorical:
    """Text column `name` as a Categorical of str (codes, not a string per row)."""
    if column.isna().any():
        raise VidqlError(f"label file '{path}': column '{name}' has a missing value")
    values = column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column)
    if not all(isinstance(c, str) for c in values.categories):
        values = pd.Categorical(column.astype("str"))
    return values


def _column_reader(path: Path, fmt: str) -> tuple[list[str], Callable[[str], pd.Series]]:
    """(the label columns to read, in order; a function reading one of them as pandas, at
    most once each). Parquet is read a column at a time."""
    if fmt == "csv":
        df = pd.read_csv(path, dtype={"label": "str"}, keep_default_na=False,
                         na_values={c: [""] for c in ["frame"] + FLOAT_COLUMNS})
        return _check_present(df.columns, path), df.pop
    parquet = pq.ParquetFile(path)
    return (_check_present(parquet.schema_arrow.names, path),
            lambda name: _parquet_column(parquet, name))


def _detection_rows(label: pd.Series) -> np.ndarray | None:
    """Which rows are detections (None: all): a row with an empty or missing label only
    says that its clip was labelled."""
    marker = label.isna().to_numpy() | (label == "").to_numpy()
    return ~marker if marker.any() else None


def _checked(name: str, column: pd.Series, keep: np.ndarray | None, path: Path):
    """Column `name` checked, of the detection rows `keep` only; the clip column keeps the
    names of clips that have no detection row among its categories."""
    if name == "clip":
        values = _categories(name, column, path)
        return values if keep is None else values[keep]
    if keep is not None:
        column = column[keep]
    if name == "label":
        return _categories(name, column, path).remove_unused_categories()
    return _numbers(name, column, path)


def _checked_columns(path: Path, fmt: str) -> Iterator[tuple[str, np.ndarray | pd.Categorical]]:
    names, read = _column_reader(path, fmt)
    label = read("label")
    keep = _detection_rows(label)
    for name in names:
        yield name, _checked(name, label if name == "label" else read(name), keep, path)


def _parquet_column(parquet, name: str) -> pd.Series:
    """Column `name` of a ParquetFile as pandas, text dictionary-encoded, copied out of
    Arrow's memory pool, which is then emptied (it would keep freed columns)."""
    column = parquet.read(columns=[name], use_threads=False).column(name)
    if name in TEXT_COLUMNS and (pa.types.is_string(column.type)
                                 or pa.types.is_large_string(column.type)):
        column = column.dictionary_encode()
    values = column.to_pandas().copy(deep=True)
    del column
    pa.default_memory_pool().release_unused()
    return values


def read_label_columns(path: str | os.PathLike) -> Iterator[tuple[str, np.ndarray | pd.Categorical]]:
    """The checked columns of a label file, one at a time, in order: clip (when present) and
    label as Categoricals of str, frame as int64, score and the box as float64. A caller
    that keeps each column compactly never holds the whole table (see `read_labels`)."""
    path = Path(path)
    fmt = _format(path)
    if not path.is_file():
        raise VidqlError(f"label file '{path}' does not exist")
    try:
        yield from _checked_columns(path, fmt)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise VidqlError(f"label file '{path}' cannot be read as {fmt}: {exc}") from exc


def read_labels(path: str | os.PathLike) -> pd.DataFrame:
    """Read a label file written by `write_labels` or in the shared CSV format: columns
    frame (int64), label (str), score and x1, y1, x2, y2 (float64), and clip (str) when
    present; others are dropped."""
    return pd.DataFrame({name: pd.Series(values).astype("str") if name in TEXT_COLUMNS else values
                         for name, values in read_label_columns(path)})


def _validated(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The label columns in order with their dtypes; VidqlError naming what is wrong."""
    out = {}
    for name in _check_present(df.columns, path):
        if name in TEXT_COLUMNS:
            out[name] = pd.Series(_categories(name, df[name], path)).astype("str")
        else:
            out[name] = _numbers(name, df[name], path)
    return pd.DataFrame(out)


def _with_empty_clips(data: pd.DataFrame, clips, path: Path) -> pd.DataFrame:
    """`data` and a row with an empty label for each of `clips` that has no detection."""
    if "clip" not in data:
        raise VidqlError(f"label file '{path}': clips are named only in a file with a 'clip' "
                         "column")
    empty = [c for c in dict.fromkeys(map(str, clips)) if c not in set(data["clip"])]
    markers = pd.DataFrame({"clip": empty, "label": ""})
    return pd.concat([data.astype({"frame": "Int64"}), markers], ignore_index=True)[data.columns]


def write_labels(df: pd.DataFrame, path: str | os.PathLike, *, clips=()) -> Path:
    """Write detections to `path` (.csv, or .parquet/.pq); the file appears only when complete.
    `clips`: the clips that were labelled; each one without a detection gets a row with an
    empty label, which says it was labelled and nothing was found."""
    path = Path(path)
    data = _validated(df, path)
    if len(clips):
        data = _with_empty_clips(data, clips, path)
    fmt = _format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if fmt == "csv":
            data.to_csv(tmp, index=False)
        else:
            data.to_parquet(tmp, index=False)
    return path
