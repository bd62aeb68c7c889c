"""Low-resolution renditions: a video transcoded once to a small size, read by original frame number.

Proxies and embedders look at frames 64-160 px high; decoding a small H.264 file is many
times cheaper than decoding the original and shrinking every frame. A rendition folder
holds `rendition.mp4` (H.264, no B-frames, short GOP for cheap random access),
`frames.npy` (the original frame number of each rendition frame) and `rendition.json`.
Paths inside are relative, so the folder can be moved or renamed as a whole.

An *oracle rendition* (`make_oracle_rendition`) is the same kind of folder made for the
oracle, not the embedder: every frame at the oracle's input size (long side in px), resized
from the decoded RGB frame with cv2 INTER_LINEAR as the ONNX letterbox does, and stored
losslessly (H.264 RGB, qp 0) with a keyframe every ORACLE_GOP frames, so the detector sees
the very pixels its letterbox makes of the original while a random read decodes at most
ORACLE_GOP small frames. Lossy settings were measured and refused: on ua_detrac, 4:4:4 at
qp 0 (only the RGB-YUV rounding) kept 80% of frames' per-class YOLOX counts, crf 2 RGB 69%.
x264's ultrafast preset (CAVLC, no deblocking) decodes 4x faster than veryfast (1080p
residential_street at 416x234: 1.2 against 5.3 ms a frame in order, a random read 11
against 46 ms) for 12% more bytes (71 against 64 KB a frame).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Sequence

import av
import numpy as np
from tqdm import tqdm

from vidql.base.errors import ParameterError, VidqlError, VideoError
from vidql.preprocess.frames import FrameReader, Size
from vidql.preprocess.probe import VideoInfo, ffmpeg_reason, probe_video
from vidql.base.ranges import Bounds

SHORT_SIDE = Bounds(16, 2160, whole=True)  # LOAD VIDEO ... WITH (rendition = px)
LONG_SIDE = Bounds(32, 4096, whole=True)  # LOAD VIDEO ... WITH (oracle_rendition = px)
ORACLE_GOP = 8  # an oracle rendition's keyframe interval: a random read decodes <= 8 frames
VIDEO_FILE = "rendition.mp4"
FRAMES_FILE = "frames.npy"
MANIFEST_FILE = "rendition.json"


def rendition_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) with the given short side, aspect kept, both even (H.264 4:2:0 needs it)."""
    scale = short_side / min(width, height)
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


def oracle_size(width: int, height: int, long_side: int) -> tuple[int, int]:
    """(width, height) with the given long side, aspect kept, as the ONNX letterbox sizes a
    frame for a square input of that side (rounded down; odd sizes are fine in RGB)."""
    scale = long_side / max(width, height)
    return max(1, int(width * scale)), max(1, int(height * scale))


@dataclass(frozen=True, eq=False)
class Rendition:
    """A low-res copy of `source` in `folder`; `frames[i]` is the original number of its frame i."""

    folder: Path
    source: str
    short_side: int
    width: int
    height: int
    source_frame_count: int
    frames: np.ndarray

    @property
    def path(self) -> Path:
        return self.folder / VIDEO_FILE

    @cached_property
    def info(self) -> VideoInfo:
        """The rendition file's own layout (probed once per Rendition object)."""
        return probe_video(self.path)

    def open(self, **reader_options) -> "RenditionReader":
        """A reader whose frame numbers are the original video's."""
        return RenditionReader(self, **reader_options)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "Rendition":
        """Open a rendition folder written by `make_rendition`."""
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text())
            frames = np.load(folder / FRAMES_FILE)
        except (OSError, ValueError) as exc:
            raise VideoError(folder, f"not a complete rendition folder ({exc}); make it again") from exc
        return cls(folder=folder, source=manifest["source"], short_side=manifest["short_side"],
                   width=manifest["width"], height=manifest["height"],
                   source_frame_count=manifest["source_frame_count"], frames=frames)


