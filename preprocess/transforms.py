"""What happens to frames between decoder and model: per-frame geometry, batch normalisation.

`FrameSpec` is applied in the decoder thread while swscale converts each frame to RGB
(crop, resize, pixel format in one pass); `Normalize` turns uint8 batches into float
tensors for a model, with numpy on the CPU or torch on any device (uint8 travels, floats
are made where the model runs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vidql.base.errors import ParameterError

PIXEL_FORMATS = {"rgb24": 3, "bgr24": 3, "gray": 1}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class FrameSpec:
    """Per-frame output: `size` (width, height), optional `crop` (x, y, w, h in source pixels),
    pixel format, and the swscale interpolation used when the size changes."""

    size: tuple[int, int] | None = None
    crop: tuple[int, int, int, int] | None = None
    pixel_format: str = "rgb24"
    interpolation: str = "AREA"

    def __post_init__(self):
        if self.pixel_format not in PIXEL_FORMATS:
            raise ParameterError(f"pixel_format must be one of {sorted(PIXEL_FORMATS)}, "
                                 f"got {self.pixel_format!r}")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ParameterError(f"size must be (width, height) with positive sides, got {self.size}")
        if self.crop is not None and (len(self.crop) != 4 or min(self.crop[2:]) < 1
                                      or min(self.crop[:2]) < 0):
            raise ParameterError(f"crop must be (x, y, width, height) inside the frame, got {self.crop}")

    @property
    def channels(self) -> int:
        return PIXEL_FORMATS[self.pixel_format]

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the frames this spec makes from frames of the given size."""
        if self.size is not None:
            return int(self.size[0]), int(self.size[1])
        if self.crop is not None:
            return int(self.crop[2]), int(self.crop[3])
        return width, height

    def check_crop(self, width: int, height: int, path: str) -> None:
        if self.crop is not None:
            x, y, w, h = self.crop
            if x + w > width or y + h > height:
                raise ParameterError(f"crop {self.crop} reaches outside the {width}x{height} "
                                     f"frames of '{path}'")

    def apply(self, frame, reformatter) -> np.ndarray:
        """Convert one decoded av.VideoFrame to a uint8 H×W×C array, cropping and resizing in swscale.

        `reformatter` is an av VideoReformatter owned by the calling thread (reusing one
        swscale context is several times faster than a fresh one per frame).

        A crop is done by scaling the whole frame so that the crop box lands on the output
        size, then slicing; the box is rounded to whole output pixels.
        """
        out_w, out_h = self.output_size(frame.width, frame.height)
        if self.crop is None:
            picture = self._convert(frame, out_w, out_h, reformatter)
        else:
            x, y, w, h = self.crop
            sx, sy = out_w / w, out_h / h
            full_w, full_h = max(round(frame.width * sx), out_w), max(round(frame.height * sy), out_h)
            left = min(round(x * sx), full_w - out_w)
            top = min(round(y * sy), full_h - out_h)
            picture = self._convert(frame, full_w, full_h, reformatter)[top:top + out_h, left:left + out_w]
        return picture.reshape(out_h, out_w, self.channels)

    def _convert(self, frame, width: int, height: int, reformatter) -> np.ndarray:
        fmt = "gray8" if self.pixel_format == "gray" else self.pixel_format
        return reformatter.reformat(frame, width=width, height=height, format=fmt,
                                    interpolation=self.interpolation).to_ndarray()


@dataclass(frozen=True)
class Normalize:
    """uint8 N×H×W×C batches to float (x/255 - mean)/std, channels first by default.

    Called on a numpy array it computes with numpy; `to_torch(batch, device)` moves the uint8
    batch to `device` first and computes there (the GPU path: a quarter of the bytes cross the bus).
    """

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels_first: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise ParameterError(f"mean and std need one value per channel and std > 0, "
                                 f"got mean={self.mean}, std={self.std}")

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """Normalise with numpy: one table look-up per channel (256 values), no float arithmetic."""
        table = self.table()
        n, height, width, channels = batch.shape
        if channels != len(self.mean):
            raise ParameterError(f"Normalize has {len(self.mean)} channels, the batch has {channels}")
        if self.channels_first:
            out = np.empty((n, channels, height, width), dtype=self.dtype)
            for c in range(channels):
                np.take(table[c], batch[..., c], out=out[:, c])
        else:
            out = np.empty(batch.shape, dtype=self.dtype)
            for c in range(channels):
                np.take(table[c], batch[..., c], out=out[..., c])
        return out

    def table(self) -> np.ndarray:
        """(channels, 256) values of (v/255 - mean)/std for every uint8 value v."""
        values = np.arange(256, dtype=np.float64) / 255.0
        mean = np.asarray(self.mean, dtype=np.float64)[:, None]
        std = np.asarray(self.std, dtype=np.float64)[:, None]
        return ((values[None, :] - mean) / std).astype(self.dtype)

    def to_torch(self, batch, device="cpu", size: tuple[int, int] | None = None):
        """Normalise with torch on `device`; optionally resize there (antialiased bilinear) first."""
        import torch

        images = to_images(batch, device, size)
        mean = torch.tensor(self.mean, device=images.device).view(1, -1, 1, 1) * 255.0
        std = torch.tensor(self.std, device=images.device).view(1, -1, 1, 1) * 255.0
        images = (images - mean) / std
        if not self.channels_first:
            images = images.permute(0, 2, 3, 1).contiguous()
        return images.to(getattr(torch, self.dtype))


def to_device(batch, device="cpu"):
    """A uint8 N×H×W×C batch (numpy array or torch tensor) as a torch tensor on `device`;
    to a GPU through pinned memory with a non-blocking copy."""
    import torch

    tensor = batch if isinstance(batch, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(batch))
    if tensor.device.type == "cpu" and torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_images(batch, device="cpu", size: tuple[int, int] | None = None):
    """The one uint8 -> tensor path: a uint8 N×H×W×C batch as float N×C×H×W (values 0..255)
    on `device`, resized there to `size` (width, height), antialiased bilinear, when given."""
    import torch

    images = to_device(batch, device).permute(0, 3, 1, 2).float()
    if size is not None and (images.shape[-1], images.shape[-2]) != tuple(size):
        images = torch.nn.functional.interpolate(images, size=(size[1], size[0]), mode="bilinear",
                                                 antialias=True, align_corners=False)
    return images
