"""A compact CNN for low-res frames: the triplet embedder's network and the per-query
proxy baseline's regressor. Cheap enough to run over every frame of a video on a CPU."""
from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from vidql.preprocess.pipeline import DECODER_NICE, cpu_count, decoder_threads
from vidql.preprocess.transforms import Normalize


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class CompactCNN(nn.Module):
    """Five 3×3 conv layers (three with stride 2), 2×2 average pooling, a linear head.

    With `normalize`, outputs lie on the unit sphere (embeddings for triplet loss);
    without, they are raw (a regressor's outputs)."""

    def __init__(self, out_dim: int = 128, width: int = 32, normalize: bool = True):
        super().__init__()
        w = width
        self.features = nn.Sequential(_conv(3, w // 2, 2), _conv(w // 2, w, 2), _conv(w, 2 * w, 1),
                                      _conv(2 * w, 4 * w, 2), _conv(4 * w, 4 * w, 1))
        self.pool = nn.AdaptiveAvgPool2d((2, 2))
        self.head = nn.Linear(16 * w, out_dim)
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.head(torch.flatten(self.pool(self.features(x)), 1))
        return nn.functional.normalize(z, dim=1) if self.normalize else z


def to_tensor(frames: np.ndarray, device="cpu", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)
              ) -> torch.Tensor:
    """uint8 N×H×W×3 RGB frames -> normalised float32 N×3×H×W tensor on `device`."""
    return Normalize(tuple(mean), tuple(std)).to_torch(frames, device)


def torch_device() -> str:
    """'cuda' when a GPU is usable, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextmanager
def cpu_threads(n: int, blas: int = 1):
    """Run the block with `n` torch intra-op threads and `blas` BLAS/OpenMP threads (numpy's
    SVD, FAISS), then restore the caller's settings. One BLAS thread by default: the PCA's
    SVD ran several times faster single-threaded on a shared 2-core machine, and its
    results then do not depend on the thread count."""
    previous = torch.get_num_threads()
    try:
        with threadpool_limits(limits=max(1, int(blas))):
            # after the limit, which caps every OpenMP runtime, torch's own among them: set
            # first, torch ran on one thread whatever `n` said
            torch.set_num_threads(max(1, int(n)))
            yield
    finally:
        torch.set_num_threads(previous)


def decoding_beside_torch():
    """Decoder settings (`decoder_threads`) for a pass that runs a network beside the
    decoding: on the CPU, a decoder per core at low priority, so the network keeps the core
    its thread needs and decoding takes every cycle it leaves. Of the slower of decode-only
    and forward-only on 2 cores (3 runs each): synthetic traffic 0.76-0.79 (one decoder:
    0.71-0.94), highway 0.80-0.83 (0.76-0.94), indoor_people 0.62-0.74 (0.48-0.49),
    ua_detrac 0.82-0.92 (0.67-0.81); the last two decode slower than the CNN runs. On a
    GPU, a decoder per core at normal priority."""
    if torch_device() != "cpu":
        return decoder_threads(None)
    return decoder_threads(None, nice=DECODER_NICE)


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system. glibc keeps what threads and torch
    freed (a training run's activations, a decoding pass's frames) as this process's memory
    until the heap is trimmed; elsewhere this does nothing."""
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):
        return
    if trim is not None:
        trim(0)


def fastest_threads(model: nn.Module, size: tuple[int, int], *, batch: int = 64,
                    repeats: int = 2, gain: float = 1.3) -> int:
    """The torch thread count for running `model` on a batch of `size` = (w, h) frames:
    every core this process may use when that is `gain` times faster than 1 thread (best
    of `repeats` timed forward passes each), else 1, since extra threads spin and on a
    shared CPU often slow down. On a GPU, or with one core: the current setting."""
    cores = cpu_count()
    if torch_device() != "cpu" or cores <= 1:
        return torch.get_num_threads()
    x = torch.zeros(batch, 3, size[1], size[0])
    model = model.eval()
    best = {}
    for n in (1, cores):
        with cpu_threads(n), torch.inference_mode():
            model(x[:2])  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
        best[n] = min(times)
    return cores if best[cores] * gain < best[1] else 1
