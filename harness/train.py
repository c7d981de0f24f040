"""Base-model training, the part every framework shares: the Table 2 choices of a test
(`Recipe`, the T/V tables), threads per rank, the LR schedule (`lr_at`: linear warm-up,
cosine decay, the linear scaling rule `lr_scale`; `Schedule`), the steps of an epoch, the
recipe of one base model's training (`run`: the schedule, the feed's seeds, the undone
warm-up, the start barrier, the timed epochs, the replica check, the result) and its timed
epochs (`epochs_loop`: hooks, heartbeats, evaluations outside the clock). A framework
gives `run` a `Trainer`: its step, feed, warm-up and Horovod or torch.distributed edges,
its package's (harness/frameworks/<name>/train.py). The math is pure; `run` drives the
framework's object and the clock; no framework imported.
"""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from harness import sampler



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


# The Table 2 choices: name -> (T/V code, meaning). harness/dat.py reads the input file's
# keywords and the T/V code from these tables; what a choice means in a framework, and
# which it refuses, are the framework's (its facts: conventions lines, REFUSES).
PRECISIONS = {"fp32": ("32", "FP32 throughout"), "fp16": ("16", "FP16 compute, FP32 master weights"),
              "bf16": ("BF", "BF16 compute, FP32 master weights")}
COMMUNICATION = {"fp32": ("C32", "gradients exchanged in FP32"), "fp16": ("C16", "gradients cast to FP16 for the exchange"),
                 "int8": ("C8", "gradients quantised to int8 (a job-wide scale a tensor), all-gathered, summed in"
                                " FP32: harness/communication.py")}
ALLREDUCE = {"ring": ("R", "the framework's own all-reduce (a ring for GPU tensors, else the library's pick)"),
             "hierarchical": ("H", "within a node first, then across nodes"),
             "adasum": ("A", "adaptive summation instead of averaging; P a power of 2"),
             "torus": ("T", "the 2D-torus all-reduce over the job's grid: harness/communication.py")}
COMPILERS = {"none": ("", "the framework's default execution, no compiler"),
             "xla": ("X", "XLA: forward and backward pass compiled; exchange and update outside"),
             "inductor": ("I", "TorchInductor: forward and backward pass compiled; loss and update outside")}
OPTIMIZERS = {"sgd": ("S", "SGD with momentum"), "adam": ("A", "Adam"), "adagrad": ("G", "AdaGrad"),
              "lars": ("L", "LARS, harness/optimizers.py's rule"),
              "lamb": ("M", "LAMB, harness/optimizers.py's rule")}


@dataclass(frozen=True)
class Recipe:
    """How a base model is trained: the Table 2 choices of one test."""
    batch: int                  # per rank
    epochs: int
    base_lr: float              # per rank; the job uses base_lr x lr_scale (P: the linear scaling rule)
    warmup_epochs: float
    optimizer: str = "sgd"
    precision: str = "fp32"     # fp16/bf16: mixed precision, FP32 master weights
    comm_precision: str = "fp32"  # fp16: gradients cast to FP16 for the all-reduce
    compiler: str = "none"      # line 33: xla or inductor: the forward and backward pass compiled
    allreduce: str = "ring"     # line 22: adasum reduces by adaptive summation instead of averaging; torus
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


# Steps run before the clock and undone (run, each framework's Trainer.warm_up): enough for graph
# optimisation, compilation and the first negotiation of the exchange, which all happen at
# the first call.
WARMUP_STEPS = 1


