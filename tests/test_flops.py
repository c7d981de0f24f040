"""Analytic FLOPs (harness/flops.py) against hand-computed Table 3 formulas,
TensorFlow's own profiler, and the paper's ResNet-50 anchor."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API, before TensorFlow
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import flops  # noqa: E402
from harness.frameworks.tensorflow import flops as keras_flops  # noqa: E402

L = tf.keras.layers


def _forward(model) -> int:
    return keras_flops.count(model).forward


def _model(input_shape, *layers):
    x = inputs = tf.keras.Input(input_shape)
    for layer in layers:
        x = layer(x)
    return tf.keras.Model(inputs, x)


def _small_cnn():
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        L.Conv2D(32, 3, padding="same", activation="relu"),
        L.BatchNormalization(),
        L.Conv2D(64, 3, activation="relu"),
        L.MaxPooling2D(),
        L.Flatten(),
        L.Dense(64, activation="relu"),
        L.Dropout(0.2),
        L.Dense(10),
    ])


def _digits_cnn():
    """The digits workload's own model, the one the shipped HPCAI500.dat trains."""
    from harness.frameworks.tensorflow import digits as tf_digits
    from harness.workloads import Dataset, digits
    return tf_digits.build_model(digits.load(Dataset.parse("embedded"), ""))


# ---- 1. hand-computed Table 3 cases ------------------------------------------

def test_conv2d_by_hand():
    # 10x12x3 input, 3x3 valid conv, 5 filters -> 8x10x5 output.
    c = keras_flops.count(_model((10, 12, 3), L.Conv2D(5, 3, activation="relu")))
    assert c.by_operator["convolution"] == 2 * 3 * 3 * 3 * 8 * 10 * 5
    # bias add + relu: one FLOP per output element each
    assert c.by_operator["elementwise"] == 8 * 10 * 5 + 8 * 10 * 5
    assert c.forward == 2 * 3 * 3 * 3 * 8 * 10 * 5 + 2 * 8 * 10 * 5


def test_conv_non_square_strided_and_1d_3d():
    # (3, 5) kernel, stride (1, 2), valid: 10x12 -> 8x4, Cin 3, Cout 5.
    c = keras_flops.count(_model((10, 12, 3), L.Conv2D(5, (3, 5), strides=(1, 2), use_bias=False)))
    assert c.forward == 2 * 3 * 5 * 3 * 8 * 4 * 5
    c = keras_flops.count(_model((32, 4), L.Conv1D(8, 5, use_bias=False)))  # 32 -> 28
    assert c.forward == 2 * 5 * 4 * 28 * 8
    c = keras_flops.count(_model((6, 6, 6, 2), L.Conv3D(4, (3, 2, 1), use_bias=False)))
    assert c.forward == 2 * (3 * 2 * 1) * 2 * (4 * 5 * 6) * 4


def test_dense_by_hand():
    c = keras_flops.count(_model((20,), L.Dense(7)))
    assert c.by_operator["dense"] == 2 * 20 * 7
    assert c.forward == 2 * 20 * 7 + 7  # + bias add


def test_depthwise_by_hand():
    # 9x9x4, 3x3 valid, depth_multiplier 2 -> 7x7x8
    c = keras_flops.count(_model((9, 9, 4), L.DepthwiseConv2D(3, depth_multiplier=2, use_bias=False)))
    assert c.by_operator["depthwise"] == 2 * 3 * 3 * 4 * 7 * 7 * 2
    assert c.forward == c.by_operator["depthwise"]


def test_separable_is_depthwise_plus_pointwise():
    # 9x9x4 -> depthwise 3x3 (x2) -> 7x7x8 -> pointwise 1x1 -> 7x7x6
    c = keras_flops.count(_model((9, 9, 4), L.SeparableConv2D(6, 3, depth_multiplier=2, use_bias=False)))
    assert c.by_operator["depthwise"] == 2 * 3 * 3 * 4 * 7 * 7 * 2
    assert c.by_operator["convolution"] == 2 * 8 * 7 * 7 * 6


def test_grouped_conv_by_hand():
    # 10x10x8, 3x3 valid, 12 filters in 4 groups -> 8x8x12, each filter sees 8/4 channels
    c = keras_flops.count(_model((10, 10, 8), L.Conv2D(12, 3, groups=4, use_bias=False)))
    assert c.forward == 2 * 3 * 3 * 8 * 8 * 8 * 12 // 4
    dense = keras_flops.count(_model((10, 10, 8), L.Conv2D(12, 3, use_bias=False)))
    assert 4 * c.forward == dense.forward


def test_transposed_conv_by_hand():
    # the conv with roles swapped: the input's spatial size multiplies
    c = keras_flops.count(_model((4, 4, 3), L.Conv2DTranspose(5, 3, strides=2, padding="same",
                                                         use_bias=False)))
    assert c.forward == 2 * 3 * 3 * 3 * 5 * 4 * 4


