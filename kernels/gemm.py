"""GEMM roofline kernel: C = A @ B, square n x n, in the run's precision, on this rank's device.

FLOPs = 2 n^3 per multiply (n^3 multiply-adds of two FLOPs each, as in Table 3).
fp16/bf16: A, B and C in that type; TensorFlow accumulates in fp32 (cuBLAS compute type
32F), as mixed-precision training does. fp32 on Ampere or newer GPUs runs on TF32 tensor
cores, TensorFlow's default, as fp32 training does too: `math` says "tf32" then.
Default n: 8192 on a GPU (large enough to saturate an A100/H100: ~1.1 TFLOP per call),
2048 on a CPU (17 GFLOP: a few seconds for the whole measurement).

    mpirun -np N python -m kernels.gemm --n 8192 --precision fp32 --repeats 5
"""
from __future__ import annotations

import sys

from kernels import cli, device, timing

DEFAULT_N = {"GPU": 8192, "CPU": 2048}
QUICK_N = 256


def flop(n: int) -> int:
    return 2 * n ** 3


def run(n: int | None = None, precision: str = "fp32", repeats: int = 5) -> dict:
    """Time one n x n GEMM on this rank's device; this rank's figures."""
    import tensorflow as tf
    dev = device.current()
    n = n or DEFAULT_N[dev.kind]
    dtype = device.dtype(precision)
    with tf.device(dev.tf_name):
        a = tf.cast(tf.random.uniform((n, n), -1.0, 1.0), dtype)
        b = tf.cast(tf.random.uniform((n, n), -1.0, 1.0), dtype)
        # Eager: the op goes straight to oneDNN / cuBLAS. A tf.function adds ~0.1 ms per call
        # on the CPU here (n=256: 55 against 200 Gflop/s), and nothing once the op is large.
        t = timing.measure(lambda: tf.linalg.matmul(a, b), repeats)
    return {"n": n, "precision": precision, "math": "tf32" if dev.tf32 and precision == "fp32" else precision,
            "device": dev.name, "seconds": t.seconds, "flop": flop(n), "flops": flop(n) / t.seconds,
            "repeats": repeats, "chain": t.chain, "samples": t.samples}


def main(argv=None) -> int:
    p = cli.parser("gemm", "GEMM roofline kernel: C = A @ B, n x n, FLOPs = 2 n^3.")
    p.add_argument("--n", type=cli.positive, help="matrix size (default 8192 on GPU, 2048 on CPU)")
    return cli.main(p, argv, lambda a: run(a.n, a.precision, a.repeats),
                    lambda a: f"GEMM {a.precision}, FLOPs = 2 n^3, median of {a.repeats} timed samples",
                    lambda r: f"n={r['n']} ({r['math']})", "Tflops", 1e12, "flops")


if __name__ == "__main__":
    sys.exit(main())
