"""Drawing a frame with an oracle's detections (boxes and labels) and encoding it as an image,
for result pages, notebooks and `scripts/result_picture.py`. Pure pixels: frames are uint8
H×W×3 RGB arrays, detections the columns of `vidql.base.detections`."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from vidql.base.errors import ParameterError

COLOURS = {"car": (31, 119, 180), "truck": (214, 39, 40), "bus": (255, 127, 14),
           "person": (44, 160, 44), "bicycle": (148, 103, 189), "motorcycle": (140, 86, 75)}
OTHER_COLOUR = (127, 127, 127)
IMAGE_FORMATS = {"jpeg": ("JPEG", "jpg"), "png": ("PNG", "png")}


def image_format(name: str) -> tuple[str, str]:
    """(PIL format, file suffix) of an image format name, `jpeg` or `png`."""
    found = IMAGE_FORMATS.get(str(name).lower().replace("jpg", "jpeg"))
    if found is None:
        raise ParameterError(f"image format must be jpeg or png; got {name!r}")
    return found


def with_boxes(detections: pd.DataFrame) -> pd.DataFrame:
    """The detections that carry a box (finite corners, x2 > x1 and y2 > y1): a label-only
    oracle's rows have none."""
    x1, y1, x2, y2 = (detections[c].to_numpy(dtype=np.float64) for c in ("x1", "y1", "x2", "y2"))
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(x1 + y1 + x2 + y2) & (x2 > x1) & (y2 > y1)
    return detections[keep]


def draw_boxes(frame: np.ndarray, detections: pd.DataFrame, scale: float = 1.0) -> Image.Image:
    """`frame` as an image with each detection's box and label drawn, its corners (in the
    frame's original pixels) multiplied by `scale` (for a frame read resized)."""
    image = Image.fromarray(np.ascontiguousarray(frame))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(9, round(11 * max(scale, 0.5))))
    width = max(1, round(2 * scale))
    for row in with_boxes(detections).itertuples(index=False):
        colour = COLOURS.get(row.label, OTHER_COLOUR)
        box = [row.x1 * scale, row.y1 * scale, row.x2 * scale, row.y2 * scale]
        draw.rectangle(box, outline=colour, width=width)
        if scale >= 0.5:  # labels stay readable on full frames only
            draw.text((box[0] + 2, max(0, box[1] - 12 * scale)), str(row.label), fill=colour,
                      font=font)
    return image


def encoded(image: Image.Image, fmt: str = "jpeg") -> bytes:
    """`image` encoded in `fmt` (`jpeg`, quality 85, or `png`)."""
    pil_format = image_format(fmt)[0]
    out = io.BytesIO()
    image.save(out, format=pil_format, **({"quality": 85} if pil_format == "JPEG" else {}))
    return out.getvalue()
