"""Analytic FLOPs of a Keras model: the Table 3 rules of HPC AI500 V3.0.

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
    normalization Cin * H * W (output elements)

Everything else (reshapes, padding, dropout, concatenation, softmax, raw TF ops
in a functional model) is ignored, as in the paper. Training = forward + backward,
backward = 2 x forward.

Against TensorFlow's profiler (`profiler_flops`), which counts the graph's ops:
convolutions, matmuls, bias adds and adds agree exactly; the profiler does not count
Relu or FusedBatchNorm (we do, Table 3 lists them), counts a pooling window's
kernel area per output element (Table 3: one), and softmax as 5 per element
(ignored here). For ResNet-50 the net difference is +0.23 %.
"""
import contextlib
import dataclasses
import io
import math
import os

# tf.keras must be the Keras 2 API (tf-keras) for the isinstance checks below.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from tensorflow.python.framework.convert_to_constants import (  # noqa: E402
    convert_variables_to_constants_v2)

CONVENTION = ("Training FLOPs per sample = 3 x forward (Table 3 rules, H/W of the "
              "output, 2 FLOPs per multiply-add, 1 per element for bias, "
              "activation, merge, pooling and normalization)")
BACKWARD_FACTOR = 2  # backward pass = 2 x forward (gradients w.r.t. inputs and weights)
OPERATORS = ("convolution", "depthwise", "dense", "elementwise", "pooling", "normalization")

L = keras.layers
# Order matters: separable, depthwise and transposed convolutions subclass Conv.
_SEPARABLE = (L.SeparableConv1D, L.SeparableConv2D)
_DEPTHWISE = (L.DepthwiseConv1D, L.DepthwiseConv2D)
_TRANSPOSED = (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose)
_CONV = (L.Conv1D, L.Conv2D, L.Conv3D)
_MERGE = (L.Add, L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum)
_ACTIVATION = (L.ReLU, L.LeakyReLU, L.PReLU, L.ELU, L.ThresholdedReLU)
_POOL = (L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D,
         L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D)
_GLOBAL_POOL = (L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D,
                L.GlobalAveragePooling1D, L.GlobalAveragePooling2D,
                L.GlobalAveragePooling3D)
_NORM = (L.BatchNormalization, L.LayerNormalization, L.GroupNormalization)
_WEIGHTED = _CONV + _SEPARABLE + _DEPTHWISE + _TRANSPOSED + (L.Dense,)
_RULED = _WEIGHTED + _MERGE + _ACTIVATION + (L.Activation,) + _POOL + _GLOBAL_POOL + _NORM
# Weighted layers that do no arithmetic: a lookup is a gather.
_NO_ARITHMETIC = (L.Embedding,)
# Softmax is a row-wise normalisation of the logits, not in Table 3: ignored.
_NOT_ELEMENTWISE = ("linear", "softmax", "log_softmax")
_ACTIVATIONS = "_activations"  # walk-internal key: output elements, not an operator


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one sample: the forward total and its split by Table 3 operator."""
    forward: int
    by_operator: dict
    activations: int = 0   # elements of every layer output, per sample (for the roofline)
    weights: int = 0       # parameters of the model

    @property
    def training(self) -> int:
        return (1 + BACKWARD_FACTOR) * self.forward


def count(model) -> FlopCount:
    """Table 3 FLOPs of one sample's forward pass through a built Keras model."""
    if not getattr(model, "_is_graph_network", False):
        raise ValueError(f"harness.flops: {type(model).__name__} {model.name!r} is not a "
                         "functional or Sequential model with a known input shape; "
                         "build it on a keras.Input of fixed shape")
    totals = dict.fromkeys(OPERATORS, 0)
    walked = _walk(model)
    activations = walked.pop(_ACTIVATIONS, 0)
    for op, flops in walked.items():
        totals[op] += flops
    return FlopCount(forward=sum(totals.values()), by_operator=totals,
                     activations=activations, weights=model.count_params())


def _walk(model) -> dict:
    # Walk the graph's nodes, not model.layers: a shared layer called twice costs
    # twice, and every node knows the shapes of its own call.
    totals = {}
    for nodes in model._nodes_by_depth.values():
        for node in nodes:
            ins = [_shape(t) for t in tf.nest.flatten(node.input_tensors) if hasattr(t, "shape")]
            outs = [_shape(t) for t in tf.nest.flatten(node.output_tensors)]
            for op, flops in _layer_flops(node.layer, ins, outs).items():
                totals[op] = totals.get(op, 0) + flops
            if not isinstance(node.layer, (keras.Model, L.InputLayer)):  # nested models count inside
                totals[_ACTIVATIONS] = totals.get(_ACTIVATIONS, 0) + sum(
                    math.prod(d for d in o if d) for o in outs)
    return totals


def _shape(tensor):
    return tuple(tensor.shape)[1:]  # per sample: drop the batch axis


