"""The oracle interface: a batch of frames in, detections out, with a stable identity.

`detect` returns a DataFrame with DETECTION_COLUMNS (vidql.base.detections), the contract a
user's oracle keeps; the label cache (engine.labelcache), the only caller, asks
`detect_in_clip` for DetectionArrays, which an oracle that has arrays already (the LABELS
oracle's table, a detector's decoded output) returns without a DataFrame.
"""
from __future__ import annotations

import difflib
import hashlib
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import pandas as pd

from vidql.base.errors import OracleError, QueryError
from vidql.base.detections import DetectionArrays, missing_columns

COCO_CLASSES = (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant "
    "stop_sign parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe "
    "backpack umbrella handbag tie suitcase frisbee skis snowboard sports_ball kite "
    "baseball_bat baseball_glove skateboard surfboard tennis_racket bottle wine_glass cup fork "
    "knife spoon bowl banana apple sandwich orange broccoli carrot hot_dog pizza donut cake "
    "chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear "
    "hair_drier toothbrush").split()


def file_digest(path: str | Path, length: int = 16) -> str:
    """Hex SHA-256 prefix of a file's bytes: the 'weights hash' part of an identity."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:length]


class Oracle(ABC):
    """An expensive target model. Subclasses set `name`, `identity` and implement detect."""

    name: str
    identity: str  # name + weights hash: cached labels are valid while this is unchanged
    needs_pixels: bool = True  # False: answers from frame numbers alone (LABELS oracle)
    batch_size: int = 8
    simulated_cost_ms: float | None = None  # a stated cost per frame instead of measured time
    # True: labelling a frame costs next to nothing (a table lookup), so the label cache
    # labels ahead freely to make fewer batches; a model's extra frames are real cost
    nearly_free: bool = False
    sources: tuple[Path, ...] = ()  # files whose bytes the identity hashes (labels, weights, code)
    # every label a query may name, when known ahead (a detector's classes, a label file's
    # labels: `label_vocabulary`); a frame function of any other is refused (`check_labels`)
    labels: tuple[str, ...] | None = None
    # seconds of one-time set-up spent inside its detect calls so far (an ONNX detector's
    # thread choice): the label cache leaves them out of the cost per frame it records
    setup_seconds: float = 0.0
    # True: `prepare_scaled` takes frames resized from larger ones (a video's oracle
    # rendition) and `detect` then gives boxes in the larger frames' pixels
    reads_scaled: bool = False

    @abstractmethod
    def detect(self, frames, frame_ids: np.ndarray) -> pd.DataFrame:
        """Detections for a batch: frames (N×H×W×3 uint8 RGB, what `prepare` made of them,
        or None when needs_pixels is False) with their frame numbers; returns
        DETECTION_COLUMNS rows, `frame` = frame_ids."""

    def prepare(self, frames: np.ndarray):
        """Pixel work on a batch (N×H×W×3 uint8 RGB) that can run ahead of `detect`, on the
        thread that decodes the next batches (an ONNX detector letterboxes there); `detect`
        then gets what this returns. By default the frames as they are."""
        return frames

    def shrink(self, frames: np.ndarray) -> np.ndarray:
        """The pixels `prepare` reads of a batch (N×H×W×3 uint8), smaller when it resizes
        them first (what a query keeps of frames decoded ahead: engine/labels/decoded.py);
        `prepare_shrunk` finishes them. By default the frames as they are."""
        return frames

    def shrunk_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of what `shrink` makes of frames of this size."""
        return width, height

    def prepare_shrunk(self, small: np.ndarray, frame_size: tuple[int, int]):
        """What `prepare` makes of frames of `frame_size` (width, height), given what
        `shrink` made of them: the same, to the bit."""
        return self.prepare(small)

    def prepare_scaled(self, frames: np.ndarray, source_size: tuple[int, int]):
        """`prepare` for frames resized from frames of `source_size` (width, height), whose
        boxes `detect` then gives in the source's pixels (only when `reads_scaled`)."""
        raise NotImplementedError(f"oracle {self.name!r} does not read resized frames")

    def detect_in_clip(self, frames: np.ndarray | None, frame_ids: np.ndarray, clip: str,
                       only_clip: bool) -> DetectionArrays:
        """`detect` for frames of clip `clip` of a collection (`only_clip`: the collection
        is a single file), as arrays; frame_ids are numbered within the clip. Oracles that
        look only at pixels need not care; the LABELS oracle looks the clip up."""
        return detection_arrays(self.detect(frames, frame_ids), self)

    def check_clips(self, clips: tuple[str, ...]) -> None:
        """Raise OracleError when this oracle cannot label a video with these clips (an
        oracle that looks at pixels labels any)."""
        return None

    def describe(self) -> str:
        return f"{type(self).__name__} {self.identity}"


