"""deeplab: DeepCAM's model, DeepLabv3+ with an Xception encoder, ported from MLPerf HPC.

The reference (mlcommons/hpc, deepcam/src/deepCam/architecture/deeplab_xception.py,
PyTorch, built as `DeepLabv3_plus(n_input=16, n_classes=3, os=16)`) written again in
Keras, channels last, layer for layer:

* Entry flow: conv 3x3 stride 2 (32) + BN + ReLU, conv 3x3 (64) + BN + ReLU; block 1
  (128, stride 2, no final ReLU); the ReLU after it; blocks 2 (256, stride 2) and 3
  (728, stride 2). Middle flow: 16 blocks of 3 separable convolutions at 728. Exit
  flow: block 20 (728 -> 1024, stride 1, a third separable convolution at the end),
  then 3 separable convolutions (1536, 1536, 2048, dilation 2) each + BN + ReLU.
  A block: separable conv + BN (+ ReLU between them, never after the last), then a
  stride-2 separable conv (no BN) when the block strides, or a stride-1 one when it
  is the last of its flow; a 1x1 conv + BN on the skip when the channels or the stride
  change; the sum; a final ReLU unless said otherwise.
* ASPP at output stride 16: 1x1 and 3x3 dilated 6, 12, 18 (each + BN + ReLU, 256), and
  a global-pooling branch (1x1 conv, a per-channel affine w x + b, ReLU) tiled back to
  the feature map; concatenated (1280), 1x1 conv + BN + ReLU (256).
* Decoder: the low-level feature (block 1's output after the entry ReLU) 1x1 conv to
  48 + BN + ReLU; two transposed 3x3 stride-2 convolutions (+ BN + ReLU) bring the ASPP
  output to the low-level size; concatenated (304); conv 3x3 + BN + ReLU twice and a
  1x1 conv with bias (256); a transposed conv (+ BN + ReLU) and a last one to the
  classes at full resolution: logits (H, W, classes), no softmax.

Where the port took a judgement (DESIGN.md says the same):
* Padding. PyTorch pads symmetrically: the stride-2 convolutions (conv1 with padding 1,
  the separable ones with compute_padding's (1, 1)) see one padded pixel on each side.
  Keras' "same" pads 0 before and 1 after on an even side, which shifts every window by
  a pixel; so a stride-2 convolution here is ZeroPadding2D(1) then a "valid" one. At
  stride 1 "same" pads symmetrically (odd effective kernels: 3, 5, 13, 25, 37), as the
  reference does.
* Transposed convolutions (k 3, stride 2, padding 1, output_padding 1 in PyTorch): the
  output pixel o takes input i when o = 2i - 1 + k; Keras' "same" would give o = 2i + k.
  Here: a "valid" Conv2DTranspose (2H + 1) cropped by one pixel at the top and left,
  which is PyTorch's exactly.
* The in-place ReLU. The reference keeps `low_level_feat = x` and then runs its shared
  `nn.ReLU(inplace=True)` on x: in place, so the low-level feature the decoder reads is
  the ReLU'd tensor. Here the ReLU's output is both the low-level feature and block 2's
  input.
* The pooling branch's TrainableAffine (w x + b per channel, w = 1, b = 0 at the start)
  is a 1x1 depthwise convolution with bias on the 1x1 map (the same function and
  weights); Table 3's depthwise rule counts it 2 + 1 FLOPs a channel where the affine
  is 2: 256 FLOPs a sample.
* The tile to (48, 72) is written for 768 x 1152 inputs; here the pooled map is tiled to
  whatever size the feature map has (tf.tile), the same at 768 x 1152.
* Batch normalisation: PyTorch's momentum 0.1 and eps 1e-5 (Keras: momentum 0.9,
  epsilon 1e-5), gamma 1, beta 0.
* Initial weights, as the reference's modules set them: the encoder's and the ASPP's
  convolutions kaiming-normal (std sqrt(2 / fan_in), not truncated), where PyTorch's
  fan_in of a depthwise filter is its 3 x 3 = 9 taps (Keras' would count the channels
  too, so the depthwise kernels get their own initializer); every other convolution
  (the bottleneck's and the pooling branch's 1x1, the low-level 1x1 and the decoder,
  whose `__init_weight` methods the reference never calls) PyTorch's default,
  kaiming-uniform with a = sqrt(5): uniform +- 1 / sqrt(fan_in), and PyTorch's fan_in of
  a transposed kernel (in, out, 3, 3) is out x 9, which is also what Keras computes for
  its (3, 3, out, in) kernel. The decoder's one bias (the 1x1 conv) is uniform
  +- 1 / sqrt(fan_in) as PyTorch's.

`scale` (HPCAI500_DEEPCAM_WIDTH / 32, test-only) multiplies every channel count and
`middle` (HPCAI500_DEEPCAM_MIDDLE) sets the middle flow's blocks, so that a test trains
in seconds; 1 and 16 build the reference. Pure model code: TensorFlow is imported by
`build` only.
"""
from __future__ import annotations