def make_rendition(src: str | os.PathLike, dst_dir: str | os.PathLike, short_side: int, *,
                   every: int = 1, progress: bool = False, crf: int = 18, gop: int = 30,
                   info: VideoInfo | None = None) -> Rendition:
    """Transcode `src` once to H.264 with short side `short_side` px, keeping every `every`-th frame.

    Writes into `dst_dir` (created; an existing rendition there is replaced only when the new
    one is complete). The rendition is checked to hold exactly the frames it claims.
    """
    short_side = SHORT_SIDE.check("rendition (short side in pixels)", short_side)
    if int(every) < 1:
        raise ParameterError(f"every must be at least 1, got {every}")
    info = info if info is not None else probe_video(src)
    width, height = rendition_size(info.width, info.height, int(short_side))
    frames = np.arange(0, info.frame_count, int(every), dtype=np.int64)
    encoder = _Encoder("libx264", "yuv420p", {"preset": "veryfast", "crf": str(crf)}, gop)
    return _write(src, info, Path(dst_dir), frames, (width, height), encoder, progress,
                  {"short_side": int(short_side), "every": int(every), "crf": crf})


def make_oracle_rendition(src: str | os.PathLike, dst_dir: str | os.PathLike, long_side: int, *,
                          progress: bool = False, info: VideoInfo | None = None) -> Rendition:
    """Every frame of `src` at long side `long_side` px (the oracle's input), resized from
    the decoded RGB frame with cv2 INTER_LINEAR and stored losslessly, a keyframe every
    ORACLE_GOP frames (see the module's notes); written into `dst_dir` as make_rendition does."""
    long_side = LONG_SIDE.check("oracle_rendition (long side in pixels)", long_side)
    info = info if info is not None else probe_video(src)
    width, height = oracle_size(info.width, info.height, long_side)
    frames = np.arange(info.frame_count, dtype=np.int64)
    encoder = _Encoder("libx264rgb", "rgb24", {"preset": "ultrafast", "qp": "0"}, ORACLE_GOP,
                       resize="cv2-linear")
    return _write(src, info, Path(dst_dir), frames, (width, height), encoder, progress,
                  {"short_side": min(width, height), "long_side": long_side, "every": 1,
                   "qp": 0, "preset": "ultrafast", "oracle": True})


@dataclass(frozen=True)
class _Encoder:
    """How a rendition is encoded: codec, pixel format, options, GOP, and how frames are
    resized ("swscale-area" from the decoded frame, or "cv2-linear" from its RGB)."""

    codec: str
    pix_fmt: str
    options: dict
    gop: int
    resize: str = "swscale-area"


