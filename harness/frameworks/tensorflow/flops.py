"""The Table 3 count of a Keras model: its walker (harness/flops.py holds the rules).

`walk` turns each call of a layer into harness/flops.py's plain record (a dict of numbers
and strings, RECORD_KINDS); `count(model)` sums harness/flops.rule over them by operator.
The graph's nodes are walked, not model.layers: a shared layer called twice costs twice,
and every node knows the shapes of its own call. `profiler_flops` is TensorFlow's own
profiler's count of the same model, the cross-check harness/flops.py's docstring compares.
TensorFlow is imported when a model is walked.
"""
import contextlib
import functools
import io
import math
import os
from types import SimpleNamespace

from harness.flops import FlopCount, by_operator

# tf.keras must be the Keras 2 API (tf-keras) for the isinstance checks below.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


# -- the walk: a built Keras model to records -----------------------------------------
def count(model) -> FlopCount:
    """Table 3 FLOPs of one sample's forward pass through a built Keras model."""
    if not getattr(model, "_is_graph_network", False):
        raise ValueError(f"harness.flops: {type(model).__name__} {model.name!r} is not a "
                         "functional or Sequential model with a known input shape; "
                         "build it on a keras.Input of fixed shape")
    records, activations = walk(model)
    totals = by_operator(records)
    return FlopCount(forward=sum(totals.values()), by_operator=totals,
                     activations=activations, weights=model.count_params(), layers=records)


@functools.cache
def _keras():
    """The tf-keras layer classes the rules know, imported on first use."""
    import tf_keras as keras
    L = keras.layers
    k = SimpleNamespace(keras=keras, L=L)
    # Order matters: separable, depthwise and transposed convolutions subclass Conv.
    k.SEPARABLE = (L.SeparableConv1D, L.SeparableConv2D)
    k.DEPTHWISE = (L.DepthwiseConv1D, L.DepthwiseConv2D)
    k.TRANSPOSED = (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose)
    k.CONV = (L.Conv1D, L.Conv2D, L.Conv3D)
    k.MERGE = (L.Add, L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum)
    k.ACTIVATION = (L.ReLU, L.LeakyReLU, L.PReLU, L.ELU, L.ThresholdedReLU)
    k.POOL = (L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D,
              L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D)
    k.GLOBAL_POOL = (L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D,
                     L.GlobalAveragePooling1D, L.GlobalAveragePooling2D,
                     L.GlobalAveragePooling3D)
    k.NORM = (L.BatchNormalization, L.LayerNormalization, L.GroupNormalization)
    k.WEIGHTED = k.CONV + k.SEPARABLE + k.DEPTHWISE + k.TRANSPOSED + (L.Dense,)
    k.RULED = (k.WEIGHTED + k.MERGE + k.ACTIVATION + (L.Activation,) + k.POOL + k.GLOBAL_POOL
               + k.NORM)
    # Weighted layers that do no arithmetic: a lookup is a gather.
    k.NO_ARITHMETIC = (L.Embedding,)
    return k


def walk(model) -> tuple[list[dict], int]:
    """(records, activations): one record per call of a layer that has a rule, and the
    elements of every layer output, per sample."""
    # Walk the graph's nodes, not model.layers: a shared layer called twice costs
    # twice, and every node knows the shapes of its own call.
    import tensorflow as tf
    k = _keras()
    records, activations = [], 0
    for depth in sorted(model._nodes_by_depth, reverse=True):  # inputs first
        for node in model._nodes_by_depth[depth]:
            ins = [_shape(t) for t in tf.nest.flatten(node.input_tensors) if hasattr(t, "shape")]
            outs = [_shape(t) for t in tf.nest.flatten(node.output_tensors)]
            recs, inner = _describe(node.layer, ins, outs)
            records += recs
            activations += inner
            if not isinstance(node.layer, (k.keras.Model, k.L.InputLayer)):  # nested models count inside
                activations += sum(math.prod(d for d in o if d) for o in outs)
    return records, activations


def _shape(tensor):
    return tuple(tensor.shape)[1:]  # per sample: drop the batch axis


