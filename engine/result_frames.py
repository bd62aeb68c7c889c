"""The frames a query's rows name, for pictures of a result: each row's `frame` (and `clip`,
which a collection needs) in the video its report names, read frame-exactly from the clip's
file by `FrameReader` (the reader the oracle's pipeline decodes with), and the oracle's boxes
for them from the label cache (never labelling a frame: a frame the query did not label
has no boxes)."""
from __future__ import annotations

from collections.abc import Iterator

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from vidql.base.detections import empty_detections
from vidql.base.errors import VidqlError
from vidql.engine.picture import with_boxes
from vidql.engine.sql.sqlnames import quote_name
from vidql.preprocess import FrameReader

ROWS_VIEW = "__vidql_result_rows"


class ResultFrames:
    """The distinct frames of a result's rows in row order: `rows` has clip, frame, ts,
    ordinal (the clip's place in load order) and position (global)."""

    def __init__(self, catalog, video: str, oracle: str | None, rows: pd.DataFrame):
        self.catalog, self.video, self.oracle, self.rows = catalog, video, oracle, rows

    @classmethod
    def of(cls, catalog, report, table: pa.Table) -> "ResultFrames | None":
        """The frames of `table`'s rows in the one video `report` names, or None when its
        rows name none: no report or catalog, no integer `frame` column, several videos, or
        a collection's rows without `clip`. VidqlError when its database is closed."""
        if catalog is None or report is None or not report.video or "frame" not in table.column_names \
                or not pa.types.is_integer(table.schema.field("frame").type):
            return None
        try:
            names = {v.lower(): v for v in catalog.video_names()}
        except duckdb.ConnectionException:
            raise VidqlError("the database this result came from is closed: show or export a "
                             "result before closing its database") from None
        video = names.get(report.video.lower())
        if video is None:
            return None
        clips = catalog.clip_table(video)
        if "clip" in table.column_names:
            clip = table.column("clip").to_pandas().astype("str")
        elif len(clips) == 1:
            clip = pd.Series([clips["clip"].iloc[0]] * table.num_rows, dtype="str")
        else:
            return None
        asked = pd.DataFrame({"row": np.arange(table.num_rows), "clip": clip,
                              "frame": table.column("frame").to_pandas()})
        asked = asked.dropna().drop_duplicates(["clip", "frame"])
        return cls(catalog, video, report.oracle, cls._located(catalog, video, asked))

    @staticmethod
    def _located(catalog, video: str, asked: pd.DataFrame) -> pd.DataFrame:
        """`asked` (row, clip, frame) joined with the video table and its clips, in row
        order; rows naming no frame of the video are left out."""
        con = catalog.con
        con.register(ROWS_VIEW, asked)
        try:
            return con.execute(
                f"SELECT r.clip, CAST(r.frame AS BIGINT) AS frame, v.ts, c.ordinal, "
                f"c.first_frame + r.frame AS position FROM {ROWS_VIEW} r "
                f"JOIN vidql.clips c ON c.video = ? AND c.clip = r.clip "
                f"JOIN main.{quote_name(video)} v ON v.clip = r.clip AND v.frame = r.frame "
                f"ORDER BY r.row", [video]).df()
        finally:
            con.unregister(ROWS_VIEW)

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, rows: np.ndarray, width: int | None = None) -> list[tuple[np.ndarray, float]]:
        """(RGB frame, its scale from the clip's pixels) of each of `rows` (indexes into
        `self.rows`), read at `width` pixels wide (the clip's own size when None)."""
        rows = np.asarray(rows, dtype=np.int64)
        out: list = [None] * len(rows)
        ordinals = self.rows["ordinal"].to_numpy()[rows]
        for ordinal in np.unique(ordinals):
            at = np.flatnonzero(ordinals == ordinal)
            info = self.catalog.clip_info(self.video, int(ordinal))
            size, scale = _size(info, width)
            with FrameReader(info.path, info) as reader:
                pixels = reader.read(self.rows["frame"].to_numpy()[rows[at]], size)
            for k, frame in zip(at, pixels, strict=True):
                out[k] = (frame, scale)
        return out

    def detections(self, positions: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, str]:
        """(the oracle's cached detections of `positions`, frame = global position; which of
        them it has labelled; the oracle's name). VidqlError when the video has no such
        oracle."""
        cache = self.catalog.label_cache(self.video, self.oracle)
        positions = np.asarray(positions, dtype=np.int64)
        labelled = np.isin(positions, cache.labelled_frames)
        found = cache.detections(positions[labelled]) if labelled.any() else empty_detections()
        return found, labelled, cache.oracle.name

    def window(self, k: int, seconds: float) -> tuple[int, int, int, float]:
        """(clip ordinal, first frame, end frame, the clip's frame rate) of the frames of row
        `k`'s clip whose `ts` lies within `seconds` / 2 of the row's."""
        row = self.rows.iloc[k]
        lo, hi = self.catalog.con.execute(
            f"SELECT min(frame), max(frame) FROM main.{quote_name(self.video)} WHERE clip = ? "
            f"AND ts BETWEEN ? AND ?", [row["clip"], row["ts"] - seconds / 2,
                                        row["ts"] + seconds / 2]).fetchone()
        info = self.catalog.clip_info(self.video, int(row["ordinal"]))
        return int(row["ordinal"]), int(lo), int(hi) + 1, float(info.fps or 25.0)

    def frames_between(self, ordinal: int, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """(frame number, RGB frame) of a clip's frames start..stop-1, decoded once in order."""
        info = self.catalog.clip_info(self.video, ordinal)
        with FrameReader(info.path, info) as reader:
            for ids, batch in reader.iter_batches(32, start, stop):
                yield from zip(ids.tolist(), batch, strict=True)


def boxes_note(frames: ResultFrames, positions: np.ndarray) -> tuple[pd.DataFrame, str]:
    """(the detections to draw on `positions`, a sentence saying whose boxes they are or
    why there are none)."""
    try:
        found, labelled, oracle = frames.detections(positions)
    except (VidqlError, duckdb.Error) as exc:
        return empty_detections(), f"No boxes: {exc}."
    drawn = with_boxes(found)
    notes = []
    if len(found) and not len(drawn):
        notes.append(f"oracle {oracle} gives labels without boxes, so none are drawn")
    elif labelled.any():
        notes.append(f"boxes: oracle {oracle}'s cached detections")
    if not labelled.all():
        missing = int((~labelled).sum())
        notes.append(f"{missing} frame{'s' if missing != 1 else ''} the oracle has not "
                     f"labelled {'have' if missing != 1 else 'has'} no boxes")
    text = "; ".join(notes)
    return drawn, text[:1].upper() + text[1:] + "."


def _size(info, width: int | None) -> tuple[tuple[int, int] | None, float]:
    """The read size (None: the clip's) at `width` pixels wide, and its scale."""
    if width is None or width >= info.width:
        return None, 1.0
    height = max(2, round(width * info.height / info.width / 2) * 2)
    return (int(width), int(height)), width / info.width
