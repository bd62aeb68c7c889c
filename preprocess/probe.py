"""Probe a video once: codec, size, rate, exact frame count, keyframes and per-frame timestamps.

Frame numbers everywhere in vidql are 0-based positions in the sequence of frames a full
sequential decode returns. `probe_video` finds, for each of them, the timestamp the decoder
gives it (so a reader can recognise frames after a seek) and which of them are keyframes
(where a seek can land). For well-behaved codecs in well-behaved containers this comes from
the packet index alone; otherwise (AVI with packed B-frames, missing or repeated timestamps)
the video is decoded once, which is the only way to learn the truth when the header lies.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidql.base.errors import VideoError
from vidql.base.files import atomic_path

# Codecs for which, in a container that gives every packet a unique pts, one packet is one
# displayed frame and the decoder's frame pts is the packet pts.
_ONE_FRAME_PER_PACKET = frozenset({"h264", "hevc", "av1", "vp9", "mjpeg", "png", "ffv1",
                                   "rawvideo", "prores", "dnxhd", "qtrle"})


# Demuxers that turn text files into "video" (ANSI art); a text file is not a video.
_NOT_VIDEO_FORMATS = frozenset({"tty"})


MISSING_PTS = np.iinfo(np.int64).min  # in `VideoInfo.pts`: a frame the decoder gave no timestamp
_ARRAYS = ("keyframes", "keyframe_seek_ts", "pts")  # VideoInfo's int64 arrays


@dataclass(frozen=True, eq=False)
class VideoInfo:
    """What vidql knows about a video's first video stream.

    `pts[i]` is the decoder timestamp of frame i (frames in decode-output order, which is
    presentation order; MISSING_PTS where the decoder gave none); `keyframes` are the frame
    numbers a seek can land on and `keyframe_seek_ts` the stream timestamps to seek to for
    each of them. The three are int64 arrays, not tuples: at a million frames a tuple took
    0.1 s to unpickle, and the garbage collector walked its million entries.
    """

    path: str
    codec: str
    width: int
    height: int
    fps: float
    frame_count: int
    duration: float
    time_base: Fraction
    keyframes: np.ndarray
    keyframe_seek_ts: np.ndarray
    pts: np.ndarray
    pts_unique: bool
    header_frame_count: int
    counted_by: str  # "packets" or "decoding"
    creation_time: str | None = None  # the container's creation time (ISO 8601), if it has one

    def timestamps(self) -> np.ndarray:
        """Each frame's time in seconds from the first frame: from its decoder timestamp,
        or frame number / fps where timestamps are missing or repeat."""
        return frame_times(self.pts, self.pts_unique, self.time_base, self.fps)

    def gop_of(self, frame: int) -> int:
        """Position in `keyframes` of the last keyframe at or before `frame`."""
        return max(int(np.searchsorted(self.keyframes, frame, side="right")) - 1, 0)

    @functools.cached_property
    def index_of_pts(self) -> "PtsIndex | None":
        """Frame number of each timestamp (None when timestamps repeat), built once per
        info however many readers use it; never pickled."""
        return PtsIndex(self.pts) if self.pts_unique else None

    def _scalars(self) -> tuple:
        return tuple(v for k, v in self.__getstate__().items() if k not in _ARRAYS)

    def __eq__(self, other) -> bool:
        return isinstance(other, VideoInfo) and self._scalars() == other._scalars() and all(
            np.array_equal(getattr(self, k), getattr(other, k)) for k in _ARRAYS)

    def __hash__(self) -> int:
        return hash(self._scalars())

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "index_of_pts"}

    def __setstate__(self, state: dict) -> None:
        """Also reads infos pickled when the arrays were tuples (pts with None)."""
        self.__dict__.update({k: _int64s(v) if k in _ARRAYS and not isinstance(v, np.ndarray)
                              else v for k, v in state.items()})


def frame_times(pts: np.ndarray, pts_unique: bool, time_base: Fraction, fps: float) -> np.ndarray:
    """Frame times in seconds from the first frame (see `VideoInfo.timestamps`)."""
    if len(pts) and pts_unique:
        return (pts - pts[0]) * float(time_base)
    return np.arange(len(pts)) / (fps or 1.0)


def frames_duration(times: np.ndarray, fps: float) -> float:
    """How long frames at `times` (seconds, ascending) last: the last one's time plus one
    mean frame step (1 / fps for a single frame). From the frames, not a container header,
    whose rate and frame count can disagree with them (an AVI with dropped frames: 3602
    frames at 59.94 in the header, half of them decoded, timestamps to 59.96 s)."""
    if not len(times):
        return 0.0
    span = float(times[-1] - times[0])
    step = span / (len(times) - 1) if len(times) > 1 and span > 0 else (1 / fps if fps > 0 else 0.0)
    return span + step


def _int64s(values) -> np.ndarray:
    """int64 array of `values`, None as MISSING_PTS."""
    return np.array([MISSING_PTS if v is None else v for v in values], dtype=np.int64)


class PtsIndex:
    """Frame number of each of a video's (unique) timestamps, as a dict would give it
    (`get`, `in`, `[]`, `len`). Timestamps that step evenly (most files) are numbered by
    arithmetic; others by a dict, which at a million frames holds about 80 MB."""

    def __init__(self, pts):
        pts = np.asarray(pts, dtype=np.int64)
        self._n = len(pts)
        first, step = (int(pts[0]), int(pts[1] - pts[0])) if self._n > 1 else (0, 0)
        even = step > 0 and np.array_equal(pts, first + step * np.arange(self._n, dtype=np.int64))
        self._first, self._step = (first, step) if even else (None, None)
        self._map = None if even else {t: i for i, t in enumerate(pts.tolist())}

    def get(self, pts, default=None):
        if self._map is not None:
            return self._map.get(pts, default)
        if not isinstance(pts, int):
            return default
        i, off = divmod(pts - self._first, self._step)
        return i if off == 0 and 0 <= i < self._n else default

    def __contains__(self, pts) -> bool:
        return self.get(pts) is not None

    def __getitem__(self, pts) -> int:
        i = self.get(pts)
        if i is None:
            raise KeyError(pts)
        return i

    def __len__(self) -> int:
        return self._n


INFO_FILE = "info.npz"  # a video's probe result in its artifacts folder
_LEGACY_INFO_FILE = "info.pkl"  # where vidql kept it as a pickle before
_SCALARS = {"path": str, "codec": str, "width": int, "height": int, "fps": float,
            "frame_count": int, "duration": float, "pts_unique": bool,
            "header_frame_count": int, "counted_by": str, "creation_time": (str, type(None))}


class DamagedInfo(Exception):
    """A saved probe result that cannot be read back; the video is probed again."""


def save_info(info: VideoInfo, file: str | os.PathLike) -> None:
    """Write `info` to `file` as data, atomically: an .npz of its int64 arrays and its
    other fields as JSON (`meta`). Nothing in it is code; `load_info` reads it back."""
    meta = {k: getattr(info, k) for k in _SCALARS}
    meta["time_base"] = [info.time_base.numerator, info.time_base.denominator]
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_path(file) as tmp, open(tmp, "wb") as out:
        np.savez(out, meta=blob, **{k: getattr(info, k) for k in _ARRAYS})


def load_info(file: str | os.PathLike) -> VideoInfo:
    """The VideoInfo `save_info` wrote to `file`; DamagedInfo when it is not one."""
    try:
        with np.load(file, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            arrays = {k: data[k] for k in _ARRAYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise DamagedInfo(f"{file}: {exc}") from None
    if not isinstance(meta, dict):
        raise DamagedInfo(f"{file}: its fields are not a JSON object")
    return _info_of(meta, arrays)


def _info_of(meta: dict, arrays: dict) -> VideoInfo:
    """A VideoInfo of checked fields: DamagedInfo for a missing field or a wrong type."""
    for key, kind in _SCALARS.items():
        value = meta.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DamagedInfo(f"field {key} is {value!r}")
        meta[key] = value
    tb = meta.get("time_base")
    if not (isinstance(tb, list) and len(tb) == 2 and all(type(v) is int for v in tb) and tb[1] > 0):
        raise DamagedInfo(f"field time_base is {tb!r}")
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype != np.int64 or value.ndim != 1:
            raise DamagedInfo(f"field {key} is not a list of int64")
    if len(arrays["pts"]) != meta["frame_count"] or not len(arrays["keyframes"]) \
            or len(arrays["keyframes"]) != len(arrays["keyframe_seek_ts"]):
        raise DamagedInfo("the per-frame arrays disagree with the frame count")
    return VideoInfo(**{k: meta[k] for k in _SCALARS}, time_base=Fraction(*tb), **arrays)


class _InfoUnpickler(pickle.Unpickler):
    """Reads an info.pkl of an older vidql: refuses every global but VideoInfo, Fraction
    and numpy's array reconstruction, so a planted pickle cannot run code."""

    ALLOWED = frozenset({("vidql.preprocess.probe", "VideoInfo"), ("fractions", "Fraction")} |
                        {(f"numpy.{core}.multiarray", f) for core in ("core", "_core")
                         for f in ("_reconstruct", "scalar")} |
                        {("numpy", "ndarray"), ("numpy", "dtype")})

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in an info.pkl")
        return super().find_class(module, name)


