"""Base-model training in PyTorch: DistributedDataParallel on one job's process group.

The recipe is harness/train.run's, every framework's (Recipe, the LR schedule lr_at, the
step count, the undone warm-up, the timed epochs_loop, the replica check), with
PyTorch's parts: the model from the workload's PyTorch module (models.get), DDP on the
job's group (harness/frameworks/pytorch/distributed.job_group: Gloo on CPUs, NCCL on
GPUs), autocast for fp16/bf16 (with a gradient scaler for fp16), DDP's fp16 compression
hook for line 21's fp16. The batches are the workload's own feed (numpy), turned into
tensors by its PyTorch module inside the clock, as TensorFlow converts them.
MPI at the edges (the replica check's broadcast over the job's communicator).
"""
from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import time

import numpy as np
import torch
import torch.distributed as dist

from harness import gpus as harness_gpus, parallelism, train, workloads
from harness.frameworks.pytorch import communication, distributed, kernels, models, optimizers, pipeline
from harness.frameworks.pytorch import feed as batch_feed   # train.feed is the host feed

AMP = {"fp16": torch.float16, "bf16": torch.bfloat16}    # line 17 -> autocast's dtype (fp32: no autocast)


def device() -> torch.device:
    """This rank's device: its GPU (setup_devices made it current) or the CPU, as the
    micro-kernels pick it (kernels.where)."""
    return kernels.where()[0]


def setup_devices(local_rank: int, sharing: int) -> dict:
    """Pin this rank: one GPU per local rank where there are GPUs, train.threads(sharing)
    threads (PyTorch's inter-op pool can be sized only before its first parallel work).
    "gpu": the GPU pinned, named by the driver (harness/gpus.pinned: under a per-rank
    CUDA_VISIBLE_DEVICES every rank's index is 0); "nccl": a job on GPUs exchanges through
    NCCL (distributed.job_group), which refuses two of its ranks on one GPU."""
    intra, inter_op = train.threads(sharing)
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter_op)
    except RuntimeError:   # already started (a second test in this process): the first setting stands
        inter_op = torch.get_num_interop_threads()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where, gpu = "CPU", None
    if gpus:
        torch.cuda.set_device(local_rank % gpus)
        where, gpu = f"GPU {local_rank % gpus} of {gpus}", harness_gpus.pinned(local_rank % gpus)
    return {"threads": intra, "inter_op": inter_op, "device": where, "gpus_on_node": gpus, "gpu": gpu,
            "nccl": bool(gpus)}


def build(workload, data, seed: int, job: int, dev: torch.device) -> torch.nn.Module:
    """The job's model, initialised from (seed, job) as TensorFlow's is; DDP then makes the
    job's ranks equal by broadcasting the root's weights."""
    torch.manual_seed((seed * 1_000_003 + job) % 2**31)
    module = models.get(workload.NAME)
    model = module.build_model(data).to(dev)
    return channels_last(model) if models.channels_last_on(dev, module.CPU_CHANNELS_LAST) else model


def channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """A 2-D convolutional model channels-last in memory: cuDNN's fast layout on a GPU, and
    the one the feed's NHWC batches already have (models.channels_first). A model with 3-D
    convolutions (cosmoflow) stays as it is: channels_last is a 4-D format, and Module.to
    would refuse its 5-D kernels."""
    if any(p.dim() == 5 for p in model.parameters()):
        return model
    return model.to(memory_format=torch.channels_last)