@dataclass
class TrainResult:
    seconds: float            # this rank's wall time, barrier to end of the last epoch, evaluations excluded
    steps_per_epoch: int
    samples: int              # samples this job processed (all its ranks, all epochs; a Start's not counted)
    final_loss: float         # last epoch's mean loss on this rank
    weights_diff: float       # max |w - w_root| over this rank's trainable weights
    weights_digest: str       # hash of this rank's trainable weights
    clock: tuple[float, float]  # time.perf_counter() at the start and the end of training (evaluations inside;
    #                             the warm-up before it)
    epochs: int = 0           # the epoch training ended after (fewer than the recipe's when the target stopped
    #                             it; a Start's epochs included)
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
                eval_every: int, mean_of=None, first: int = 0) -> Loop:
    """The timed epochs, every framework's: `steps` calls step(x, y) -> loss (a scalar
    tensor that float() reads) each from `feed`, hooks and heartbeats around them,
    `evaluate` (if any) after each due epoch with the clock stopped; it ends the loop by
    returning True (the target reached). `mean_of(losses)`: an epoch's mean loss from its
    steps' returns (default: the mean of their floats; a pipeline's stages but the last
    return None, and learn the mean from the last). `first`: the epochs a checkpoint had
    trained already (Start): the loop trains the rest, numbered on, and `feed` holds theirs."""
    mean_of = mean_of or (lambda losses: float(np.mean([float(l) for l in losses])))
    start = time.perf_counter()
    if hooks:
        hooks.run_start()
    due = set(evaluation_epochs(epochs, eval_every)) if evaluate else set()
    paused, trained, mean_loss = 0.0, epochs, float("nan")     # paused: s spent evaluating, outside the clock
    for epoch in range(first, epochs):
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


@dataclass(frozen=True)
class Schedule:
    """One base model's LR schedule (lr_at): warm-up to `peak`, cosine decay to 0 at `total`."""
    peak: float     # LR at the end of the warm-up: the base LR x lr_scale
    warmup: int     # steps of linear warm-up
    total: int      # steps of training, all epochs

    def at(self, step: int) -> float:
        return lr_at(step, self.total, self.warmup, self.peak)


class Trainer(Protocol):
    """A framework's side of one base model's training on this rank, which `run` drives:
    what only the framework knows (its step, its feed, how to undo a step, its
    collectives), never the recipe."""
    size: int           # the job's ranks
    share: int          # this rank's share of each step's batches (data parallelism: its rank in the job)
    shares: int         # the shares of a step (P; a split model: its replicas)
    step_batch: int     # samples of a share a step (B; a split model: B x S, the pipeline's batch)
    lr_factor: float    # the base LR's factor (lr_scale: P by the linear scaling rule)
    mean_of: object     # an epoch's mean loss from its steps' returns (epochs_loop), or None: their mean

    def prepare(self, schedule: Schedule) -> tuple:
        """(step(x, y) -> loss, the optimizer's settings under Keras' names for the MLLOG),
        the step updating at schedule.at(its step number)."""

    def warm_up(self, rows: np.ndarray, steps: int, feed_seed: int) -> None:
        """`steps` real steps on the batches of `rows`, every state they write put back."""

    def feed(self, shards, epochs: int, steps: int, feed_seed: int):
        """One iterator of (x, y) batches for every epoch, epoch e's rows `shards(e)`."""

    def sync(self) -> None:
        """Collective in the job: the root's non-trainable state (batch-norm statistics) on
        every rank, and a split model's stages assembled, so every rank predicts with the root's model."""

    def consistency(self) -> tuple:
        """(the replica check's largest difference, this rank's weights' digest): replica_check."""

    def stage(self) -> dict | None:
        """TrainResult.stage: a split model's record of this rank, else None."""

    def state(self) -> bytes | None:
        """COLLECTIVE over the job: the base model's whole training state as bytes on the
        job's root (a checkpoint's: harness/checkpoint.py), None on its other ranks: the
        weights, the optimizer's slots, the loss scale, the step number, the random streams;
        restore() of them on every rank goes on exactly where training was. In data
        parallelism every rank's state is the root's (a checkpoint follows an evaluation,
        whose sync put the root's batch-norm statistics on every rank); a split model's
        stages each hold their own, which the root gathers. A state that cannot be taken
        raises NotImplementedError, on every rank alike."""

    def restore(self, state: bytes) -> None:
        """state()'s bytes back in place (after the undone warm-up)."""


@dataclass(frozen=True)
class Start:
    """Where one base model's training goes on from a checkpoint (harness/checkpoint.py)."""
    epochs: int      # the epochs it had trained
    state: bytes     # its Trainer.state() then


