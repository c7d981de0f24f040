"""The digits workload's model in MindSpore: the small CNN harness/frameworks/tensorflow/
digits.py builds in Keras, layer for layer (2 convolutions with ReLU, batch norm between
them, max-pool, 2 dense), Keras' initial weights (Glorot-uniform kernels, zero biases) and
batch norm (epsilon 1e-3, momentum 0.99), so that the three frameworks train the same
architecture with the same FLOPs and weights (tests/test_mindspore.py). The data, the
feed's batches and the quality are the workload's own (harness/workloads/digits.py): this
module turns the feed's numpy batches into tensors, gives the loss and the predictions.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from harness.frameworks.mindspore import models, train

INIT = {"weight_init": "XavierUniform", "bias_init": "zeros", "has_bias": True}   # Keras' Glorot-uniform, zero bias


def build_model(data) -> nn.Cell:
    """For images of data.x_train's shape (N, H, W, C: channels last, as the reader gives
    them); the model takes them channels first (N, C, H, W), MindSpore's CPU layout."""
    height, width, channels = data.x_train.shape[1:]
    return nn.SequentialCell(
        nn.Conv2d(channels, 32, 3, pad_mode="same", **INIT), nn.ReLU(),
        nn.BatchNorm2d(32, eps=1e-3, momentum=0.99),   # Keras' defaults: moving = 0.99 moving + 0.01 batch
        nn.Conv2d(32, 64, 3, pad_mode="same", **INIT), nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Dense(64 * (height // 2) * (width // 2), 128, **INIT), nn.ReLU(),
        nn.Dropout(p=0.25),
        nn.Dense(128, data.num_classes, **INIT))


def sample(data):
    """One input of batch 1, channels first (the FLOP count's forward pass)."""
    height, width, channels = data.x_train.shape[1:]
    return ms.Tensor(np.zeros((1, channels, height, width), np.float32))


def inputs(x: np.ndarray):
    return models.channels_first(x)


def targets(y: np.ndarray):
    return ms.Tensor(np.asarray(y, np.int32))


def loss(outputs, labels):
    """Per-sample cross-entropy of the logits, as the Keras twin's
    sparse_categorical_crossentropy(from_logits=True)."""
    return ops.cross_entropy(outputs, labels, reduction="none")


def predict(model: nn.Cell, data, rows: slice, batch: int = 512) -> np.ndarray:
    """Class probabilities (computed in FP32) of validation rows `rows`."""
    x = data.x_val[rows]
    return train.class_probabilities(model, (inputs(x[i:i + batch]) for i in range(0, len(x), batch)),
                                     data.num_classes)