def _load_legacy_info(file: Path) -> VideoInfo:
    """The VideoInfo of an old info.pkl, read through the allow-list; DamagedInfo otherwise."""
    try:
        with open(file, "rb") as raw:
            info = _InfoUnpickler(raw).load()
    except Exception as exc:  # anything a damaged or planted pickle raises: probe again
        raise DamagedInfo(f"{file}: {exc}") from None
    if not isinstance(info, VideoInfo):
        raise DamagedInfo(f"{file} holds a {type(info).__name__}, not a VideoInfo")
    meta = info.__getstate__()
    tb = meta.get("time_base")
    if isinstance(tb, Fraction):
        meta["time_base"] = [tb.numerator, tb.denominator]
    return _info_of(meta, {k: meta.get(k) for k in _ARRAYS})


def stored_info(directory: str | os.PathLike, path: str) -> VideoInfo:
    """The probe result of the video at `path` saved in `directory` (its INFO_FILE). An
    info.pkl of an older vidql is read through an allow-list and saved anew as data; one
    that is absent or damaged is probed again and saved."""
    directory = Path(directory)
    saved, legacy = directory / INFO_FILE, directory / _LEGACY_INFO_FILE
    info = _read_or_none(saved, load_info)
    if info is None:
        info = _read_or_none(legacy, _load_legacy_info) or probe_video(path)
        _save_quietly(info, saved, legacy)
    return info if info.path == path else dataclasses.replace(info, path=path)