def run(trainer: Trainer, indices: np.ndarray, recipe: Recipe, *, seed: int, job: int, world_barrier,
        hooks=None, on_step=None, evaluate=None, eval_every: int = 0, warmup_steps: int = WARMUP_STEPS,
        start: Start | None = None, checkpoint=None) -> TrainResult:
    """Train one base model, every framework's recipe, on the job's resample `indices`.
    `hooks` (optional) gets recipe(name, optimizer settings, peak_lr, warmup_steps,
    total_steps) once the step is built, then run_start(), epoch_start(epoch) and
    epoch_stop(epoch, epochs, loss, elapsed), epochs counted from 1; `on_step(step)`
    (optional) runs before every step (watchdog heartbeat, fault injection).
    `evaluate(epoch) -> stop` (optional) runs after each of evaluation_epochs(epochs,
    eval_every), on every rank of the job, the root's statistics synced first, with the
    training clock stopped; True ends training there (the target reached).
    `start` (optional): go on from a checkpoint, its epochs not trained again (each epoch's
    rows and augmentation depend on the epoch alone: sampler.epoch_shard, each_epoch's seed +
    e); TrainResult's samples are then this training's alone. `checkpoint(epoch, state)`
    (optional) runs after each evaluation that does not stop training, on every rank of the
    job, with trainer.state (a function every rank of the job calls: COLLECTIVE for a split
    model)."""
    steps = steps_per_epoch(len(indices), trainer.shares, trainer.step_batch, job)   # P x B samples a step in every mode
    schedule = Schedule(recipe.base_lr * trainer.lr_factor, int(round(recipe.warmup_epochs * steps)),
                        steps * recipe.epochs)
    step, config = trainer.prepare(schedule)
    if hooks:   # the recipe as built, for the MLLOG (before run_start, as MLPerf logs it)
        hooks.recipe(recipe.optimizer, config, schedule.peak, schedule.warmup, schedule.total)
    done = start.epochs if start else 0
    shards = lambda e: sampler.epoch_shard(indices, seed, job, done + e, trainer.share,  # noqa: E731
                                           trainer.shares, trainer.step_batch)
    feed_seed = seed * 1_000_003 + job * 1009   # the job's augmentation: the warm-up's is epoch 1's
    if warmup_steps:   # on the first batches of its first epoch, read again by the timed epoch
        trainer.warm_up(shards(0)[:warmup_steps * trainer.step_batch], warmup_steps, feed_seed + done)
    if start:   # after the undone warm-up, which put back the state it found
        trainer.restore(start.state)
    # One feed for every epoch, made before the clock: epoch e's shard is drawn when the
    # feed reaches it; reading, decoding and augmenting are the workload's, inside the
    # clock (MLPerf).
    feed = trainer.feed(shards, recipe.epochs - done, steps, feed_seed + done)
    world_barrier()   # every job starts the clock together: FLOPS divides by the slowest

    def evaluation(epoch: int) -> bool:   # every rank predicts with the whole model, the root's statistics
        trainer.sync()
        stop = evaluate(epoch)
        if checkpoint and not stop and epoch < recipe.epochs:   # the state training goes on from
            checkpoint(epoch, trainer.state)
        return stop
    loop = epochs_loop(step, feed, steps, recipe.epochs, job, hooks, on_step, evaluate and evaluation, eval_every,
                       trainer.mean_of, done)
    del feed   # tearing a pipeline down can take seconds (ic's tf.data): after the clock
    diff, digest = trainer.consistency()
    if evaluate is None:   # else the last evaluation has synced it: the model is the root's already
        trainer.sync()
    return TrainResult(loop.seconds, steps, steps * (loop.trained - done) * recipe.batch * trainer.size,
                       loop.mean_loss, diff, digest, loop.clock, loop.trained, trainer.stage())


def replica_check(mine: np.ndarray, root: np.ndarray) -> tuple[float, str]:
    """Replica consistency, this benchmark's residual check, every framework's: (the
    largest difference between this rank's trainable weights `mine` and the job root's
    `root`, both flat float64, a digest of `mine`). Pure."""
    return float(np.max(np.abs(mine - root))) if mine.size else 0.0, weights_digest(mine)


def weights_digest(flat: np.ndarray) -> str:
    """A rank's trained weights (flat float64) in 16 hex digits: equal weights, equal digests."""
    import hashlib
    return hashlib.sha256(flat.tobytes()).hexdigest()[:16]
