"""Decoding, frame access, low-res renditions and the pipelined preprocessing runtime."""
from vidql.preprocess.frames import FrameReader
from vidql.preprocess.gpu import DeviceTransform, cuda_available, dali_available
from vidql.preprocess.batches import frame_batches, run_pipeline
from vidql.preprocess.pipeline import Batch, DecodeStats, Pipeline, PipelineError
from vidql.preprocess.placement import Placement, plan_placement
from vidql.preprocess.probe import VideoInfo, probe_video
from vidql.preprocess.rendition import (Rendition, RenditionReader, make_rendition, open_rendition,
                                        rendition_size)
from vidql.preprocess.transforms import FrameSpec, Normalize

__all__ = ["Batch", "DecodeStats", "DeviceTransform", "FrameReader", "FrameSpec", "Normalize", "Pipeline",
           "PipelineError", "Placement", "Rendition", "RenditionReader", "VideoInfo", "cuda_available",
           "dali_available", "frame_batches", "make_rendition", "open_rendition", "plan_placement",
           "probe_video", "rendition_size", "run_pipeline"]
