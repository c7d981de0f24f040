"""Memory-bandwidth roofline kernel: the STREAM triad a = b + s * c on large fp32 vectors.

Bytes moved per call = 3 x array bytes: b and c read, a written (STREAM's convention; the
read-for-ownership of `a` that a CPU without streaming stores also does is not counted).
Elements are fp32 whatever the run's precision: bandwidth is a property of the memory,
and fp16 arithmetic on a CPU would be emulated and time the ALUs instead.
Default: 256 MiB per array on a GPU (768 MiB in all; GPU L2 caches are 6-50 MiB), 64 MiB
on a CPU (192 MiB in all; twice a 32 MiB L3 per array): caches must not serve the data.
Raise --mib where a rank sees a larger last-level cache.

The triad is one XLA-fused kernel writing into a preallocated variable. Unfused,
TensorFlow writes s * c to a temporary first: 5 arrays of traffic, not 3 (one rank here:
eager `b + s * c` gives 21 GB/s by the 3-array count, the fused triad 31 GB/s). Where
XLA cannot compile (a GPU without ptxas, say) the unfused triad runs and `fused` is
False: its figure then understates the bandwidth by up to 5/3.

    mpirun -np N python -m kernels.stream --mib 64 --repeats 5
"""
from __future__ import annotations

import sys

from kernels import cli, device, timing

DEFAULT_MIB = {"GPU": 256, "CPU": 64}
QUICK_MIB = 8
ARRAYS = 3                     # b, c read; a written


def run(mib: int | None = None, repeats: int = 5) -> dict:
    """Time the triad on `mib` MiB per array; this rank's bandwidth in bytes/s."""
    import tensorflow as tf
    dev = device.current()
    mib = mib or DEFAULT_MIB[dev.kind]
    n = mib * 2 ** 20 // 4
    with tf.device(dev.tf_name):
        b = tf.random.uniform((n,))
        c = tf.random.uniform((n,))
        s = tf.constant(3.0)
        a = tf.Variable(tf.zeros((n,)))

        def make_triad(jit: bool):
            @tf.function(jit_compile=jit)
            def triad(b, c, s):
                a.assign(b + s * c)      # under XLA one loop: reads b and c, writes a
                return a[:1]             # depends on the write: timing.sync waits for it
            return triad

        triad, fused = make_triad(True), True
        try:
            timing.sync(triad(b, c, s))
        except tf.errors.OpError:
            triad, fused = make_triad(False), False
        t = timing.measure(lambda: triad(b, c, s), repeats)
    moved = ARRAYS * n * 4
    return {"array_bytes": n * 4, "bytes": moved, "dtype": "fp32", "fused": fused, "device": dev.name,
            "seconds": t.seconds, "bandwidth": moved / t.seconds, "repeats": repeats, "chain": t.chain,
            "samples": t.samples}


def main(argv=None) -> int:
    p = cli.parser("stream", "STREAM triad a = b + s*c (fp32): bytes = 3 x array size.", precision=False)
    p.add_argument("--mib", type=cli.positive, help="MiB per array (default 256 on GPU, 64 on CPU)")
    return cli.main(p, argv, lambda a: run(a.mib, a.repeats),
                    lambda a: f"STREAM triad fp32, bytes = 3 x array size, median of {a.repeats} timed samples",
                    lambda r: f"{r['array_bytes'] / 2 ** 20:.0f} MiB x 3", "GB/s", 1e9, "bandwidth")


if __name__ == "__main__":
    sys.exit(main())
