"""Table 3 FLOPs of a PyTorch model, counted at the operator level (issue 34, item 5).

One sample's forward pass runs under a TorchDispatchMode that sees every aten operator
the model dispatches (after autograd: what actually computes), so a functional op (the
residual `x + identity`, `F.relu`) counts exactly as its module twin does. Each operator
with a Table 3 rule becomes the plain record harness/flops.py has a rule for (the same
RECORD_KINDS as a Keras layer's), and the sums are harness/flops.py's: one rule, written
once in the neutral core, applied to what each framework's walker reports.

    convolution (aten.convolution)        conv; `groups` = Cin > 1: depthwise (Keras' DepthwiseConv2D;
                                          a separable convolution is that and a 1x1 conv, as Table 3
                                          splits it); transposed: transposed
    mm, addmm, bmm, baddbmm               dense (addmm/baddbmm: the bias added)
    add, sub, mul, div, maximum, minimum  merge, 2 inputs, when both are tensors of more than one
                                          element (a scalar scale, e.g. CosmoFlow's x 1.2, is ignored
                                          as Keras ignores a Lambda)
    relu, leaky_relu, tanh, sigmoid,...   activation (softmax and log-softmax: ignored)
    max/avg pooling                       pooling; to 1 x 1 (adaptive, or a mean over the spatial
                                          axes): global pooling, one FLOP per input element
    batch, layer and group norm           normalization

The model runs in eval mode (batch-norm statistics are not updated; dropout is off) at
batch 1. Weights are counted as Keras counts them, batch-norm moving statistics
included (PyTorch keeps those as buffers): the same architecture has the same weights
in both frameworks. An operator that reads one of the model's parameters and has no
rule (other than a view or a lookup) stops the count, naming it, rather than count 0.
Activations (for the roofline's intensity estimate): the output elements of every leaf
module's call, per sample (Keras counts every layer's output; a PyTorch model spells its
activations and flattening as modules too, so the two differ by those).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness import flops

aten = torch.ops.aten
_CONV = {aten.convolution}
_DENSE = {aten.mm: False, aten.bmm: False, aten.addmm: True, aten.baddbmm: True}   # op: adds a bias
_MERGE = {aten.add, aten.add_, aten.sub, aten.sub_, aten.mul, aten.mul_, aten.div, aten.div_, aten.maximum,
          aten.minimum}
_ACTIVATION = {aten.relu: "relu", aten.relu_: "relu", aten.leaky_relu: "leakyrelu", aten.leaky_relu_: "leakyrelu",
               aten.tanh: "tanh", aten.tanh_: "tanh", aten.sigmoid: "sigmoid", aten.sigmoid_: "sigmoid",
               aten.hardtanh: "relu6", aten.hardtanh_: "relu6", aten.gelu: "gelu", aten.elu: "elu",
               aten.elu_: "elu", aten.silu: "swish", aten.silu_: "swish", aten.hardswish: "hard_swish"}
_POOL = {aten.max_pool2d_with_indices, aten.max_pool3d_with_indices, aten.avg_pool2d, aten.avg_pool3d,
         aten.max_pool2d, aten.max_pool3d, aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d,
         aten.adaptive_max_pool2d, aten.adaptive_max_pool3d}
_NORM = {aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit, aten.native_batch_norm,
         aten.native_layer_norm, aten.native_group_norm}
# operators that may read a parameter without arithmetic: views, copies, lookups
_FREE = {aten.t, aten.view, aten._unsafe_view, aten.reshape, aten.permute, aten.transpose, aten.expand,
         aten.detach, aten.alias, aten.clone, aten.contiguous, aten._to_copy, aten.slice, aten.select,
         aten.squeeze, aten.unsqueeze, aten.embedding, aten.index_select, aten.lift_fresh}


_UNCOUNTED = [0]     # depth of `uncounted` blocks the forward pass is in


@contextmanager
def uncounted():
    """`with flops.uncounted():` the operators inside are not Table 3's (a model's box
    math: anchor decoding, NMS, the ROI crop's sampling grid, which Keras runs inside a
    layer without a rule): the count skips them. No effect outside a count."""
    _UNCOUNTED[0] += 1
    try:
        yield
    finally:
        _UNCOUNTED[0] -= 1


def count(model: torch.nn.Module, sample) -> flops.FlopCount:
    """Table 3 FLOPs of one sample's forward pass; `sample`: one input of batch 1 (a
    tensor, or a tuple of them whose first is the batch, e.g. ewa's (images, boxes))."""
    records, activations = walk(model, sample)
    totals = flops.by_operator(records)
    return flops.FlopCount(forward=sum(totals.values()), by_operator=totals, activations=activations,
                           weights=weights(model), layers=records)


