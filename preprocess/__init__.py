"""Decoding, frame access, low-res renditions and the pipelined preprocessing runtime."""
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.pipeline import Batch, Pipeline, PipelineError, frame_batches, run_pipeline
from vidql.preprocess.probe import VideoInfo, probe_video
from vidql.preprocess.rendition import Rendition, RenditionReader, make_rendition, open_rendition
from vidql.preprocess.transforms import FrameSpec, Normalize

__all__ = ["Batch", "FrameReader", "FrameSpec", "Normalize", "Pipeline", "PipelineError", "Rendition",
           "RenditionReader", "VideoInfo", "frame_batches", "make_rendition", "open_rendition",
           "probe_video", "run_pipeline"]
