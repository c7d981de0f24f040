"""The ic workload's model in MindSpore: ResNet-50 v1.5 as harness/frameworks/tensorflow/
resnet.py builds it in Keras and harness/frameworks/pytorch/ic.py in PyTorch, layer for
layer, from the design's numbers in harness/workloads/ic.py. v1.5: a down-sampling
bottleneck strides on its 3x3 convolution. Convolutions without bias ("pad" kernel // 2 on
each side), batch norm with Keras' momentum 0.9 and eps 1e-5, He-normal fan-out kernels
truncated at 2 sigma, the last batch norm of each residual branch with gamma 0, the
classifier N(0, 0.01) with a zero bias: 25,557,032 trainable parameters and the Keras
model's Table 3 count at 224 px, as PyTorch's. Weight decay: the coupled kind on the
kernels (L2), as PyTorch's. The feed: ic.numpy_batches (Pillow in the rank's threads), the
same as PyTorch's.
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import Normal, TruncatedNormal

from harness.frameworks.mindspore import kernels, models, train
from harness.workloads import ic

L2 = ic.WEIGHT_DECAY          # coupled weight decay on the kernels
_STD_OF_TRUNCATED = 0.87962566103423978   # the standard deviation of N(0, 1) truncated at +-2


def _conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """Padded kernel // 2 on each side; Keras' He-normal fan-out, truncated at 2 sigma."""
    std = math.sqrt(2.0 / (cout * kernel * kernel)) / _STD_OF_TRUNCATED
    return nn.Conv2d(cin, cout, kernel, stride, pad_mode="pad", padding=kernel // 2, has_bias=False,
                     weight_init=TruncatedNormal(sigma=std, a=-2 * std, b=2 * std))


def _bn(c: int, zero: bool = False) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=ic.BN_EPSILON, momentum=ic.BN_MOMENTUM, gamma_init="zeros" if zero else "ones")


class Residual(nn.Cell):
    """relu(shortcut(x) + branch(x)), its cells set by a subclass; its own arithmetic, the
    add and the ReLU, is what `records` tells Table 3's count (harness/frameworks/mindspore/
    flops.py). ewa's backbone builds on it too."""

    def construct(self, x):
        return ops.relu(self.shortcut(x) + self.branch(x))

    @staticmethod
    def records(output) -> list[dict]:
        return [{"kind": "merge", "inputs": 2, "out": output.size},
                {"kind": "activation", "activation": "relu", "out": output.size}]


class Bottleneck(Residual):
    """ResNet-50 v1.5's bottleneck: the stride on its 3 x 3, a projection shortcut where the
    shape changes, the branch's last batch norm from gamma 0."""

    def __init__(self, cin: int, inner: int, stride: int):
        super().__init__()
        out = inner * ic.EXPANSION
        self.projects = stride != 1 or cin != out
        self.shortcut = nn.SequentialCell(_conv(cin, out, 1, stride), _bn(out)) if self.projects else nn.Identity()
        self.branch = nn.SequentialCell(_conv(cin, inner, 1), _bn(inner), nn.ReLU(),
                                        _conv(inner, inner, 3, stride), _bn(inner), nn.ReLU(),   # v1.5
                                        _conv(inner, out, 1), _bn(out, zero=True))


def resnet_v1_5(classes: int, width: int = ic.WIDTH, stages=ic.STAGES) -> nn.Cell:
    """Logits (no softmax) of (N, 3, H, W) images; width and stages as resnet.build's."""
    layers, cin = [_conv(3, width, 7, 2), _bn(width), nn.ReLU(), nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)], width
    for s, blocks in enumerate(stages):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width * 2 ** s, 2 if (b == 0 and s > 0) else 1))
            cin = width * 2 ** s * ic.EXPANSION
    logits = nn.Dense(cin, classes, weight_init=Normal(0.01), bias_init="zeros")
    return nn.SequentialCell(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), logits)


def build_model(data) -> nn.Cell:
    width, stages = ic.shape()
    return resnet_v1_5(data.num_classes, width, stages)


def sample(data):
    return ms.Tensor(np.zeros((1, 3, data.side, data.side), np.float32))


def batches(data, rows, batch: int, *, training: bool, seed: int):
    """The training feed (harness/workloads' batches() contract): ic.numpy_batches."""
    return ic.numpy_batches(data, data.train, rows, batch, augment=training, seed=seed,
                            workers=kernels.PINNED.get("threads", 1))


def inputs(x: np.ndarray):
    return models.channels_first(x)


def targets(y: np.ndarray):
    return ms.Tensor(np.asarray(y, np.int32))


def loss(outputs, labels):
    """Per-sample cross-entropy with label smoothing 0.1 (y (1 - 0.1) + 0.1 / classes)."""
    return ops.cross_entropy(outputs, labels, reduction="none", label_smoothing=ic.LABEL_SMOOTHING)


def predict(model: nn.Cell, data, rows: slice) -> np.ndarray:
    """Softmax probabilities (FP32) of validation rows `rows`."""
    idx = np.arange(data.n_val)[rows]
    feed = ic.numpy_batches(data, data.val, idx, ic.EVAL_BATCH, augment=False, drop_remainder=False,
                            workers=kernels.PINNED.get("threads", 1))
    return train.class_probabilities(model, (inputs(x) for x, _ in feed), data.num_classes)