def count_built(module, data) -> flops.FlopCount:
    """The count of the model a workload's PyTorch module builds for `data`, built again
    on the meta device: the same modules and shapes with no storage and no arithmetic, so
    that counting DeepCAM at 768 x 1152 takes no memory and no time on any rank (and draws
    nothing from the random generators, whose state the training goes on from)."""
    with torch.device("meta"):
        return count(module.build_model(data), module.sample(data))


def weights(model: torch.nn.Module) -> int:
    """Parameters and batch-norm moving statistics, as Keras' count_params counts them."""
    stats = sum(b.numel() for name, b in model.named_buffers() if name.rsplit(".", 1)[-1].startswith("running_"))
    return sum(p.numel() for p in model.parameters()) + stats


def walk(model: torch.nn.Module, sample) -> tuple[list[dict], int]:
    """(records, activations) of one sample's forward pass (module docstring)."""
    first = tensors(sample)[0]
    if first.shape[0] != 1:
        raise ValueError(f"harness.flops: found a sample of batch {first.shape[0]}, expected batch 1")
    names = {m: n or type(model).__name__ for n, m in model.named_modules()}
    where, outputs = [type(model).__name__], [0]
    leaves = {m for m in names if not list(m.children())}

    def enter(module, _):
        where.append(names[module])

    def leave(module, _, out):
        where.pop()
        if module in leaves:
            outputs[0] += sum(t.numel() for t in tensors(out))
    hooks = [h for m in names for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    recorder = _Recorder({id(p) for p in model.parameters()}, where)
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad(), recorder:
            model(sample)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return recorder.records, outputs[0]


class _Recorder(TorchDispatchMode):
    """Turns each dispatched operator with a rule into a record, named by its module."""

    def __init__(self, params: set, where: list):
        super().__init__()
        self.params, self.where, self.records = params, where, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _UNCOUNTED[0]:
            return out
        rec = record(func.overloadpacket, args, out)
        if rec is not None:
            self.records.append({"layer": self.where[-1], **rec})
        elif func.overloadpacket not in _FREE and any(id(a) in self.params for a in tensors(args)):
            raise TypeError(f"harness.flops: no Table 3 rule for operator {func} in {self.where[-1]!r}, which reads"
                            " one of the model's parameters; add a rule to harness/frameworks/pytorch/flops.py"
                            " rather than count it as 0")
        return out


def record(op, args, out) -> dict | None:
    """The record of one operator at batch 1 (None: no rule, ignored)."""
    y = tensors(out)[0] if tensors(out) else None
    if y is None:
        return None
    if op in _CONV:
        x, w, bias, transposed, groups = args[0], args[1], args[2], args[6], args[8]
        kernel, cin = math.prod(w.shape[2:]), x.shape[1]
        if transposed:
            return {"kind": "transposed", "kernel": kernel, "filters": w.shape[1] * groups, "in": x.numel(),
                    "out": y.numel(), "bias": int(bias is not None), "activation": "linear"}
        if groups == cin and groups > 1:
            return {"kind": "depthwise", "kernel": kernel, "cin": cin, "depth_multiplier": w.shape[0] // cin,
                    "out": y.numel(), "bias": int(bias is not None), "activation": "linear"}
        return {"kind": "conv", "kernel": kernel, "cin": cin, "groups": groups, "filters": w.shape[0],
                "out": y.numel(), "bias": int(bias is not None), "activation": "linear"}
    if op in _DENSE:
        a = args[1] if _DENSE[op] else args[0]
        return {"kind": "dense", "fin": a.shape[-1], "out": y.numel(), "bias": int(_DENSE[op]), "activation": "linear"}
    if op in _MERGE:
        both = [a for a in args[:2] if isinstance(a, torch.Tensor) and a.numel() > 1]
        return {"kind": "merge", "inputs": 2, "out": y.numel()} if len(both) == 2 else None
    if op in _ACTIVATION:
        return {"kind": "activation", "activation": _ACTIVATION[op], "out": y.numel()}
    if op in _POOL or (op == aten.mean and args[0].dim() > 2 and y.numel() == args[0].shape[1]):
        if y.numel() == y.shape[1] and op not in (aten.max_pool2d_with_indices, aten.max_pool3d_with_indices):
            return {"kind": "global_pooling", "in": args[0].numel()}     # to 1 x 1: every input read once
        return {"kind": "pooling", "out": y.numel()}
    if op in _NORM:
        return {"kind": "normalization", "out": y.numel()}
    return None


def tensors(value) -> list:
    """The tensors in an operator's arguments or outputs (nested tuples and lists)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    return []
