"""How a job's ranks exchange their gradients where Horovod's own all-reduce is not the
answer: line 21's int8 communication and line 22's 2D-torus all-reduce.

Int8 (line 21): a job's gradients exchanged as 8-bit integers.

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

2D torus (line 22, Mikami et al. 2018, which Table 2 cites): the job's ranks as an X x Y
grid (`grid`, the rule in its docstring); reduce-scatter along the rows, all-reduce along
the columns, all-gather along the rows, on Horovod process sets (`Torus`, registered at
hvd.init). A rank sends 2 (X - 1) / X x N along its row and 2 (Y - 1) / (X Y) x N along
its column, the ring's 2 (P - 1) / P x N in all, in 2 (X - 1) + 2 (Y - 1) steps instead
of the ring's 2 (P - 1): fewer latencies, and only 1 / X of the gradient on the
network when a row is a node. `grid` is pure; `Torus.of` and `torus_average` take the
Horovod module (MPI at the edge).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


# -- line 22 torus: the 2D-torus all-reduce (Mikami et al., Table 2's reference) -----------
@dataclass(frozen=True)
class Grid:
    """A job's ranks (0..P-1, the job's own numbering) as an X x Y grid: Y rows of X ranks,
    each row ascending, as Horovod orders a process set's ranks."""
    rows: tuple[tuple[int, ...], ...]
    rule: str       # "nodes": a row is a node's ranks; "square": the most-square X x Y over consecutive ranks

    @property
    def X(self) -> int:         # ranks a row
        return len(self.rows[0])

    @property
    def Y(self) -> int:         # rows (ranks a column)
        return len(self.rows)

    @property
    def columns(self) -> tuple[tuple[int, ...], ...]:
        """Column c: the c-th rank of every row, which holds the same chunk after the
        row's reduce-scatter."""
        return tuple(zip(*self.rows))

    def describe(self) -> str:
        return f"{self.X} x {self.Y} ({RULES[self.rule]})"


RULES = {"nodes": "rows: a node's ranks", "square": "rows: consecutive ranks, the most-square X x Y"}


def grid(nodes) -> Grid:
    """The torus of a job whose rank i runs on node `nodes[i]`. Rows follow the nodes where
    they can: when the job spans 2 or more nodes with the same number (2 or more) of its
    ranks on each, a row is a node's ranks (X = ranks a node, Y = nodes), so that the
    reduce-scatter and the all-gather, which move the whole gradient, stay on a node's
    links and only 1/X of it crosses the network. Otherwise (one node, uneven nodes, one
    rank a node) the most-square factorisation P = X x Y, X >= Y the smallest such X,
    over consecutive ranks (mpirun places consecutive ranks together): a prime P is one
    row, reduce-scatter then all-gather, the ring all-reduce's own two halves."""
    by_node: dict = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    counts = {len(ranks) for ranks in by_node.values()}
    if len(by_node) > 1 and len(counts) == 1 and counts != {1}:
        return Grid(tuple(tuple(ranks) for ranks in by_node.values()), "nodes")
    P = len(nodes)
    X = min(d for d in range(1, P + 1) if P % d == 0 and d * d >= P)
    return Grid(tuple(tuple(range(r, r + X)) for r in range(0, P, X)), "square")


def job_grid(ranks, node_of_rank) -> Grid:
    """The torus of the job of world ranks `ranks` (its root first), from the node index of
    each world rank: what the run registers, --check prints and --verify re-derives."""
    return grid([node_of_rank[r] for r in ranks])


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


# -- what carried a job's exchange, for the report and results.json ----------------------
def library(allreduce: str, gpu: bool, nccl: bool, mpi: bool) -> str:
    """The library that carried a job's gradients, as Horovod reports its build: NCCL where
    the tensors live on a GPU and Horovod has NCCL (built with HOROVOD_GPU_OPERATIONS=NCCL:
    `make venv GPU=1`), NCCL within a node and MPI across for hierarchical and Adasum;
    otherwise Horovod's CPU path, MPI (Gloo where Horovod runs without MPI), and
    hierarchical is then Horovod's flat all-reduce."""
    cpu = "MPI" if mpi else "Gloo"
    if gpu and nccl:
        return f"NCCL within a node, {cpu} across" if allreduce in ("hierarchical", "adasum") else "NCCL"
    return f"{cpu} (flat: hierarchical needs NCCL)" if allreduce == "hierarchical" else cpu


def carriers(framework: str, allreduce: str) -> set[str]:
    """Every library that can carry a job's gradients in `framework`: Horovod's as its
    build may report (`library`), torch.distributed's backends (Gloo on CPUs, NCCL on GPUs)."""
    if framework == "pytorch":
        return {"Gloo", "NCCL"}
    return {library(allreduce, gpu, nccl, mpi) for gpu in (False, True) for nccl in (False, True)
            for mpi in (False, True)}


def exchange(comm_precision: str, allreduce: str, ranks: int, grid: Grid | None, carrier: str,
             framework: str = "tensorflow") -> str:
    """One job's gradient exchange in words: lines 21-22 as they ran in `framework` and
    `carrier` (`library`, or torch.distributed's backend); the torus with its grid."""
    if ranks == 1:
        return "none (P = 1)"
    if comm_precision == "int8":
        return f"int8 all-gather, {carrier}"
    ring = "DDP all-reduce" if framework == "pytorch" else "Horovod all-reduce"
    how = {"ring": ring, "hierarchical": "hierarchical all-reduce", "adasum": "Adasum",
           "torus": f"torus {grid.describe() if grid else ''}"}[allreduce]
    return f"{how}{', fp16' if comm_precision == 'fp16' else ''}, {carrier}"
