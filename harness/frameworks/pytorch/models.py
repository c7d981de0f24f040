"""The workloads' models in PyTorch: one module a workload (harness/frameworks/pytorch/
<workload>.py), behind one small interface (`Model`), as harness/workloads/ holds each
workload's data, feed and quality once for every framework.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from harness import workloads
from harness.frameworks.pytorch import facts, feed



class Model(Protocol):
    def build_model(self, data): ...          # a torch.nn.Module for this data
    def sample(self, data): ...               # one input of batch 1 (the FLOP count's forward pass)
    def inputs(self, x, device): ...          # a feed batch's inputs (numpy, as the workload reads them) as tensors
    def targets(self, y, device): ...         # its targets as tensors
    def loss(self, outputs, targets): ...     # per-sample loss (outputs in FP32)

    def predict(self, model, data, rows: slice, device):
        """np.ndarray (rows, the workload's score_width): scores of validation rows."""

    # Optional (DEFAULTS): the training feed where the workload's own would need another
    # framework (ic's is tf.data): batches(data, rows, batch, *, training, seed), the
    # workloads' batches() contract; None: the workload's feed.
    batches: object
    # Optional (DEFAULTS): coupled weight decay on the kernels, the Keras twin's L2 kernel
    # regularizer (train.make_optimizer).
    L2: float
    # Optional (DEFAULTS: None, an nn.Sequential's children): chain(model) -> the model's
    # blocks in order, whose composition is its forward pass, for line 37's split modes
    # (harness/frameworks/pytorch/pipeline.py).
    chain: object
    # Optional (DEFAULTS: False): the model and its 4-D batches channels-last on CPUs too,
    # as on GPUs (channels_last_on), where bench/layout.py measured oneDNN faster so.
    CPU_CHANNELS_LAST: bool


DEFAULTS = {"batches": None, "L2": 0.0, "chain": None, "CPU_CHANNELS_LAST": False}


def channels_last_on(device, cpu_channels_last: bool) -> bool:
    """Whether a 2-D model and its 4-D batches are channels-last in memory on `device`: on
    a GPU always (cuDNN's fast layout for convolutions), on a CPU where the model's module
    says so (its CPU_CHANNELS_LAST: oneDNN's speed there depends on the model)."""
    import torch
    return torch.device(device).type == "cuda" or cpu_channels_last


def channels_first(x: np.ndarray, device, cpu_channels_last: bool = False):
    """A feed batch (N, ..., C: channels last, as the workloads' readers give them) as a
    tensor on `device` of shape (N, C, ...), as PyTorch's layers take it: a 4-D batch
    channels-last in memory (as read, no copy) where its model is (channels_last_on), else
    channels first."""
    import torch
    t = feed.to_device(np.ascontiguousarray(x), device).movedim(-1, 1)   # pinned, non-blocking on a GPU
    if t.dim() == 4 and channels_last_on(device, cpu_channels_last):
        return t.contiguous(memory_format=torch.channels_last)
    # view: the canonical strides. With one channel movedim's strides, (HW, 1, W, 1), already
    # count as contiguous and as channels-last too: a channels-first model's convolutions
    # then ran channels-last, and the first kernel's gradient came out so, against DDP's
    # bucket view of the kernel (its "Grad strides do not match" warning, every rank).
    return t.contiguous().view(t.shape)


def keras_init(model):
    """Keras' default initial weights on `model`'s convolutions and dense layers (Glorot-
    uniform kernels, zero biases), so that a model starts from the distribution its Keras
    twin does; `model` returned."""
    from torch import nn
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


REQUIRED = workloads.required_members(Model, DEFAULTS)


def get(workload: str) -> Model:
    """The PyTorch module of `workload`, checked against the interface."""
    if workload not in facts.BUILT:
        raise KeyError(f"workload {workload!r} has no PyTorch model yet (built: {', '.join(facts.BUILT)})")
    return workloads.checked_module(f"harness.frameworks.pytorch.{workload}", REQUIRED, DEFAULTS)