def _layer_flops(layer, ins, outs) -> dict:
    """FLOPs of one call of `layer`, by operator; `ins`/`outs` are per-sample shapes."""
    if isinstance(layer, keras.Model):  # nested Sequential / functional model
        if not getattr(layer, "_is_graph_network", False):
            raise ValueError(f"harness.flops: nested model {layer.name!r} is subclassed; "
                             "only functional and Sequential models can be walked")
        return _walk(layer)
    if isinstance(layer, L.TimeDistributed):  # the inner layer runs once per step
        steps, step_in = ins[0][0], (None,) + ins[0][1:]
        step_out = tuple(layer.layer.compute_output_shape(step_in))
        inner = _layer_flops(layer.layer, [step_in[1:]], [step_out[1:]])
        return {op: _known(layer, steps) * f for op, f in inner.items()}
    if isinstance(layer, L.Wrapper):  # e.g. SpectralNormalization: same shapes as inner
        return _layer_flops(layer.layer, ins, outs)

    if not isinstance(layer, _RULED):
        if layer.weights and not isinstance(layer, _NO_ARITHMETIC):
            raise TypeError(f"harness.flops: no Table 3 rule for layer {layer.name!r} of "
                            f"class {type(layer).__name__}, which has weights; add a rule "
                            "to harness/flops.py rather than count it as 0")
        return {}  # reshape, padding, dropout, concatenate, softmax...: ignored

    x, y = ins[0], outs[0]
    out = _elements(layer, y)
    flops = {}
    if isinstance(layer, _CONV + _SEPARABLE + _DEPTHWISE + _TRANSPOSED):
        k = math.prod(layer.kernel_size)
        cin = _known(layer, x[-1] if layer.data_format == "channels_last" else x[0])
        if isinstance(layer, _SEPARABLE):
            mid = cin * layer.depth_multiplier  # channels between the two stages
            spatial = out // layer.filters
            flops["depthwise"] = 2 * k * mid * spatial
            flops["convolution"] = 2 * mid * out  # the 1x1 pointwise stage
        elif isinstance(layer, _DEPTHWISE):
            flops["depthwise"] = 2 * k * out  # out channels = Cin x depth_multiplier
        elif isinstance(layer, _TRANSPOSED):
            # The gradient of a conv: roles of input and output swapped, so the
            # spatial size that multiplies is the input's.
            flops["convolution"] = 2 * k * layer.filters * _elements(layer, x)
        else:
            flops["convolution"] = 2 * k * (cin // layer.groups) * out
    elif isinstance(layer, L.Dense):  # on N-D input: one FLin x FLout product per row
        flops["dense"] = 2 * _known(layer, x[-1]) * out
    elif isinstance(layer, _MERGE):  # k inputs need k - 1 binary ops per element
        flops["elementwise"] = (len(ins) - 1) * out
    elif isinstance(layer, L.Activation):
        flops["elementwise"] = _activation(layer.activation, out)
    elif isinstance(layer, _ACTIVATION):
        flops["elementwise"] = out
    elif isinstance(layer, _POOL):
        flops["pooling"] = out
    elif isinstance(layer, _GLOBAL_POOL):  # the output is 1 x 1: every input is read once
        flops["pooling"] = _elements(layer, x)
    elif isinstance(layer, _NORM):
        flops["normalization"] = out

    # Bias and a fused activation are the same element-wise work as separate layers
    # (TensorFlow's profiler counts the BiasAdd; it does not count Relu).
    if isinstance(layer, _WEIGHTED):
        flops["elementwise"] = out * int(layer.use_bias) + _activation(layer.activation, out)
    return flops


def _activation(fn, elements) -> int:
    return 0 if getattr(fn, "__name__", "") in _NOT_ELEMENTWISE else elements


def _elements(layer, shape) -> int:
    return math.prod(_known(layer, d) for d in shape)


def _known(layer, dim) -> int:
    if dim is None:
        raise ValueError(f"harness.flops: layer {layer.name!r} has an undefined dimension; "
                         "build the model on a fixed input shape")
    return int(dim)


def profiler_flops(model, input_shape=None) -> int:
    """TensorFlow's own float-op count for one sample's forward pass.

    The model is traced at batch 1 in inference mode, its variables frozen into
    constants (the profiler only sees ops of a static graph), and the graph is
    handed to the tf.compat.v1 profiler. For cross-checking the analytic count.
    """
    shape = tuple(input_shape or model.input_shape[1:])
    fn = tf.function(lambda x: model(x, training=False))
    frozen = convert_variables_to_constants_v2(
        fn.get_concrete_function(tf.TensorSpec((1, *shape), tf.float32)))
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph.as_graph_def(), name="")
    # The profiler cannot look inside a function call and would silently miss its
    # FLOPs (tf-keras runs grouped convolution as a jit-compiled function): refuse.
    calls = [op.name for op in graph.get_operations()
             if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    if calls:
        raise ValueError(f"harness.flops: the profiler cannot count inside function "
                         f"calls {calls}; compare this model analytically only")
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    options = builder(builder.float_operation()).with_empty_output().build()
    with contextlib.redirect_stdout(io.StringIO()):
        return int(tf.compat.v1.profiler.profile(graph, options=options).total_float_ops)
