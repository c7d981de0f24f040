"""The digits workload's model in PyTorch: the small CNN harness/frameworks/tensorflow/digits.py
builds in Keras, layer for layer (2 convolutions with ReLU, batch norm between them, max-pool,
2 dense), so that the two frameworks train the same architecture with the same FLOPs and
weights (tests/test_pytorch_flops.py). The data, the feed's batches and the quality are
the workload's own (harness/workloads/digits.py), written once for both frameworks: this
module turns the feed's numpy batches into tensors (`inputs`, `targets`), gives the loss
and the predictions (the interface of harness/frameworks/pytorch/models.py).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from harness.frameworks.pytorch import feed, models, train


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


# Channels-last on CPUs too: oneDNN trains this model's small convolutions 1.1-1.2x faster
# so than channels-first (bench/layout.py; ResNet-50 1.00-1.02x, DeepLabv3+ 0.79-0.86x on
# 2 threads: they stay channels-first on CPUs).
CPU_CHANNELS_LAST = True


def inputs(x: np.ndarray, device) -> torch.Tensor:
    """A batch of the workload's images (N, H, W, C), shaped channels first on `device`."""
    return models.channels_first(x, device, CPU_CHANNELS_LAST)


def targets(y: np.ndarray, device) -> torch.Tensor:
    return feed.to_device(np.asarray(y, np.int64), device)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of the logits (in FP32: the harness casts), as the Keras
    twin's sparse_categorical_crossentropy(from_logits=True)."""
    return nn.functional.cross_entropy(outputs, labels, reduction="none")


def predict(model: nn.Module, data, rows: slice, device, batch: int = 512) -> np.ndarray:
    """Class probabilities (computed in FP32) of validation rows `rows`."""
    x = data.x_val[rows]
    return train.class_probabilities(model, (inputs(x[i:i + batch], device) for i in range(0, len(x), batch)),
                                     data.num_classes)