def _read_or_none(file: Path, read) -> VideoInfo | None:
    """`read(file)`, or None when the file is absent or damaged."""
    if not file.is_file():
        return None
    try:
        return read(file)
    except DamagedInfo:
        return None


def _save_quietly(info: VideoInfo, saved: Path, legacy: Path) -> None:
    """Save `info` and remove an old info.pkl, where the folder allows (else it reads as
    it is, next time too)."""
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        save_info(info, saved)
        legacy.unlink(missing_ok=True)
    except OSError:
        pass


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Read a video's layout; raise VideoError when it is missing, not a video, corrupt or undecodable."""
    path = Path(path)
    if not path.exists():
        raise VideoError(path, "file does not exist")
    if not path.is_file():
        raise VideoError(path, "not a regular file")
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise VideoError(path, f"FFmpeg cannot parse it ({ffmpeg_reason(exc)}); it is truncated, "
                                 "corrupt or not a video") from exc
    with container:
        stream, codec = _video_stream(path, container)
        packets, demuxed = _demux_packet_table(path, container, stream)
        listed = int(stream.frames or 0)
        if container.format.name.startswith("mov") and demuxed < listed:
            raise VideoError(path, f"truncated file: its index lists {listed} frames but the data "
                                   f"holds only {demuxed}")
        pts, keyframe_pts, counted_by = _frame_layout(path, codec, packets)
        created = container.metadata.get("creation_time") or stream.metadata.get("creation_time")
        return _build_info(path, stream, codec, pts, keyframe_pts, counted_by, created)


def _video_stream(path: Path, container):
    """(first video stream, codec name), or a VideoError saying why there is none to decode."""
    if not container.streams.video or container.format.name in _NOT_VIDEO_FORMATS:
        kinds = sorted({s.type for s in container.streams if s.type != "video"})
        holds = f"{' and '.join(kinds)} streams only" if kinds else "no streams"
        raise VideoError(path, f"file has no video stream (FFmpeg reads it as "
                               f"'{container.format.name}' with {holds}); it is truncated, "
                               "corrupt or not a video")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        raise VideoError(path, "unsupported codec: FFmpeg does not know the video stream's "
                               "codec, no decoder available")
    codec = stream.codec_context.name
    try:
        av.codec.Codec(codec, "r")
    except Exception as exc:
        raise VideoError(path, f"unsupported codec '{codec}': no decoder available") from exc
    if not stream.codec_context.width or not stream.codec_context.height:
        raise VideoError(path, f"video stream has no frame size (codec '{codec}', corrupt header?)")
    return stream, codec


def _frame_layout(path: Path, codec: str, packets):
    """(pts, keyframe pts, counted_by): from the packets when the decoder agrees with
    them, else by decoding every frame once."""
    fast = _packet_layout(codec, packets)
    if fast is not None:
        try:
            _check_first_frame_decodes(path, fast[0][0])
            return fast[0], fast[1], "packets"
        except _NotTrusted:
            pass
    return *_decode_layout(path, packets), "decoding"


def ffmpeg_reason(exc: BaseException) -> str:
    """FFmpeg's words for an error, without errno and C function names."""
    text = re.sub(r"^\[Errno -?\d+\] ", "", str(exc)).split(": '")[0]
    return text or type(exc).__name__


def _demux_packet_table(path: Path, container, stream):
    """(pts, dts, is_keyframe) of every packet to be shown, and the count of all data packets."""
    packets = []
    demuxed = 0
    try:
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            demuxed += 1
            if packet.is_discard:
                continue
            packets.append((packet.pts, packet.dts, bool(packet.is_keyframe)))
    except av.error.FFmpegError as exc:
        raise VideoError(path, f"corrupt or truncated container after {len(packets)} packets "
                               f"({ffmpeg_reason(exc)})") from exc
    if not packets:
        raise VideoError(path, "video stream holds no frames (empty or truncated file)")
    return packets, demuxed