def make_optimizer(name: str, model, lr: float, momentum: float, options: dict, l2: float = 0.0):
    """(optimizer, its settings under Keras' names for the MLLOG): line 18's optimizer in
    PyTorch with Keras' defaults, so that both frameworks run the same recipe (Adam's and
    AdaGrad's epsilon 1e-7, AdaGrad's initial accumulator 0.1). Weight decay reaches the
    kernels only (weights of 2 or more dimensions), never biases or batch norm, as
    TensorFlow's optimizers.py excludes them: the workload's `options` weight decay is Keras'
    decoupled kind (Adam then is AdamW), the model's `l2` (its Keras twin's L2 kernel
    regularizer) the coupled kind, PyTorch's plain weight_decay. LARS and LAMB are ours
    (optimizers.py: TensorFlow's rules); an option's global_clipnorm (deepcam's LAMB) is
    applied by the Step, to the job's averaged gradients before the update, as Keras does."""
    decoupled = float(options.get("weight_decay") or 0.0)
    wd = decoupled or l2
    params = [p for p in model.parameters() if p.requires_grad]
    clip = {"global_clipnorm": float(options["global_clipnorm"])} if options.get("global_clipnorm") else {}
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    adam = {"beta_1": 0.9, "beta_2": 0.999}
    if name == "sgd":
        opt, config = torch.optim.SGD(groups, lr=lr, momentum=momentum), {"momentum": momentum, "weight_decay": wd}
    elif name == "adam":
        eps = float(options.get("epsilon", 1e-7))
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        opt, config = cls(groups, lr=lr, betas=(0.9, 0.999), eps=eps), {**adam, "epsilon": eps, "weight_decay": wd}
    elif name == "adagrad":
        opt, config = torch.optim.Adagrad(groups, lr=lr, initial_accumulator_value=0.1, eps=1e-7), {"weight_decay": wd}
    elif name == "lars":   # ours (optimizers.py): decay in the rule, the model's l2 on the gradient, as in TF
        opt = optimizers.LARS(params, lr=lr, momentum=momentum, weight_decay=decoupled, l2=l2)
        config = {"momentum": momentum, "weight_decay": decoupled}
    elif name == "lamb":
        eps = float(options.get("epsilon", 1e-6))
        opt = optimizers.LAMB(params, lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=decoupled, l2=l2)
        config = {**adam, "epsilon": eps, "weight_decay": decoupled}
    else:
        raise ValueError(f"optimizer {name!r} is not built in PyTorch (harness/frameworks.UNSUPPORTED)")
    return opt, {**config, **clip}


def feed(workload, module, data, shards, epochs: int, batch: int, seed: int):
    """The training batches of every epoch: the model module's own batches() where it has
    one (e.g. ic's Pillow decoding in the rank's threads), else the workload's feed."""
    return workloads.training_feed(module.batches or workload.batches, None, data, shards, epochs, batch, seed)


def train_base_model(workload, data, model, indices: np.ndarray, recipe: train.Recipe, *, comm, dev,
                     watchdog: float = 0.0, **hooks) -> train.TrainResult:
    """Train one base model on the job's process group (made by the caller) and its MPI
    communicator `comm`: harness/train.run's recipe with this package's Trainer (`hooks`:
    run's seed, job, world_barrier and its optional hooks; `watchdog`: the run's limit, s,
    which NCCL's timeout a step stays under: distributed.step_timeout)."""
    return train.run(Trainer(workload, data, model, recipe, comm, dev, watchdog), indices, recipe, **hooks)


