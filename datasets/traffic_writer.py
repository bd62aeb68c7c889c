"""Writing a synthetic traffic video to an MP4 file, with its exact ground truth."""
from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

import av
import pandas as pd

from vidql.base.errors import ParameterError
from vidql.base.files import atomic_path

from .synthetic import TrafficScene, progress_bar
from .traffic_model import CHUNK


class _BackgroundEncoder:
    """Encodes and muxes frames on a second thread (libx264 releases the GIL), in order,
    while the caller renders the next ones."""

    def __init__(self, container, stream):
        self._container, self._stream = container, stream
        self._queue: queue.Queue = queue.Queue(maxsize=16)
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="vidql-encode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (frame := self._queue.get()) is not None:
                self._container.mux(self._stream.encode(frame))
            self._container.mux(self._stream.encode(None))
        except BaseException as exc:  # handed to the caller; drain so it never blocks
            self._failure.append(exc)
            while self._queue.get() is not None:
                pass

    def put(self, frame) -> None:
        if self._failure:
            raise self._failure[0]
        self._queue.put(frame)

    def close(self) -> None:
        """Flush and wait; re-raises an encoding error."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._failure:
            raise self._failure[0]


def generate_traffic(path: str | os.PathLike, n_frames: int, *, width: int = 320,
                     height: int = 180, fps: int = 30, seed: int = 0, gop: int = 30,
                     progress: bool = False) -> pd.DataFrame:
    """Write a synthetic traffic video (H.264 MP4, yuv420p, a keyframe every `gop` frames,
    no B-frames) to `path` and return its exact ground truth (see the module docstring).

    Decoded frame i is rendered frame i. The file appears only when complete (written to a
    temporary file in the same folder, then renamed). Speeds are per frame; `fps` only sets
    the timestamps."""
    from .traffic_render import TrafficRenderer  # OpenCV loads only when pixels are drawn

    if int(gop) < 1 or int(fps) < 1:
        raise ParameterError(f"gop and fps must be positive, got gop={gop}, fps={fps}")
    scene = TrafficScene(n_frames, width, height, seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    truth = []
    bar = progress_bar(scene.n_frames, progress, f"traffic {path.name}")
    try:
        with atomic_path(path, path.suffix or ".mp4") as tmp, av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=int(fps))
            stream.width, stream.height, stream.pix_fmt = scene.width, scene.height, "yuv420p"
            stream.codec_context.thread_count = 2  # fixed, so the bytes do not depend on the host
            stream.options = {
                "preset": "ultrafast", "crf": "23", "tune": "zerolatency",
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0"}
            encoder = _BackgroundEncoder(container, stream)
            try:
                renderer = TrafficRenderer(scene)
                for f0 in range(0, scene.n_frames, CHUNK):
                    f1 = min(f0 + CHUNK, scene.n_frames)
                    pl = scene.placements(f0, f1)
                    truth.append(scene.truth_rows(pl))
                    for i, rgb in enumerate(renderer.render(pl, f0, f1)):
                        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
                        frame.pts = f0 + i
                        encoder.put(frame)
                        if bar is not None:
                            bar.update(1)
            finally:
                encoder.close()
    finally:
        if bar is not None:
            bar.close()
    return pd.concat(truth, ignore_index=True)
