"""Base-model training in TensorFlow: Horovod data parallelism on one job's sub-communicator.

Each job is its own Horovod world (`hvd.init(comm=job_comm)`): its all-reduces never
leave the job, so the M base models train independently, as bagging requires. The
training step runs train.WARMUP_STEPS times before the clock and is undone (`Trainer.warm_up`),
keeps its step number and LR in the graph, and with line 33's `xla` compiles its forward
and backward pass. The recipe, the schedule, the timed epochs and the replica check are
harness/train.py's (`run`, every framework's); here TensorFlow's side of it (`Trainer`:
its step, feed, undone warm-up and Horovod's edges). The model, its loss, input
signature and feed come from the workload's TensorFlow module (models.get).
"""
from __future__ import annotations

import math
import sys

import numpy as np

from harness import checkpoint, gpus as harness_gpus, workloads
from harness.frameworks.tensorflow import communication, models
from harness.train import Recipe, Schedule, TrainResult, lr_scale, replica_check, run, threads


def setup_devices(local_rank: int, sharing: int) -> dict:
    """Pin this rank before TensorFlow starts its runtime: one GPU per local rank where
    there are GPUs, and `threads(sharing)`. "gpu": the GPU pinned, named by the driver
    (harness/gpus.pinned; TensorFlow's list index is CUDA's ordinal unless TensorFlow left
    a GPU out, e.g. one of too low a compute capability); "nccl": Horovod was built with
    NCCL, whose communicators refuse two ranks on one GPU ("Duplicate GPU detected",
    horovod#3929); a build without it carries GPU tensors through MPI or Gloo, which allow it.
    Any NCCL in the build counts (HOROVOD_GPU_OPERATIONS=NCCL, or only some operations):
    a refusal is safer than a crash mid-test."""
    # tf_keras imports pandas where it is installed (the venv's is mlperf-logging's) only to
    # accept DataFrames in Model.fit, which no rank passes: ~0.7 s of every rank's start here
    # (import tensorflow 4.5-5.3 s with it, 4.2-4.8 without). A None entry makes that
    # import fail as if pandas were absent; where pandas is already loaded it stays.
    sys.modules.setdefault("pandas", None)
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")  # Horovod's per-test broadcasts retrace; TF warns each time
    threads_, inter_op = threads(sharing)
    tf.config.threading.set_intra_op_parallelism_threads(threads_)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    gpus = tf.config.list_physical_devices("GPU")
    device, pinned = "CPU", None
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.set_visible_devices([gpu], "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
        device, pinned = f"GPU {local_rank % len(gpus)} of {len(gpus)}", harness_gpus.pinned(local_rank % len(gpus))
    # each job's Horovod (interface.Job) would import it later; here, once the runtime is configured, it
    # loads while the driver holds the garbage collector off (driver._collector_off)
    import horovod.tensorflow as hvd
    return {"threads": threads_, "inter_op": inter_op, "device": device, "gpus_on_node": len(gpus), "gpu": pinned,
            "nccl": bool(gpus) and bool(hvd.nccl_built())}


def learning_rate(step, total_steps: int, warmup_steps: int, peak: float):
    """harness/train.lr_at in TensorFlow's ops (the step number a graph variable). Works on Python
    numbers and on TensorFlow scalars alike."""
    import tensorflow as tf
    step = tf.cast(step, tf.float32)
    warm = peak * (step + 1.0) / max(1, warmup_steps)
    frac = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    decay = 0.5 * peak * (1.0 + tf.cos(math.pi * tf.minimum(frac, 1.0)))
    return tf.where(step < warmup_steps, warm, decay)


# Line 17's precisions as Keras' global policies
POLICY = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}

# Random ops that keep their state inside the kernel, where no variable holds it: a
# warm-up step would move their draws, so the restored run would no longer be the run
# without warm-up. Random draws in a training step must come from tf.random.Generator
# (a variable) or stateless ops with an explicit seed.
HIDDEN_STATE_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
    "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial", "RandomCrop"})


def build(workload, data, seed: int, job: int, precision: str = "fp32"):
    """The job's model, initialised from (seed, job): base models start differently,
    and the job's ranks are then made equal by broadcasting from the job's root. The
    precision policy is global in Keras: set for every model, fp32 included."""
    import tensorflow as tf
    tf.keras.mixed_precision.set_global_policy(POLICY[precision])
    tf.keras.utils.set_random_seed((seed * 1_000_003 + job) % 2**31)
    # Keras' random layers (dropout) draw from a tf.random.Generator whose state is a
    # variable, not from kernels with hidden state: the warm-up of `train` can undo them.
    tf.keras.backend.experimental.enable_tf_random_generator()
    return models.get(workload.NAME).build_model(data)


def train(workload, data, model, indices: np.ndarray, recipe: Recipe, *, torus=None, **hooks) -> TrainResult:
    """Train one base model: harness/train.run's recipe with this package's Trainer
    (`hooks`: run's seed, job, world_barrier and its optional hooks). `torus`
    (communication.Torus, its process sets registered at hvd.init) is the grid of line
    22's torus."""
    return run(Trainer(workload, data, model, recipe, torus), indices, recipe, **hooks)