class Trainer:
    """PyTorch's side of harness/train.run (its Trainer). Line 37's mode (recipe.mode):
    data parallelism (Step: every rank a share of each step's batch), or the model cut into
    stages (PipelineStep on a pipeline.Split: a pipeline reads its replica's share of the
    job's batches, B x S samples a step, on its first stage and its last)."""

    def __init__(self, workload, data, model, recipe: train.Recipe, comm, dev, watchdog: float = 0.0):
        self.workload, self.data, self.model, self.recipe, self.comm, self.dev = workload, data, model, recipe, comm, dev
        self.watchdog = watchdog
        self.module = models.get(workload.NAME)
        self.size = comm.size
        mode = parallelism.resolve(parallelism.parse(recipe.mode), self.size, recipe.batch)
        self.split = None if mode.kind == "data" else pipeline.Split(self.module, data, mode)
        self.share, self.shares, self.step_batch = (comm.rank, self.size, recipe.batch) if self.split is None else (
            self.split.groups.replica, mode.replicas, mode.pipeline_batch)
        # the linear scaling rule; lr_scale's other branch is Adasum's, which PyTorch refuses (its facts' REFUSES)
        self.lr_factor = train.lr_scale(recipe.allreduce, self.size, self.size, False)
        self.mean_of = None if self.split is None else (lambda losses: self.split.epoch_loss(losses, dev))

    def prepare(self, schedule: train.Schedule):
        args = (self.workload, self.module, self.model, self.recipe, self.dev, schedule.at)
        self.s = Step(*args) if self.split is None else PipelineStep(*args, self.split)
        return self.s, self.s.config

    def _batches(self, rows_of, epochs: int, steps: int, feed_seed: int):
        if self.split is not None and not self.split.reads:   # a middle stage: its inputs come from the stage before
            return ((None, None) for _ in range(steps * epochs))
        pairs = feed(self.workload, self.module, self.data, rows_of, epochs, self.step_batch, feed_seed)
        # on a GPU pinned, non-blocking, one batch ahead on a side stream; on CPUs as the step asks
        return batch_feed.batches(pairs, lambda xy: (self.module.inputs(xy[0], self.dev),
                                                     self.module.targets(xy[1], self.dev)), steps, self.dev)

    def warm_up(self, rows: np.ndarray, steps: int, feed_seed: int) -> None:
        self.s.undone_warm_up(itertools.islice(self._batches(lambda e: rows, 1, steps, feed_seed), steps))
        # set-up done (DDP's first broadcast, compilation, autotuning): NCCL's groups from here on
        # time out as a step would, so that a lost peer fails the survivors' collective (distributed.py)
        groups = [None] if self.split is None else [None, self.split.groups.pipeline, self.split.groups.replicas_group]
        distributed.shorten(distributed.step_timeout(self.s.warm_up_step, self.watchdog), groups)

    def feed(self, shards, epochs: int, steps: int, feed_seed: int):
        return self._batches(shards, epochs, steps, feed_seed)

    def sync(self) -> None:
        """The job root's batch-norm statistics on every rank (DDP averages gradients only),
        or a split model's stages assembled on every rank."""
        if self.split is None:
            _root_buffers(self.model, dist)
        else:
            self.split.assemble(self.model)

    def consistency(self) -> tuple[float, str]:
        return _consistency(self.model, self.comm, self.split)

    def stage(self) -> dict | None:
        return self.split and _stage_record(self.split, self.s, self.comm.rank == 0)

    def state(self) -> bytes | None:
        """The job root's bytes of Step.snapshot's state (torch.save), None on the other
        ranks. In data parallelism every rank's is the root's (DDP keeps the replicas equal).
        A split model (COLLECTIVE over the job): the whole model, as the evaluation's sync
        assembled it on every rank, and each stage's own state (its optimizer's slots, the
        step number, the random generators), its first replica's, gathered to the root."""
        if self.split is None:
            return _saved(self.s.snapshot(copied=False)) if self.comm.rank == 0 else None
        mine, groups = self.s.snapshot(copied=False), self.split.groups
        own = _saved({k: v for k, v in mine.items() if k != "model"}) if groups.replica == 0 else None
        stages = self.comm.gather((groups.stage, own) if own else None, root=0)
        if self.comm.rank != 0:
            return None
        return _saved({"model": mine["model"], "stages": [b for _, b in sorted(x for x in stages if x)]})

    def restore(self, state: bytes) -> None:
        """state()'s bytes back in place; a split model's rank takes the model and its own
        stage's state (a stage's replicas, its first replica's)."""
        saved = _loaded(state)
        if self.split is not None:
            saved = {"model": saved["model"], **_loaded(saved["stages"][self.split.groups.stage])}
        self.s.restore(saved)


