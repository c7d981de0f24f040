"""Analytic FLOPs: the Table 3 rules of HPC AI500 V3.0, for every framework.

The benchmark's FLOPS figure is an *analytic* count (Eq. 4, APC) divided by time,
so it does not depend on which kernels a framework happens to launch. Per sample,
forward pass, H x W the output's spatial size:

    convolution   2 * prod(kernel) * Cin/groups * H * W * Cout
    depthwise     2 * prod(kernel) * Cin * H * W * depth_multiplier
    dense         2 * FLin * FLout   (the paper prints FLin * FLout; we count a
                                      multiply-add as 2 FLOPs, as for convolution,
                                      which is also what TensorFlow's profiler does)
    element-wise  1 per output element: bias add, activations, Add/Multiply/...
    pooling       Cin * H * W (output elements); global pooling: input elements

In 3D (Conv3D, MaxPooling3D: cosmoflow) the same rules with D x H x W: convolution
2 * K^3 * Cin * D * H * W * Cout at the output's size, pooling one FLOP per output
element. TensorFlow's profiler counts Conv3D by the same formula and has no count for
MaxPool3D, LeakyRelu or Tanh (tests/test_cosmoflow.py compares what it counts exactly).
    normalization Cin * H * W (output elements)

Everything else (reshapes, padding, dropout, concatenation, softmax, raw TF ops
in a functional model) is ignored, as in the paper. Training = forward + backward,
backward = 2 x forward.

Against TensorFlow's profiler (`profiler_flops`), which counts the graph's ops:
convolutions, matmuls, bias adds and adds agree exactly; the profiler does not count
Relu or FusedBatchNorm (we do, Table 3 lists them), counts a pooling window's
kernel area per output element (Table 3: one), and softmax as 5 per element
(ignored here). For ResNet-50 the net difference is +0.23 %.

Two steps, so that a count can be checked without a framework: each framework's walker
turns each call of a layer (or operator) into a plain record (a dict of numbers and
strings: the operator kind and every size its rule needs, see RECORD_KINDS: Keras' in
harness/frameworks/tensorflow/flops.py, PyTorch's in harness/frameworks/pytorch/flops.py),
and `rule(record)` is the pure Table 3 function of one record; a count is the sum of
`rule` over the records (`by_operator`). results.json keeps the records (`model_layers`),
so `harness/verify.py` re-derives the FLOPs per sample from them. Pure; no framework
imported.
"""
import dataclasses

CONVENTION = ("Training FLOPs per sample = 3 x forward (Table 3 rules, H/W of the "
              "output, 2 FLOPs per multiply-add, 1 per element for bias, "
              "activation, merge, pooling and normalization)")
BACKWARD_FACTOR = 2  # backward pass = 2 x forward (gradients w.r.t. inputs and weights)
OPERATORS = ("convolution", "depthwise", "dense", "elementwise", "pooling", "normalization")
# Softmax is a row-wise normalisation of the logits, not in Table 3: ignored.
_NOT_ELEMENTWISE = ("linear", "softmax", "log_softmax")

# A record's keys by kind (besides "layer", the layer's name, and "times", how often
# the call repeats per sample, 1 unless under TimeDistributed). `in`/`out`: elements per
# sample of the input/output; `kernel`: prod(kernel_size); weighted kinds also carry
# `bias` (0/1) and `activation` (the fused activation's name).
RECORD_KINDS = {
    "conv": ("kernel", "cin", "groups", "filters", "out"),
    "separable": ("kernel", "cin", "depth_multiplier", "filters", "out"),
    "depthwise": ("kernel", "cin", "depth_multiplier", "out"),
    "transposed": ("kernel", "filters", "in", "out"),
    "dense": ("fin", "out"),
    "merge": ("inputs", "out"),
    "activation": ("activation", "out"),
    "pooling": ("out",),
    "global_pooling": ("in",),
    "normalization": ("out",),
}
_WEIGHTED_KINDS = ("conv", "separable", "depthwise", "transposed", "dense")


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one sample: the forward total and its split by Table 3 operator."""
    forward: int
    by_operator: dict
    activations: int = 0   # elements of every layer output, per sample (for the roofline)
    weights: int = 0       # parameters of the model
    # the walk's records, one per call of a layer with a rule (sum of rule() = forward)
    layers: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    @property
    def training(self) -> int:
        return (1 + BACKWARD_FACTOR) * self.forward


# -- the rules: pure, no TensorFlow -------------------------------------------------
def rule(record: dict) -> dict:
    """Table 3 FLOPs of one call of a layer, by operator, from its walk record."""
    try:
        kind, out = record["kind"], record.get("out", 0)
        if kind not in RECORD_KINDS:
            raise ValueError(f"harness.flops: no Table 3 rule for a record of kind {kind!r} "
                             f"(layer {record.get('layer')!r}; kinds: {', '.join(RECORD_KINDS)})")
        k = record.get("kernel")
        if kind == "conv":
            flops = {"convolution": 2 * k * (record["cin"] // record["groups"]) * out}
        elif kind == "separable":
            mid = record["cin"] * record["depth_multiplier"]  # channels between the two stages
            flops = {"depthwise": 2 * k * mid * (out // record["filters"]),
                     "convolution": 2 * mid * out}          # the 1x1 pointwise stage
        elif kind == "depthwise":
            flops = {"depthwise": 2 * k * out}  # out channels = Cin x depth_multiplier
        elif kind == "transposed":
            # The gradient of a conv: roles of input and output swapped, so the
            # spatial size that multiplies is the input's.
            flops = {"convolution": 2 * k * record["filters"] * record["in"]}
        elif kind == "dense":  # on N-D input: one FLin x FLout product per row
            flops = {"dense": 2 * record["fin"] * out}
        elif kind == "merge":  # k inputs need k - 1 binary ops per element
            flops = {"elementwise": (record["inputs"] - 1) * out}
        elif kind == "activation":
            flops = {"elementwise": _activation(record["activation"], out)}
        elif kind == "pooling":
            flops = {"pooling": out}
        elif kind == "global_pooling":  # the output is 1 x 1: every input is read once
            flops = {"pooling": record["in"]}
        else:  # normalization
            flops = {"normalization": out}
        # Bias and a fused activation are the same element-wise work as separate layers
        # (TensorFlow's profiler counts the BiasAdd; it does not count Relu).
        if kind in _WEIGHTED_KINDS:
            flops["elementwise"] = out * int(record["bias"]) + _activation(record["activation"], out)
        times = record.get("times", 1)
    except KeyError as e:
        raise ValueError(f"harness.flops: record of layer {record.get('layer')!r} lacks {e}") from None
    return {op: times * f for op, f in flops.items()}


def by_operator(records) -> dict:
    """Forward FLOPs per sample by Table 3 operator: the sum of `rule` over the records."""
    totals = dict.fromkeys(OPERATORS, 0)
    for r in records:
        for op, flops in rule(r).items():
            totals[op] += flops
    return totals


def _activation(name, elements) -> int:
    return 0 if name in _NOT_ELEMENTWISE else elements
