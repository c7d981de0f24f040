"""Convolution roofline kernel: a 3x3 convolution of ResNet-50's kind, NHWC (channels-last).

Shape: batch x 56 x 56 x 256 input, 3x3 kernel, 256 filters, stride 1, SAME padding, so
the output is batch x 56 x 56 x 256. That is the 56 x 56 feature map of ResNet-50's
conv2_x stage at the 256-channel width of its bottleneck outputs: 3.70 GFLOPs per sample,
16x any single 3x3 layer of ResNet-50, so that it saturates the device as a roofline must.
Channels-last is the Keras default the training uses (and what tensor cores want).
FLOPs = 2 x K^2 x Cin x H x W x Cout per sample, H and W of the output (Table 3): the
nominal count, so an algorithm that does fewer (Winograd, FFT; cuDNN and oneDNN pick one
for 3x3) shows as a higher rate, as it does in the training the roofline bounds.
Default batch: 128 on a GPU (474 GFLOP per call), 4 on a CPU.

    mpirun -np N python -m kernels.conv --batch 128 --precision fp16 --repeats 5
"""
from __future__ import annotations

import sys

from kernels import cli, device, timing

DEFAULT_BATCH = {"GPU": 128, "CPU": 4}
SHAPE = {"hw": 56, "cin": 256, "cout": 256, "k": 3}
QUICK = {"batch": 1, "hw": 28, "cin": 64, "cout": 64, "k": 3}


def flop_per_sample(k: int, cin: int, h: int, w: int, cout: int) -> int:
    """Table 3: 2 x K^2 x Cin x H x W x Cout, with H and W of the output."""
    return 2 * k * k * cin * h * w * cout


def run(batch: int | None = None, hw: int = 56, cin: int = 256, cout: int = 256, k: int = 3,
        precision: str = "fp32", repeats: int = 5) -> dict:
    """Time one batch x hw x hw x cin convolution (k x k, cout filters, stride 1, SAME)."""
    import tensorflow as tf
    dev = device.current()
    batch = batch or DEFAULT_BATCH[dev.kind]
    dtype = device.dtype(precision)
    with tf.device(dev.tf_name):
        x = tf.cast(tf.random.uniform((batch, hw, hw, cin), -1.0, 1.0), dtype)
        f = tf.cast(tf.random.uniform((k, k, cin, cout), -1.0, 1.0), dtype)
        # Eager, as for GEMM: a tf.function only adds call overhead to a single op.
        t = timing.measure(lambda: tf.nn.conv2d(x, f, strides=1, padding="SAME", data_format="NHWC"),
                           repeats)
    work = batch * flop_per_sample(k, cin, hw, hw, cout)    # SAME, stride 1: output is hw x hw
    return {"batch": batch, "height": hw, "width": hw, "cin": cin, "cout": cout, "kernel": k,
            "layout": "NHWC", "precision": precision,
            "math": "tf32" if dev.tf32 and precision == "fp32" else precision,
            "device": dev.name, "seconds": t.seconds, "flop": work, "flops": work / t.seconds,
            "repeats": repeats, "chain": t.chain, "samples": t.samples}


def main(argv=None) -> int:
    p = cli.parser("conv", "Convolution roofline kernel (NHWC, stride 1, SAME): "
                           "FLOPs = 2 K^2 Cin H W Cout per sample.")
    p.add_argument("--batch", type=cli.positive, help="samples per call (default 128 on GPU, 4 on CPU)")
    p.add_argument("--hw", type=cli.positive, default=SHAPE["hw"], help="height = width (default 56)")
    p.add_argument("--cin", type=cli.positive, default=SHAPE["cin"], help="input channels (default 256)")
    p.add_argument("--cout", type=cli.positive, default=SHAPE["cout"], help="filters (default 256)")
    p.add_argument("--k", type=cli.positive, default=SHAPE["k"], help="kernel size K (default 3)")
    return cli.main(p, argv, lambda a: run(a.batch, a.hw, a.cin, a.cout, a.k, a.precision, a.repeats),
                    lambda a: f"CONV {a.precision}, FLOPs = 2 K^2 Cin H W Cout per sample, "
                              f"median of {a.repeats} timed samples",
                    lambda r: f"{r['batch']}x{r['height']}x{r['width']}x{r['cin']} k{r['kernel']} "
                              f"->{r['cout']} ({r['math']})", "Tflops", 1e12, "flops")


if __name__ == "__main__":
    sys.exit(main())
