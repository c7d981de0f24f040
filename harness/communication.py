"""Communication precision int8 (line 21): a job's gradients exchanged as 8-bit integers.

Table 2 of HPC AI500 V3.0 lists Int8 among the communication precisions. Gradients are
quantised symmetrically, per tensor, with a scale every rank of the job agrees on before
quantising: s = max over the job's ranks of max |g| / 127 (one small all-reduce of the
per-tensor maxima, op Max). Each rank sends q = round(g / s), clipped to [-127, 127], as
int8; int8 cannot be summed on the wire without overflow (two ranks' 127 + 127 already
leave the range), so the job all-gathers the int8 tensors (Horovod's grouped_allgather)
and every rank sums the P of them in FP32 and divides by P: the job's ranks still
AVERAGE their gradients, each element within s / 2 of the FP32 average (each rank's
rounding error is at most s / 2, and the average of P of them too).

Bytes a rank receives per step for N gradient elements: int8 all-gather (P - 1) x N (and
4 bytes a tensor for the scales), against a ring all-reduce's 2 (P - 1) / P x N x 4 for
fp32 and x 2 for fp16: int8 moves fewer bytes than fp32 while P < 8 and than fp16 while
P < 4 (P = 2: N, against 4 N and 2 N), more beyond. The report says so.

`maximum`, `scales`, `quantise` and `dequantised_mean` are the arithmetic (TensorFlow ops,
no communication); `int8_average` adds Horovod's two collectives around them. A gradient
that is not finite on any rank (fp16's loss scaling overflows on purpose) comes out NaN
on every rank, as through the FP32 exchange, so that the loss-scale optimizer skips the
step.
"""
from __future__ import annotations

LEVELS = 127     # int8's symmetric range: -127..127 (-128 unused, so that -q is always representable)


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
    |g| <= the job's max, so |g / scale| <= 127)."""
    import tensorflow as tf
    return tf.cast(tf.clip_by_value(tf.round(tf.cast(g, tf.float32) / scale), -LEVELS, LEVELS), tf.int8)


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