def label_vocabulary(names) -> tuple[str, ...]:
    """The labels a label file can be asked about: its own (`names`), plus the COCO class
    names when every one of its labels is one (a COCO detector's output, so a class absent
    from the clip counts 0, and only a name no detector gives is a mistake)."""
    names = tuple(name for name in names if name)
    if not set(names) <= set(COCO_CLASSES):
        return names
    return names + tuple(name for name in COCO_CLASSES if name not in names)


def check_labels(oracle: Oracle, labels, sql: str) -> None:
    """Raise QueryError for the first of `labels` (None: any class) that `oracle`, whose
    labels are known ahead, can never give, naming the nearest it gives; `sql` is the query
    text, for the label's position. An oracle without known labels (PYTHON) accepts any."""
    if oracle.labels is None:
        return
    for label in labels:
        if label is not None and label not in oracle.labels:
            near = nearest_labels(label, oracle.labels)
            found = sql.find("'" + label.replace("'", "''") + "'")
            listed = ", ".join(oracle.labels[:12]) + (", ..." if len(oracle.labels) > 12 else "")
            raise QueryError(
                f"oracle {oracle.name!r} has no class {label!r}" + (
                    f"; did you mean {alternatives(near)}?" if near else ""),
                sql, found if found >= 0 else None,
                hint=f"class names are case-sensitive; its classes: {listed}")


def alternatives(names: list[str]) -> str:
    """'a', 'b' or 'c'."""
    quoted = [repr(name) for name in names]
    return " or ".join(filter(None, [", ".join(quoted[:-1]), quoted[-1]]))


def nearest_labels(label: str, known) -> list[str]:
    """The names of `known` nearest `label`: those equal to it but for case, else up to
    three close ones (difflib) scoring near the closest ('cars': 'car', not 'carrot')."""
    same = [name for name in known if name.lower() == label.lower()]
    if same:
        return same
    close = difflib.get_close_matches(label, list(known), n=3)
    scores = [difflib.SequenceMatcher(None, label, name).ratio() for name in close]
    return [name for name, score in zip(close, scores, strict=True) if score >= scores[0] - 0.1]


def detection_arrays(df: pd.DataFrame, oracle: Oracle) -> DetectionArrays:
    """An oracle's DETECTION_COLUMNS DataFrame as new arrays (the frame is not kept; a
    missing label gets code -1, which `check_detections` refuses)."""
    missing = missing_columns(df)
    if missing:
        raise OracleError(f"oracle {oracle.name!r} returned detections without columns {missing}")
    return DetectionArrays.of(df)


def check_detections(det: DetectionArrays, frame_ids: np.ndarray, oracle: Oracle) -> np.ndarray:
    """Validate an oracle's output before it is cached, so a buggy oracle cannot poison it;
    returns each detection's position in `frame_ids` (distinct)."""
    rows = det.rows_in(frame_ids)
    stray = rows < 0
    if stray.any():
        raise OracleError(f"oracle {oracle.name!r} returned detections for frames it was not "
                          f"asked about: {sorted(set(det.frame[stray].tolist()))[:5]}")
    if (det.codes < 0).any() or (det.values.dtype.kind == "f" and np.isnan(det.values).any()):
        raise OracleError(f"oracle {oracle.name!r} returned detections with missing values")
    if len(det) and det.codes.max() >= len(det.names):
        raise OracleError(f"oracle {oracle.name!r} returned detections of classes beyond its "
                          f"{len(det.names)} class names (give it the model's classes)")
    return rows
