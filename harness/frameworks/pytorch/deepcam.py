"""DeepCAM's model in PyTorch: DeepLabv3+ with an Xception encoder, as MLPerf HPC's reference
(mlcommons/hpc, deepcam/src/deepCam/architecture/deeplab_xception.py, PyTorch) builds it
with `DeepLabv3_plus(n_input=16, n_classes=3, os=16)`, and as harness/frameworks/tensorflow/
deeplab.py ports it to Keras, both from the design's numbers in harness/workloads/deepcam.py:
the same blocks, channels, paddings, dilations, initial weights and batch-norm settings
(deeplab.py's docstring gives each judgement the port took; here
PyTorch's own layers are the reference's: symmetric padding, ConvTranspose2d with
output_padding 1, kaiming-normal encoder and ASPP, PyTorch's defaults elsewhere). Two
choices keep the two frameworks' models the same function with the same weights:

* the pooling branch's TrainableAffine (w x + b a channel) is a 1 x 1 depthwise
  convolution with bias, as in the Keras port (the same weights and function);
* the in-place ReLU after block 1: its output is both the low-level feature and block 2's
  input, as the reference's in-place ReLU makes it.

The scale and middle-flow settings of harness/workloads/deepcam.shape() shrink it for
tests as they shrink the Keras model. 56,454,720 trainable parameters at scale 1
(tests/test_pytorch_flops.py), the Keras port's; the same Table 3 count.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from harness.frameworks.pytorch import feed, models, train
from harness.workloads import climate, deepcam

BN_MOMENTUM = 1 - deepcam.BN_MOMENTUM    # PyTorch's 0.1 (Keras counts momentum the other way)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=deepcam.BN_EPSILON, momentum=BN_MOMENTUM)


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = False,
          reference_init: bool = True) -> nn.Conv2d:
    """A convolution padded dilation x (kernel - 1) / 2 on each side; kaiming-normal where
    the reference's modules set it (`reference_init`), PyTorch's default elsewhere."""
    conv = nn.Conv2d(cin, cout, kernel, stride, dilation * (kernel - 1) // 2, dilation, bias=bias)
    if reference_init:
        nn.init.kaiming_normal_(conv.weight)
    return conv


class Separable(nn.Module):
    """SeparableConv2d_same: depthwise 3x3 (padding dilation) then pointwise 1x1, no bias,
    nothing between them; kaiming-normal both (a depthwise filter's fan-in is its 9 taps)."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.depthwise = nn.Conv2d(cin, cin, 3, stride, dilation, dilation, groups=cin, bias=False)
        self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)
        nn.init.kaiming_normal_(self.depthwise.weight)
        nn.init.kaiming_normal_(self.pointwise.weight)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


class Block(nn.Module):
    """The reference's Block: its branch layer for layer as harness/workloads/deepcam.block_rep
    lays it out for every port; a 1x1 conv + BN on the skip when the channels or the stride
    change; the sum; a final ReLU unless `end_with_relu` is False."""

    def __init__(self, cin: int, cout: int, reps: int, stride: int = 1, dilation: int = 1,
                 end_with_relu: bool = True, grow_first: bool = True, is_last: bool = False):
        super().__init__()
        layer = {"separable": Separable, "bn": _bn, "relu": nn.ReLU}
        self.rep = nn.Sequential(*(layer[kind](*args) for kind, *args in
                                   deepcam.block_rep(cin, cout, reps, stride, dilation, grow_first, is_last)))
        self.skip = None
        if cout != cin or stride != 1:
            self.skip = nn.Sequential(_conv(cin, cout, 1, stride), _bn(cout))
        self.end_with_relu = end_with_relu

    def forward(self, x):
        y = self.rep(x) + (x if self.skip is None else self.skip(x))
        return F.relu(y) if self.end_with_relu else y


def _conv_bn_relu(conv: nn.Module, c: int) -> nn.Sequential:
    return nn.Sequential(conv, _bn(c), nn.ReLU())


class Xception(nn.Module):
    """The encoder: (features at stride 16, the low-level feature at stride 4)."""

    def __init__(self, cin: int, c, middle: int, exit_rates: tuple):
        super().__init__()
        e0, e1 = c(deepcam.ENTRY[0]), c(deepcam.ENTRY[1])
        b1, b2, b3 = (c(n) for n in deepcam.BLOCKS)
        x0, x1, x2, x3 = (c(n) for n in deepcam.EXIT)
        self.entry = nn.Sequential(_conv_bn_relu(_conv(cin, e0, 3, stride=2), e0), _conv_bn_relu(_conv(e0, e1, 3), e1),
                                   Block(e1, b1, 2, stride=2, end_with_relu=False), nn.ReLU())
        self.middle = nn.Sequential(Block(b1, b2, 2, stride=2), Block(b2, b3, 2, stride=2, is_last=True),
                                    *(Block(b3, b3, 3) for _ in range(middle)),
                                    Block(b3, x0, 2, dilation=exit_rates[0], end_with_relu=False, grow_first=False,
                                          is_last=True),
                                    *(_conv_bn_relu(Separable(a, b, dilation=exit_rates[1]), b)
                                      for a, b in ((x0, x1), (x1, x2), (x2, x3))))

    def forward(self, x):
        low = self.entry(x)
        return self.middle(low), low


