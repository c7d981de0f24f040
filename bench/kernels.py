"""Our GEMM kernel against numpy's GEMM and a plain tf.matmul loop, fp32, in one process.

    .venv/bin/python bench/kernels.py

Our kernel: kernels.gemm.run (tf.function, warm-up, chained calls, median of 5 samples).
numpy: a @ b, the same warm-up and median. Plain TensorFlow: what a user would write,
eager `tf.matmul` in a loop with one `.numpy()` at the end, timed as a whole (median of
5 loops). Same n, same cores (TensorFlow's and numpy's default threads: all of them).
Other people's processes share the machine: each size is measured again (common.TRIES
times at most) while they used more than common.QUIET cores, and the quietest is kept.
A ratio far from 1 against the plain loop would mean our timing adds or hides cost;
against numpy it shows the BLAS gap (this machine's OPENBLAS_CORETYPE pins numpy's
OpenBLAS to the AVX2 kernel, TensorFlow's oneDNN uses AVX-512).
"""
import os
import statistics
import sys
import time

import common

sys.path.insert(0, common.ROOT)      # the `kernels` package, not this file (bench/kernels.py)
import numpy as np                   # noqa: E402

from kernels import gemm             # noqa: E402

SIZES, REPEATS, SAMPLE = (256, 512, 1024, 2048), 5, 0.05
PAUSE = 0.5   # TensorFlow's and OpenBLAS's idle threads spin after a call: let them stop first


def median_seconds(call, sync=lambda out: out) -> float:
    """Warm-up, then REPEATS samples of enough back-to-back calls to last SAMPLE seconds."""
    time.sleep(PAUSE)
    sync(call())
    start = time.perf_counter()
    sync(call())
    chain = max(1, round(SAMPLE / (time.perf_counter() - start)))
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(chain):
            out = call()
        sync(out)
        samples.append((time.perf_counter() - start) / chain)
    return statistics.median(samples)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")   # minus idle, iowait


def one_size(n: int) -> tuple[list, float]:
    """(table row, cores other processes kept busy meanwhile)."""
    import tensorflow as tf
    common.wait_quiet(patience=30)
    wall, busy, ours_cpu = time.perf_counter(), machine_busy(), sum(os.times()[:2])
    time.sleep(PAUSE)
    ours = gemm.run(n, "fp32", REPEATS)["flops"] / 1e9
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    numpy = gemm.flop(n) / median_seconds(lambda: a @ b) / 1e9
    ta, tb = tf.constant(a), tf.constant(b)
    plain = gemm.flop(n) / median_seconds(lambda: tf.matmul(ta, tb), lambda c: c.numpy()) / 1e9
    other = max(0.0, (machine_busy() - busy) - (sum(os.times()[:2]) - ours_cpu)) / (time.perf_counter() - wall)
    return [n, f"{ours:.1f}", f"{numpy:.1f}", f"{plain:.1f}", f"{ours / numpy:.2f}", f"{ours / plain:.2f}",
            f"{other:.2f}"], other


def main() -> None:
    print(f"machine: {common.machine()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    rows = []
    for n in SIZES:
        rows.append(common.quietest(lambda: one_size(n))[0])
        print(f"n={n} done", file=sys.stderr, flush=True)
    print("\nGEMM fp32, Gflop/s (FLOPs = 2 n^3), median of 5 samples; other load = cores used by "
          "other processes meanwhile")
    print(common.table(["n", "ours", "numpy", "tf.matmul loop", "ours/numpy", "ours/tf loop", "other load"], rows))


if __name__ == "__main__":
    main()