class Trainer:
    """TensorFlow's side of harness/train.run (its Trainer): Horovod's world is the job's,
    every rank one share of each step's batch."""
    mean_of = None

    def __init__(self, workload, data, model, recipe: Recipe, torus=None):
        import horovod.tensorflow as hvd
        self.hvd, self.workload, self.data, self.model, self.recipe, self.torus = hvd, workload, data, model, recipe, torus
        self.module = models.get(workload.NAME)
        self.size = self.shares = hvd.size()
        self.share, self.step_batch = hvd.rank(), recipe.batch
        self.lr_factor = lr_scale(recipe.allreduce, self.size, hvd.local_size(), hvd.nccl_built())
        # TensorFlow's feed of the workload, else its numpy one
        self.batches = self.module.batches or workload.batches

    def prepare(self, schedule: Schedule):
        sched = lambda s: learning_rate(s, schedule.total, schedule.warmup, schedule.peak)  # noqa: E731
        self.step, opt = _make_step(self.workload, self.module, self.model, self.recipe, self.size, sched, self.torus)
        self.concrete = self.step.get_concrete_function(*self.module.input_signature(self.data, self.recipe.batch))
        _refuse_hidden_random_state(self.concrete.graph, self.workload.NAME)
        return self.step, opt.get_config()

    def warm_up(self, rows: np.ndarray, steps: int, feed_seed: int) -> None:
        _undone_warm_up(self.step, self.concrete.variables, self.batches, self.data, rows, self.step_batch, feed_seed)

    def feed(self, shards, epochs: int, steps: int, feed_seed: int):
        return workloads.training_feed(self.batches, self.module.stream, self.data, shards, epochs, self.step_batch,
                                       feed_seed)

    def sync(self) -> None:
        """Horovod averages gradients only: the batch-norm statistics differ per replica,
        and every rank of the job predicts with the root's (training never reads them)."""
        if self.size > 1:
            self.hvd.broadcast_variables(self.model.non_trainable_variables, root_rank=0)

    def consistency(self) -> tuple[float, str]:
        """replica_check of this rank's trainable weights against the job root's (Horovod's broadcast)."""
        mine = np.concatenate([v.numpy().ravel() for v in self.model.trainable_variables]).astype(np.float64)
        return replica_check(mine, self.hvd.broadcast(mine, root_rank=0, name="consistency_check").numpy())

    def stage(self) -> None:
        return None

    def state(self) -> bytes | None:
        """The job root's: every variable the step writes (the undone warm-up's: weights,
        optimizer slots, step counters, loss scale, batch-norm statistics, random generators'
        states) in the order they were made (checkpoint.pack); None on the other ranks. A
        checkpoint follows an evaluation, whose sync put the root's batch-norm statistics on
        every rank: every rank's state is the root's."""
        if self.share != 0:
            return None
        return checkpoint.pack([(v.name, v.numpy()) for v in _in_creation_order(self.concrete.variables)])

    def restore(self, state: bytes) -> None:
        variables = _in_creation_order(self.concrete.variables)
        values, _ = checkpoint.unpack(state, [tuple(v.shape) for v in variables])
        for v, value in zip(variables, values):
            v.assign(value)


def _in_creation_order(variables) -> list:
    """`variables` in the order they were made: the same in every process that builds the
    same model and step, where a traced function's list of them is not (two processes
    listed one model's in two orders here) and their names are not either (Keras numbers
    a layer's by the models the process built before: conv2d, conv2d_1). The order is
    TensorFlow's creation number, the end of each variable's `_unique_id` (its handle's
    shared name, `name_N`); NotImplementedError where a TensorFlow gives none (the
    checkpoint is then not written, and says why)."""
    def made(v) -> int:
        tail = str(getattr(v, "_unique_id", "")).rpartition("_")[2]
        if not tail.isdigit():
            raise NotImplementedError(f"TensorFlow {v.name}'s creation number (_unique_id) is not"
                                      " readable: its training state cannot be ordered")
        return int(tail)
    return sorted(variables, key=made)


