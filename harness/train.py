"""Base-model training, the part every framework shares: the Table 2 choices of a test
(`Recipe`, the T/V tables), threads per rank, the LR schedule (`lr_at`: linear warm-up,
cosine decay, the linear scaling rule `lr_scale`), the steps of an epoch, the timed epochs
(`epochs_loop`: hooks, heartbeats, evaluations outside the clock) and the replica check.
Each framework's training step and its Horovod or torch.distributed edges are its
package's (harness/frameworks/tensorflow/train.py, harness/frameworks/pytorch/train.py).
Pure, but for the clock in epochs_loop; no framework imported.
"""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass

import numpy as np



def threads(sharing: int) -> tuple[int, int]:
    """(intra-op, inter-op) threads of a rank: cores / ranks-sharing-them, so that ranks
    do not fight (`sharing`: the ranks on this rank's node, or on its machine where
    several nodes run on one: topology.Nodes.ranks_sharing_cores); every framework's
    setup_devices pins these."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    intra = max(1, min(cores, (os.cpu_count() or 1) // sharing))
    return intra, 1 if intra == 1 else 2


def lr_at(step: int, total_steps: int, warmup_steps: int, peak: float) -> float:
    """The LR of step `step` (from 0): linear warm-up to `peak` (base LR x P, the linear
    scaling rule) over `warmup_steps`, then cosine decay to zero at `total_steps`. Pure;
    learning_rate is the same schedule in TensorFlow's ops, for its graph."""
    if step < warmup_steps:
        return peak * (step + 1.0) / max(1, warmup_steps)
    frac = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(frac, 1.0)))


# The Table 2 choices this module implements: name -> (T/V code, meaning). harness/dat.py
# reads the input file's keywords and the T/V code from these tables.
PRECISIONS = {"fp32": ("32", "float32"), "fp16": ("16", "mixed_float16"), "bf16": ("BF", "mixed_bfloat16")}
COMMUNICATION = {"fp32": ("C32", "gradients all-reduced in FP32"), "fp16": ("C16", "Horovod Compression.fp16"),
                 "int8": ("C8", "gradients quantised to int8 (a job-wide scale a tensor), all-gathered, summed in"
                                " FP32: harness/communication.py")}
ALLREDUCE = {"ring": ("R", "Horovod's default all-reduce: NCCL's ring for GPU tensors in an NCCL build, else"
                           " MPI_Allreduce (the algorithm the MPI library picks)"),
             "hierarchical": ("H", "HOROVOD_HIERARCHICAL_ALLREDUCE=1 (NCCL inside a node)"),
             "adasum": ("A", "Horovod's Adasum (op=hvd.Adasum), adaptive summation; P a power of 2"),
             "torus": ("T", "2D-torus all-reduce over Horovod process sets: harness/communication.py")}
COMPILERS = {"none": ("", "TensorFlow graph (tf.function), no XLA"),
             "xla": ("X", "XLA: forward and backward pass jit_compiled; all-reduce and update outside"),
             "inductor": ("I", "torch.compile (TorchInductor), PyTorch's: forward and backward pass compiled,"
                               " DDP's all-reduce between its graphs; loss and update outside")}
OPTIMIZERS = {"sgd": ("S", "SGD with momentum"), "adam": ("A", "Keras Adam"), "adagrad": ("G", "Keras AdaGrad"),
              "lars": ("L", "LARS, harness/frameworks/*/optimizers.py"),
              "lamb": ("M", "LAMB, harness/frameworks/*/optimizers.py")}


@dataclass(frozen=True)
class Recipe:
    """How a base model is trained: the Table 2 choices of one test."""
    batch: int                  # per rank
    epochs: int
    base_lr: float              # per rank; the job uses base_lr x lr_scale (P: the linear scaling rule)
    warmup_epochs: float
    optimizer: str = "sgd"
    precision: str = "fp32"     # fp16/bf16: Keras mixed precision, FP32 master weights
    comm_precision: str = "fp32"  # fp16: gradients cast to FP16 for the all-reduce
    compiler: str = "none"      # line 33: xla (TensorFlow) or inductor (PyTorch): the forward and backward pass compiled
    allreduce: str = "ring"     # line 22: adasum reduces by Horovod's Adasum instead of averaging; torus
    #                             averages over the job's grid (harness/communication.py)
    mode: str = "data"          # line 37: the parallel mode inside the base model, as written (harness/parallelism.py)


def lr_scale(allreduce: str, size: int, local_size: int, nccl: bool) -> int:
    """The factor of the base LR (line 19) for a job of `size` ranks: the linear scaling
    rule, P; with Adasum, Horovod's convention (its docs and examples): 1 where Adasum
    reduces every rank (MPI, on the CPU), the ranks of a node with NCCL (which averages
    inside a node, Adasum across nodes)."""
    if allreduce != "adasum":
        return size
    return local_size if nccl else 1


