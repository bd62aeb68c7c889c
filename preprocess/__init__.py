"""Decoding, frame access, low-res renditions and the pipelined preprocessing runtime."""
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.probe import VideoInfo, probe_video

__all__ = ["FrameReader", "VideoInfo", "probe_video"]
