"""GPU pieces of the runtime, each optional and imported only when asked for.

`DeviceTransform` ships uint8 batches to a torch device (pinned memory, non-blocking copy)
and resizes/normalises there. `dali_frame_batches` decodes on the GPU with NVIDIA DALI
(NVDEC). Neither runs without CUDA; the CPU path in `pipeline` is always complete.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from vidql.base.errors import ParameterError, VideoError, VidqlError
from vidql.preprocess.probe import VideoInfo, probe_video
from vidql.preprocess.transforms import Normalize, to_device, to_images


class DaliDecodeError(VideoError):
    """NVDEC, through DALI, cannot decode a video that the CPU decodes (a clip that does not
    start at an IDR frame, say): decode it on the CPU."""


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def dali_available() -> bool:
    """True when NVIDIA DALI is importable and a CUDA device is present."""
    if not cuda_available():
        return False
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class DeviceTransform:
    """Move a uint8 N×H×W×C batch to `device`, resize it there to `size` (w, h), normalise it.

    With `normalize=None` the result stays uint8 (resized through float and rounded back).
    """

    device: str = "cuda"
    size: tuple[int, int] | None = None
    normalize: Normalize | None = None

    def __call__(self, batch):
        import torch

        if self.normalize is not None:
            return self.normalize.to_torch(batch, self.device, self.size)
        tensor = to_device(batch, self.device)
        if self.size is None or (tensor.shape[2], tensor.shape[1]) == tuple(self.size):
            return tensor
        images = to_images(tensor, self.device, self.size)
        return images.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def dali_frame_batches(path: str | os.PathLike, *, size: tuple[int, int] | None = None,
                       batch_size: int = 64, info: VideoInfo | None = None, device_id: int = 0
                       ) -> Iterator[tuple[np.ndarray, "object"]]:
    """Yield (frame numbers, uint8 N×H×W×3 torch CUDA tensor) for every frame, decoded by NVDEC.

    Only for videos whose frames are numbered reliably by timestamp (probe counted them from
    packets): DALI names frames by timestamp, and vidql must agree with it frame for frame.
    """
    info = info if info is not None else probe_video(path)
    if info.counted_by != "packets":
        raise VidqlError(f"'{path}' has irregular timestamps; decode it on the CPU instead of DALI")
    if batch_size < 1:
        raise ParameterError(f"batch_size must be at least 1, got {batch_size}")
    import torch
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import feed_ndarray

    @pipeline_def(batch_size=1, num_threads=2, device_id=device_id, prefetch_queue_depth=2)
    def reader():
        video, frame_num = fn.experimental.readers.video(  # the last sequence padded with -1
            device="gpu", filenames=[str(path)], sequence_length=batch_size, step=batch_size,
            random_shuffle=False, enable_frame_num="sequence", pad_mode="constant", name="reader")
        if size is not None:
            video = fn.resize(video, resize_x=size[0], resize_y=size[1], antialias=True)
        return video, frame_num

    pipe = reader()
    try:
        with _dali_errors(path):
            pipe.build()
        delivered = 0
        while delivered < info.frame_count:
            with _dali_errors(path):
                video, frame_num = pipe.run()
            numbers = np.asarray(frame_num.as_cpu().as_tensor()).reshape(-1)
            count = int((numbers >= 0).sum())
            if count == 0 or not np.array_equal(numbers[:count], np.arange(delivered, delivered + count)):
                raise DaliDecodeError(path, f"DALI returned frames {numbers[:3].tolist()}... where "
                                            f"{delivered} was expected; decode it on the CPU instead")
            sequence = video[0]
            out = torch.empty(tuple(sequence.shape()), dtype=torch.uint8, device=f"cuda:{device_id}")
            feed_ndarray(sequence, out, cuda_stream=torch.cuda.current_stream(device_id))
            yield numbers[:count].astype(np.int64), out[:count]
            delivered += count
    finally:
        del pipe


@contextmanager
def _dali_errors(path):
    """A DALI pipeline's RuntimeError (not torch's: a CUDA error stays what it is) as the
    DaliDecodeError that sends the video to the CPU."""
    try:
        yield
    except RuntimeError as exc:
        raise DaliDecodeError(path, f"DALI cannot decode it ({_reason(exc)})") from exc


def _reason(exc: RuntimeError) -> str:
    """The line of a DALI error that says what went wrong (its messages carry the pipeline's
    definition and C++ context around it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("Error in worker thread:", "Assert on"))]
    return (said or lines or [type(exc).__name__])[0]
