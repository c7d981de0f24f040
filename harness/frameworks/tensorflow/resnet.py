"""ResNet-50 v1.5 in Keras layers (functional, channels-last).

v1.5 differs from the original ResNet-50 (v1, `keras.applications.ResNet50`) in one
place: a down-sampling bottleneck puts its stride 2 on the 3x3 convolution instead of
the first 1x1, so the 1x1 runs at the input's full resolution. That is ~6 % more
arithmetic than v1 and ~0.5 % more Top-1 (NVIDIA's reference recipe).

FLOPs at 224x224 (harness.flops, Table 3 rules; tests/test_ic.py checks them): 8.205
GFLOPs forward, 24.61 per training sample, so APC at |B| = 512 is 12 603 GFLOPs. The
paper's 11 776 GFLOPs (23.0 per sample) is v1's count: the same builder with v1_5=False
gives 7.741 forward, 23.22 training (+1.0 %). TensorFlow's profiler counts 8.186 GFLOPs
forward on this graph (the analytic count is +0.23 %: it counts ReLU and batch norm).

Conventions of the reference recipe kept here: convolutions without bias (each is
followed by batch norm, whose beta is the bias), batch norm with momentum 0.9 and
epsilon 1e-5, He-normal (fan-out) kernels, and optionally the last batch norm of each
residual branch initialised with gamma = 0 so every block starts as the identity
(Goyal et al. 2017), which helps large-batch and short runs.

Weight decay is an L2 kernel regularizer on conv and dense kernels only (not batch-norm
parameters, not biases). Keras' L2(l2) adds l2 * sum(w^2) to the loss, whose gradient is
2 * l2 * w; the reference's weight decay wd means a gradient of wd * w, so l2 = wd / 2.

Only layers that harness.flops has Table 3 rules for are used (Conv2D, Dense,
BatchNormalization, Activation, Add, MaxPooling2D, GlobalAveragePooling2D) plus
ZeroPadding2D, which does no arithmetic.
"""
from __future__ import annotations

# The design's numbers are the workload's (harness/workloads/ic.py), which PyTorch's
# ResNet (harness/frameworks/pytorch/ic.py) builds from too.
from harness.workloads.ic import BN_EPSILON, BN_MOMENTUM, EXPANSION, STAGES, WIDTH


def build(input_shape, classes: int, *, weight_decay: float = 0.0, width: int = WIDTH,
          stages=STAGES, zero_init_residual: bool = True, v1_5: bool = True,
          name: str = "resnet50_v1_5"):
    """A ResNet v1.5 returning logits (no softmax). `width` and `stages` exist for tests
    and benchmarks on small machines; the defaults are ResNet-50. v1_5=False puts the
    stride on the first 1x1 (v1), only to compare FLOPs with the paper's figure."""
    import tensorflow as tf
    L = tf.keras.layers
    reg = tf.keras.regularizers.L2(weight_decay / 2) if weight_decay else None  # l2 = wd / 2
    # a new initializer per layer: tf-keras gives one unseeded instance the same values
    # at every call, which would make same-shape kernels identical
    conv_init = lambda: tf.keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")  # noqa: E731

    def conv(x, filters, kernel, stride, label):
        if stride > 1 and kernel > 1:
            # explicit symmetric padding, as the reference; "same" with stride 2 pads
            # asymmetrically. ZeroPadding2D does no arithmetic (not counted).
            x = L.ZeroPadding2D(kernel // 2, name=f"{label}_pad")(x)
            padding = "valid"
        else:
            padding = "same"
        return L.Conv2D(filters, kernel, stride, padding=padding, use_bias=False,
                        kernel_initializer=conv_init(), kernel_regularizer=reg, name=label)(x)

    def bn(x, label, zero=False):
        return L.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                                    gamma_initializer="zeros" if zero else "ones", name=label)(x)

    def bottleneck(x, inner, stride, label):
        out = inner * EXPANSION
        shortcut = x
        if stride != 1 or x.shape[-1] != out:
            shortcut = bn(conv(x, out, 1, stride, f"{label}_0_conv"), f"{label}_0_bn")
        s1, s3 = (1, stride) if v1_5 else (stride, 1)
        y = L.Activation("relu", name=f"{label}_1_relu")(bn(conv(x, inner, 1, s1, f"{label}_1_conv"), f"{label}_1_bn"))
        y = L.Activation("relu", name=f"{label}_2_relu")(bn(conv(y, inner, 3, s3, f"{label}_2_conv"), f"{label}_2_bn"))
        y = bn(conv(y, out, 1, 1, f"{label}_3_conv"), f"{label}_3_bn", zero=zero_init_residual)
        return L.Activation("relu", name=f"{label}_out")(L.Add(name=f"{label}_add")([shortcut, y]))

    inputs = tf.keras.Input(tuple(input_shape), name="image")
    x = conv(inputs, width, 7, 2, "conv1_conv")
    x = L.Activation("relu", name="conv1_relu")(bn(x, "conv1_bn"))
    x = L.ZeroPadding2D(1, name="pool1_pad")(x)
    x = L.MaxPooling2D(3, 2, name="pool1_pool")(x)
    for s, blocks in enumerate(stages):
        for b in range(blocks):
            stride = 2 if (b == 0 and s > 0) else 1  # v1.5: on the 3x3 (see bottleneck)
            x = bottleneck(x, width * 2**s, stride, f"conv{s + 2}_block{b + 1}")
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    logits = L.Dense(classes, kernel_initializer=tf.keras.initializers.RandomNormal(stddev=0.01),
                     kernel_regularizer=reg, name="logits", dtype="float32")(x)
    return tf.keras.Model(inputs, logits, name=name)
