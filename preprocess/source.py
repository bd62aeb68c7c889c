"""The pipeline's view of a video: which file to decode and how its frames are numbered."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from vidql.base.errors import ParameterError, VidqlError
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import VideoInfo, probe_video
from vidql.preprocess.rendition import Rendition, RenditionReader, rendition_positions


@dataclass(frozen=True, eq=False)
class Source:
    """One video as the pipeline sees it: the file to decode and how its frames are numbered."""

    path: str  # the file decoded (the rendition file for a rendition)
    info: VideoInfo
    name: str  # the video the user knows (the original for a rendition)
    rendition: Rendition | None = None

    @property
    def frame_count(self) -> int:
        return self.info.frame_count

    def reader(self, threads: int, interpolation: str = "AREA", options: dict | None = None) -> FrameReader:
        return FrameReader(self.path, self.info, threads=threads, interpolation=interpolation, options=options)

    def to_original(self, positions: np.ndarray) -> np.ndarray:
        return positions if self.rendition is None else self.rendition.frames[positions]

    def to_positions(self, frames: np.ndarray) -> np.ndarray:
        """Own frame positions of original frame numbers (range-checked)."""
        if self.rendition is not None:
            return rendition_positions(self.rendition, frames)
        bad = frames[(frames < 0) | (frames >= self.frame_count)]
        if len(bad):
            raise VidqlError(f"frame {int(bad[0])} is out of range for '{self.name}', "
                             f"which has frames 0..{self.frame_count - 1}")
        return frames


def as_source(source) -> Source:
    """A path, VideoInfo, Rendition, RenditionReader, FrameReader or Source as a pipeline Source."""
    if isinstance(source, Source):
        return source
    if isinstance(source, RenditionReader):
        source = source.rendition
    if isinstance(source, Rendition):
        return Source(str(source.path), source.info, source.source, source)
    if isinstance(source, FrameReader):
        return Source(source.path, source.info, source.path)
    if isinstance(source, VideoInfo):
        return Source(source.path, source, source.path)
    if isinstance(source, (str, os.PathLike)):
        info = probe_video(source)
        return Source(str(source), info, str(source))
    raise ParameterError(f"cannot read frames from a {type(source).__name__}; give a path, "
                         f"VideoInfo or Rendition")
