"""Table 3 FLOPs of a MindSpore model, counted cell by cell (issue 47).

One sample's forward pass runs in eval mode (batch-norm statistics not updated, dropout
off) at batch 1, with a forward hook on every leaf cell: each call of a cell with a Table 3
rule becomes the plain record harness/flops.py has a rule for (the same RECORD_KINDS as a
Keras layer's and a PyTorch operator's), and the sums are harness/flops.py's.

    nn.Conv2d, nn.Conv3d    conv (group = Cin > 1: depthwise), its bias
    nn.Conv2dTranspose      transposed (counted per input pixel, the other frameworks' rule), its bias
    nn.Dense                dense, its bias
    nn.ReLU, ...            activation
    nn.MaxPool2d, AvgPool2d pooling
    nn.BatchNorm2d          normalization
    nn.AdaptiveAvgPool2d    global pooling (to 1 x 1): one FLOP per input element
    nn.Flatten, nn.Dropout  nothing (a view; off in eval mode)
    UNCOUNTED = True        nothing: a cell that says it has no Table 3 operator (cosmoflow's
                            x 1.2, as Keras ignores a Lambda)

A hook sees cells, not the operators a cell's construct runs itself (a residual `x + y`),
so a model nests its leaves in nn.SequentialCell, whose construct is the composition of
its cells and nothing else (or an nn.CellList, which has no construct: its owner calls
its cells), or in a cell that states its own arithmetic: records(output) -> the records
of what its construct computes beside its children (ResNet's bottleneck: the add and the
ReLU; DeepLab's encoder and ASPP: none, they route, concatenate and tile). Any other cell
with children, or a leaf with no rule, stops the count, naming it, rather than count 0.
A transposed convolution is a leaf (nn.Conv2dTranspose): no hook needed more than the
others'. Weights are counted as Keras
counts them, batch-norm moving statistics included (MindSpore keeps those as parameters
too). Activations: the output elements of every leaf cell's call, per sample.
"""
from __future__ import annotations

import math

from mindspore import nn

from harness import flops

_ACTIVATION = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.LeakyReLU: "leakyrelu",
               nn.GELU: "gelu", nn.ELU: "elu"}
_POOL = (nn.MaxPool2d, nn.AvgPool2d, nn.MaxPool3d, nn.AvgPool3d)
_NORM = (nn.BatchNorm2d, nn.BatchNorm1d, nn.BatchNorm3d, nn.LayerNorm)
_FREE = (nn.Flatten, nn.Dropout, nn.Identity)
_CONTAINERS = (nn.SequentialCell, nn.CellList)


def count(model: nn.Cell, sample) -> flops.FlopCount:
    """Table 3 FLOPs of one sample's forward pass; `sample`: one input of batch 1 (a Tensor,
    or a tuple of them whose first is the images: ewa's detector takes its boxes too)."""
    batch = (sample[0] if isinstance(sample, tuple) else sample).shape[0]
    if batch != 1:
        raise ValueError(f"harness.flops: found a sample of batch {batch}, expected batch 1")
    records, outputs, hooks = [], [0], []
    for name, cell in model.cells_and_names():
        if cell.cells():
            if hasattr(cell, "records"):    # its construct's own arithmetic, as the cell states it
                hooks.append(cell.register_forward_hook(_own(name, cell, records)))
            elif not isinstance(cell, _CONTAINERS):
                raise TypeError(f"harness.flops: cell {name or type(cell).__name__!r} ({type(cell).__name__}) has"
                                " children and a construct of its own, whose operators a cell hook cannot see;"
                                " give it records(output) (its own arithmetic) rather than count it as 0")
            continue
        hooks.append(cell.register_forward_hook(_recorder(name, records, outputs)))
    was = model.training
    try:
        model.set_train(False)
        model(sample)
    finally:
        model.set_train(was)
        for h in hooks:
            h.remove()
    totals = flops.by_operator(records)
    return flops.FlopCount(forward=sum(totals.values()), by_operator=totals, activations=outputs[0],
                           weights=weights(model), layers=records)


def _recorder(name: str, records: list, outputs: list):
    def hook(cell, inputs, output):
        outputs[0] += output.size
        rec = record(cell, inputs[0], output)
        if rec is not None:
            records.append({"layer": name, **rec})
    return hook


def _own(name: str, cell, records: list):
    def hook(_, inputs, output):
        records.extend({"layer": name, **r} for r in cell.records(output))
    return hook


def count_built(module, data) -> flops.FlopCount:
    """The count of the model a workload's MindSpore module builds for `data`, built again:
    the global random generator's state is put back after (its initial weights draw from it)."""
    import mindspore as ms
    state = ms.get_rng_state()
    try:
        return count(module.build_model(data), module.sample(data))
    finally:
        ms.set_rng_state(state)


def weights(model: nn.Cell) -> int:
    """Parameters and batch-norm moving statistics, as Keras' count_params counts them."""
    return sum(p.size for p in model.get_parameters())


def record(cell: nn.Cell, x, y) -> dict | None:
    """The record of one leaf cell's call at batch 1 (None: a cell without arithmetic)."""
    if getattr(cell, "UNCOUNTED", False):   # a cell without a Table 3 operator by design (a scalar scale)
        return None
    if isinstance(cell, nn.Conv2dTranspose):   # the gradient of a conv: its input's pixels multiply
        return {"kind": "transposed", "kernel": math.prod(cell.kernel_size), "filters": cell.out_channels,
                "in": x.size, "out": y.size, "bias": int(cell.has_bias), "activation": "linear"}
    if isinstance(cell, (nn.Conv2d, nn.Conv3d)):
        kernel, bias = math.prod(cell.kernel_size), int(cell.has_bias)
        if cell.group == cell.in_channels and cell.group > 1:
            return {"kind": "depthwise", "kernel": kernel, "cin": cell.in_channels,
                    "depth_multiplier": cell.out_channels // cell.in_channels, "out": y.size, "bias": bias,
                    "activation": "linear"}
        return {"kind": "conv", "kernel": kernel, "cin": cell.in_channels, "groups": cell.group,
                "filters": cell.out_channels, "out": y.size, "bias": bias, "activation": "linear"}
    if isinstance(cell, nn.Dense):
        if cell.activation_flag:
            raise TypeError("harness.flops: a Dense cell with a fused activation; spell it as a cell of its own")
        return {"kind": "dense", "fin": cell.in_channels, "out": y.size, "bias": int(cell.has_bias),
                "activation": "linear"}
    if type(cell) in _ACTIVATION:
        return {"kind": "activation", "activation": _ACTIVATION[type(cell)], "out": y.size}
    if isinstance(cell, _POOL):
        return {"kind": "pooling", "out": y.size}
    if isinstance(cell, nn.AdaptiveAvgPool2d) and y.shape[2:] == (1, 1):   # global: every input read once
        return {"kind": "global_pooling", "in": x.size}
    if isinstance(cell, _NORM):
        return {"kind": "normalization", "out": y.size}
    if isinstance(cell, _FREE):
        return None
    raise TypeError(f"harness.flops: no Table 3 rule for cell {type(cell).__name__}; add one to"
                    " harness/frameworks/mindspore/flops.py rather than count it as 0")