def _saved(obj) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


def _loaded(blob: bytes):
    """_saved's object. Onto the CPU: load_state_dict moves each tensor to its parameter's
    device, but an optimizer's step counts, which must stay on the CPU (Adam's unless
    capturable); weights_only: tensors, numbers, bytes and containers alone, no code,
    whoever wrote the file."""
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)


def _stage_record(split, s, root: bool) -> dict:
    """TrainResult.stage of a split model's rank (the job root's with the cut)."""
    out = {"stage": split.groups.stage, "replica": split.groups.replica, "busy": s.busy.seconds, "seconds": s.seconds}
    if root:
        out["cut"] = [dataclasses.asdict(x) for x in split.stages]
        out["trainable"] = split.trainable
    return out


def _consistency(model, comm, split) -> tuple[float, str]:
    """(the replica check's largest difference, this rank's weights' digest): data
    parallelism compares every rank with the job's root over MPI; a split model each
    stage's replicas with its owner, then digests the whole model once assembled."""
    if split is not None:
        diff = split.replica_diff(model)
        split.assemble(model)
        return diff, train.weights_digest(_flat(model))
    mine = _flat(model)
    root = mine.copy()
    comm.Bcast(root, root=0)
    return train.replica_check(mine, root)


def _flat(model) -> np.ndarray:
    return torch.cat([p.detach().double().flatten().cpu() for p in model.parameters()]).numpy()


class Step:
    """The training step of one base model: step(x, y) -> loss: forward under autocast
    (line 17; compiled by torch.compile for line 33's inductor), the loss in FP32,
    backward (DDP averaging the gradients on the job's group, through the fp16
    compression hook for line 21's fp16), the gradients clipped where the workload's
    options say so, the update at the LR
    `schedule(step number)` gives, with a dynamic gradient scaler for fp16. The job's
    ranks start from the root's weights (DDP broadcasts them when it wraps the model).
    A job of one rank exchanges nothing (its Exchange line: "none (P = 1)"), as in
    TensorFlow and MindSpore: no DDP, whose hook would still cast its gradients to FP16
    (line 21's fp16) or quantise them (int8) and which copies them through its buckets
    every step."""

    def __init__(self, workload, module, model, recipe: train.Recipe, dev, schedule):
        self.module, self.model, self.dev, self.schedule = module, model, dev, schedule
        wrapped = _ddp(model, dev, recipe.comm_precision) if dist.get_world_size() > 1 else model
        # line 33's inductor: torch.compile of the DDP-wrapped model (PyTorch's way: DDP's
        # optimizer splits the graph at its buckets, so each bucket's all-reduce still starts
        # during the backward pass); compiled at the first call, in the warm-up before the clock
        self.forward = torch.compile(wrapped) if recipe.compiler == "inductor" else wrapped
        self.opt, self.config = make_optimizer(recipe.optimizer, model, schedule(0), workload.MOMENTUM,
                                               workload.OPTIMIZER_OPTIONS.get(recipe.optimizer, {}), module.L2)
        self.max_norm = self.config.get("global_clipnorm", 0.0)
        self.amp = AMP.get(recipe.precision)
        self.scaler = torch.amp.GradScaler(dev.type) if recipe.precision == "fp16" else None  # FP16's narrow range
        self.taken = 0        # steps taken: the LR schedule's step number
        self.warm_up_step = 0.0   # s, the slowest warm-up step (distributed.step_timeout)

    def __call__(self, x, y):
        for group in self.opt.param_groups:
            group["lr"] = self.schedule(self.taken)
        self.taken += 1
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.dev.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            out = self.forward(x)
        loss = self.module.loss(_fp32(out), y).mean()
        if self.scaler is None:
            loss.backward()
            self.clip()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)   # the clip sees the true gradients; step() then skips unscaling
            self.clip()
            self.scaler.step(self.opt)
            self.scaler.update()
        return loss.detach()

    def clip(self) -> None:
        """Scale the job's averaged gradients to the option's global norm where theirs is
        larger (Keras' global_clipnorm; apex FusedLAMB's max_grad_norm, deepcam's reference).
        An fp16 overflow is already on the scaler's record (unscale_ found it): the step is skipped."""
        if self.max_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)

    def undone_warm_up(self, batches) -> None:
        """Set-up before the clock, like MLPerf's init phase: real steps on `batches`
        (the allocator's first growth; DDP's buckets and the first all-reduces where the job
        has 2 or more ranks), then every
        state the step writes put back (weights, batch-norm statistics, the optimizer's
        slots, the loss scale, the step number, the random generators dropout draws
        from): the timed epochs then train from exactly the state a run without warm-up
        would start from."""
        cuda = self.dev.type == "cuda"
        saved = self.snapshot()
        for x, y in batches:
            t0 = time.perf_counter()
            loss = self(x, y)
            if loss is not None:    # a pipeline's stages but the last return none
                float(loss)         # waits for the step
            if cuda:
                torch.cuda.synchronize(self.dev)   # a middle stage's too (outside the clock)
            self.warm_up_step = max(self.warm_up_step, time.perf_counter() - t0)
        self.restore(saved)

    def snapshot(self, copied: bool = True) -> dict:
        """Every state a step writes, copied: the weights and batch-norm statistics, the
        optimizer's slots, the loss scale, the step number, the random generators dropout
        draws from (the undone warm-up's and a checkpoint's: Trainer.state, which
        serialises it at once and so takes it uncopied)."""
        cuda = self.dev.type == "cuda"
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "scaler": self.scaler and self.scaler.state_dict(), "taken": self.taken,
                 "rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state(self.dev) if cuda else None}
        return copy.deepcopy(state) if copied else state

    def restore(self, saved: dict) -> None:
        """snapshot()'s state back in place."""
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["optimizer"])
        if self.scaler is not None:
            self.scaler.load_state_dict(saved["scaler"])
        self.taken = saved["taken"]
        torch.set_rng_state(saved["rng"])
        if self.dev.type == "cuda":
            torch.cuda.set_rng_state(saved["cuda_rng"], self.dev)