def _packet_layout(codec: str, packets) -> tuple[list[int], set[int]] | None:
    """Per-frame pts and keyframe pts from packets alone, or None when packets cannot be trusted."""
    if codec not in _ONE_FRAME_PER_PACKET:
        return None
    pts = [p[0] for p in packets]
    if any(t is None for t in pts) or len(set(pts)) != len(pts):
        return None
    keyframe_pts = {p[0] for p in packets if p[2]}
    if not keyframe_pts:
        return None
    return sorted(pts), keyframe_pts


def _check_first_frame_decodes(path: Path, first_pts: int) -> None:
    """Decode until the first frame comes out; it must carry the smallest packet pts."""
    with av.open(str(path)) as fresh:
        vstream = fresh.streams.video[0]
        try:
            for frame in fresh.decode(vstream):
                if frame.pts is not None and frame.pts != first_pts:
                    raise _NotTrusted
                return
        except av.error.FFmpegError as exc:
            raise VideoError(path, f"the video cannot be decoded ({ffmpeg_reason(exc)})") from exc
    raise VideoError(path, "the video stream decodes to no frames")


class _NotTrusted(Exception):
    """The packet index disagrees with the decoder; fall back to decoding."""


def _decode_layout(path: Path, packets) -> tuple[list[int | None], set[int]]:
    """Decode every frame once (no pixel conversion) to learn the true count and timestamps."""
    keyframe_packet_pts = {p[0] for p in packets if p[2] and p[0] is not None}
    pts: list[int | None] = []
    keyframe_pts: set[int] = set()
    with av.open(str(path)) as fresh:
        vstream = fresh.streams.video[0]
        vstream.thread_type = "AUTO"
        try:
            for frame in fresh.decode(vstream):
                if frame.is_corrupt:
                    raise VideoError(path, f"frame {len(pts)} is corrupt (damaged data in the file)")
                if frame.key_frame and frame.pts in keyframe_packet_pts:
                    keyframe_pts.add(frame.pts)
                pts.append(frame.pts)
        except av.error.FFmpegError as exc:
            if not pts:
                raise VideoError(path, f"the video cannot be decoded ({ffmpeg_reason(exc)})") from exc
            raise VideoError(path, f"decoding failed at frame {len(pts)} ({ffmpeg_reason(exc)})") from exc
    if not pts:
        raise VideoError(path, "the video stream decodes to no frames")
    return pts, keyframe_pts


def _build_info(path: Path, stream, codec: str, pts, keyframe_pts, counted_by: str,
                created: str | None) -> VideoInfo:
    n = len(pts)
    pts = _int64s(pts)
    pts_unique = bool(not (pts == MISSING_PTS).any() and len(np.unique(pts)) == n)
    keys = np.array(sorted(keyframe_pts), dtype=np.int64)
    keyframes = np.flatnonzero(np.isin(pts, keys)) if pts_unique else np.zeros(0, np.int64)
    if not len(keyframes) or keyframes[0] != 0:
        keyframes = np.concatenate([[0], keyframes])  # frame 0 is always reachable by seeking to the start
    keyframes = keyframes.astype(np.int64)
    at = pts[keyframes]
    seek_ts = np.where(np.isin(at, keys), at, _START) if pts_unique else \
        np.full(len(keyframes), _START, dtype=np.int64)
    time_base = stream.time_base or Fraction(1, 1)
    fps = _frame_rate(stream, pts if pts_unique else None, time_base)
    duration = frames_duration(frame_times(pts, pts_unique, time_base, fps), fps)
    return VideoInfo(
        path=str(path), codec=codec,
        width=int(stream.codec_context.width), height=int(stream.codec_context.height),
        fps=fps, frame_count=n, duration=duration, time_base=Fraction(time_base),
        keyframes=keyframes, keyframe_seek_ts=seek_ts.astype(np.int64), pts=pts,
        pts_unique=pts_unique, header_frame_count=int(stream.frames or 0), counted_by=counted_by,
        creation_time=created or None,
    )


# Seek target meaning "the start of the file" (used when a keyframe has no usable timestamp).
_START = -(2**62)


def _frame_rate(stream, pts, time_base: Fraction) -> float:
    """The header's average rate when present, else the median spacing of timestamps."""
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if rate and float(rate) > 0:
        return float(rate)
    if pts is not None and len(pts) > 1:
        steps = np.sort(np.diff(np.sort(pts)))
        step = int(steps[len(steps) // 2])
        if step > 0:
            return float(1 / (step * time_base))
    return 0.0