def test_pooling_by_hand():
    assert _forward(_model((8, 8, 6), L.MaxPooling2D(2))) == 4 * 4 * 6
    assert _forward(_model((8, 8, 6), L.AveragePooling2D(3, strides=1))) == 6 * 6 * 6
    # global pooling: every input element is read once
    assert _forward(_model((8, 8, 6), L.GlobalAveragePooling2D())) == 8 * 8 * 6


def test_normalization_by_hand():
    c = keras_flops.count(_model((5, 5, 3), L.BatchNormalization()))
    assert c.by_operator["normalization"] == 5 * 5 * 3 == c.forward
    assert _forward(_model((4, 6), L.LayerNormalization())) == 4 * 6


def test_elementwise_and_ignored_layers():
    a, b, c = (tf.keras.Input((4, 4, 2)) for _ in range(3))
    add3 = tf.keras.Model([a, b, c], L.Add()([a, b, c]))
    assert _forward(add3) == 2 * 4 * 4 * 2  # k - 1 = 2 binary adds per element
    assert _forward(_model((4, 4, 2), L.Activation("relu"))) == 32
    assert _forward(_model((4, 4, 2), L.ReLU())) == 32
    ignored = (L.Activation("softmax"), L.Softmax(), L.ZeroPadding2D(1), L.Dropout(0.5),
               L.Flatten(), L.Reshape((-1,)))
    assert _forward(_model((4, 4, 2), *ignored)) == 0


def test_flopcount_contract():
    c = keras_flops.count(_digits_cnn())
    assert c.training == 3 * c.forward
    assert c.forward == sum(c.by_operator.values())
    assert _forward(_digits_cnn()) == c.forward
    assert "3 x forward" in flops.CONVENTION and "\n" not in flops.CONVENTION


# ---- 2./3. against TensorFlow's profiler and the paper ------------------------

@pytest.mark.parametrize("input_shape,layer", [
    ((9, 9, 4), L.DepthwiseConv2D(3, depth_multiplier=2)),
    ((9, 9, 4), L.SeparableConv2D(6, 3, depth_multiplier=2, use_bias=False)),
    ((4, 4, 3), L.Conv2DTranspose(5, 3, strides=2, padding="same", use_bias=False)),
    ((32, 4), L.Conv1D(8, 5)),
    ((6, 6, 6, 2), L.Conv3D(4, (3, 2, 1), use_bias=False)),
    ((10, 12, 3), L.Conv2D(5, (3, 5), strides=(1, 2), padding="same")),
    ((7, 7, 16), L.GlobalAveragePooling2D()),
    ((5, 7), L.Dense(3)),
], ids=lambda v: type(v).__name__ if not isinstance(v, tuple) else None)
def test_single_layers_match_profiler_exactly(input_shape, layer):
    # no activation, normalization or pooling window: the two counts use the same rule
    model = _model(input_shape, layer)
    assert _forward(model) == keras_flops.profiler_flops(model, input_shape)


@pytest.fixture(scope="module")
def resnet50():
    return tf.keras.applications.ResNet50(weights=None)


def test_resnet50_matches_profiler(resnet50):
    analytic = _forward(resnet50)
    profiled = keras_flops.profiler_flops(resnet50, (224, 224, 3))
    assert analytic == pytest.approx(profiled, rel=0.02)


def test_resnet50_matches_paper_apc(resnet50):
    # Paper: APC = 11 776 GFLOPs for |B| = 512 at 224x224 (forward + backward).
    apc = keras_flops.count(resnet50).training * 512
    assert apc == pytest.approx(11776e9, rel=0.02)


def test_digits_cnn_matches_profiler():
    model = _digits_cnn()
    assert _forward(model) == pytest.approx(keras_flops.profiler_flops(model), rel=0.02)


def test_profiler_refuses_what_it_cannot_see():
    # tf-keras runs grouped convolution inside a function call the profiler skips
    with pytest.raises(ValueError, match="function call"):
        keras_flops.profiler_flops(_model((10, 10, 8), L.Conv2D(12, 3, groups=4)))


# ---- 4. nesting and sharing ---------------------------------------------------

def test_nested_sequential_counts_as_flat():
    flat = _small_cnn()
    inputs = tf.keras.Input((8, 8, 1))
    body = tf.keras.Sequential([L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(),
                                L.Flatten(), L.Dense(64, activation="relu")])
    x = L.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = L.BatchNormalization()(x)
    x = L.Dense(10)(L.Dropout(0.2)(body(x)))
    nested = tf.keras.Model(inputs, x)
    assert keras_flops.count(nested) == keras_flops.count(flat)


def test_shared_layer_and_wrapper():
    dense = L.Dense(7, use_bias=False)  # called twice: costs twice
    inputs = tf.keras.Input((7,))
    twice = tf.keras.Model(inputs, dense(dense(inputs)))
    assert _forward(twice) == 2 * (2 * 7 * 7)
    timed = _model((5, 7), L.TimeDistributed(L.Dense(3, use_bias=False)))
    assert _forward(timed) == 5 * 2 * 7 * 3


