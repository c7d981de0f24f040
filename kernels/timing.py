"""The timing discipline every roofline kernel shares.

One warm-up call is excluded: tracing, cuBLAS/cuDNN autotuning, XLA compilation and
first-touch allocation happen there, once per run, not once per call. A second untimed
call sizes the chain (below). Then `repeats` timed samples; the median is reported
because one sample slowed by the OS, a daemon or another rank must not move the figure.

TensorFlow launches GPU kernels asynchronously: an op returns when its kernel is
queued, not when it is done, so the clock may be read only after a sync. Each sample
chains several calls and syncs once after the last, so that the sync (a few tens of
microseconds: a tiny slice kernel, a 4-byte copy to the host, the host waking up) stays
negligible against the kernels it covers, whatever the size.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

TARGET_SAMPLE = 0.05   # seconds of kernels per timed sample: sync and dispatch cost <1 %
MAX_CHAIN = 1000


@dataclass
class Timing:
    seconds: float        # median seconds per call
    samples: list         # seconds per call of each timed sample
    chain: int            # calls per timed sample


def sync(tensor) -> None:
    """Wait until `tensor` has been computed. Copying one element of it to the host cannot
    complete before the kernel that writes it, and the kernels of one device stream run in
    launch order, so this also waits for every call chained before it. One element, not
    `tensor.numpy()`: copying a 256 MiB result would be timed as if it were the kernel."""
    import tensorflow as tf
    tf.reshape(tensor, [-1])[0].numpy()


def measure(call, repeats: int, sync=sync) -> Timing:
    """Time `call()` (launches one kernel call, returns a tensor that depends on it);
    `sync(tensor)` waits for it (TensorFlow's above; a framework passes its own)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sync(call())                                     # warm-up, excluded
    start = time.perf_counter()
    sync(call())                                     # sizes the chain, excluded
    once = time.perf_counter() - start
    chain = max(1, min(MAX_CHAIN, math.ceil(TARGET_SAMPLE / max(once, 1e-9))))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(chain):
            out = call()
        sync(out)
        samples.append((time.perf_counter() - start) / chain)
    return Timing(statistics.median(samples), samples, chain)
