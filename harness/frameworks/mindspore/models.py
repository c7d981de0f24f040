"""The workloads' models in MindSpore: one module a workload (harness/frameworks/mindspore/
<workload>.py), behind one small interface (`Model`), as harness/workloads/ holds each
workload's data, feed and quality once for every framework.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from harness import workloads
from harness.frameworks.mindspore import facts


class Model(Protocol):
    def build_model(self, data): ...          # a mindspore.nn.Cell for this data
    def sample(self, data): ...               # one input of batch 1 (the FLOP count's forward pass)
    def inputs(self, x): ...                  # a feed batch's inputs (numpy, as the workload reads them) as a Tensor
    def targets(self, y): ...                 # its targets as a Tensor
    def loss(self, outputs, targets): ...     # per-sample loss (outputs in FP32)

    def predict(self, model, data, rows: slice):
        """np.ndarray (rows, the workload's score_width): scores of validation rows."""

    # Optional (DEFAULTS): the training feed where the workload's own would need another
    # framework (ic's is tf.data): batches(data, rows, batch, *, training, seed), the
    # workloads' batches() contract; None: the workload's feed.
    batches: object
    # Optional (DEFAULTS): coupled weight decay on the kernels, the Keras twin's L2 kernel
    # regularizer (train.make_optimizer).
    L2: float
    # Optional (DEFAULTS): whether a step's forward and backward pass compile into one
    # mindspore.jit graph; False: eager (PyNative), for a model whose forward pass runs host
    # code (ewa's NMS). Its outputs may then be a dict (the loss reads them by name).
    JIT: bool


DEFAULTS = {"batches": None, "L2": 0.0, "JIT": True}


def channels_first(x: np.ndarray):
    """A feed batch (N, ..., C: channels last, as the workloads' readers give them) as an
    FP32 Tensor of shape (N, C, ...), the layout MindSpore's CPU convolutions take."""
    import mindspore as ms
    return ms.Tensor(np.ascontiguousarray(np.moveaxis(np.asarray(x, np.float32), -1, 1)))


REQUIRED = workloads.required_members(Model, DEFAULTS)


def get(workload: str) -> Model:
    """The MindSpore module of `workload`, checked against the interface."""
    if workload not in facts.BUILT:
        raise KeyError(f"workload {workload!r} has no MindSpore model yet (built: {', '.join(facts.BUILT)})")
    return workloads.checked_module(f"harness.frameworks.mindspore.{workload}", REQUIRED, DEFAULTS)