# ---- 5. refuse to guess ---------------------------------------------------------

def test_unknown_weighted_layer_is_an_error():
    with pytest.raises(TypeError, match="LSTM"):
        keras_flops.count(_model((5, 3), L.LSTM(4)))

    class Scale(L.Layer):
        def build(self, shape):
            self.w = self.add_weight(name="w", shape=shape[-1:])

        def call(self, x):
            return x * self.w

    with pytest.raises(TypeError, match="Scale"):
        keras_flops.count(_model((4,), Scale()))


def test_subclassed_model_is_an_error():
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.d = L.Dense(2)

        def call(self, x):
            return self.d(x)

    net = Net()
    net(tf.zeros((1, 3)))
    with pytest.raises(ValueError, match="functional or Sequential"):
        keras_flops.count(net)


def test_activations_and_weights_for_the_roofline():
    # 10x12x3 -> Conv2D(5, 3, valid) -> 8x10x5 = 400 outputs; Flatten (400, counted:
    # a layer output) -> Dense(7) = 7 outputs; weights 3*3*3*5+5 + 400*7+7
    model = _model((10, 12, 3), L.Conv2D(5, 3), L.Flatten(), L.Dense(7))
    c = keras_flops.count(model)
    assert c.activations == 400 + 400 + 7
    assert c.weights == (27 * 5 + 5) + (400 * 7 + 7)


# ---- 6. the walk's records and the pure rule (harness/verify.py re-derives from them) ----

# Totals of the count before it was split into walk + rule (harness/flops.py as of
# b7205df): the split must not change a single FLOP.
_BEFORE = {
    "small_cnn": (1450442, {"convolution": 1363968, "depthwise": 0, "dense": 75008, "elementwise": 8842,
                            "pooling": 576, "normalization": 2048}, 7690, 56522),
    "digits": (2676490, {"convolution": 2396160, "depthwise": 0, "dense": 264704, "elementwise": 12554,
                         "pooling": 1024, "normalization": 2048}, 10506, 151434),
    "resnet50": (7752024040, None, None, None),
}


def _rederived(c) -> int:
    return sum(sum(flops.rule(r).values()) for r in c.layers)


@pytest.mark.parametrize("name,build", [("small_cnn", _small_cnn), ("digits", _digits_cnn)])
def test_count_unchanged_and_equal_to_the_rule_over_the_walk(name, build):
    import json
    c = keras_flops.count(build())
    forward, by_op, activations, weights = _BEFORE[name]
    assert (c.forward, c.by_operator, c.activations, c.weights) == (forward, by_op, activations, weights)
    assert _rederived(c) == c.forward and flops.by_operator(c.layers) == c.by_operator
    # plain records: JSON numbers and strings, the same after a round trip
    assert json.loads(json.dumps(c.layers)) == c.layers
    assert all(r["kind"] in flops.RECORD_KINDS and isinstance(r["layer"], str) for r in c.layers)


def test_resnet50_count_unchanged_by_the_split(resnet50):
    c = keras_flops.count(resnet50)
    assert c.forward == _BEFORE["resnet50"][0] == _rederived(c)
    assert 150 <= len(c.layers) <= 200   # one record per call with a rule: compact enough for results.json
    assert c.layers[0]["layer"] == "conv1_conv"  # in forward order, inputs first


def test_records_of_shared_nested_and_time_distributed_layers():
    dense = L.Dense(7, use_bias=False)
    inputs = tf.keras.Input((7,))
    twice = keras_flops.count(tf.keras.Model(inputs, dense(dense(inputs))))
    assert [r["layer"] for r in twice.layers] == [dense.name, dense.name]   # one record per call
    timed = keras_flops.count(_model((5, 7), L.TimeDistributed(L.Dense(3))))
    assert timed.layers == [{"layer": timed.layers[0]["layer"], "kind": "dense", "fin": 7, "out": 3, "bias": 1,
                             "activation": "linear", "times": 5}]
    assert timed.forward == 5 * (2 * 7 * 3 + 3) == _rederived(timed)
    body = tf.keras.Sequential([L.Conv2D(4, 3, activation="relu")])
    x = tf.keras.Input((6, 6, 2))
    nested = keras_flops.count(tf.keras.Model(x, L.Dense(2)(L.Flatten()(body(x)))))
    assert [r["kind"] for r in nested.layers] == ["conv", "dense"] and _rederived(nested) == nested.forward


def test_flopcount_equality_ignores_layer_names():
    # two builds of one architecture get different layer names, not different counts
    a, b = keras_flops.count(_small_cnn()), keras_flops.count(_small_cnn())
    assert a == b and [r["layer"] for r in a.layers] != [r["layer"] for r in b.layers]


def test_flops_module_needs_no_tensorflow_until_a_model_is_walked():
    import subprocess
    import sys
    code = ("import sys; from harness import flops; "
            "flops.rule({'kind': 'dense', 'fin': 3, 'out': 2, 'bias': 1, 'activation': 'relu'}); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