# Steps run before the clock and undone (each framework's train): enough for graph
# optimisation, compilation and the first negotiation of the exchange, which all happen at
# the first call.
WARMUP_STEPS = 1
@dataclass
class TrainResult:
    seconds: float            # this rank's wall time, barrier to end of the last epoch, evaluations excluded
    steps_per_epoch: int
    samples: int              # samples this job processed (all its ranks, all epochs)
    final_loss: float         # last epoch's mean loss on this rank
    weights_diff: float       # max |w - w_root| over this rank's trainable weights
    weights_digest: str       # hash of this rank's trainable weights
    clock: tuple[float, float]  # time.perf_counter() at the start and the end of training (evaluations inside;
    #                             the warm-up before it)
    epochs: int = 0           # epochs trained (fewer than the recipe's when the target stopped it)
    stage: dict | None = None  # a split model (line 37): this rank's stage, replica, busy and step seconds (the
    #                             timed steps'); the job root's also the cut and the trainable weights


def evaluation_epochs(epochs: int, every: int) -> list[int]:
    """The epochs (from 1) after which the ensemble is evaluated: every `every` epochs
    (line 31; 0 = none along the way) and always after the last."""
    along = range(every, epochs, every) if every > 0 else ()
    return [*along, epochs]


def steps_per_epoch(samples: int, size: int, batch: int, job: int) -> int:
    """Whole global batches (P x B) in a resample of `samples`; ValueError if none."""
    steps = samples // (size * batch)
    if steps < 1:
        raise ValueError(f"job {job}: resample of {samples} samples is smaller than "
                         f"P x B = {size} x {batch}; lower B or P, or use more data")
    return steps


@dataclass(frozen=True)
class Loop:
    seconds: float               # training, evaluations excluded
    trained: int                 # epochs trained
    mean_loss: float             # over the last epoch's steps
    clock: tuple[float, float]   # time.perf_counter() at the start and the end


def epochs_loop(step, feed, steps: int, epochs: int, job: int, hooks, on_step, evaluate,
                eval_every: int, mean_of=None) -> Loop:
    """The timed epochs, every framework's: `steps` calls step(x, y) -> loss (a scalar
    tensor that float() reads) each from `feed`, hooks and heartbeats around them,
    `evaluate` (if any) after each due epoch with the clock stopped; it ends the loop by
    returning True (the target reached). `mean_of(losses)`: an epoch's mean loss from its
    steps' returns (default: the mean of their floats; a pipeline's stages but the last
    return None, and learn the mean from the last)."""
    mean_of = mean_of or (lambda losses: float(np.mean([float(l) for l in losses])))
    start = time.perf_counter()
    if hooks:
        hooks.run_start()
    due = set(evaluation_epochs(epochs, eval_every)) if evaluate else set()
    paused, trained, mean_loss = 0.0, epochs, float("nan")     # paused: s spent evaluating, outside the clock
    for epoch in range(epochs):
        if hooks:
            hooks.epoch_start(epoch + 1)
        losses = []
        for s, (x, y) in enumerate(itertools.islice(feed, steps)):
            if on_step is not None:
                on_step(epoch * steps + s)
            losses.append(step(x, y))
        if len(losses) != steps:  # a short epoch on one rank would hang the others' all-reduce
            raise RuntimeError(f"job {job}: the workload fed {len(losses)} batches in epoch {epoch + 1}, "
                               f"expected {steps}")
        mean_loss = mean_of(losses)  # also waits for the last step
        if hooks:
            hooks.epoch_stop(epoch + 1, epochs, mean_loss, time.perf_counter() - start - paused)
        if epoch + 1 in due:
            t0 = time.perf_counter()
            reached = evaluate(epoch + 1)
            paused += time.perf_counter() - t0
            if reached:
                trained = epoch + 1
                break
    stop = time.perf_counter()
    return Loop(stop - start - paused, trained, mean_loss, (start, stop))


def replica_check(mine: np.ndarray, root: np.ndarray) -> tuple[float, str]:
    """Replica consistency, this benchmark's residual check, every framework's: (the
    largest difference between this rank's trainable weights `mine` and the job root's
    `root`, both flat float64, a digest of `mine`). Pure."""
    return float(np.max(np.abs(mine - root))) if mine.size else 0.0, weights_digest(mine)


def weights_digest(flat: np.ndarray) -> str:
    """A rank's trained weights (flat float64) in 16 hex digits: equal weights, equal digests."""
    import hashlib
    return hashlib.sha256(flat.tobytes()).hexdigest()[:16]
