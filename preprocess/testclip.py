"""Synthetic clips whose every frame is recognisable, for tests and decode benchmarks."""
from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np


def counter_frame(index: int, width: int, height: int) -> np.ndarray:
    """An RGB frame showing `index` in binary as 16 big black/white cells over a moving gradient."""
    ys, xs = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = (xs * 255 // max(width - 1, 1) + 3 * index) % 256
    frame[..., 1] = (ys * 255 // max(height - 1, 1) + 5 * index) % 256
    frame[..., 2] = (7 * index) % 256
    cell = max(min(width // 16, height // 4), 2)
    for bit in range(16):
        value = 255 if (index >> bit) & 1 else 0
        frame[0:cell, bit * cell:(bit + 1) * cell] = value
    side = max(height // 6, 4)  # a square moving across, so motion search has work to do
    x0 = (index * 7) % max(width - side, 1)
    y0 = height // 2 - side // 2
    frame[y0:y0 + side, x0:x0 + side] = (255, 32, 32)
    return frame


def write_counter_video(path: str | os.PathLike, n_frames: int, width: int = 320, height: int = 240,
                        *, fps: int = 30, gop: int = 12, bframes: int = 2, codec: str = "libx264",
                        crf: int = 23, open_gop: bool = False) -> str:
    """Encode `n_frames` counter frames; H.264 with a fixed GOP and B-frames unless `codec` says otherwise.

    `open_gop` lets B-frames before a keyframe refer to the previous GOP (x264 only), the
    case where frames decoded right after a seek can be damaged.
    """
    path = str(path)
    with av.open(path, mode="w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.max_b_frames = bframes
        if codec == "libx264":
            stream.options = {"preset": "veryfast", "crf": str(crf),
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"
                                             + (":open-gop=1" if open_gop else "")}
        for index in range(n_frames):
            frame = av.VideoFrame.from_ndarray(counter_frame(index, width, height), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path
