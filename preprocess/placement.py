"""Where each stage runs (CPU or GPU), chosen by measuring the stages on a short probe.

A placement says where decoding (cpu/dali), resizing (cpu: swscale inside the decoder, or
cuda) and normalising (cpu/cuda/none) run. Stages on the same resource share it, so a
resource needs the sum of its stages' times per frame; the pipeline runs at the pace of the
busiest resource. The planner measures each stage alone on ~100 frames, predicts every
possible placement's rate, and picks the fastest; `override` forces a choice.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from vidql.base.errors import ParameterError
from vidql.preprocess.gpu import (DaliDecodeError, DeviceTransform, cuda_available, dali_available,
                                  dali_frame_batches)
from vidql.preprocess.pipeline import Pipeline
from vidql.preprocess.source import as_source
from vidql.preprocess.transforms import FrameSpec, Normalize


@dataclass(frozen=True)
class Placement:
    """Where decode, resize and normalise run, and the rates that led to it (frames/s)."""

    decode: str = "cpu"  # "cpu" | "dali"
    resize: str = "cpu"  # "cpu" (swscale while converting) | "cuda"
    normalize: str = "cpu"  # "cpu" | "cuda" | "none"
    predicted_fps: float = float("nan")
    stage_fps: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        return f"decode={self.decode},resize={self.resize},normalize={self.normalize}"

    def pipeline_args(self, size: tuple[int, int] | None, normalize: Normalize | None) -> dict:
        """`spec` and `transform` arguments of a CPU-decoding Pipeline that realise this placement."""
        if self.decode != "cpu":
            raise ParameterError("a DALI placement decodes outside the CPU pipeline; use frame_batches")
        if self.resize == "cuda":
            return {"spec": FrameSpec(), "transform": DeviceTransform("cuda", size, normalize)}
        spec = FrameSpec(size=size)
        if normalize is None or self.normalize == "none":
            return {"spec": spec, "transform": None}
        if self.normalize == "cuda":
            return {"spec": spec, "transform": DeviceTransform("cuda", None, normalize)}
        return {"spec": spec, "transform": normalize}


# (decode, resize, normalize) -> {resource: [stages whose time per frame it pays]}
_STAGES = {
    ("cpu", "cpu", "cpu"): {"cpu": ["decode_resize_cpu", "normalize_cpu"]},
    ("cpu", "cpu", "cuda"): {"cpu": ["decode_resize_cpu"], "gpu": ["normalize_cuda"]},
    ("cpu", "cuda", "cuda"): {"cpu": ["decode_full_cpu"], "gpu": ["resize_normalize_cuda"]},
    ("dali", "cuda", "cuda"): {"gpu": ["decode_dali", "resize_normalize_cuda"]},
    ("cpu", "cpu", "none"): {"cpu": ["decode_resize_cpu"]},
    ("cpu", "cuda", "none"): {"cpu": ["decode_full_cpu"], "gpu": ["resize_cuda"]},
    ("dali", "cuda", "none"): {"gpu": ["decode_dali", "resize_cuda"]},
}


def candidates(cuda: bool, dali: bool, normalize: bool) -> list[tuple[str, str, str]]:
    """Placements possible on this machine, CPU-only first (preferred on ties)."""
    return [key for key in _STAGES
            if (cuda or "cuda" not in key) and (dali or key[0] != "dali")
            and (key[2] != "none") == normalize]


def predict(key: tuple[str, str, str], rates: dict[str, float]) -> float:
    """Pipeline rate of a placement: the frames/s of its busiest resource."""
    per_resource = [sum(1.0 / rates[name] for name in names) for names in _STAGES[key].values()]
    return 1.0 / max(per_resource)


def choose_placement(rates: dict[str, float], keys: list[tuple[str, str, str]]) -> Placement:
    """The placement with the highest predicted rate among `keys` (earlier wins ties)."""
    best = max(keys, key=lambda k: (predict(k, rates), -keys.index(k)))
    return Placement(*best, predicted_fps=predict(best, rates), stage_fps=dict(rates))


def measure_stages(source, size: tuple[int, int] | None, normalize: Normalize | None, *,
                   probe_frames: int = 96, batch_size: int = 32, workers: int | None = None,
                   cuda: bool = False, dali: bool = False) -> dict[str, float]:
    """Frames/s of each stage alone, on the first `probe_frames` frames of `source`."""
    source = as_source(source)
    frames = np.arange(min(probe_frames, source.frame_count))
    rates = {"decode_resize_cpu": _pipeline_rate(source, frames, FrameSpec(size=size), batch_size, workers)}
    with Pipeline(source, spec=FrameSpec(size=size), frames=frames[:batch_size], batch_size=batch_size) as p:
        small = next(iter(p)).frames
    if normalize is not None:
        rates["normalize_cpu"] = _call_rate(normalize, small)
    if cuda:
        import torch

        rates["decode_full_cpu"] = _pipeline_rate(source, frames, FrameSpec(), batch_size, workers)
        with Pipeline(source, frames=frames[:batch_size], batch_size=batch_size) as p:
            full = next(iter(p)).frames
        sync = torch.cuda.synchronize
        if normalize is None:
            rates["resize_cuda"] = _call_rate(DeviceTransform("cuda", size), full, sync)
        else:
            rates["normalize_cuda"] = _call_rate(DeviceTransform("cuda", None, normalize), small, sync)
            rates["resize_normalize_cuda"] = _call_rate(DeviceTransform("cuda", size, normalize), full, sync)
    if dali:
        try:
            rates["decode_dali"] = _dali_rate(source, size, len(frames), batch_size)
        except DaliDecodeError as exc:
            warnings.warn(f"{exc}; decoding it on the CPU", stacklevel=2)
    return rates


def _dali_rate(source, size, frames: int, batch_size: int) -> float:
    start, count = time.perf_counter(), 0
    for indices, _ in dali_frame_batches(source.path, size=size, batch_size=batch_size, info=source.info):
        count += len(indices)
        if count >= frames:
            break
    return count / (time.perf_counter() - start)


def measured(key: tuple[str, str, str], rates: dict[str, float]) -> bool:
    """True when every stage of a placement has a measured rate (DALI's is missing for a
    video NVDEC cannot decode)."""
    return all(name in rates for names in _STAGES[key].values() for name in names)


def plan_placement(source, size: tuple[int, int] | None, *, normalize: Normalize | None = None,
                   override: str | Placement | None = None, probe_frames: int = 96,
                   workers: int | None = None) -> Placement:
    """Measure the stages on `source` and return the placement with the highest predicted rate.

    `override` ("cpu", "cuda", "dali" or a Placement) skips the choice but still checks that
    the machine can run it.
    """
    cuda, dali = cuda_available(), dali_available()
    if isinstance(override, Placement):
        return override
    keys = candidates(cuda, dali, normalize is not None)
    if override is not None:
        wanted = {"cpu": lambda k: "cuda" not in k and k[0] == "cpu",
                  "cuda": lambda k: k[0] == "cpu" and k[1] == "cuda",
                  "dali": lambda k: k[0] == "dali"}
        if override not in wanted:
            raise ParameterError(f"placement override must be 'cpu', 'cuda' or 'dali', got {override!r}")
        keys = [k for k in keys if wanted[override](k)]
        if not keys:
            raise ParameterError(f"placement {override!r} is not possible here (CUDA: {cuda}, DALI: {dali})")
    rates = measure_stages(source, size, normalize, probe_frames=probe_frames, workers=workers,
                           cuda=cuda, dali=dali and any(k[0] == "dali" for k in keys))
    keys = [k for k in keys if measured(k, rates)]
    if not keys:
        raise ParameterError(f"placement {override!r} is not possible for this video: DALI cannot decode it")
    return choose_placement(rates, keys)


def _pipeline_rate(source, frames, spec, batch_size, workers) -> float:
    start = time.perf_counter()
    with Pipeline(source, spec=spec, frames=frames, batch_size=batch_size, workers=workers) as pipeline:
        count = sum(len(batch) for batch in pipeline)
    return count / max(time.perf_counter() - start, 1e-9)


def _call_rate(fn, batch, sync=None, repeats: int = 3) -> float:
    fn(batch)  # warm-up (allocations, CUDA context)
    if sync:
        sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(batch)
    if sync:
        sync()
    return repeats * len(batch) / max(time.perf_counter() - start, 1e-9)
