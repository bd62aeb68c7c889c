"""What reading a clip's frames costs: its GOP layout, a measured decode time per frame and
a measured time to convert a frame read to RGB.

A frame can only be decoded from its GOP's keyframe, so reading frame f decodes every frame
from that keyframe to f. Read in file order by one decoder that moves forward (vidql's
`FrameReader.iter_frames`), a set of frames costs, for each GOP it touches, the frames from
the keyframe to the last one wanted there; read one at a time, each frame costs its own
distance from the keyframe. Only the frames read are converted to RGB (a 1080p frame's
conversion costs about half its decoding), so a call that keeps most of the frames it
decodes costs more per decoded frame than one that skips most. `ReadCost` prices both,
from which EXPLAIN and the planner price a query's decoding, and from which a video loaded
with `oracle_rendition = 'auto'` decides whether a clip's oracle rendition pays
(`rendition_pays`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vidql.base.files import atomic_path
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import VideoInfo

MEASURED_FRAMES = 48  # frames decoded (from the start, in order) to time a clip's decoding
# A lossless RGB frame of an oracle rendition decodes about this many times slower per pixel
# than a camera's lossy file: measured 8-10x on the shared clips (1.9 ms for a 416x234 frame
# against 4.1 ms for the 1080p original, bench `rendition`).
LOSSLESS_PIXEL_COST = 10.0
RENDITION_GAIN = 4.0  # 'auto' writes a rendition where a random read costs >= 4x less on it


@dataclass(frozen=True)
class DecodeTiming:
    """Seconds to decode one frame of a clip, and to convert one frame read to RGB at its
    stored size, as measured."""

    seconds_per_frame: float
    frames_timed: int
    width: int
    height: int
    seconds_per_read: float = 0.0


@dataclass(frozen=True, eq=False)
class ReadCost:
    """A clip's reading cost: `keyframes` (ascending frame numbers, the first 0),
    `frame_count`, the decode time of one frame and the conversion time of one frame read."""

    keyframes: np.ndarray
    frame_count: int
    seconds_per_frame: float
    seconds_per_read: float = 0.0

    @classmethod
    def of(cls, info: VideoInfo, timing: DecodeTiming) -> "ReadCost":
        keyframes = np.asarray(info.keyframes, dtype=np.int64)
        if keyframes.size == 0 or keyframes[0] != 0:
            keyframes = np.concatenate([[0], keyframes[keyframes > 0]])
        return cls(keyframes, int(info.frame_count), float(timing.seconds_per_frame),
                   float(timing.seconds_per_read))

    def _offsets(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(GOP number, distance from its keyframe) of each frame."""
        frames = np.asarray(frames, dtype=np.int64)
        gops = np.searchsorted(self.keyframes, frames, side="right") - 1
        return gops, frames - self.keyframes[gops]

    def decoded_in_order(self, frames) -> int:
        """Frames decoded to read `frames` in file order with a decoder that moves forward:
        each GOP touched is decoded from its keyframe to the last frame wanted in it."""
        frames = np.unique(np.asarray(frames, dtype=np.int64))
        if frames.size == 0:
            return 0
        gops, offsets = self._offsets(frames)
        last = np.r_[gops[1:] != gops[:-1], True]  # the last wanted frame of each GOP
        return int((offsets[last] + 1).sum())

    def decoded_one_by_one(self, frames) -> int:
        """Frames decoded to read each of `frames` on its own (a seek to its keyframe each)."""
        frames = np.asarray(frames, dtype=np.int64)
        return int((self._offsets(frames)[1] + 1).sum()) if frames.size else 0

    def seconds(self, decoded_frames: float, read_frames: float = 0) -> float:
        """Seconds to decode `decoded_frames` frames and convert the `read_frames` of them
        that are read."""
        return float(decoded_frames) * self.seconds_per_frame + float(read_frames) * self.seconds_per_read

    def random_read_seconds(self) -> float:
        """Mean seconds to read one frame on its own, over all of the clip's frames (each
        GOP of L frames decodes 1..L frames: L(L+1)/2 in all), converting it included."""
        gops = np.diff(np.r_[self.keyframes, self.frame_count]).astype(np.float64)
        return self.seconds((gops * (gops + 1) / 2).sum() / max(self.frame_count, 1), 1)


def rendition_cost(cost: ReadCost, size: tuple[int, int], small: tuple[int, int],
                   gop: int) -> ReadCost:
    """The estimated ReadCost of an oracle rendition not written yet: frames of `small`
    (width, height) px from a clip of `size` read at `cost`, a keyframe every `gop` frames,
    each pixel LOSSLESS_PIXEL_COST times the clip's own to decode and convert (an RGB
    stream's conversion is a copy: the cost is all decoding)."""
    share = small[0] * small[1] / max(size[0] * size[1], 1)
    return ReadCost(np.arange(0, cost.frame_count, gop, dtype=np.int64), cost.frame_count,
                    (cost.seconds_per_frame + cost.seconds_per_read) * LOSSLESS_PIXEL_COST * share)


def rendition_pays(cost: ReadCost, rendition: ReadCost) -> bool:
    """Whether a random frame reads at least RENDITION_GAIN times faster from `rendition`
    than from the clip (`cost`): the 1080p GOP-120 clip 27x (measured), ua_detrac and
    hangzhou_junction 13x pay; highway (320x240, 2.4x), residential_street and indoor_people
    (1.1-1.4x), where the copy would cost 17-56x the file's disk, do not."""
    return cost.random_read_seconds() >= RENDITION_GAIN * rendition.random_read_seconds()


def measure_decode(info: VideoInfo, frames: int = MEASURED_FRAMES) -> DecodeTiming:
    """Time decoding the clip's first `frames` frames in order, and converting them to RGB at
    its stored size, as the oracle's reader does (the file opening is left out)."""
    timed = np.arange(1, min(frames, info.frame_count - 1) + 1) if info.frame_count > 1 else np.zeros(1)
    decoding = converting = 0.0
    with FrameReader(info.path, info) as reader:
        reader.read([0])  # open the file and the decoder first
        last = time.perf_counter()
        for _, frame in reader.iter_frames(timed.tolist()):
            now = time.perf_counter()
            decoding += now - last
            reader.reformatter.reformat(frame, format="rgb24").to_ndarray()
            last = time.perf_counter()
            converting += last - now
    return DecodeTiming(decoding / timed.size, int(timed.size), int(info.width), int(info.height),
                        converting / timed.size)


def save_timing(timing: DecodeTiming, path: Path) -> None:
    """Write `timing` as JSON, atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(asdict(timing)))


def load_timing(path: Path) -> DecodeTiming | None:
    """The timing saved at `path`, or None when it is absent, unreadable or has no conversion
    time (measure again)."""
    try:
        data = json.loads(Path(path).read_text())
        return DecodeTiming(float(data["seconds_per_frame"]), int(data["frames_timed"]),
                            int(data["width"]), int(data["height"]), float(data["seconds_per_read"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
