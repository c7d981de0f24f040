"""The workloads' models in PyTorch: one module a workload (harness/frameworks/pytorch/
<workload>.py), behind one small interface (`Model`), as harness/workloads/ holds each
workload's data, feed and quality once for every framework.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from harness import workloads

# The workloads whose model is built in PyTorch (harness/frameworks.BUILT reads it).
BUILT = ("digits", "ic", "cosmoflow", "deepcam", "ewa")
# The workloads whose PyTorch model is a chain of blocks that line 37's model, pipeline and
# mixed modes cut into stages (harness/frameworks.split_problem reads it).
SPLIT = ("digits", "ic", "cosmoflow", "deepcam")


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


DEFAULTS = {"batches": None, "L2": 0.0, "chain": None}


def channels_first(x: np.ndarray, device):
    """A feed batch (N, ..., C: channels last, as the workloads' readers give them) as a
    tensor on `device` of shape (N, C, ...), as PyTorch's layers take it: in memory channels
    first on a CPU, channels last (as read, no copy) for a 4-D batch on a GPU, where the
    model is channels-last too (train.build)."""
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device).movedim(-1, 1)
    if torch.device(device).type == "cuda" and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    # view: the canonical strides, no copy. With one channel (digits) movedim's strides,
    # (HW, 1, W, 1), already count as contiguous, and as channels-last too: a CPU
    # convolution's backward then made the first kernel's gradient channels-last, unlike
    # DDP's bucket view of it (PyTorch's "Grad strides do not match bucket view strides"
    # warning on every rank, and a strided copy each step).
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
    if workload not in BUILT:
        raise KeyError(f"workload {workload!r} has no PyTorch model yet (built: {', '.join(BUILT)})")
    return workloads.checked_module(f"harness.frameworks.pytorch.{workload}", REQUIRED, DEFAULTS)