class ASPP(nn.Module):
    """The bottleneck: four atrous branches and the pooling branch (tiled back to the
    feature map), concatenated, fused by a 1x1 conv + BN + ReLU."""

    def __init__(self, cin: int, c: int, rates: tuple):
        super().__init__()
        self.branches = nn.ModuleList(_conv_bn_relu(_conv(cin, c, 1 if r == 1 else 3, dilation=r), c) for r in rates)
        affine = nn.Conv2d(c, c, 1, groups=c, bias=True)      # TrainableAffine: w x + b, w = 1, b = 0
        nn.init.ones_(affine.weight)
        nn.init.zeros_(affine.bias)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), _conv(cin, c, 1, reference_init=False), affine, nn.ReLU())
        self.fuse = _conv_bn_relu(_conv(c * (len(rates) + 1), c, 1, reference_init=False), c)

    def forward(self, x):
        g = self.pool(x).expand(-1, -1, x.shape[2], x.shape[3])
        return self.fuse(torch.cat([b(x) for b in self.branches] + [g], dim=1))


def _deconv(cin: int, cout: int) -> nn.ConvTranspose2d:
    """ConvTranspose2d(k 3, stride 2, padding 1, output_padding 1, no bias): 2H x 2W."""
    return nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1, bias=False)


class DeepLab(nn.Module):
    """(N, inputs, H, W) -> (N, classes, H, W) logits, H and W multiples of 16."""

    def __init__(self, inputs: int, classes: int, scale: float = 1.0, middle: int = deepcam.MIDDLE_BLOCKS,
                 rates: tuple = (deepcam.ASPP_RATES, deepcam.EXIT_RATES)):
        super().__init__()
        c = lambda n: deepcam.channels(n, scale)   # noqa: E731
        deep, low, dec = c(deepcam.EXIT[-1]), c(deepcam.LOW_LEVEL), c(deepcam.DECODER)
        self.encoder = Xception(inputs, c, middle, rates[1])
        self.aspp = ASPP(deep, c(deepcam.ASPP), rates[0])
        self.low = _conv_bn_relu(_conv(c(deepcam.BLOCKS[0]), low, 1, reference_init=False), low)
        self.up1 = nn.Sequential(_conv_bn_relu(_deconv(c(deepcam.ASPP), dec), dec), _conv_bn_relu(_deconv(dec, dec), dec))
        self.up2 = nn.Sequential(_conv_bn_relu(_conv(dec + low, dec, 3, reference_init=False), dec),
                                 _conv_bn_relu(_conv(dec, dec, 3, reference_init=False), dec),
                                 _conv(dec, dec, 1, bias=True, reference_init=False),
                                 _conv_bn_relu(_deconv(dec, dec), dec), _deconv(dec, classes))

    def forward(self, x):
        if x.shape[2] % deepcam.OUTPUT_STRIDE or x.shape[3] % deepcam.OUTPUT_STRIDE:
            raise ValueError(f"deeplab: found {x.shape[2]} x {x.shape[3]}, expected multiples of"
                             f" {deepcam.OUTPUT_STRIDE} (the encoder's output stride)")
        deep, low = self.encoder(x)
        return self.up2(torch.cat([self.up1(self.aspp(deep)), self.low(low)], dim=1))


def build_model(data) -> nn.Module:
    scale, middle = deepcam.shape()
    return DeepLab(climate.CHANNELS, climate.CLASSES, scale=scale, middle=middle)


class _Entry(nn.Module):
    """The chain's first block: the entry flow, its output both the deep path's input and
    the low-level feature the decoder joins (a pair from here on)."""

    def __init__(self, entry: nn.Module):
        super().__init__()
        self.entry = entry

    def forward(self, x):
        low = self.entry(x)
        return low, low


class _Deep(nn.Module):
    """A block of the deep path (a middle or exit block, ASPP, the first up-sampling), the
    low-level feature carried along beside it to the decoder's stage."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, pair):
        deep, low = pair
        return self.block(deep), low


class _Join(nn.Module):
    """The decoder's join: the deep path and the reduced low-level feature, concatenated."""

    def __init__(self, low: nn.Module):
        super().__init__()
        self.low = low

    def forward(self, pair):
        deep, low = pair
        return torch.cat([deep, self.low(low)], dim=1)


def chain(model: DeepLab) -> list[nn.Module]:
    """DeepLab as a chain of blocks for line 37's split modes (the model's own modules,
    wrapped): the entry flow; each middle and exit block, ASPP and the first up-sampling
    with the low-level feature carried beside them; the join; the decoder's layers. Its
    composition is DeepLab.forward (tests/test_pipeline.py)."""
    return [_Entry(model.encoder.entry), *(_Deep(b) for b in model.encoder.middle), _Deep(model.aspp),
            _Deep(model.up1), _Join(model.low), *model.up2]


def sample(data) -> torch.Tensor:
    return torch.zeros(1, climate.CHANNELS, data.height, data.width)


def inputs(x: np.ndarray, device) -> torch.Tensor:
    return models.channels_first(x, device)


def targets(y: np.ndarray, device) -> torch.Tensor:
    return feed.to_device(np.asarray(y, np.int64), device)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample loss: the mean over pixels of the class-weighted cross entropy."""
    weights = _class_weights(outputs.device, outputs.dtype)
    return torch.mean(F.cross_entropy(outputs, labels, reduction="none") * weights[labels], dim=(1, 2))


@functools.cache
def _class_weights(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """CLASS_WEIGHTS on `device`, made once: not a host-to-device copy every step."""
    return torch.tensor(deepcam.CLASS_WEIGHTS, dtype=dtype, device=device)


def predict(model: nn.Module, data, rows: slice, device) -> np.ndarray:
    """Per-pixel class probabilities (softmax in FP32) of validation samples `rows`, each
    flattened H x W x 3, pixel-major (the Keras twin's layout, tensorflow/deepcam.predict)."""
    feed = (inputs(x, device) for x in deepcam.validation_samples(data, rows))
    out = train.outputs(model, feed, lambda logits: torch.softmax(logits.float(), dim=1).movedim(1, -1).flatten(1))
    return out if len(out) else np.zeros((0, deepcam.score_width(data)), np.float32)