import functools
import math

# The design's numbers are the workload's (harness/workloads/deepcam.py), which PyTorch's
# port (harness/frameworks/pytorch/deepcam.py) builds from too.
from harness.workloads.deepcam import (ASPP, ASPP_RATES, BLOCKS, BN_EPSILON, BN_MOMENTUM, DECODER, ENTRY, EXIT,
                                       EXIT_RATES, LOW_LEVEL, MIDDLE_BLOCKS, OUTPUT_STRIDE, block_rep, channels)


def build(height: int, width: int, inputs: int, classes: int, scale: float = 1.0,
          middle: int = MIDDLE_BLOCKS, rates: tuple = (ASPP_RATES, EXIT_RATES), name: str = "deepcam"):
    """The functional Keras model: (H, W, inputs) float32 -> (H, W, classes) logits.
    H and W must be multiples of OUTPUT_STRIDE. `rates`: the ASPP's and the exit flow's
    dilation rates (the reference's; all 1 builds the undilated twin that the FLOP
    check compares with TensorFlow's profiler at small sizes, tests/test_deepcam.py)."""
    import tensorflow as tf
    if height % OUTPUT_STRIDE or width % OUTPUT_STRIDE:
        raise ValueError(f"deeplab: found {height} x {width}, expected multiples of {OUTPUT_STRIDE}"
                         " (the encoder's output stride)")
    b = _Builder(tf.keras.layers, lambda c: channels(c, scale), *rates)
    x = tf.keras.Input((height, width, inputs), name="climate")
    deep, low = b.xception(x, middle)
    out = b.decoder(b.aspp(deep), low, classes)
    return tf.keras.Model(x, out, name=name)


