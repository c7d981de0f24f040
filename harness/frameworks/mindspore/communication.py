"""A MindSpore job's gradient exchange over its MPI communicator (facts.py says why not
MindSpore's own communication): the gradients, on the host, flattened into one buffer, one
all-reduce a step, divided by P: the job's ranks average, as Horovod's CPU path does.
Line 21's fp16 casts the buffer to FP16 for the wire and sums it in FP16 there (an MPI
user operation: MPI has no standard FP16 type), as Horovod's Compression.fp16 does, back to
FP32 after. Line 21's int8 is harness/communication.py's scheme (its docstring has the
reasoning and the bytes): a scale a tensor the job agrees on (one Max all-reduce of the
per-tensor maxima), each rank's tensors rounded to int8, all-gathered, summed in FP32 and
divided by P; a non-finite gradient on any rank makes its tensor NaN on every rank.

MPI at the edges (`average`, `int8_average`, `broadcast`); `flatten`, `unflatten`,
`sum_fp16` and the int8 arithmetic (`maxima`, `scales`, `quantise`, `dequantised_mean`:
the TensorFlow and PyTorch functions' twins, held to the numpy reference by
tests/test_conformance.py) are plain numpy.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from harness.communication import LEVELS


def flatten(arrays) -> np.ndarray:
    """The arrays' elements in order, one FP32 buffer (an empty buffer for none)."""
    return np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays]) if arrays else np.zeros(0, np.float32)


def unflatten(flat: np.ndarray, shapes) -> list[np.ndarray]:
    """`flat` cut back into arrays of `shapes`, in order (flatten's inverse)."""
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    if at != flat.size:
        raise ValueError(f"unflatten: {flat.size} elements for shapes of {at}")
    return out


def sum_fp16(inbuf, outbuf, datatype) -> None:
    """MPI user operation: outbuf += inbuf, both FP16 (sent as 16-bit words)."""
    into = np.frombuffer(outbuf, np.float16)
    into += np.frombuffer(inbuf, np.float16)


_SUM_FP16 = []   # the operation, created once a process (MPI must be initialised first)


def average(arrays, comm_precision: str, comm) -> list[np.ndarray]:
    """COLLECTIVE over the job's `comm`: the job's average of each of `arrays` (this rank's
    gradients, numpy), exchanged in line 21's precision (fp32, fp16 or int8); a job of one
    rank exchanges nothing."""
    shapes = [np.shape(a) for a in arrays]
    if comm.size == 1:
        return unflatten(flatten(arrays), shapes)
    if comm_precision == "int8":
        return unflatten(int8_average(arrays, comm), shapes)
    flat = flatten(arrays)
    if comm_precision == "fp16":
        if not _SUM_FP16:
            _SUM_FP16.append(MPI.Op.Create(sum_fp16, commute=True))
        wire = flat.astype(np.float16)
        comm.Allreduce(MPI.IN_PLACE, [wire.view(np.uint16), MPI.UINT16_T], op=_SUM_FP16[0])
        flat = wire.astype(np.float32)
    elif comm_precision == "fp32":
        comm.Allreduce(MPI.IN_PLACE, [flat, MPI.FLOAT], op=MPI.SUM)
    else:
        raise ValueError(f"communication precision {comm_precision!r}: expected fp32, fp16 or int8")
    flat /= np.float32(comm.size)
    return unflatten(flat, shapes)


def maxima(arrays) -> np.ndarray:
    """max |g| of each array (FP32), +inf where one is not finite (a Max keeps an inf)."""
    return np.array([np.abs(a).max(initial=0.0) if np.isfinite(a).all() else np.inf for a in arrays], np.float32)


def scales(peaks: np.ndarray) -> np.ndarray:
    """max / 127, and 1 where a tensor is zero on every rank (any scale quantises zeros)."""
    return np.where(peaks > 0, peaks / np.float32(LEVELS), np.float32(1.0)).astype(np.float32)


def quantise(g: np.ndarray, scale: np.float32) -> np.ndarray:
    """round(g / scale) half to even as int8, clipped to [-127, 127]; 0 where g / scale is
    not finite (an infinite scale: the NaN comes back through dequantised_mean)."""
    with np.errstate(invalid="ignore"):
        q = np.round(np.asarray(g, np.float32) / scale)
    return np.where(np.isfinite(q), np.clip(q, -LEVELS, LEVELS), 0).astype(np.int8)


def dequantised_mean(rows: np.ndarray, scale: np.float32) -> np.ndarray:
    """The average of the ranks' int8 rows (ranks, n), summed in FP32 and scaled back;
    0 x inf = NaN everywhere for an infinite scale."""
    with np.errstate(invalid="ignore"):
        return rows.astype(np.float32).sum(0) * np.float32(scale / np.float32(len(rows)))


def int8_average(arrays, comm) -> np.ndarray:
    """COLLECTIVE over the job's `comm`: its int8-exchanged average of `arrays`, flattened
    and concatenated in their order (FP32)."""
    peaks = maxima(arrays)
    comm.Allreduce(MPI.IN_PLACE, [peaks, MPI.FLOAT], op=MPI.MAX)
    s = scales(peaks)
    mine = np.concatenate([quantise(a, s[i]).ravel() for i, a in enumerate(arrays)])
    rows = np.empty((comm.size, mine.size), np.int8)
    comm.Allgather([mine, MPI.INT8_T], [rows, MPI.INT8_T])
    means, at = [], 0
    for i, a in enumerate(arrays):
        n = np.size(a)
        means.append(dequantised_mean(rows[:, at:at + n], s[i]))
        at += n
    return np.concatenate(means) if means else np.zeros(0, np.float32)


def broadcast(arrays, comm) -> list[np.ndarray]:
    """COLLECTIVE over `comm`: the root's `arrays` on every rank (FP32)."""
    shapes = [np.shape(a) for a in arrays]
    flat = flatten(arrays)
    comm.Bcast([flat, MPI.FLOAT], root=0)
    return unflatten(flat, shapes)