def _write(src, info: VideoInfo, dst_dir: Path, frames: np.ndarray, size: tuple[int, int],
           encoder: _Encoder, progress: bool, manifest: dict) -> Rendition:
    """Encode `frames` of `src` at `size` into a staging folder, check it, then put it at
    `dst_dir` (replacing what was there) with its frame numbers and manifest."""
    staging = dst_dir.with_name(dst_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _transcode(info, staging / VIDEO_FILE, frames, size, encoder, progress)
        written = probe_video(staging / VIDEO_FILE)
        if written.frame_count != len(frames):
            raise VideoError(src, f"the rendition holds {written.frame_count} frames, expected "
                                  f"{len(frames)}; the source may be damaged")
        np.save(staging / FRAMES_FILE, frames)
        manifest = {"source": str(Path(src).resolve()), "width": size[0], "height": size[1],
                    "source_frame_count": info.frame_count, "codec": "h264",
                    "gop": encoder.gop, **manifest}
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        shutil.rmtree(dst_dir, ignore_errors=True)
        staging.rename(dst_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Rendition.load(dst_dir)


def rendition_positions(rendition: Rendition, frames: Sequence[int] | np.ndarray) -> np.ndarray:
    """Positions in `rendition` of original frame numbers; VidqlError for one it does not hold."""
    wanted = np.asarray(frames, dtype=np.int64).reshape(-1)
    kept = rendition.frames
    at = np.searchsorted(kept, wanted)
    ok = at < len(kept)
    ok[ok] = kept[at[ok]] == wanted[ok]
    if not ok.all():
        every = int(kept[1] - kept[0]) if len(kept) > 1 else 1
        raise VidqlError(f"frame {int(wanted[~ok][0])} is not in the rendition of '{rendition.source}' "
                         f"(it holds frames 0..{rendition.source_frame_count - 1} in steps of {every})")
    return at


def open_rendition(folder: str | os.PathLike, **reader_options) -> "RenditionReader":
    """Open a rendition folder as a frame reader numbered like the original video."""
    return Rendition.load(folder).open(**reader_options)


def _transcode(info: VideoInfo, out: Path, frames: np.ndarray, size: tuple[int, int],
               encoder: _Encoder, progress: bool) -> None:
    rate = Fraction(info.fps).limit_denominator(1001) if info.fps > 0 else Fraction(30)
    bar = None
    if progress:
        bar = tqdm(total=len(frames), desc=f"rendition {Path(info.path).name}", unit="frame")
    try:
        with av.open(str(out), mode="w") as container, FrameReader(info.path, info) as reader:
            stream = container.add_stream(encoder.codec, rate=rate)
            stream.width, stream.height, stream.pix_fmt = size[0], size[1], encoder.pix_fmt
            stream.options = {**encoder.options, "x264-params": (
                f"keyint={encoder.gop}:min-keyint={encoder.gop}:scenecut=0:bframes=0")}
            for position, (_, frame) in enumerate(reader.iter_frames(frames.tolist())):
                small = _resized(reader, frame, size, encoder)
                small.pts = position
                small.time_base = Fraction(1) / rate
                container.mux(stream.encode(small))
                if bar is not None:
                    bar.update(1)
            container.mux(stream.encode(None))
    except av.error.FFmpegError as exc:
        raise VideoError(out, f"writing the rendition failed ({ffmpeg_reason(exc)})") from exc
    finally:
        if bar is not None:
            bar.close()


def _resized(reader: FrameReader, frame: "av.VideoFrame", size: tuple[int, int],
             encoder: _Encoder) -> "av.VideoFrame":
    """A decoded frame at `size` in the encoder's pixel format, resized as it says."""
    if encoder.resize == "cv2-linear":
        import cv2

        rgb = reader.reformatter.reformat(frame, format="rgb24").to_ndarray()
        small = cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR)
        return av.VideoFrame.from_ndarray(np.ascontiguousarray(small), format=encoder.pix_fmt)
    return reader.reformatter.reformat(frame, width=size[0], height=size[1],
                                       format=encoder.pix_fmt, interpolation="AREA")


class RenditionReader:
    """FrameReader over a rendition, with frame numbers of the original video."""

    def __init__(self, rendition: Rendition, **reader_options):
        self.rendition = rendition
        self.reader = FrameReader(rendition.path, rendition.info, **reader_options)
        self.info = self.reader.info
        self.frames = rendition.frames
        self.path = str(rendition.path)

    def __enter__(self) -> "RenditionReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()

    def __len__(self) -> int:
        return len(self.frames)

    def positions(self, frames: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rendition positions of original frame numbers; each must be in the rendition."""
        return rendition_positions(self.rendition, frames)

    def read(self, frames: Sequence[int] | np.ndarray, size: Size | None = None) -> np.ndarray:
        """Frames by original number, in the order asked, as N×H×W×3 uint8 RGB."""
        return self.reader.read(self.positions(frames), size=size)

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None,
                     size: Size | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (original frame numbers, frames) for the rendition's frames in start..stop-1."""
        stop = self.rendition.source_frame_count if stop is None else stop
        if start < 0 or stop > self.rendition.source_frame_count or start > stop:
            raise VidqlError(f"frames {start}..{stop - 1} are out of range for "
                             f"'{self.rendition.source}', which has frames "
                             f"0..{self.rendition.source_frame_count - 1}")
        first, last = np.searchsorted(self.frames, [start, stop])
        for positions, batch in self.reader.iter_batches(batch_size, int(first), int(last), size):
            yield self.frames[positions], batch