def _make_step(workload, module, model, recipe: Recipe, size: int, schedule, torus=None):
    """(step, optimizer): the training step, a tf.function of (x, y) -> loss (the loss of
    `module`, the workload's TensorFlow module): forward and backward (by XLA where line
    33 says so), Horovod's gradient average (or Adasum) on the job's ranks, the update at
    the LR `schedule(step number)` gives, loss scaling for fp16; and the optimizer it
    updates with (the workload's momentum and options). The job's ranks start from the
    root's weights."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from harness.frameworks.tensorflow import optimizers   # TensorFlow at its top: after the devices are pinned
    opt = optimizers.make(recipe.optimizer, schedule(0), momentum=workload.MOMENTUM,
                          **workload.OPTIMIZER_OPTIONS.get(recipe.optimizer, {}))
    fp16 = recipe.precision == "fp16"
    if fp16:  # FP16's narrow range underflows small gradients: scale the loss (dynamically)
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
    # The slots (and the iteration count) made now, not by apply_gradients inside the first
    # trace: a tf.function that creates variables is traced a second time without them
    # (tracing the step twice cost ~15 % of a small test's run here). Zeros either way.
    opt.build(model.trainable_variables)
    if size > 1:   # one rank is its own root (Horovod's broadcast would copy it onto itself)
        hvd.broadcast_variables(model.variables, root_rank=0)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hpcai500_step")  # steps taken: in the graph

    def loss_and_grads(x, y, tape_wrapper):
        with tf.GradientTape() as tape:
            out = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), model(x, training=True))  # loss in FP32
            loss = tf.reduce_mean(module.loss(y, out))
            if model.losses:  # weight decay written as the workload's kernel regularizers
                loss += tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
            scaled = opt.get_scaled_loss(loss) if fp16 else loss
        return loss, tape_wrapper(tape).gradient(scaled, model.trainable_variables)

    reduced = _reduced(recipe, loss_and_grads, size, torus)

    @tf.function(autograph=False)  # plain Python control flow: tracing skips ~2 s of AST conversion per rank
    def step(x, y):
        i = counter.read_value()   # the step number and the LR live in the graph: no host constant per step
        with tf.control_dependencies([i]):
            counter.assign_add(1)
        opt.learning_rate.assign(schedule(i))
        loss, grads = reduced(x, y)
        if fp16:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step, opt


def _reduced(recipe: Recipe, loss_and_grads, size: int, torus=None):
    """The step's (x, y) -> (loss, the job's gradients): `loss_and_grads(x, y, wrap)`
    under the tape `wrap` gives, then the exchange of lines 21-22. Horovod's
    DistributedGradientTape averages (or Adasums) inside the tape; where XLA compiles the
    forward and backward pass (Horovod's all-reduce has no XLA kernel) a grouped all-reduce
    computes the same outside the cluster; int8 (line 21) exchanges the plain tape's
    gradients quantised, and the torus (line 22) averages them over its grid (this
    package's communication.py)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    compression = hvd.Compression.fp16 if recipe.comm_precision == "fp16" else hvd.Compression.none
    op = hvd.Adasum if recipe.allreduce == "adasum" else hvd.Average
    plain = lambda x, y: loss_and_grads(x, y, lambda t: t)  # noqa: E731
    if size == 1 and recipe.compiler != "xla":
        # A job of one rank exchanges nothing: Horovod's tape would wrap each gradient in a
        # tf.cond whose identity branch it takes where its process set has one rank (no
        # compression, no Adasum), and tracing those conds cost ~2 s of a small test's set-up
        return plain
    if recipe.compiler != "xla" and recipe.comm_precision != "int8" and recipe.allreduce != "torus":
        return lambda x, y: loss_and_grads(x, y, lambda t: hvd.DistributedGradientTape(t, compression=compression,
                                                                                         op=op))
    local = tf.function(plain, jit_compile=True, autograph=False) if recipe.compiler == "xla" else plain
    if recipe.comm_precision == "int8":
        exchange = lambda grads: communication.int8_average(grads, hvd)  # noqa: E731
    elif recipe.allreduce == "torus":
        exchange = lambda grads: communication.torus_average(grads, hvd, torus, compression)  # noqa: E731
    else:
        exchange = lambda grads: hvd.grouped_allreduce(grads, op=op, compression=compression)  # noqa: E731

    def reduced(x, y):
        loss, grads = local(x, y)
        return loss, exchange(grads) if size > 1 else grads
    return reduced


def _undone_warm_up(step, variables, batches, data, rows: np.ndarray, batch: int, feed_seed: int) -> None:
    """Set-up before the clock, like MLPerf's init phase: run real steps on `rows` (the
    first batches of epoch 1) so that TensorFlow's graph optimisation (and XLA's
    compilation), the allocator's first growth and Horovod's first negotiation of every
    gradient all happen here, then put back every variable the step writes (weights,
    optimizer slots, step counters, loss scale, batch-norm statistics, random
    generators' states): the timed epochs then train exactly the samples they count,
    from exactly the state a run without warm-up would start from."""
    state = [(v, v.numpy()) for v in variables]
    for x, y in batches(data, rows, batch, training=True, seed=feed_seed):
        step(x, y).numpy()
    for v, value in state:
        v.assign(value)


def _refuse_hidden_random_state(graph, workload: str) -> None:
    """Raise if the traced step (or a function it calls) holds a random op with hidden
    state (HIDDEN_STATE_RANDOM_OPS): the warm-up could not be undone. A workload bug."""
    found = {op.type for op in graph.get_operations()} | {
        node.op for fn in graph.as_graph_def().library.function for node in fn.node_def}
    hidden = sorted(found & HIDDEN_STATE_RANDOM_OPS)
    if hidden:
        raise RuntimeError(f"workload {workload}: the training step uses random op(s) {', '.join(hidden)}, whose "
                           "state no variable holds; draw from a tf.random.Generator or a stateless op instead")
