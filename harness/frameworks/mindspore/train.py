"""Base-model training in MindSpore: each step's forward and backward pass one
mindspore.jit graph, the job's gradients averaged over its MPI communicator
(communication.average, on the host), then mindspore.nn's optimizer.

The recipe is harness/train.run's, every framework's (the LR schedule, the step count,
the undone warm-up, the timed epochs, the replica check), with MindSpore's parts: the
model from the workload's MindSpore module (models.get), its initial weights the job
root's (an MPI broadcast, as DDP and Horovod start a job), the batches the workload's own
numpy feed turned into tensors inside the clock.
MPI at the edges (the job's broadcasts and all-reduces over its communicator).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import mindspore as ms
from mindspore import log as ms_log
from mindspore import nn, ops

from harness import checkpoint, train, workloads
from harness.frameworks.mindspore import communication, kernels, models, optimizers


def setup_devices(local_rank: int, sharing: int) -> dict:
    """Pin this rank to train.threads(sharing) CPU threads (MindSpore's CPU kernels' pool and
    its dispatch threads: set before its first operator). The PyPI wheel is MindSpore's CPU
    build: a rank computes on the CPU on every node, GPUs or not."""
    intra, inter_op = train.threads(sharing)
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)   # eager between the steps; each step one mindspore.jit graph
    ms.device_context.cpu.op_tuning.threads_num(intra)
    ms.runtime.dispatch_threads_num(inter_op)
    kernels.PINNED["threads"] = intra
    return {"threads": intra, "inter_op": inter_op, "device": "CPU", "gpus_on_node": 0, "gpu": None, "nccl": False}


def build(workload, data, seed: int, job: int, precision: str) -> nn.Cell:
    """The job's model, initialised from (seed, job) as the other frameworks' are; the
    Step then makes the job's ranks equal by broadcasting the root's weights. Line 17's
    fp16: mindspore.amp's O2, Keras' mixed_float16 (every cell computes in FP16 but batch
    norm and the cells that say FP32, as Keras' float32 layers, the weights FP32 and cast at
    use, the output cast back to FP32)."""
    ms.set_seed((seed * 1_000_003 + job) % 2**31)
    model = models.get(workload.NAME).build_model(data)
    if precision != "fp16":
        return model
    model = ms.amp.auto_mixed_precision(model, amp_level="O2", dtype=ms.float16)
    for _, cell in model.cells_and_names():   # a cell that says it computes in FP32 (ewa's heads and ROI crop)
        if getattr(cell, "FP32", False):
            cell.to_float(ms.float32)
    return model


def make_optimizer(name: str, model: nn.Cell, lr, momentum: float, options: dict, l2: float = 0.0):
    """(optimizer, its settings under Keras' names for the MLLOG): line 18's optimizer in
    MindSpore at the LR `lr` (one, or one a step: a 1-D float32 array that the optimizer
    indexes by its global_step, MindSpore's dynamic LR) with Keras' defaults (Adam's
    epsilon 1e-7, AdaGrad's initial accumulator 0.1).
    Weight decay reaches the kernels only (weights of 2 or more dimensions), never biases or
    batch norm: the model's `l2` (its Keras twin's L2 kernel regularizer) is the coupled
    kind, MindSpore's weight_decay; an option's decoupled weight decay is LARS's, LAMB's and
    Adam's (ours: optimizers.py; Adam then is AdamW, deepcam's, as PyTorch's). An option's
    global_clipnorm (deepcam's LAMB) is applied by the Step, to the job's averaged gradients
    before the update, as Keras does."""
    decoupled = float(options.get("weight_decay") or 0.0)
    params = model.trainable_params()
    weighted = [p for p in params if len(p.shape) >= 2]
    groups = [{"params": weighted, "weight_decay": l2}, {"params": [p for p in params if len(p.shape) < 2],
                                                         "weight_decay": 0.0}] if weighted and l2 else params
    if decoupled and name not in ("lars", "lamb", "adam"):   # no workload asks it of another (OPTIMIZER_OPTIONS)
        raise ValueError(f"optimizer {name!r}: decoupled weight decay is built for lars, lamb and adam in MindSpore")
    clip = {"global_clipnorm": float(options["global_clipnorm"])} if options.get("global_clipnorm") else {}
    opt, config = _optimizer(name, params, groups, lr, momentum, options, decoupled, l2)
    return opt, {**config, **clip}


def _optimizer(name: str, params, groups, lr, momentum: float, options: dict, decoupled: float, l2: float):
    """(optimizer, its settings) of line 18's `name` over `params` (`groups`: the same with
    the coupled decay on the kernels alone), make_optimizer's rules."""
    if name == "sgd":
        return nn.SGD(groups, learning_rate=lr, momentum=momentum), {"momentum": momentum, "weight_decay": l2}
    if name == "adam":
        eps = float(options.get("epsilon", 1e-7))
        config = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": eps, "weight_decay": decoupled or l2}
        if decoupled:   # AdamW (deepcam's): ours, nn.Adam's decay is the coupled kind (optimizers.py)
            return optimizers.AdamW(params, lr=lr, eps=eps, weight_decay=decoupled, l2=l2), config
        return nn.Adam(groups, learning_rate=lr, eps=eps), config
    if name == "adagrad":
        return nn.Adagrad(groups, accum=0.1, learning_rate=lr), {"weight_decay": l2}
    if name == "lars":   # ours (optimizers.py): decay in the rule, the model's l2 on the gradient
        return (optimizers.LARS(params, lr=lr, momentum=momentum, weight_decay=decoupled, l2=l2),
                {"momentum": momentum, "weight_decay": decoupled})
    if name == "lamb":
        eps = float(options.get("epsilon", 1e-6))
        return (optimizers.LAMB(params, lr=lr, eps=eps, weight_decay=decoupled, l2=l2),
                {"beta_1": 0.9, "beta_2": 0.999, "epsilon": eps, "weight_decay": decoupled})
    raise ValueError(f"optimizer {name!r} is not built in MindSpore (its facts' REFUSES)")


def train_base_model(workload, data, model, indices: np.ndarray, recipe: train.Recipe, *, comm,
                     **hooks) -> train.TrainResult:
    """Train one base model on the job's MPI communicator `comm`: harness/train.run's
    recipe with this package's Trainer (`hooks`: run's seed, job, world_barrier and its
    optional hooks)."""
    return train.run(Trainer(workload, data, model, recipe, comm), indices, recipe, **hooks)


class Trainer:
    """MindSpore's side of harness/train.run (its Trainer): data parallelism, every rank
    a share of each step's batch."""

    def __init__(self, workload, data, model, recipe: train.Recipe, comm):
        self.workload, self.data, self.model, self.recipe, self.comm = workload, data, model, recipe, comm
        self.module = models.get(workload.NAME)
        self.size = self.shares = comm.size
        self.share, self.step_batch = comm.rank, recipe.batch
        self.lr_factor = train.lr_scale(recipe.allreduce, self.size, self.size, False)   # P: the linear scaling rule
        self.mean_of = None

    def prepare(self, schedule: train.Schedule):
        self.s = Step(self.workload, self.module, self.model, self.recipe, schedule, self.comm)
        return self.s, self.s.config

    def _batches(self, shards, epochs: int, feed_seed: int):
        return ((self.module.inputs(x), self.module.targets(y)) for x, y in workloads.training_feed(
            self.module.batches or self.workload.batches, None, self.data, shards, epochs, self.step_batch, feed_seed))

    def warm_up(self, rows: np.ndarray, steps: int, feed_seed: int) -> None:
        self.s.undone_warm_up(self._batches(lambda e: rows, 1, feed_seed), steps)

    def feed(self, shards, epochs: int, steps: int, feed_seed: int):
        return self._batches(shards, epochs, feed_seed)

    def sync(self) -> None:
        """The job root's batch-norm statistics on every rank (the exchange averages gradients only)."""
        root_state(self.model, self.comm)

    def consistency(self) -> tuple[float, str]:
        mine = flat_weights(self.model)
        root = mine.copy()
        self.comm.Bcast(root, root=0)
        return train.replica_check(mine, root)

    def stage(self) -> None:
        return None

    def state(self) -> bytes | None:
        """The job root's Step.snapshot (checkpoint.pack); None on the other ranks. A
        checkpoint follows an evaluation, whose sync put the root's batch-norm statistics on
        every rank: every rank's state is the root's."""
        if self.comm.rank != 0:
            return None
        arrays, extra = self.s.snapshot()
        return checkpoint.pack(arrays, extra)

    def restore(self, state: bytes) -> None:
        params = self.s.parameters()
        arrays, extra = checkpoint.unpack(state, [tuple(p.shape) for p in params])
        self.s.restore((list(zip([p.name for p in params], arrays)), extra))


def flat_weights(model: nn.Cell) -> np.ndarray:
    """The trainable weights in order, flat float64 (the replica check's and the digest's)."""
    params = model.trainable_params()
    return np.concatenate([p.asnumpy().astype(np.float64).ravel() for p in params]) if params else np.zeros(0)


def root_state(model: nn.Cell, comm, trainable: bool = False) -> None:
    """COLLECTIVE over the job's `comm`: the root's batch-norm statistics (and with
    `trainable` every weight) on every rank."""
    params = [p for p in model.get_parameters() if trainable or not p.requires_grad]
    for p, value in zip(params, communication.broadcast([p.asnumpy() for p in params], comm)):
        put(p, value)


def put(param, value: np.ndarray) -> None:
    """`value` written into `param`'s own memory (ops.assign): set_data would give the
    parameter a new tensor, and a graph compiled before (the step's) kept updating the old
    one (batch-norm statistics then froze at their first sync for the evaluations)."""
    ops.assign(param, ms.Tensor(np.asarray(value), param.dtype))


class Recompiled(logging.Filter):
    """Drops MindSpore's warning `The function "fused" at the file ".../mindspore/train.py", line N
    has been compiled again. Try to reuse the function object decorated by @jit ...` for the
    step graphs of this file, and nothing else: each base model's Step is a graph of its own (its
    own parameters and optimizer, closed over), compiled in its warm-up before the clock
    (Step.undone_warm_up), so the second base model's compile is expected, not the misuse the
    warning is for (a jit function made anew each call; a shape that changes recompiles through
    another path, still said). MindSpore's own setting, GLOG_v=3, would drop every warning with it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("has been compiled again" in message and f'at the file "{__file__}"' in message)


# MindSpore's Python logger (mindspore.log's own; where a version has none, the warning stays)
if hasattr(ms_log, "_get_logger"):
    ms_log._get_logger().addFilter(Recompiled())


class Step:
    """The training step of one base model: step(x, y) -> loss. The forward and backward
    pass (one mindspore.jit graph) gives this rank's loss and gradients; the job averages
    the gradients over MPI in line 21's precision; the optimizer updates at the LR
    `schedule.at(step number)` gives. The job's ranks start from the root's weights. The
    optimizer holds the whole schedule, one LR a step, and indexes it by its own global_step
    (MindSpore's dynamic LR): writing each step's LR into it from the host cost an assign a
    step, 0.48 ms dispatched and 2.6 ms waited for, 3-16 % of a 2-rank digits step here
    (bench/README.md). A job of
    one rank in FP32 with MindSpore's own optimizer and no clipping runs the update in the
    same graph (`fused`), as MindSpore's tutorials write a step: nothing leaves it."""

    def __init__(self, workload, module, model, recipe: train.Recipe, schedule: train.Schedule, comm):
        self.model, self.comm, self.comm_precision = model, comm, recipe.comm_precision
        root_state(model, comm, trainable=True)
        # steps 0 to total, lr_at's 0 the last (so 2 or more: MindSpore warns of a 1-D LR of one)
        lrs = np.array([schedule.at(s) for s in range(schedule.total + 1)], np.float32)
        self.opt, self.config = make_optimizer(recipe.optimizer, model, lrs, workload.MOMENTUM,
                                               workload.OPTIMIZER_OPTIONS.get(recipe.optimizer, {}), module.L2)
        model.set_train(True)

        def forward(x, y, scale):   # the loss times the loss scale (1 but in fp16); the loss itself the aux
            loss = module.loss(fp32(model(x)), y).mean()
            return loss * scale, loss
        grad = ms.value_and_grad(forward, None, self.opt.parameters, has_aux=True)
        self.grad = ms.jit(grad) if module.JIT else grad
        self.scale = LossScale() if recipe.precision == "fp16" else None
        self.fused = None
        # a job of one rank: nothing to exchange or check, MindSpore's own optimizer in the graph
        if module.JIT and comm.size == 1 and self.scale is None and not self.config.get("global_clipnorm") \
                and isinstance(self.opt, nn.Optimizer):

            def fused(x, y, scale):
                # (loss x scale, loss): unpacked as `(_, loss)`, the unused first left MindSpore's graph
                # an isolated node, and MindSpore warned at each compile "Some side effect nodes were
                # eliminated by mistake" (auto_monad.cc ClearIsolatedNodes); indexed, no node is left over
                values, grads = grad(x, y, scale)
                self.opt(grads)
                return values[1]
            self.fused = ms.jit(fused)

    def __call__(self, x, y):
        if self.fused is not None:   # a job of one rank: one graph, as MindSpore's tutorials train
            return self.fused(x, y, ms.Tensor(1.0, ms.float32))
        scale = self.scale.value if self.scale else 1.0
        (_, loss), grads = self.grad(x, y, ms.Tensor(scale, ms.float32))
        mean = communication.average([g.asnumpy() for g in grads], self.comm_precision, self.comm)
        if self.scale is not None:   # the job's averaged gradients: every rank skips the same steps
            mean = [g / np.float32(scale) for g in mean]
            if not self.scale.update(all(np.isfinite(g).all() for g in mean)):
                # a skipped step still counts in the LR schedule, as Keras' LossScaleOptimizer counts it
                ops.assign_add(self.opt.global_step, ms.Tensor([1], ms.int32))
                return loss
        self.opt(tuple(ms.Tensor(g) for g in clipped(mean, self.config.get("global_clipnorm", 0.0))))
        return loss

    def undone_warm_up(self, batches, steps: int) -> None:
        """Set-up before the clock, like MLPerf's init phase: `steps` real steps (the jit
        graph's compilation, the first exchange), then every state the step writes put back
        (snapshot). Dropout's masks inside the jit graph come from its operator's own
        generator, which MindSpore does not expose: the timed epochs draw other masks than a
        run without warm-up would (and a model gone on from a checkpoint other than an
        uninterrupted one would)."""
        saved = self.snapshot()
        for _, (x, y) in zip(range(steps), batches):
            float(self(x, y).asnumpy())   # waits for the step
        self.restore(saved)

    def parameters(self) -> list:
        """What the step writes of the model's and the optimizer's: their parameters."""
        return [*self.model.get_parameters(), *self.opt.get_parameters()]

    def snapshot(self) -> tuple[list, dict]:
        """Every state the step writes, copied: (the model's weights and batch-norm
        statistics and the optimizer's slots and steps, by name; the global random
        generator, a model's own numpy generator `host_rng` (ewa's draws), the fp16 loss
        scale); checkpoint.pack's arrays and extras (Trainer.state)."""
        host = getattr(self.model, "host_rng", None)
        return ([(p.name, p.asnumpy().copy()) for p in self.parameters()],
                {"rng": ms.get_rng_state().asnumpy().tolist(), "host_rng": host.bit_generator.state if host else None,
                 "scale": dataclasses.asdict(self.scale) if self.scale else None})

    def restore(self, saved: tuple[list, dict]) -> None:
        """snapshot()'s state back in place."""
        arrays, extra = saved
        for p, (_, value) in zip(self.parameters(), arrays):
            put(p, value)
        ms.set_rng_state(ms.Tensor(np.array(extra["rng"], np.uint8)))
        if extra["host_rng"] is not None:
            self.model.host_rng.bit_generator.state = extra["host_rng"]
        self.scale = LossScale(**extra["scale"]) if extra["scale"] else None


@dataclass
class LossScale:
    """fp16's dynamic loss scale, Keras' LossScaleOptimizer's rule: 2^15 to start, halved
    when the job's averaged gradients are not finite (the step skipped), doubled after
    2000 finite steps in a row."""
    value: float = 2.0 ** 15
    good: int = 0       # finite steps since the last change

    def update(self, finite: bool) -> bool:
        """Record one step's verdict; whether to apply its update."""
        if not finite:
            self.value, self.good = max(self.value / 2, 1.0), 0
            return False
        self.good += 1
        if self.good == 2000:
            self.value, self.good = self.value * 2, 0
        return True


def clipped(grads: list, max_norm: float) -> list:
    """The job's averaged gradients scaled to global norm `max_norm` where theirs is larger
    (Keras' global_clipnorm; clip_grad_norm_'s epsilon 1e-6, as PyTorch's Step); 0: as they are."""
    if not max_norm:
        return grads
    norm = float(np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads)))
    factor = max_norm / (norm + 1e-6)
    return [g * np.float32(factor) for g in grads] if factor < 1 else grads


def fp32(outputs):
    """A model's outputs in FP32: a Tensor, or a dict of them (ewa's detector; its host
    arrays as they are)."""
    if isinstance(outputs, dict):
        return {k: v.astype(ms.float32) if isinstance(v, ms.Tensor) else v for k, v in outputs.items()}
    return outputs.astype(ms.float32)


def class_probabilities(model: nn.Cell, inputs, classes: int) -> np.ndarray:
    """Softmax of the model's logits, in FP32, over the batches `inputs` (Tensors), in eval
    mode: what a classifier's predict() returns."""
    out = outputs(model, inputs, lambda logits: ops.softmax(logits.astype(ms.float32), axis=1))
    return out if len(out) else np.zeros((0, classes), np.float32)


def host(value) -> np.ndarray:
    """A Tensor's values on the host; a host array (or anything numpy takes) as it is."""
    return value.asnumpy() if isinstance(value, ms.Tensor) else np.asarray(value)


def outputs(model: nn.Cell, inputs, post=fp32) -> np.ndarray:
    """`post` of the model's outputs (FP32 by default; a Tensor or a host array: ewa's
    detections are made on the host) over the batches `inputs`, in eval mode, concatenated
    on the host (an empty array where `inputs` is): the one loop of every workload's predict()."""
    was = model.training
    model.set_train(False)
    try:
        out = [host(post(model(x))) for x in inputs]
    finally:
        model.set_train(was)
    return np.concatenate(out) if out else np.zeros((0,), np.float32)
