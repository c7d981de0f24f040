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

Each framework runs the scheme with its own ops (TensorFlow and Horovod:
harness/frameworks/tensorflow/communication.py; PyTorch: a DDP hook in
harness/frameworks/pytorch/communication.py). A gradient that is not finite on any rank
(fp16's loss scaling overflows on purpose) comes out NaN on every rank, as through the
FP32 exchange, so that the loss scaling skips the step.

2D torus (line 22, Mikami et al. 2018, which Table 2 cites): the job's ranks as an X x Y
grid (`grid`, the rule in its docstring); reduce-scatter along the rows, all-reduce along
the columns, all-gather along the rows, on Horovod process sets (`Torus`, registered at
hvd.init). A rank sends 2 (X - 1) / X x N along its row and 2 (Y - 1) / (X Y) x N along
its column, the ring's 2 (P - 1) / P x N in all, in 2 (X - 1) + 2 (Y - 1) steps instead
of the ring's 2 (P - 1): fewer latencies, and only 1 / X of the gradient on the
network when a row is a node. This module is the framework-free part, pure: the grid
(`grid`, `job_grid`), what carried a job's exchange and how it reads in the report; the
Horovod process sets and the collectives are TensorFlow's package's (`Torus`,
`torus_average`). `int8_quantised` and `int8_mean` are the int8 arithmetic in numpy: the
reference every framework's ops are held to (tests/test_conformance.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LEVELS = 127     # int8's symmetric range: -127..127 (-128 unused, so that -q is always representable)


# -- line 21 int8: the reference arithmetic (numpy, FP32 as the frameworks compute it) ------
def int8_quantised(per_rank: list) -> tuple[np.ndarray, np.float32]:
    """(each rank's int8 tensor, stacked one row a rank; the scale the job agreed on) for one
    gradient tensor given each rank's: scale = max over the ranks of max |g| / 127, +inf if
    any rank's tensor is not finite (MPI's Max may drop a NaN but keeps an inf), 1 if every
    rank's is zero (any scale quantises zeros); q = round(g / scale) half to even, clipped to
    [-127, 127], and 0 where g / scale is not finite (a NaN has no int8; the NaN comes back
    in int8_mean)."""
    g = [np.asarray(x, np.float32).ravel() for x in per_rank]
    peak = max(np.float32(np.abs(x).max(initial=0.0)) if np.isfinite(x).all() else np.float32(np.inf) for x in g)
    scale = np.float32(peak / np.float32(LEVELS)) if peak > 0 else np.float32(1.0)
    with np.errstate(invalid="ignore"):
        q = [np.round(x / scale) for x in g]
    return np.stack([np.where(np.isfinite(x), np.clip(x, -LEVELS, LEVELS), 0).astype(np.int8) for x in q]), scale


def int8_mean(per_rank: list) -> np.ndarray:
    """The job's int8-exchanged average of one gradient tensor (FP32, flat): the ranks' int8
    tensors summed in FP32, times scale / P; NaN everywhere for an infinite scale (0 x inf),
    as the FP32 exchange would give, so that the loss scaling skips the step."""
    q, scale = int8_quantised(per_rank)
    with np.errstate(invalid="ignore"):
        return q.astype(np.float32).sum(0) * np.float32(scale / np.float32(len(per_rank)))


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


# -- what carried a job's exchange, for the report and results.json ----------------------
# Line 21's int8 exchange in words, the same scheme in every framework (each framework's
# conventions lines quote it)
INT8 = ("each gradient quantised to int8 with one scale a tensor the job agrees on (max |g| over its ranks / 127),"
        " all-gathered and summed in FP32 on every rank, then averaged: within scale / 2 of the FP32 average; a rank"
        " receives (P - 1) x N bytes a step for N gradient elements, fewer than a ring all-reduce in fp32"
        " (8 (P - 1) / P x N) while P < 8 and in fp16 (4 (P - 1) / P x N) while P < 4")


def exchange(comm_precision: str, allreduce: str, ranks: int, grid: Grid | None, carrier: str, ring: str) -> str:
    """One job's gradient exchange in words: lines 21-22 as they ran, `ring` the framework's
    own word for line 22's ring (its facts' RING), `carrier` the library that carried it
    (its facts' carriers); the torus with its grid."""
    if ranks == 1:
        return "none (P = 1)"
    if comm_precision == "int8":
        return f"int8 all-gather, {carrier}"
    how = {"ring": ring, "hierarchical": "hierarchical all-reduce", "adasum": "Adasum",
           "torus": f"torus {grid.describe() if grid else ''}"}[allreduce]
    return f"{how}{', fp16' if comm_precision == 'fp16' else ''}, {carrier}"


def split_exchange(comm_precision: str, allreduce: str, stages: int, replicas: int, carrier: str) -> str:
    """A split model's exchanges in words (line 37): activations between its stages, and
    each stage's gradients over its replicas (none with one replica; a plain all-reduce
    once a step, harness/frameworks/pytorch/communication.average)."""
    grads = "none" if replicas == 1 else exchange(comm_precision, allreduce, replicas, None, carrier, "all-reduce")
    return f"activations point-to-point between {stages} stages, {carrier}; a stage's gradients: {grads}"
