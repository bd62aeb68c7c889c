"""Low-resolution frame sources for embedders and proxies: one clip (`LowResSource`), and
several read as one (`ConcatSource`: the clips of a collection at global positions)."""
from __future__ import annotations

from contextlib import closing
from pathlib import Path

import numpy as np

from vidql.base.errors import ParameterError, VidqlError
from vidql.preprocess.batches import frame_batches
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.rendition import Rendition

# decoded frames the embedding passes may hold ahead: a quarter of the pipeline's default,
# enough to keep the embedder fed, so an index build's memory stays flat
LOWRES_BUDGET = 128 << 20


class LowResSource:
    """A frame source (n_frames, read, iter_batches, proxy_size) over one clip for low-res
    consumers: its rendition when it has one (original frame numbers), else the original,
    resized."""

    DEFAULT_SHORT_SIDE = 36

    def __init__(self, info, rendition_dir: Path | None = None):
        self.info = info
        self.n_frames = info.frame_count
        self.rendition = Rendition.load(rendition_dir) if rendition_dir else None

    @property
    def keyframes(self) -> np.ndarray:
        """Frames a decoder can start at (of the rendition when reading one)."""
        if self.rendition is not None:
            return np.asarray(self.rendition.frames)[self.rendition.info.keyframes]
        return self.info.keyframes

    def proxy_size(self, short_side: int | None = None) -> tuple[int, int]:
        """(width, height) with the given short side, keeping the aspect ratio (even sizes)."""
        s = short_side or self.DEFAULT_SHORT_SIDE
        w, h = self.info.width, self.info.height
        scale = s / min(w, h)
        return max(2, round(w * scale / 2) * 2), max(2, round(h * scale / 2) * 2)

    def read(self, frames, size=None) -> np.ndarray:
        reader = self.rendition.open() if self.rendition else FrameReader(self.info.path, self.info)
        with reader:
            return reader.read(frames, size=size)

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None, size=None):
        stop = self.n_frames if stop is None else stop
        frames = None if (start, stop) == (0, self.n_frames) else np.arange(start, stop)
        with closing(frame_batches(self.rendition or self.info, size=size, batch_size=batch_size,
                                   frames=frames, memory_budget=LOWRES_BUDGET)) as batches:
            yield from batches


class ConcatSource:
    """Frame sources (`n_frames`, `read(frames, size)`, `iter_batches(batch_size, start,
    stop, size)`, `proxy_size(short_side)`, e.g. the catalog's LowResSource) one after the
    other: position g of clip i is `offsets[i] + frame`. Every frame is read at one size,
    the first clip's `proxy_size` unless a size is given, whatever each clip's own size.
    `append` adds a clip at the end; earlier positions never move."""

    def __init__(self, sources=()):
        self.sources: list = []
        for source in sources:
            self.append(source)

    def append(self, source) -> None:
        if int(source.n_frames) < 1:
            raise ParameterError(f"a clip of a collection needs frames; this one has "
                                 f"{source.n_frames}")
        self.sources.append(source)

    @property
    def offsets(self) -> np.ndarray:
        """First global position of each clip, and the total at the end (len = clips + 1)."""
        return np.concatenate([[0], np.cumsum([int(s.n_frames) for s in self.sources])])

    @property
    def n_frames(self) -> int:
        return int(self.offsets[-1])

    @property
    def keyframes(self) -> np.ndarray:
        """Global positions a decoder can start at: each clip's start and keyframes."""
        offsets = self.offsets
        parts = [offsets[:-1]] + [np.asarray(getattr(s, "keyframes", ()), dtype=np.int64) + o
                                  for s, o in zip(self.sources, offsets[:-1], strict=True)]
        return np.unique(np.concatenate(parts)).astype(np.int64)

    def proxy_size(self, short_side: int | None = None) -> tuple[int, int]:
        """(width, height) of the first clip's proxy frames, used for every clip."""
        if not self.sources:
            raise VidqlError("the collection has no clips, so it has no proxy size")
        return self.sources[0].proxy_size(short_side)

    def read(self, frames, size=None) -> np.ndarray:
        """uint8 N×H×W×3 frames at global positions `frames` (any order), at `size`."""
        frames = np.asarray(frames, dtype=np.int64).reshape(-1)
        size = tuple(size) if size is not None else self.proxy_size()
        offsets = self.offsets
        if len(frames) and (frames.min() < 0 or frames.max() >= offsets[-1]):
            bad = frames[(frames < 0) | (frames >= offsets[-1])][0]
            raise ParameterError(f"frame position {int(bad)} is out of range: the collection "
                                 f"has positions 0..{int(offsets[-1]) - 1}")
        out = np.empty((len(frames), size[1], size[0], 3), dtype=np.uint8)
        clip = np.searchsorted(offsets, frames, side="right") - 1
        for i in np.unique(clip):
            rows = np.flatnonzero(clip == i)
            out[rows] = self.sources[i].read(frames[rows] - offsets[i], size=size)
        return out

    def iter_batches(self, batch_size: int, start: int = 0, stop: int | None = None,
                     size=None):
        """(global positions, uint8 B×H×W×3) batches of [start, stop) in order; a batch
        never spans two clips."""
        size = tuple(size) if size is not None else self.proxy_size()
        offsets = self.offsets
        stop = int(offsets[-1]) if stop is None else int(stop)
        for i, source in enumerate(self.sources):
            lo, hi = max(start, offsets[i]), min(stop, offsets[i + 1])
            if lo >= hi:
                continue
            for positions, batch in source.iter_batches(batch_size, int(lo - offsets[i]),
                                                        int(hi - offsets[i]), size=size):
                yield np.asarray(positions, dtype=np.int64) + offsets[i], batch
