"""`Result.export` and `vidql export`: one image per frame a result's rows name (JPEG or PNG,
the oracle's boxes drawn when asked), optionally an H.264 MP4 of the seconds around each,
and an `index.html` beside them showing the images, clip, frame and ts, the query and its
report (an aggregate's page shows its intervals, any other result its rows)."""
from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from urllib.parse import quote

import av
import numpy as np

from vidql.base.detections import empty_detections
from vidql.base.errors import VidqlError
from vidql.base.ranges import CLIP_SECONDS
from vidql.engine.picture import draw_boxes, encoded, image_format
from vidql.engine.result_frames import ResultFrames, boxes_note
from vidql.engine.result_html import (Card, caption, grid_html, intervals_html, is_aggregate, page,
                                      rows_html)

PAGE_WIDTH = 240  # an image's width on the page
CHUNK = 32  # frames read at once


def export_result(result, out: str | Path, *, boxes: bool = True,
                  clip_seconds: float | None = None, image_format_name: str = "jpeg") -> Path:
    """Write `result`'s frames, clips and `index.html` into the folder `out` (made if
    missing; files of the same names are replaced); returns the page's path."""
    image_format(image_format_name)  # refuses an unknown one before any work
    if clip_seconds is not None:
        clip_seconds = CLIP_SECONDS.check("clip seconds", clip_seconds)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VidqlError(f"cannot make the export folder '{out}': {exc}") from None
    frames = ResultFrames.of(result.catalog, result.report, result.table)
    if frames is not None and len(frames):
        body = _write_frames(frames, out, boxes, clip_seconds, image_format_name)
    elif is_aggregate(result.table):
        body = intervals_html(result.table)
    else:
        body = rows_html(result.table)
    index = out / "index.html"
    index.write_text(page(result.query, result.report, body), encoding="utf-8")
    return index


def _write_frames(frames: ResultFrames, out: Path, boxes: bool, clip_seconds: float | None,
                  fmt: str) -> str:
    """Write each frame's image in `fmt` (and clip); the page's grid of them."""
    suffix = image_format(fmt)[1]
    (out / "frames").mkdir(exist_ok=True)
    if clip_seconds is not None:
        (out / "clips").mkdir(exist_ok=True)
    positions = frames.rows["position"].to_numpy()
    detections, note = boxes_note(frames, positions) if boxes else (None, "Boxes not drawn.")
    cards = []
    for start in range(0, len(frames), CHUNK):
        rows = np.arange(start, min(start + CHUNK, len(frames)))
        for k, (pixels, _) in zip(rows, frames.read(rows), strict=True):
            row = frames.rows.iloc[k]
            stem = f"{k:04d}_{_safe(row['clip'])}_{int(row['frame'])}"
            image = draw_boxes(pixels, _of(detections, positions[k]))
            (out / "frames" / f"{stem}.{suffix}").write_bytes(encoded(image, fmt))
            text = caption(row)
            if clip_seconds is not None:
                _write_clip(frames, k, clip_seconds, out / "clips" / f"{stem}.mp4", boxes)
                text += (f"<br><a href='clips/{quote(stem)}.mp4'>{clip_seconds:g} s "
                         f"around it (MP4)</a>")
            src = f"frames/{quote(stem)}.{suffix}"
            cards.append(Card(src, min(PAGE_WIDTH, image.width), text, stem, link=src))
    return grid_html(cards, len(cards), note)


def _write_clip(frames: ResultFrames, k: int, seconds: float, path: Path, boxes: bool) -> None:
    """An H.264 MP4 of the frames within `seconds` / 2 of row `k`'s, at its clip's rate,
    with the oracle's boxes on the frames it labelled when `boxes`."""
    ordinal, start, stop, fps = frames.window(k, seconds)
    first = frames.rows["position"].iloc[k] - frames.rows["frame"].iloc[k]
    detections = boxes_note(frames, first + np.arange(start, stop))[0] if boxes else None
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(100000))
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "23"}
        for k, (number, pixels) in enumerate(frames.frames_between(ordinal, start, stop)):
            image = draw_boxes(pixels, _of(detections, first + number))
            even = image.crop((0, 0, image.width - image.width % 2, image.height - image.height % 2))
            if k == 0:  # yuv420p needs even sides
                stream.width, stream.height = even.width, even.height
            container.mux(stream.encode(av.VideoFrame.from_image(even)))
        container.mux(stream.encode(None))


def _of(detections, position: int):
    """The rows of `detections` (None: none drawn) on one frame."""
    if detections is None:
        return empty_detections()
    return detections[detections["frame"] == position]


def _safe(name: str) -> str:
    """A clip name as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:60] or "clip"
