"""Frame-exact access to a video: random reads by frame number and in-order batches.

Random reads seek to the last keyframe at or before each wanted frame and decode forward,
so frames that share a GOP cost one decode of that GOP; a frame is recognised after a seek
by its timestamp (from `probe_video`), never by counting from an uncertain landing point.
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from vidql.base.errors import VidqlError, VideoError
from vidql.preprocess.probe import VideoInfo, ffmpeg_reason, probe_video

Size = tuple[int, int]  # (width, height)


class FrameReader:
    """Open a video for reading frames as uint8 RGB arrays (N×H×W×3), by frame number.

    `size=(width, height)` on a read resizes inside swscale while converting to RGB.
    `threads=0` lets FFmpeg pick its decoder threads; use 1 when many readers run at once.
    `options` are FFmpeg decoder options (e.g. {"skip_loop_filter": "all"}) that trade
    exactness for speed; leave them empty for frame-exact output.
    A reader belongs to one thread; parallel decoding uses one reader per thread.
    """

    def __init__(self, path: str | os.PathLike, info: VideoInfo | None = None, *,
                 threads: int = 0, interpolation: str = "AREA",
                 options: dict[str, str] | None = None):
        self.info = info if info is not None else probe_video(path)
        self.path = str(path)
        self.threads = threads
        self.interpolation = interpolation
        self.options = dict(options or {})
        self._index_of_pts = self.info.index_of_pts
        self._container = None
        self._stream = None
        # One swscale context for the reader's life: frame.to_ndarray(format=...) builds a new
        # one per frame, which costs more than decoding a small frame.
        self.reformatter = VideoReformatter()
        self.seeks = 0  # number of seeks done, for tests and benchmarks
        self.decoded = 0  # number of frames the decoder returned

    # -- lifetime -------------------------------------------------------------------
    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the demuxer and decoder."""
        if self._container is not None:
            self._container.close()
            self._container = None
            self._stream = None

    def __len__(self) -> int:
        return self.info.frame_count

    # -- public reads ---------------------------------------------------------------
    def read(self, frames: Sequence[int] | np.ndarray, size: Size | None = None) -> np.ndarray:
        """Frames by number, in the order asked (duplicates allowed), as N×H×W×3 uint8 RGB."""
        wanted = np.asarray(frames, dtype=np.int64).reshape(-1)
        self._check_range(wanted)
        width, height = self._out_size(size)
        out = np.empty((len(wanted), height, width, 3), dtype=np.uint8)
        if len(wanted) == 0:
            return out
        unique, rows = np.unique(wanted, return_inverse=True)
        order = np.argsort(rows, kind="stable")
        rows_of = np.split(order, np.cumsum(np.bincount(rows))[:-1])
        for k, (_, frame) in enumerate(self.iter_frames(unique.tolist())):
            out[rows_of[k]] = self._to_rgb(frame, width, height)
        return out

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None,
                     size: Size | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (frame numbers, N×H×W×3 uint8 frames) for frames start..stop-1, decoding once in order."""
        if batch_size < 1:
            raise VidqlError(f"batch_size must be at least 1, got {batch_size}")
        stop = self.info.frame_count if stop is None else stop
        if start < 0 or stop > self.info.frame_count or start > stop:
            raise VidqlError(f"frames {start}..{stop - 1} are out of range for '{self.path}', "
                             f"which has frames 0..{self.info.frame_count - 1}")
        width, height = self._out_size(size)
        frames = self.iter_range(start, stop)
        for first in range(start, stop, batch_size):
            count = min(batch_size, stop - first)
            batch = np.empty((count, height, width, 3), dtype=np.uint8)
            for row in range(count):
                _, frame = next(frames)  # iter_frames yields each target once, in order, or raises
                batch[row] = self._to_rgb(frame, width, height)
            yield np.arange(first, first + count, dtype=np.int64), batch

    def iter_range(self, start: int, stop: int) -> Iterator[tuple[int, "av.VideoFrame"]]:
        """Yield (frame number, decoded av.VideoFrame) for every frame start..stop-1, in order."""
        if start >= stop:
            return
        yield from self.iter_frames(range(start, stop))

    def iter_keyframes(self, batch_size: int, size: Size | None = None
                       ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (frame numbers, frames) of the keyframes only; the decoder skips every other frame.

        Much cheaper than a full decode when a coarse sample of the video is enough.
        """
        if self._index_of_pts is None or self.info.counted_by != "packets":
            # untrusted layouts (packed B-frames, missing pts): seek to each keyframe instead
            keyframes = self.info.keyframes
            for at in range(0, len(keyframes), batch_size):
                yield keyframes[at:at + batch_size], self.read(keyframes[at:at + batch_size], size)
            return
        width, height = self._out_size(size)
        names, pictures = [], []
        with av.open(self.path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            stream.codec_context.skip_frame = "NONKEY"
            try:
                for frame in container.decode(stream):
                    index = self._index_of_pts.get(frame.pts)
                    if index is None:
                        continue
                    names.append(index)
                    pictures.append(self._to_rgb(frame, width, height))
                    if len(names) == batch_size:
                        yield np.asarray(names, dtype=np.int64), np.stack(pictures)
                        names, pictures = [], []
            except av.error.FFmpegError as exc:
                raise VideoError(self.path, f"decoding keyframes failed after frame "
                                            f"{names[-1] if names else 'none'} ({ffmpeg_reason(exc)})") from exc
        if names:
            yield np.asarray(names, dtype=np.int64), np.stack(pictures)

    # -- decoding -------------------------------------------------------------------
    def iter_frames(self, targets: Sequence[int]) -> Iterator[tuple[int, "av.VideoFrame"]]:
        """Yield (n, av.VideoFrame) for each target frame number (ascending, unique), seeking only to skip work."""
        info = self.info
        position = -1  # frame number of the last frame the open decoder produced
        decoding = None
        gop = -1
        for target in targets:
            target_gop = info.gop_of(target)
            if decoding is None or target <= position or info.keyframes[target_gop] > position + 1:
                decoding, gop = self._start_at(target_gop), target_gop
                position = -1
            while True:
                try:
                    index, frame = next(decoding)
                except StopIteration:
                    raise VideoError(self.path, f"frame {target} could not be decoded: the stream "
                                                f"ended after frame {position}") from None
                position = index
                if index < target:
                    continue
                if index == target:
                    yield index, frame
                    break
                # The decoder went past the target: the seek landed after it; start earlier.
                if gop == 0:
                    raise VideoError(self.path, f"frame {target} is missing from the decoded stream")
                decoding, gop = self._start_at(gop - 1), gop - 1
                position = -1

    def _start_at(self, gop: int) -> Iterator[tuple[int, "av.VideoFrame"]]:
        """Position the demuxer at keyframe number `gop` and return a (frame number, frame) generator."""
        info = self.info
        if gop == 0 or self._index_of_pts is None:
            self.close()  # reopening is the one seek to the start that every container honours
            container = self._open()
            first = 0
        else:
            container = self._open()
            container.seek(int(info.keyframe_seek_ts[gop]), stream=self._stream, backward=True)
            first = None
        self.seeks += 1
        return self._numbered_frames(container, first, int(info.keyframes[gop]))

    def _numbered_frames(self, container, first: int | None, keyframe: int
                         ) -> Iterator[tuple[int, "av.VideoFrame"]]:
        """Decode forward, naming each frame by its timestamp (or by counting from a known start).

        Frames before `keyframe` (the seek point) may come out damaged after a seek (open GOPs
        refer to the GOP before); they are never wanted from this position, so only damage at
        or after the keyframe is an error.
        """
        by_pts = self._index_of_pts
        last = -1 if first == 0 else None
        try:
            for packet in container.demux(self._stream):
                for frame in packet.decode():
                    self.decoded += 1
                    if by_pts is not None and frame.pts in by_pts:
                        last = by_pts[frame.pts]
                    elif last is not None:
                        last += 1
                    if frame.is_corrupt and (last is None or last >= keyframe):
                        where = "a frame after a seek" if last is None else f"frame {last}"
                        raise VideoError(self.path, f"{where} is corrupt (damaged data in the file)")
                    if last is None:
                        continue  # unknown frame before any recognised one: cannot name it
                    yield last, frame
        except av.error.FFmpegError as exc:
            where = "the first frame after a seek" if last is None else f"frame {last + 1}"
            raise VideoError(self.path, f"decoding failed near {where} of {self.info.frame_count} "
                                        f"({ffmpeg_reason(exc)})") from exc

    def _open(self):
        if self._container is None:
            try:
                self._container = av.open(self.path)
            except av.error.FFmpegError as exc:
                raise VideoError(self.path, f"cannot open ({ffmpeg_reason(exc)})") from exc
            stream = self._container.streams.video[0]
            if self.threads == 1:
                stream.thread_type = "NONE"
            else:
                stream.thread_type = "AUTO"
                stream.codec_context.thread_count = self.threads
            if self.options:
                stream.codec_context.options = dict(self.options)
            self._stream = stream
        return self._container

    # -- helpers --------------------------------------------------------------------
    def _check_range(self, wanted: np.ndarray) -> None:
        n = self.info.frame_count
        bad = wanted[(wanted < 0) | (wanted >= n)]
        if len(bad):
            raise VidqlError(f"frame {int(bad[0])} is out of range for '{self.path}', "
                             f"which has frames 0..{n - 1}")

    def _out_size(self, size: Size | None) -> Size:
        if size is None:
            return self.info.width, self.info.height
        width, height = int(size[0]), int(size[1])
        if width < 1 or height < 1:
            raise VidqlError(f"output size must be positive (width, height), got {size}")
        return width, height

    def _to_rgb(self, frame: "av.VideoFrame", width: int, height: int) -> np.ndarray:
        return self.reformatter.reformat(frame, width=width, height=height, format="rgb24",
                                         interpolation=self.interpolation).to_ndarray()
