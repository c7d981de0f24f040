"""DeepCAM's model in MindSpore: DeepLabv3+ with an Xception encoder, as MLPerf HPC's
reference (mlcommons/hpc, deepcam/src/deepCam/architecture/deeplab_xception.py, PyTorch)
builds it, written again layer for layer from harness/frameworks/pytorch/deepcam.py (its
twin here) and the design's numbers in harness/workloads/deepcam.py; harness/frameworks/
tensorflow/deeplab.py's docstring gives each judgement the ports took. MindSpore's layers
can be the reference's own, as PyTorch's are:

* symmetric padding, dilation x (kernel - 1) / 2 on each side ("pad" mode), so a stride-2
  convolution sees one padded pixel on each side as the reference's does;
* the transposed convolutions (PyTorch's k 3, stride 2, padding 1, output_padding 1): an
  nn.Conv2dTranspose padded 1 before and 0 after (_deconv says why not output_padding);
* batch norm eps 1e-5, momentum 0.9 in MindSpore's convention (moving = 0.9 moving + 0.1
  batch, Keras' way of counting; PyTorch's 0.1), gamma 1, beta 0;
* initial weights: the encoder's and the ASPP's convolutions kaiming-normal (std
  sqrt(2 / fan_in), not truncated; a depthwise filter's fan_in its 9 taps); every other
  convolution PyTorch's default, uniform +- 1 / sqrt(fan_in), the bias too (a transposed
  kernel's fan_in is its out channels x 9, as PyTorch computes it); both written out here
  rather than left to MindSpore's defaults;
* the pooling branch's TrainableAffine (w x + b a channel, w = 1, b = 0) a 1 x 1 depthwise
  convolution with bias, as in the other two ports (the same function and weights);
* the ReLU after block 1: its output is both the low-level feature and block 2's input, as
  the reference's in-place ReLU makes it.

56,454,720 trainable parameters at scale 1, the same Table 3 count by operator and weights
as PyTorch's and Keras' (tests/test_mindspore.py); the scale and middle-flow settings of
deepcam.shape() shrink it for tests as they shrink the other two. Given PyTorch's weights
and batch-norm statistics, name for name, its eval-mode logits were PyTorch's to 4e-7
(shrunk, 32 x 48, checked once by hand: the two frameworks live in two venvs). The loss
and the prediction are PyTorch's: the class-weighted per-pixel cross entropy, its plain
mean over pixels a sample; per-pixel softmax probabilities, pixel-major. deepcam's LAMB
clips the job's averaged gradients at global norm 1 (train.Step, its options'
global_clipnorm).

Table 3 by cells (harness/frameworks/mindspore/flops.py): a block's add and final ReLU are
its `records`; the encoder, ASPP and the model itself only pass tensors on, concatenate and
tile (no Table 3 operator: empty records).
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import Normal, Uniform

from harness.frameworks.mindspore import models, train
from harness.workloads import climate, deepcam


def _kaiming(fan_in: int) -> Normal:
    """PyTorch's kaiming_normal_ (fan-in, gain sqrt 2): N(0, 2 / fan_in), not truncated."""
    return Normal(sigma=math.sqrt(2.0 / fan_in))


def _default(fan_in: int) -> Uniform:
    """PyTorch's default for a convolution's kernel (kaiming-uniform, a = sqrt 5) and bias:
    U(-1 / sqrt(fan_in), 1 / sqrt(fan_in))."""
    return Uniform(scale=1.0 / math.sqrt(fan_in))


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=deepcam.BN_EPSILON, momentum=deepcam.BN_MOMENTUM)


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = False,
          reference_init: bool = True) -> nn.Conv2d:
    """A convolution padded dilation x (kernel - 1) / 2 on each side; kaiming-normal where
    the reference's modules set it (`reference_init`), PyTorch's default elsewhere (the
    bias PyTorch's default in both)."""
    fan_in = cin * kernel * kernel
    return nn.Conv2d(cin, cout, kernel, stride, pad_mode="pad", padding=dilation * (kernel - 1) // 2,
                     dilation=dilation, has_bias=bias,
                     weight_init=_kaiming(fan_in) if reference_init else _default(fan_in),
                     bias_init=_default(fan_in) if bias else "zeros")