class PipelineStep(Step):
    """The training step of one stage of a split model (line 37's model, pipeline, mixed):
    step(x, y) -> the pipeline batch's mean loss on the last stage, None on the others.
    The batch (first stage: inputs; last: targets; others: nothing) is cut into the mode's
    micro-batches on its schedule (torch.distributed.pipelining), forward under autocast
    (line 17), the loss in FP32 on the last stage; a stage's replicas (mixed) then average
    its gradients on their group in line 21's precision (communication.average: DDP's
    reducer under pipelining failed with as many micro-batches as stages), then the
    stage's optimizer. `busy` (pipeline.Busy) sums the stage's compute seconds and
    `seconds` the schedule's (the replicas' average and the update apart): the stage's
    idle share is the rest."""

    def __init__(self, workload, module, model, recipe: train.Recipe, dev, schedule, split):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        self.module, self.model, self.dev, self.schedule, self.split = module, model, dev, schedule, split
        groups, mode = split.groups, split.mode
        self.part, self.comm_precision = split.part(model), recipe.comm_precision
        stage = PipelineStage(self.part, groups.stage, groups.stages, dev, group=groups.pipeline)
        self.clock = pipeline.clock(dev.type)
        self.busy = pipeline.Busy(stage, self.clock)
        order = ScheduleGPipe if mode.schedule == "gpipe" else Schedule1F1B
        self.pipe = order(stage, mode.microbatches, loss_fn=lambda out, y: module.loss(_fp32(out), y).mean())
        self.opt, self.config = make_optimizer(recipe.optimizer, self.part, schedule(0), workload.MOMENTUM,
                                               workload.OPTIMIZER_OPTIONS.get(recipe.optimizer, {}), module.L2)
        self.max_norm, self.amp, self.scaler = self.config.get("global_clipnorm", 0.0), AMP.get(recipe.precision), None
        self.taken, self.seconds, self.warm_up_step = 0, 0.0, 0.0

    def __call__(self, x, y):
        for group in self.opt.param_groups:
            group["lr"] = self.schedule(self.taken)
        self.taken += 1
        self.opt.zero_grad(set_to_none=True)
        groups, losses = self.split.groups, []
        t0 = self.clock.mark()    # the schedule's span: its chunks (busy) and its waits (idle)
        with torch.autocast(self.dev.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            if groups.first_stage:
                self.pipe.step(x)
            elif groups.last_stage:
                self.pipe.step(target=y, losses=losses)
            else:
                self.pipe.step()
        t1 = self.clock.mark()
        self.busy.read()          # once a step: on a GPU the one wait, for the stage's last chunk
        self.seconds += self.clock.seconds(t0, t1)
        if groups.replicas > 1:   # mixed: the stage's gradients averaged over its replicas, once a step
            communication.average([p.grad for p in self.part.parameters() if p.grad is not None],
                                  self.comm_precision, groups.replicas_group)
        self.clip()
        self.opt.step()
        return torch.stack(losses).mean().detach() if losses else None

    def clip(self) -> None:
        """The workload's global clipping (deepcam's LAMB) of the whole model's gradients:
        each stage's squared norm summed over its pipeline (a stage's replicas hold the
        same averaged gradients), every stage scaled by one factor, as clip_grad_norm_
        scales the unsplit model's."""
        if not self.max_norm:
            return
        grads = [p.grad for p in self.part.parameters() if p.grad is not None]
        total = torch.stack([g.double().pow(2).sum() for g in grads]).sum() if grads else torch.zeros(
            (), dtype=torch.float64, device=self.dev)
        dist.all_reduce(total, group=self.split.groups.pipeline)
        factor = self.max_norm / (float(total.sqrt()) + 1e-6)     # clip_grad_norm_'s epsilon
        if factor < 1:
            torch._foreach_mul_(grads, factor)

    def undone_warm_up(self, batches) -> None:
        super().undone_warm_up(batches)
        self.seconds = self.busy.seconds = 0.0     # the timed steps' alone


def _ddp(model, dev, comm_precision: str):
    """`model` in DistributedDataParallel on the job's group, with line 21's communication
    hook: fp16 casts the gradients to FP16 for the all-reduce and back; int8 is
    harness/frameworks/pytorch/communication.py's."""
    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if comm_precision == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif comm_precision == "int8":
        ddp.register_comm_hook(None, communication.int8_hook)
    return ddp


def _fp32(out):
    """A model's outputs in FP32 (a tensor, or a dict of them: ewa's detector)."""
    return {k: v.float() for k, v in out.items()} if isinstance(out, dict) else out.float()


def _root_buffers(model, dist) -> None:
    """The job root's batch-norm statistics on every rank: DDP averages gradients only,
    and each replica's own forward pass moves its statistics."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def class_probabilities(model, inputs, classes: int) -> np.ndarray:
    """Softmax of the model's logits, in FP32, over the batches `inputs` (tensors on the
    model's device), in eval mode: what a classifier's predict() returns."""
    out = outputs(model, inputs, lambda logits: torch.softmax(logits.float(), dim=1))
    return out if len(out) else np.zeros((0, classes), np.float32)


def outputs(model, inputs, post=lambda out: out.float()) -> np.ndarray:
    """`post` of the model's outputs (FP32 by default) over the batches `inputs`, in eval
    mode and without gradients, concatenated on the host (an empty array where `inputs`
    is): the one loop of every workload's predict()."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = [post(model(x)).cpu().numpy() for x in inputs]
    finally:
        model.train(was)
    return np.concatenate(out) if out else np.zeros((0,), np.float32)
