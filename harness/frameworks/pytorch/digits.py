"""The digits workload's model in PyTorch: the small CNN harness/workloads/digits.py builds
in Keras, layer for layer (2 convolutions with ReLU, batch norm between them, max-pool,
2 dense), so that the two frameworks train the same architecture with the same FLOPs and
weights (tests/test_pytorch_flops.py). The data, the feed's batches and the quality are
the workload's own (harness/workloads/digits.py), written once for both frameworks.
"""
from __future__ import annotations

import torch
from torch import nn


def build_model(data) -> nn.Module:
    """For images of data.x_train's shape (N, H, W, C: channels last, as the reader gives
    them); the model takes them channels first (N, C, H, W), as PyTorch's layers do."""
    height, width, channels = data.x_train.shape[1:]
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(),
        nn.BatchNorm2d(32, eps=1e-3, momentum=0.01),   # Keras' defaults: epsilon 1e-3, momentum 0.99
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 2) * (width // 2), 128), nn.ReLU(),
        nn.Dropout(0.25),
        nn.Linear(128, data.num_classes))


def sample(data) -> torch.Tensor:
    """One input of batch 1, channels first (the FLOP count's forward pass)."""
    height, width, channels = data.x_train.shape[1:]
    return torch.zeros(1, channels, height, width)