def taps_on_map(size: int, rate: int, kernel: int) -> slice:
    """The taps along one axis of a "same"-padded convolution (stride 1, dilated `rate`)
    that read the map of `size` pixels from some output pixel: tap a reads the pixel
    (a - (kernel - 1) / 2) x rate away, inside the map from some pixel iff that distance is
    under `size`. Every other tap reads padding's zeros only. Pure."""
    half = (kernel - 1) // 2
    reach = min(half, (size - 1) // rate)    # the farthest tap from the centre that can land on the map
    return slice(half - reach, half + reach + 1)


@functools.cache
def _atrous_conv2d(layers):
    """Keras' Conv2D that leaves out of the computation the taps that read only padding
    (`taps_on_map`): the same output and gradients (those taps' gradients are 0 in the
    full convolution too), the same kernel, weights and Table 3 count (the walker counts
    a Conv2D by its kernel). Why: at small sizes the ASPP's 4 x 6 map (64 x 96 inputs) is
    smaller than its rates (6, 12, 18), and TensorFlow runs a dilated convolution on a CPU
    through a SpaceToBatch grid padded to multiples of the rate: their backward passes took
    12.8 of the 13.4 s step at 64 x 96 (bench/deepcam_profile.py). At 768 x 1152 the map
    (48 x 72) holds every tap and the layer is Keras' own."""
    import tensorflow as tf

    class AtrousConv2D(layers.Conv2D):
        def convolution_op(self, inputs, kernel):
            rows, cols = (taps_on_map(n, r, k) for n, r, k in zip(inputs.shape[1:3], self.dilation_rate,
                                                                  self.kernel_size))
            if (rows.stop - rows.start, cols.stop - cols.start) == tuple(self.kernel_size):
                return super().convolution_op(inputs, kernel)
            taps = kernel[rows, cols]
            return tf.nn.convolution(inputs, taps, padding="SAME", dilations=[
                r if t > 1 else 1 for r, t in zip(self.dilation_rate, taps.shape[:2])])
    return AtrousConv2D


class _Builder:
    """The layers, named after the reference's modules (xception.block4.rep.3, ...)."""

    def __init__(self, layers, c, aspp_rates, exit_rates):
        self.L, self.c, self.aspp_rates, self.exit_rates = layers, c, aspp_rates, exit_rates

    # -- initial weights ---------------------------------------------------------------
    def kaiming_normal(self):
        """torch.nn.init.kaiming_normal_: std sqrt(2 / fan_in), fan_in = Cin x taps."""
        import tensorflow as tf
        return tf.keras.initializers.VarianceScaling(2.0, "fan_in", "untruncated_normal")

    def kaiming_normal_depthwise(self, taps: int):
        """The same for a depthwise filter, whose PyTorch fan_in is its taps alone."""
        import tensorflow as tf
        return tf.keras.initializers.RandomNormal(stddev=math.sqrt(2.0 / taps))

    def torch_default(self):
        """PyTorch's default for Conv2d and ConvTranspose2d weights: kaiming-uniform with
        a = sqrt(5), i.e. uniform +- 1 / sqrt(fan_in)."""
        import tensorflow as tf
        return tf.keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")

    # -- building blocks ---------------------------------------------------------------
    def bn(self, x, name):
        return self.L.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name)(x)

    def relu(self, x, name):
        return self.L.ReLU(name=name)(x)

    def conv(self, x, filters, kernel, name, stride=1, dilation=1, init=None, bias=False):
        """A convolution padded as PyTorch's `padding = dilation x (kernel - 1) / 2`; a
        bias (bias=True) initialised as PyTorch's, uniform +- 1 / sqrt(fan_in)."""
        import tensorflow as tf
        if stride > 1:
            x = self.L.ZeroPadding2D((kernel - 1) // 2, name=name + ".pad")(x)
        bound = 1.0 / math.sqrt(kernel * kernel * x.shape[-1])
        layer = _atrous_conv2d(self.L) if dilation > 1 and stride == 1 else self.L.Conv2D
        return layer(filters, kernel, strides=stride, dilation_rate=dilation,
                     padding="valid" if stride > 1 else "same", use_bias=bias,
                     kernel_initializer=init or self.kaiming_normal(),
                     bias_initializer=tf.keras.initializers.RandomUniform(-bound, bound), name=name)(x)

    def separable(self, x, filters, name, stride=1, dilation=1):
        """SeparableConv2d_same: depthwise 3x3 then pointwise 1x1, no bias, nothing
        between them; padding dilation on each side."""
        if stride > 1:
            x = self.L.ZeroPadding2D(dilation, name=name + ".pad")(x)
        return self.L.SeparableConv2D(
            filters, 3, strides=stride, dilation_rate=dilation, padding="valid" if stride > 1 else "same",
            use_bias=False, depthwise_initializer=self.kaiming_normal_depthwise(9),
            pointwise_initializer=self.kaiming_normal(), name=name)(x)

    def block(self, x, inplanes, planes, reps, name, stride=1, dilation=1, end_with_relu=True,
              grow_first=True, is_last=False):
        """The reference's Block (see the module docstring)."""
        planes_c, y = self.c(planes), x
        for k, (kind, *args) in enumerate(block_rep(self.c(inplanes), planes_c, reps, stride, dilation, grow_first,
                                                    is_last)):
            at = f"{name}.rep.{k}"   # the reference's layer names
            if kind == "separable":
                _, out, step, rate = args
                y = self.separable(y, out, at, stride=step, dilation=rate)
            else:
                y = self.bn(y, at) if kind == "bn" else self.relu(y, at)
        skip = x
        if planes != inplanes or stride != 1:
            skip = self.L.Conv2D(planes_c, 1, strides=stride, use_bias=False,
                                 kernel_initializer=self.kaiming_normal(), name=f"{name}.skip")(x)
            skip = self.bn(skip, f"{name}.skipbn")
        y = self.L.Add(name=f"{name}.add")([y, skip])
        return self.relu(y, f"{name}.relu") if end_with_relu else y

    # -- the three parts ---------------------------------------------------------------
    def xception(self, x, middle: int):
        """The encoder: (features at stride 16, the low-level feature at stride 4)."""
        c, p = self.c, "xception_features"
        x = self.relu(self.bn(self.conv(x, c(ENTRY[0]), 3, f"{p}.conv1", stride=2), f"{p}.bn1"), f"{p}.relu1")
        x = self.relu(self.bn(self.conv(x, c(ENTRY[1]), 3, f"{p}.conv2"), f"{p}.bn2"), f"{p}.relu2")
        x = self.block(x, ENTRY[1], BLOCKS[0], 2, f"{p}.block1", stride=2, end_with_relu=False)
        low = x = self.relu(x, f"{p}.relu")     # in place in the reference: the low-level feature too
        x = self.block(x, BLOCKS[0], BLOCKS[1], 2, f"{p}.block2", stride=2)
        x = self.block(x, BLOCKS[1], BLOCKS[2], 2, f"{p}.block3", stride=2, is_last=True)
        for i in range(middle):
            x = self.block(x, BLOCKS[2], BLOCKS[2], 3, f"{p}.block{4 + i}")
        x = self.block(x, BLOCKS[2], EXIT[0], 2, f"{p}.block20", dilation=self.exit_rates[0], end_with_relu=False,
                       grow_first=False, is_last=True)
        for i, f in enumerate(EXIT[1:], 3):
            x = self.separable(x, c(f), f"{p}.conv{i}", dilation=self.exit_rates[1])
            x = self.relu(self.bn(x, f"{p}.bn{i}"), f"{p}.relu{i}")
        return x, low

    def aspp(self, x):
        """The bottleneck: four atrous branches and the pooling branch, fused."""
        import tensorflow as tf
        c, p = self.c, "bottleneck"
        branches = []
        for i, rate in enumerate(self.aspp_rates, 1):
            y = self.conv(x, c(ASPP), 1 if rate == 1 else 3, f"{p}.aspp{i}.atrous_convolution", dilation=rate)
            branches.append(self.relu(self.bn(y, f"{p}.aspp{i}.bn"), f"{p}.aspp{i}.relu"))
        h, w = x.shape[1], x.shape[2]
        g = self.L.GlobalAveragePooling2D(keepdims=True, name=f"{p}.global_avg_pool.0")(x)
        g = self.conv(g, c(ASPP), 1, f"{p}.global_avg_pool.1", init=self.torch_default())
        g = self.L.DepthwiseConv2D(1, use_bias=True, depthwise_initializer="ones", bias_initializer="zeros",
                                   name=f"{p}.global_avg_pool.2")(g)      # TrainableAffine: w x + b
        g = self.relu(g, f"{p}.global_avg_pool.3")
        # tf.tile, as the reference's torch.tile: its gradient is a sum XLA compiles (an
        # UpSampling2D's ResizeNearestNeighborGrad has no XLA kernel on the CPU)
        branches.append(self.L.Lambda(lambda t: tf.tile(t, (1, h, w, 1)), name=f"{p}.tile")(g))
        x = self.L.Concatenate(name=f"{p}.cat")(branches)
        x = self.conv(x, c(ASPP), 1, f"{p}.conv", init=self.torch_default())
        return self.relu(self.bn(x, f"{p}.bn"), f"{p}.relu")

    def transposed(self, x, filters, name):
        """ConvTranspose2d(k 3, stride 2, padding 1, output_padding 1, no bias): 2H x 2W."""
        y = self.L.Conv2DTranspose(filters, 3, strides=2, padding="valid", use_bias=False,
                                   kernel_initializer=self.torch_default(), name=name)(x)
        return self.L.Cropping2D(((1, 0), (1, 0)), name=name + ".crop")(y)

    def decoder(self, x, low, classes: int):
        """The low-level projection and the DeconvUpsampler, to full-resolution logits."""
        c, p = self.c, "upsample"
        low = self.conv(low, c(LOW_LEVEL), 1, "conv2", init=self.torch_default())
        low = self.relu(self.bn(low, "bn2"), "relu")
        for i in (0, 3):
            x = self.relu(self.bn(self.transposed(x, c(DECODER), f"{p}.deconv1.{i}"), f"{p}.deconv1.{i + 1}"),
                          f"{p}.deconv1.{i + 2}")
        x = self.L.Concatenate(name=f"{p}.cat")([x, low])
        for i in (0, 3):
            x = self.conv(x, c(DECODER), 3, f"{p}.conv1.{i}", init=self.torch_default())
            x = self.relu(self.bn(x, f"{p}.conv1.{i + 1}"), f"{p}.conv1.{i + 2}")
        x = self.conv(x, c(DECODER), 1, f"{p}.conv1.6", init=self.torch_default(), bias=True)
        x = self.relu(self.bn(self.transposed(x, c(DECODER), f"{p}.deconv2.0"), f"{p}.deconv2.1"),
                      f"{p}.deconv2.2")
        return self.transposed(x, classes, f"{p}.last_deconv.0")
