"""The ic workload's model in PyTorch: ResNet-50 v1.5 as harness/frameworks/tensorflow/
resnet.py builds it in Keras, layer for layer, both from the design's numbers in
harness/workloads/ic.py (torchvision's resnet50 is the same network; it is not used
because torchvision pins one torch build each, and the one for this torch is not on PyPI
for every platform the benchmark runs on: written here it is ~60 lines with no
dependency). v1.5: a down-sampling bottleneck strides on its 3x3 convolution.
Convolutions without bias, batch norm with momentum 0.1 and eps 1e-5 (Keras' 0.9),
He-normal fan-out kernels truncated at 2 sigma (Keras' VarianceScaling(2, fan_out,
truncated_normal)), the last batch norm of each residual branch with gamma 0, the
classifier N(0, 0.01) with a zero bias. 25,557,032 trainable parameters and the Keras
model's Table 3 count at 224 px (tests/test_pytorch_flops.py).

Weight decay: resnet.py's L2 kernel regularizer of wd / 2 adds wd x w to a kernel's
gradient; here the optimizer's (coupled) weight decay wd on the kernels alone (L2
below: train.make_optimizer puts batch norm and biases in a group without it).

The feed: ic.numpy_batches, the same records and transforms as TensorFlow's tf.data
pipeline decoded with Pillow in the rank's threads (ic.py says how the two differ).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from harness.frameworks.pytorch import feed, models, train
from harness.workloads import ic

L2 = ic.WEIGHT_DECAY          # coupled weight decay on the kernels (module docstring)
_STD_OF_TRUNCATED = 0.87962566103423978   # the standard deviation of N(0, 1) truncated at +-2


def _conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """Padded kernel // 2 on each side (resnet.py's ZeroPadding2D before a strided
    convolution, "same" otherwise: the same for odd kernels); Keras' He-normal fan-out."""
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
    std = math.sqrt(2.0 / (cout * kernel * kernel)) / _STD_OF_TRUNCATED
    nn.init.trunc_normal_(conv.weight, std=std, a=-2 * std, b=2 * std)
    return conv


def _bn(c: int, zero: bool = False) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, eps=ic.BN_EPSILON, momentum=1 - ic.BN_MOMENTUM)
    if zero:
        nn.init.zeros_(bn.weight)
    return bn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, inner: int, stride: int, zero_init_residual: bool = True):
        super().__init__()
        out = inner * ic.EXPANSION
        self.shortcut = None
        if stride != 1 or cin != out:
            self.shortcut = nn.Sequential(_conv(cin, out, 1, stride), _bn(out))
        self.branch = nn.Sequential(_conv(cin, inner, 1), _bn(inner), nn.ReLU(),
                                    _conv(inner, inner, 3, stride), _bn(inner), nn.ReLU(),   # v1.5
                                    _conv(inner, out, 1), _bn(out, zero_init_residual))

    def forward(self, x):
        return F.relu((x if self.shortcut is None else self.shortcut(x)) + self.branch(x))


def resnet_v1_5(classes: int, width: int = ic.WIDTH, stages=ic.STAGES) -> nn.Module:
    """Logits (no softmax) of (N, 3, H, W) images; width and stages as resnet.build's."""
    layers, cin = [_conv(3, width, 7, 2), _bn(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], width
    for s, blocks in enumerate(stages):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width * 2 ** s, 2 if (b == 0 and s > 0) else 1))
            cin = width * 2 ** s * ic.EXPANSION
    logits = nn.Linear(cin, classes)
    nn.init.normal_(logits.weight, std=0.01)
    nn.init.zeros_(logits.bias)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), logits)


def build_model(data) -> nn.Module:
    width, stages = ic.shape()
    return resnet_v1_5(data.num_classes, width, stages)


def sample(data) -> torch.Tensor:
    return torch.zeros(1, 3, data.side, data.side)


def batches(data, rows, batch: int, *, training: bool, seed: int):
    """The training feed (harness/workloads' batches() contract): ic.numpy_batches."""
    return ic.numpy_batches(data, data.train, rows, batch, augment=training, seed=seed,
                            workers=torch.get_num_threads())


def inputs(x: np.ndarray, device) -> torch.Tensor:
    return models.channels_first(x, device)


def targets(y: np.ndarray, device) -> torch.Tensor:
    return feed.to_device(np.asarray(y, np.int64), device)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy with label smoothing 0.1 (Keras' and PyTorch's smoothing
    are the same: y (1 - 0.1) + 0.1 / classes)."""
    return F.cross_entropy(outputs, labels, reduction="none", label_smoothing=ic.LABEL_SMOOTHING)


def predict(model: nn.Module, data, rows: slice, device) -> np.ndarray:
    """Softmax probabilities (FP32) of validation rows `rows`."""
    idx = np.arange(data.n_val)[rows]
    feed = ic.numpy_batches(data, data.val, idx, ic.EVAL_BATCH, augment=False, drop_remainder=False,
                            workers=torch.get_num_threads())
    return train.class_probabilities(model, (inputs(x, device) for x, _ in feed), data.num_classes)