def _describe(layer, ins, outs) -> tuple[list[dict], int]:
    """The records of one call of `layer` (`ins`/`outs`: per-sample shapes), and the
    activations counted inside it (a nested model's)."""
    k = _keras()
    if isinstance(layer, k.keras.Model):  # nested Sequential / functional model
        if not getattr(layer, "_is_graph_network", False):
            raise ValueError(f"harness.flops: nested model {layer.name!r} is subclassed; "
                             "only functional and Sequential models can be walked")
        return walk(layer)
    if isinstance(layer, k.L.TimeDistributed):  # the inner layer runs once per step
        steps, step_in = _known(layer, ins[0][0]), (None,) + ins[0][1:]
        step_out = tuple(layer.layer.compute_output_shape(step_in))
        recs, inner = _describe(layer.layer, [step_in[1:]], [step_out[1:]])
        return [{**r, "times": r.get("times", 1) * steps} for r in recs], steps * inner
    if isinstance(layer, k.L.Wrapper):  # e.g. SpectralNormalization: same shapes as inner
        return _describe(layer.layer, ins, outs)
    if not isinstance(layer, k.RULED):
        if layer.weights and not isinstance(layer, k.NO_ARITHMETIC):
            raise TypeError(f"harness.flops: no Table 3 rule for layer {layer.name!r} of "
                            f"class {type(layer).__name__}, which has weights; add a rule "
                            "to harness/flops.py rather than count it as 0")
        return [], 0  # reshape, padding, dropout, concatenate, softmax...: ignored
    return [_record(layer, ins, outs)], 0


def _record(layer, ins, outs) -> dict:
    """The plain record of one call of a layer that has a rule (RECORD_KINDS)."""
    k = _keras()
    x, y = ins[0], outs[0]
    rec = {"layer": layer.name}
    out = _elements(layer, y)
    if isinstance(layer, k.CONV + k.SEPARABLE + k.DEPTHWISE + k.TRANSPOSED):
        kernel = math.prod(layer.kernel_size)
        cin = _known(layer, x[-1] if layer.data_format == "channels_last" else x[0])
        if isinstance(layer, k.SEPARABLE):
            rec.update(kind="separable", kernel=kernel, cin=cin, depth_multiplier=layer.depth_multiplier,
                       filters=layer.filters, out=out)
        elif isinstance(layer, k.DEPTHWISE):
            rec.update(kind="depthwise", kernel=kernel, cin=cin, depth_multiplier=layer.depth_multiplier, out=out)
        elif isinstance(layer, k.TRANSPOSED):
            rec.update(kind="transposed", kernel=kernel, filters=layer.filters, out=out)
            rec["in"] = _elements(layer, x)
        else:
            rec.update(kind="conv", kernel=kernel, cin=cin, groups=layer.groups, filters=layer.filters, out=out)
    elif isinstance(layer, k.L.Dense):
        rec.update(kind="dense", fin=_known(layer, x[-1]), out=out)
    elif isinstance(layer, k.MERGE):
        rec.update(kind="merge", inputs=len(ins), out=out)
    elif isinstance(layer, k.L.Activation):
        rec.update(kind="activation", activation=_name(layer.activation), out=out)
    elif isinstance(layer, k.ACTIVATION):
        rec.update(kind="activation", activation=type(layer).__name__.lower(), out=out)
    elif isinstance(layer, k.POOL):
        rec.update(kind="pooling", out=out)
    elif isinstance(layer, k.GLOBAL_POOL):
        rec.update(kind="global_pooling")
        rec["in"] = _elements(layer, x)
    else:  # k.NORM
        rec.update(kind="normalization", out=out)
    if isinstance(layer, k.WEIGHTED):
        rec.update(bias=int(layer.use_bias), activation=_name(layer.activation))
    return rec


def _name(fn) -> str:
    return getattr(fn, "__name__", "")


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
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    shape = tuple(input_shape or model.input_shape[1:])
    fn = tf.function(lambda x: model(x, training=False), autograph=False)
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
