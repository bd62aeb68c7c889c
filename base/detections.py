"""Detections, the one currency of labels: a DataFrame with DETECTION_COLUMNS (`frame, label,
score, x1, y1, x2, y2`), one row per detected object, boxes in original pixels; a frame
without detections has no row. Oracles return them, label files and indexes store them;
the label cache passes them as `DetectionArrays`, the same columns as arrays."""
from __future__ import annotations

from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class DetectionArrays:
    """Detections as arrays, as the label cache keeps an oracle batch: `frame` (int64),
    `codes` (int32) into `names` (the labels), and `values` (m×5: score, x1, y1, x2, y2) in
    float64 or in a narrower dtype that holds them exactly, as the oracle has them (a
    detector's float32, a table's whole pixels as integers), so that nothing converts them
    and back before they are journalled; `to_frame` gives float64. Counting, journalling
    and shifting them costs no DataFrame."""

    frame: np.ndarray
    codes: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame) -> "DetectionArrays":
        """New arrays of a DETECTION_COLUMNS DataFrame; a missing label gets code -1."""
        label = df["label"] if df["label"].dtype == "str" else df["label"].astype("str")
        codes, names = pd.factorize(label.array)
        values = np.empty((len(df), len(FLOAT_COLUMNS)))
        for i, c in enumerate(FLOAT_COLUMNS):
            values[:, i] = df[c].to_numpy()
        return cls(df["frame"].to_numpy().astype(np.int64), codes.astype(np.int32),
                   tuple(str(n) for n in names), values)

    @classmethod
    def concat(cls, parts: list["DetectionArrays"]) -> "DetectionArrays":
        """One set of the detections of `parts`, in order, their names merged."""
        names = tuple(dict.fromkeys(n for p in parts for n in p.names))
        codes = [np.asarray([names.index(n) for n in p.names], dtype=np.int32)[p.codes]
                 if p.names != names else p.codes for p in parts]
        return cls(np.concatenate([p.frame for p in parts] or [np.zeros(0, np.int64)]),
                   np.concatenate(codes or [np.zeros(0, np.int32)]), names,
                   np.concatenate([p.values for p in parts] or [np.zeros((0, len(FLOAT_COLUMNS)))]))

    def __len__(self) -> int:
        return len(self.frame)

    def rows_in(self, frames: np.ndarray) -> np.ndarray:
        """Each detection's position in `frames` (distinct frame numbers, in any order), -1
        where its frame is not there."""
        frames = np.asarray(frames)
        if not len(frames):
            return np.full(len(self.frame), -1, dtype=np.int64)
        if (frames[1:] > frames[:-1]).all() and (self.frame[1:] >= self.frame[:-1]).all():
            # both ascending (an oracle's usual output): each frame's run of detections,
            # found by a search per frame instead of one per detection (5x faster)
            first = np.searchsorted(self.frame, frames, side="left")
            count = np.searchsorted(self.frame, frames, side="right") - first
            if count.sum() == len(self.frame):  # else some are elsewhere: the general way
                return np.repeat(np.arange(len(frames)), count)
        order = np.argsort(frames, kind="stable")
        at = np.minimum(np.searchsorted(frames, self.frame, sorter=order), len(frames) - 1)
        rows = order[at]
        return np.where(frames[rows] == self.frame, rows, -1)

    def label_code(self, label: str) -> int:
        """The code of `label`, or -1 when no detection has it."""
        return self.names.index(label) if label in self.names else -1

    def shifted(self, by: int) -> "DetectionArrays":
        """The same detections with `by` added to every frame number."""
        return replace(self, frame=self.frame + by)

    def where(self, keep: np.ndarray) -> "DetectionArrays":
        """The detections where boolean `keep` holds."""
        return replace(self, frame=self.frame[keep], codes=self.codes[keep],
                       values=self.values[keep])

    def to_frame(self) -> pd.DataFrame:
        """The DETECTION_COLUMNS DataFrame, in the standard dtypes."""
        return with_dtypes({"frame": self.frame,
                            "label": np.asarray(self.names, dtype=object)[self.codes],
                            **{c: self.values[:, i] for i, c in enumerate(FLOAT_COLUMNS)}})
