"""A MindSpore job's gradient exchange over its MPI communicator (facts.py says why not
MindSpore's own communication): the gradients, on the host, flattened into one buffer, one
all-reduce a step, divided by P: the job's ranks average, as Horovod's CPU path does.
Line 21's fp16 casts the buffer to FP16 for the wire and sums it in FP16 there (an MPI
user operation: MPI has no standard FP16 type), as Horovod's Compression.fp16 does, back to
FP32 after.

MPI at the edges (`average`, `broadcast`); `flatten`, `unflatten` and `sum_fp16` are plain
numpy.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI


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
    gradients, numpy), exchanged in line 21's precision (fp32 or fp16)."""
    shapes = [np.shape(a) for a in arrays]
    flat = flatten(arrays)
    if comm.size > 1:
        if comm_precision == "fp16":
            if not _SUM_FP16:
                _SUM_FP16.append(MPI.Op.Create(sum_fp16, commute=True))
            wire = flat.astype(np.float16)
            comm.Allreduce(MPI.IN_PLACE, [wire.view(np.uint16), MPI.UINT16_T], op=_SUM_FP16[0])
            flat = wire.astype(np.float32)
        elif comm_precision == "fp32":
            comm.Allreduce(MPI.IN_PLACE, [flat, MPI.FLOAT], op=MPI.SUM)
        else:
            raise ValueError(f"communication precision {comm_precision!r} is not built in MindSpore (its REFUSES)")
        flat /= np.float32(comm.size)
    return unflatten(flat, shapes)


def broadcast(arrays, comm) -> list[np.ndarray]:
    """COLLECTIVE over `comm`: the root's `arrays` on every rank (FP32)."""
    shapes = [np.shape(a) for a in arrays]
    flat = flatten(arrays)
    comm.Bcast([flat, MPI.FLOAT], root=0)
    return unflatten(flat, shapes)
