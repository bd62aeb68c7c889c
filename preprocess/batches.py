"""Convenience front ends of the pipeline: iterate one video's batches or feed a consumer,
with the stages placed on CPU or GPU (and DALI decoding dispatched) as asked."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from tqdm import tqdm

from vidql.base.errors import ParameterError
from vidql.preprocess.gpu import DeviceTransform, dali_frame_batches
from vidql.preprocess.pipeline import Batch, DecodeStats, Pipeline, located
from vidql.preprocess.placement import Placement, plan_placement
from vidql.preprocess.source import as_source
from vidql.preprocess.transforms import FrameSpec


def frame_batches(source, *, size: tuple[int, int] | None = None, batch_size: int = 64,
                  frames=None, workers: int | None = None, spec: FrameSpec | None = None,
                  transform: Callable | None = None, normalize=None, placement=None,
                  memory_budget: int = 512 << 20, decoder_nice: int | None = None,
                  stats: DecodeStats | None = None) -> Iterator[tuple[np.ndarray, Any]]:
    """Yield (original frame numbers, batch) for one video, in frame order.

    `source` is a path, VideoInfo or Rendition (frame numbers are the original video's);
    `frames` restricts to some frames (delivered ascending, once each). Batches are uint8
    N×H×W×3 unless `transform` or `normalize` (a `Normalize`) says otherwise.
    `placement` ("auto", "cpu", "cuda", "dali" or a `Placement`) puts resize/normalise
    (and decode) on the GPU; None keeps everything on the CPU without measuring.
    `memory_budget`: bytes of decoded frames the pipeline may hold ahead of the consumer;
    `decoder_nice`: the decoders' priority below the caller's (see `Pipeline`); `stats`:
    a DecodeStats the CPU decoders' work is added to.
    """
    args = placed_args(source, size, spec, transform, normalize, placement, workers, frames, batch_size)
    if "dali" in args:
        yield from args["dali"]
        return
    with Pipeline(source, batch_size=batch_size, frames=frames, workers=workers,
                  memory_budget=memory_budget, decoder_nice=decoder_nice, stats=stats,
                  **args) as pipeline:
        for batch in pipeline:
            yield batch.indices, batch.frames


def run_pipeline(sources, consumer: Callable[[Batch], Any], *, size: tuple[int, int] | None = None,
                 batch_size: int = 64, frames=None, workers: int | None = None,
                 spec: FrameSpec | None = None, transform: Callable | None = None, normalize=None,
                 placement=None, progress: bool = False) -> list:
    """Feed every batch, in frame order, to `consumer(batch)`; return its results in order.

    The consumer runs in the calling thread while decoders and transforms work ahead.
    Arguments as for `frame_batches` (`placement` applies to the first source's measurements).
    """
    first = sources[0] if isinstance(sources, (list, tuple)) else sources
    args = placed_args(first, size, spec, transform, normalize, placement, workers, frames, None)
    results = []
    with Pipeline(sources, batch_size=batch_size, frames=frames, workers=workers, **args) as pipeline:
        bar = None
        if progress:
            bar = tqdm(total=pipeline.total_frames, unit="frame", desc="preprocess")
        try:
            for batch in pipeline:
                try:
                    results.append(consumer(batch))
                except Exception as exc:
                    raise located("consumer", batch, exc) from exc
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
    return results


def placed_args(source, size, spec, transform, normalize, placement, workers, frames,
            dali_batch_size: int | None) -> dict:
    """Pipeline arguments (spec, transform) for a placement; or a DALI batch iterator
    (only when `dali_batch_size` is given, i.e. for `frame_batches`)."""
    if placement is None:
        if normalize is not None:
            if transform is not None:
                raise ParameterError("give either transform or normalize, not both")
            transform = normalize
        return {"size": size, "spec": spec, "transform": transform}
    if spec is not None or transform is not None:
        raise ParameterError("a placement builds spec and transform itself; give size and normalize")
    chosen = placement if isinstance(placement, Placement) else plan_placement(
        source, size, normalize=normalize, override=None if placement == "auto" else placement,
        workers=workers)
    if chosen.decode == "dali":
        if dali_batch_size is None or frames is not None or isinstance(source, (list, tuple)):
            raise ParameterError("DALI decoding reads one whole video; use placement='cuda' here")
        src = as_source(source)
        finish = DeviceTransform("cuda", None, normalize) if normalize is not None else None
        batches = dali_frame_batches(src.path, size=size, batch_size=dali_batch_size, info=src.info)
        return {"dali": ((src.to_original(i), finish(b) if finish else b) for i, b in batches)}
    return chosen.pipeline_args(size, normalize)
