"""CosmoFlow's 3D CNN in PyTorch: the model harness/frameworks/tensorflow/cosmoflow.py builds
in Keras (MLPerf HPC's reference is Keras), layer for layer: 5 blocks of Conv3D 3x3x3 (padding 1:
Keras' "same") + LeakyReLU 0.3 + max-pool 2, flatten, 2 dense + LeakyReLU + dropout 0.5,
dense to the 4 parameters, tanh, x 1.2. Keras' initial weights (Glorot-uniform kernels,
zero biases), so that both frameworks start from the same distribution. The same Table 3
count (cosmoflow.forward_flops, tests/test_pytorch_flops.py) and the same weights.

The data, its decoding, the feed and the quality are the workload's own, written once for
both frameworks; this module turns the feed's numpy volumes (N, D, H, W, C) into tensors
channels first (N, C, D, H, W).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from harness.frameworks.pytorch import feed, models, train
from harness.workloads import cosmoflow as cf


class _Scale(nn.Module):
    """x 1.2 (Keras' Lambda): a scalar multiply, which Table 3 does not count."""

    def forward(self, x):
        return x * cf.OUTPUT_SCALE


def build_model(data) -> nn.Module:
    layers, cin, side = [], cf.CHANNELS, data.side
    for f in cf.filters():
        layers += [nn.Conv3d(cin, f, 3, padding=1), nn.LeakyReLU(cf.LEAKY_ALPHA), nn.MaxPool3d(2)]
        cin, side = f, side // 2
    layers.append(nn.Flatten())
    fin = cin * side ** 3
    for n in cf.DENSE:
        layers += [nn.Linear(fin, n), nn.LeakyReLU(cf.LEAKY_ALPHA), nn.Dropout(cf.DROPOUT)]
        fin = n
    layers += [nn.Linear(fin, cf.PARAMETERS), nn.Tanh(), _Scale()]
    return models.keras_init(nn.Sequential(*layers))


def sample(data) -> torch.Tensor:
    return torch.zeros(1, cf.CHANNELS, data.side, data.side, data.side)


def inputs(x: np.ndarray, device) -> torch.Tensor:
    return models.channels_first(x, device)


def targets(y: np.ndarray, device) -> torch.Tensor:
    return feed.to_device(np.asarray(y, np.float32), device)


def loss(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample mean squared error over the 4 parameters (the reference's MSE)."""
    return torch.mean(torch.square(outputs - y), dim=-1)


def predict(model: nn.Module, data, rows: slice, device) -> np.ndarray:
    """The 4 predicted parameters (float64) of validation rows `rows`."""
    out = train.outputs(model, (inputs(x, device) for x in cf.validation_volumes(data, rows)))
    return out.astype(np.float64) if len(out) else np.zeros((0, cf.PARAMETERS))
