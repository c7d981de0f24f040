"""Line 21's int8 exchange and line 22's 2D torus in TensorFlow with Horovod's collectives:
the scheme and the grid are harness/communication.py's (framework-free); here the ops.

`maximum`, `scales`, `quantise` and `dequantised_mean` are the int8 arithmetic (TensorFlow
ops, no communication); `int8_average` adds Horovod's two collectives around them.
`Torus.of` registers a job's row and column process sets; `torus_average` runs the
reduce-scatter, all-reduce and all-gather on them. MPI at the edge: the Horovod module is
passed in.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.communication import LEVELS, Grid


def maximum(g):
    """max |g| of one rank's tensor, +inf if any element is not finite: MPI's Max may drop
    a NaN (NaN > x is false), but it keeps an inf, which dequantised_mean turns into NaN
    for every rank."""
    import tensorflow as tf
    return tf.where(tf.reduce_all(tf.math.is_finite(g)), tf.reduce_max(tf.abs(g)), float("inf"))


def scales(maxima):
    """Per-tensor scales from the job's per-tensor max |g|: max / 127, and 1 where a
    tensor is zero on every rank (any scale quantises zeros to zeros)."""
    import tensorflow as tf
    return tf.where(maxima > 0, maxima / LEVELS, tf.ones_like(maxima))


def quantise(g, scale):
    """round(g / scale) as int8, clipped to [-127, 127] (the clip only guards rounding:
    |g| <= the job's max, so |g / scale| <= 127); 0 where g / scale is not finite (an
    infinite scale: casting a NaN to int8 is undefined; the NaN comes back through
    dequantised_mean), as harness/communication.int8_quantised says."""
    import tensorflow as tf
    q = tf.round(tf.cast(g, tf.float32) / scale)
    return tf.cast(tf.where(tf.math.is_finite(q), tf.clip_by_value(q, -LEVELS, LEVELS), tf.zeros_like(q)), tf.int8)


def dequantised_mean(gathered, scale, ranks: int):
    """The average over the job's ranks of their int8 tensors (gathered along axis 0, one
    row a rank), summed in FP32 and scaled back. An infinite scale (some rank's gradient
    was not finite: `maximum`) quantised every element to 0, and 0 x inf makes every
    element NaN here, so that the loss-scale optimizer skips the step."""
    import tensorflow as tf
    return tf.reduce_sum(tf.cast(gathered, tf.float32), axis=0) * (scale / ranks)


def int8_average(grads, hvd):
    """The job's average of each gradient in `grads`, exchanged as int8 (module docstring)."""
    import tensorflow as tf
    flat = [tf.reshape(tf.cast(g, tf.float32), (1, -1)) for g in grads]
    maxima = hvd.allreduce(tf.stack([maximum(f) for f in flat]), op=hvd.Max)
    s = scales(maxima)
    gathered = hvd.grouped_allgather([quantise(f, s[i]) for i, f in enumerate(flat)])
    return [tf.cast(tf.reshape(dequantised_mean(q, s[i], hvd.size()), tf.shape(g)), g.dtype)
            for i, (q, g) in enumerate(zip(gathered, grads))]


@dataclass(frozen=True)
class Torus:
    """A rank's part in its job's grid: the Horovod process sets of its row and column.
    `sets` is what hvd.init(process_sets=...) must register, the same list on every
    rank of the job: every row and column of 2 or more ranks that is not the whole job
    (Horovod refuses a duplicate of its global set; a one-rank phase is skipped)."""
    grid: Grid
    row: object             # hvd.ProcessSet of this rank's row (the global set when one row is the job)
    column: object          # of its column
    sets: tuple             # every set to register, in the same order on every rank

    @staticmethod
    def of(g: Grid, rank: int, hvd) -> "Torus":
        """Before hvd.init (process sets are registered there): `rank` in the job."""
        P = g.X * g.Y
        made = {s: hvd.ProcessSet(list(s)) for s in g.rows + g.columns if 1 < len(s) < P}
        pick = lambda groups: made.get(next(s for s in groups if rank in s), hvd.global_process_set)  # noqa: E731
        return Torus(g, pick(g.rows), pick(g.columns), tuple(made.values()))


def torus_average(grads, hvd, torus: Torus, compression):
    """The job's average of `grads` by the 2D torus: the gradients flattened into one FP32
    buffer, zero-padded to a multiple of X; its average over the row by reduce-scatter
    (each rank of the row keeps 1/X of it), over the column by all-reduce (the rows are
    equal in size, so the mean of the row means is the job's mean), gathered back along
    the row; cut, split and reshaped. `compression` (line 21: Horovod's none or fp16)
    casts the buffer for all three phases."""
    import tensorflow as tf
    X, Y = torus.grid.X, torus.grid.Y
    sizes = [int(np.prod(g.shape)) for g in grads]
    flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), (-1,)) for g in grads], axis=0)
    buf, ctx = compression.compress(tf.pad(flat, [[0, -sum(sizes) % X]]))
    if X > 1:
        buf = hvd.reducescatter(buf, op=hvd.Average, process_set=torus.row)
    if Y > 1:
        buf = hvd.allreduce(buf, op=hvd.Average, process_set=torus.column)
    if X > 1:
        buf = hvd.allgather(buf, process_set=torus.row)
    parts = tf.split(tf.cast(compression.decompress(buf, ctx), tf.float32)[:sum(sizes)], sizes)
    return [tf.cast(tf.reshape(p, g.shape), g.dtype) for p, g in zip(parts, grads)]
