"""CosmoFlow's 3D CNN in MindSpore: the model harness/frameworks/tensorflow/cosmoflow.py
builds in Keras (MLPerf HPC's reference is Keras), layer for layer: 5 blocks of Conv3D 3x3x3
("same") + LeakyReLU 0.3 + max-pool 2, flatten, 2 dense + LeakyReLU + dropout 0.5, dense to
the 4 parameters, tanh, x 1.2. Keras' initial weights (Glorot-uniform kernels, zero biases).
The same Table 3 count (cosmoflow.forward_flops) and weights as the other two frameworks'.

The data, its decoding, the feed and the quality are the workload's own; this module turns
the feed's numpy volumes (N, D, H, W, C) into tensors channels first (N, C, D, H, W).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn

from harness.frameworks.mindspore import models, train
from harness.workloads import cosmoflow as cf

INIT = {"weight_init": "XavierUniform", "bias_init": "zeros", "has_bias": True}   # Keras' Glorot-uniform, zero bias


class Scale(nn.Cell):
    """x 1.2 (Keras' Lambda): a scalar multiply, which Table 3 does not count."""
    UNCOUNTED = True   # harness/frameworks/mindspore/flops.py: no Table 3 operator, by design

    def construct(self, x):
        return x * cf.OUTPUT_SCALE


def build_model(data) -> nn.Cell:
    layers, cin, side = [], cf.CHANNELS, data.side
    for f in cf.filters():
        layers += [nn.Conv3d(cin, f, 3, pad_mode="same", **INIT), nn.LeakyReLU(cf.LEAKY_ALPHA), nn.MaxPool3d(2, 2)]
        cin, side = f, side // 2
    layers.append(nn.Flatten())
    fin = cin * side ** 3
    for n in cf.DENSE:
        layers += [nn.Dense(fin, n, **INIT), nn.LeakyReLU(cf.LEAKY_ALPHA), nn.Dropout(p=cf.DROPOUT)]
        fin = n
    layers += [nn.Dense(fin, cf.PARAMETERS, **INIT), nn.Tanh(), Scale()]
    return nn.SequentialCell(layers)


def sample(data):
    return ms.Tensor(np.zeros((1, cf.CHANNELS, data.side, data.side, data.side), np.float32))


def inputs(x: np.ndarray):
    return models.channels_first(x)


def targets(y: np.ndarray):
    return ms.Tensor(np.asarray(y, np.float32))


def loss(outputs, y):
    """Per-sample mean squared error over the 4 parameters (the reference's MSE)."""
    return ((outputs - y) ** 2).mean(axis=-1)


def predict(model: nn.Cell, data, rows: slice) -> np.ndarray:
    """The 4 predicted parameters (float64) of validation rows `rows`."""
    out = train.outputs(model, (inputs(x) for x in cf.validation_volumes(data, rows)))
    return out.astype(np.float64) if len(out) else np.zeros((0, cf.PARAMETERS))