def _separable(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.SequentialCell:
    """SeparableConv2d_same: depthwise 3x3 (padding dilation) then pointwise 1x1, no bias,
    nothing between them (a SequentialCell: the FLOP count sees the two convolutions)."""
    depthwise = nn.Conv2d(cin, cin, 3, stride, pad_mode="pad", padding=dilation, dilation=dilation, group=cin,
                          has_bias=False, weight_init=_kaiming(9))
    pointwise = nn.Conv2d(cin, cout, 1, has_bias=False, weight_init=_kaiming(cin))
    return nn.SequentialCell(depthwise, pointwise)


class Block(nn.Cell):
    """The reference's Block: its branch layer for layer as harness/workloads/deepcam.block_rep
    lays it out for every port; a 1x1 conv + BN on the skip when the channels or the stride
    change; the sum; a final ReLU unless `end_with_relu` is False."""

    def __init__(self, cin: int, cout: int, reps: int, stride: int = 1, dilation: int = 1,
                 end_with_relu: bool = True, grow_first: bool = True, is_last: bool = False):
        super().__init__()
        layer = {"separable": _separable, "bn": _bn, "relu": nn.ReLU}
        self.rep = nn.SequentialCell([layer[kind](*args) for kind, *args in
                                      deepcam.block_rep(cin, cout, reps, stride, dilation, grow_first, is_last)])
        projects = cout != cin or stride != 1
        self.skip = nn.SequentialCell(_conv(cin, cout, 1, stride), _bn(cout)) if projects else nn.Identity()
        self.end_with_relu = end_with_relu

    def construct(self, x):
        y = self.rep(x) + self.skip(x)
        return ops.relu(y) if self.end_with_relu else y

    def records(self, output) -> list[dict]:
        """The sum, and the final ReLU where the block ends with one."""
        relu = [{"kind": "activation", "activation": "relu", "out": output.size}] if self.end_with_relu else []
        return [{"kind": "merge", "inputs": 2, "out": output.size}, *relu]


def _conv_bn_relu(conv: nn.Cell, c: int) -> nn.SequentialCell:
    return nn.SequentialCell(conv, _bn(c), nn.ReLU())


def _no_arithmetic(output) -> list[dict]:
    """A cell that only routes, concatenates or tiles its children's tensors: no Table 3 operator."""
    return []


class Xception(nn.Cell):
    """The encoder: (features at stride 16, the low-level feature at stride 4)."""
    records = staticmethod(_no_arithmetic)

    def __init__(self, cin: int, c, middle: int, exit_rates: tuple):
        super().__init__()
        e0, e1 = c(deepcam.ENTRY[0]), c(deepcam.ENTRY[1])
        b1, b2, b3 = (c(n) for n in deepcam.BLOCKS)
        x0, x1, x2, x3 = (c(n) for n in deepcam.EXIT)
        self.entry = nn.SequentialCell(_conv_bn_relu(_conv(cin, e0, 3, stride=2), e0),
                                       _conv_bn_relu(_conv(e0, e1, 3), e1),
                                       Block(e1, b1, 2, stride=2, end_with_relu=False), nn.ReLU())
        self.middle = nn.SequentialCell(Block(b1, b2, 2, stride=2), Block(b2, b3, 2, stride=2, is_last=True),
                                        *(Block(b3, b3, 3) for _ in range(middle)),
                                        Block(b3, x0, 2, dilation=exit_rates[0], end_with_relu=False,
                                              grow_first=False, is_last=True),
                                        *(_conv_bn_relu(_separable(a, b, dilation=exit_rates[1]), b)
                                          for a, b in ((x0, x1), (x1, x2), (x2, x3))))

    def construct(self, x):
        low = self.entry(x)
        return self.middle(low), low


class ASPP(nn.Cell):
    """The bottleneck: four atrous branches and the pooling branch (tiled back to the
    feature map: a broadcast, no arithmetic), concatenated, fused by a 1x1 conv + BN + ReLU."""
    records = staticmethod(_no_arithmetic)

    def __init__(self, cin: int, c: int, rates: tuple):
        super().__init__()
        self.branches = nn.CellList([_conv_bn_relu(_conv(cin, c, 1 if r == 1 else 3, dilation=r), c) for r in rates])
        affine = nn.Conv2d(c, c, 1, group=c, has_bias=True, weight_init="ones", bias_init="zeros")   # w x + b
        self.pool = nn.SequentialCell(nn.AdaptiveAvgPool2d(1), _conv(cin, c, 1, reference_init=False), affine,
                                      nn.ReLU())
        self.fuse = _conv_bn_relu(_conv(c * (len(rates) + 1), c, 1, reference_init=False), c)

    def construct(self, x):
        g = self.pool(x)
        g = ops.broadcast_to(g, (g.shape[0], g.shape[1], x.shape[2], x.shape[3]))
        return self.fuse(ops.cat([b(x) for b in self.branches] + [g], axis=1))


def _deconv(cin: int, cout: int) -> nn.Conv2dTranspose:
    """PyTorch's ConvTranspose2d(k 3, stride 2, padding 1, output_padding 1, no bias): 2H x
    2W, output pixel o taking input i where o = 2i - 1 + k. Here padding (1, 0, 1, 0): the
    first row and column of the full (2H + 1) x (2W + 1) result cropped, none of the last,
    which is PyTorch's exactly; MindSpore 2.10's own padding 1 with output_padding 1 gives
    another function on the CPU (tried against a loop of the rule above: off everywhere).
    Its kernel (cin, cout, 3, 3), PyTorch's default (fan_in cout x 9)."""
    return nn.Conv2dTranspose(cin, cout, 3, stride=2, pad_mode="pad", padding=(1, 0, 1, 0), has_bias=False,
                              weight_init=_default(cout * 9))


class DeepLab(nn.Cell):
    """(N, inputs, H, W) -> (N, classes, H, W) logits, H and W multiples of 16 (build_model
    checks the data's: a raise inside construct would be the compiled graph's)."""
    records = staticmethod(_no_arithmetic)

    def __init__(self, inputs: int, classes: int, scale: float = 1.0, middle: int = deepcam.MIDDLE_BLOCKS,
                 rates: tuple = (deepcam.ASPP_RATES, deepcam.EXIT_RATES)):
        super().__init__()
        c = lambda n: deepcam.channels(n, scale)   # noqa: E731
        deep, low, dec = c(deepcam.EXIT[-1]), c(deepcam.LOW_LEVEL), c(deepcam.DECODER)
        self.encoder = Xception(inputs, c, middle, rates[1])
        self.aspp = ASPP(deep, c(deepcam.ASPP), rates[0])
        self.low = _conv_bn_relu(_conv(c(deepcam.BLOCKS[0]), low, 1, reference_init=False), low)
        self.up1 = nn.SequentialCell(_conv_bn_relu(_deconv(c(deepcam.ASPP), dec), dec),
                                     _conv_bn_relu(_deconv(dec, dec), dec))
        self.up2 = nn.SequentialCell(_conv_bn_relu(_conv(dec + low, dec, 3, reference_init=False), dec),
                                     _conv_bn_relu(_conv(dec, dec, 3, reference_init=False), dec),
                                     _conv(dec, dec, 1, bias=True, reference_init=False),
                                     _conv_bn_relu(_deconv(dec, dec), dec), _deconv(dec, classes))

    def construct(self, x):
        deep, low = self.encoder(x)
        return self.up2(ops.cat([self.up1(self.aspp(deep)), self.low(low)], axis=1))


def build_model(data) -> nn.Cell:
    if data.height % deepcam.OUTPUT_STRIDE or data.width % deepcam.OUTPUT_STRIDE:
        raise ValueError(f"deeplab: found {data.height} x {data.width}, expected multiples of"
                         f" {deepcam.OUTPUT_STRIDE} (the encoder's output stride)")
    scale, middle = deepcam.shape()
    return DeepLab(climate.CHANNELS, climate.CLASSES, scale=scale, middle=middle)


def sample(data):
    return ms.Tensor(np.zeros((1, climate.CHANNELS, data.height, data.width), np.float32))


def inputs(x: np.ndarray):
    return models.channels_first(x)


def targets(y: np.ndarray):
    return ms.Tensor(np.asarray(y, np.int32))


# made once, a constant of the step's graph
_CLASS_WEIGHTS = ms.Tensor(np.asarray(deepcam.CLASS_WEIGHTS, np.float32))


def loss(outputs, labels):
    """Per-sample loss: the mean over pixels of the class-weighted cross entropy (w[label]
    times each pixel's, as PyTorch's cross_entropy(weight=w, reduction='none') weighs it)."""
    pixels = ops.cross_entropy(outputs, labels, reduction="none") * ops.gather(_CLASS_WEIGHTS, labels, 0)
    return pixels.mean(axis=(1, 2))


def _probabilities(logits):
    """Per-pixel softmax in FP32, each sample flattened H x W x 3, pixel-major."""
    p = ops.softmax(logits.astype(ms.float32), axis=1).transpose(0, 2, 3, 1)
    return p.reshape(p.shape[0], -1)


def predict(model: nn.Cell, data, rows: slice) -> np.ndarray:
    """Per-pixel class probabilities of validation samples `rows` (PyTorch's layout)."""
    out = train.outputs(model, (inputs(x) for x in deepcam.validation_samples(data, rows)), _probabilities)
    return out if len(out) else np.zeros((0, deepcam.score_width(data)), np.float32)
