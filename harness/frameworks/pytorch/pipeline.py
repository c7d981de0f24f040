"""Line 37's model, pipeline and mixed modes in PyTorch (issue 35): a base model cut into
stages on torch.distributed.pipelining, PyTorch's maintained pipeline machinery.

The model is a chain of blocks (`chain`: an nn.Sequential's children, or the workload
module's own `chain(model)`); `blocks` profiles it on the meta device (each block's Table 3
FLOPs by harness/frameworks/pytorch/flops.walk, its weights and output elements), and
harness/parallelism.stages cuts it where the costliest stage costs least. Every rank of
a job builds the whole model from the job's seed (the same initial weights as data
parallelism) and trains the blocks of its stage: job rank r is stage r // R, replica
r % R (parallelism.py). A pipeline's stages meet on a process group of their own; a
stage's replicas (mixed) average their gradients on another, once a step after the
schedule (harness/frameworks/pytorch/communication.average).

train.PipelineStep is one training step of a stage: the pipeline batch (B x S samples) cut into m
micro-batches on the schedule of line 37 (ScheduleGPipe, Schedule1F1B; model = one
micro-batch), the loss on the last stage (the workload's per-sample loss, its mean over
the micro-batch; the schedule divides the gradients by m: the mean over the pipeline's
batch), then the stage's optimizer. It times its stage's forward and backward chunks,
so that each stage's idle share (the bubble, and the waits for its neighbours) is
measured, not assumed.

MPI nowhere: the job's process group (distributed.job_group) is the default group here.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from harness import flops as rules
from harness import parallelism
from harness.frameworks.pytorch import distributed, flops


def chain(module, model: nn.Module) -> list[nn.Module]:
    """The model's blocks in order, whose composition is the model's forward pass."""
    if module.chain is not None:
        return list(module.chain(model))
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"{type(model).__name__} is not an nn.Sequential and its workload gives no chain()")
    return list(model.children())


def blocks(module, data) -> list[parallelism.Block]:
    """The chain of the model `module` builds for `data`, profiled on the meta device (no
    memory, no arithmetic, no draw from the random generators): each block's forward
    FLOPs (Table 3, one sample), weights and output elements."""
    with torch.device("meta"):
        links = chain(module, module.build_model(data))
        seq = nn.Sequential(*links)
        outs = [0] * len(links)

        def keep(k):
            return lambda _m, _i, out: outs.__setitem__(k, sum(t.numel() for t in flops.tensors(out)))
        hooks = [b.register_forward_hook(keep(k)) for k, b in enumerate(links)]
        try:
            records, _ = flops.walk(seq, module.sample(data))
        finally:
            for h in hooks:
                h.remove()
    per = [[] for _ in links]
    for r in records:    # the walk names each record by its module: "k" or "k.child..." for block k
        per[int(r["layer"].split(".")[0])].append(r)
    return [parallelism.Block(f"{k} {type(b).__name__}", sum(rules.by_operator(per[k]).values()), flops.weights(b),
                              outs[k], sum(p.numel() for p in b.parameters() if p.requires_grad))
            for k, b in enumerate(links)]


class Groups:
    """COLLECTIVE over the job's default group: the process groups of a job of S stages x
    R replicas (every rank makes every group, in one order, as torch.distributed needs):
    `pipeline`, this rank's pipeline (its replica's S stages, stage order = group rank
    order); `replicas_group`, its stage's R replicas (None when R = 1); `stage`, `replica`,
    `stages`, `replicas` its place and the counts."""

    def __init__(self, r: parallelism.Resolved):
        rank = dist.get_rank()
        S, R = r.stages, r.replicas
        self.stage, self.replica, self.stages, self.replicas = rank // R, rank % R, S, R
        # the job's group's set-up timeout (NCCL's subgroups would take 10 minutes); the timed epochs' is
        # a step's (train.Trainer.warm_up)
        pipes = [dist.new_group([s * R + k for s in range(S)], timeout=distributed.TIMEOUT) for k in range(R)]
        reps = ([dist.new_group([s * R + k for k in range(R)], timeout=distributed.TIMEOUT) for s in range(S)]
                if R > 1 else [None] * S)
        self.pipeline, self.replicas_group = pipes[self.replica], reps[self.stage]
        self.last = (S - 1) * R + self.replica     # the job rank of this pipeline's last stage
        self.owner = lambda s: s * R               # the job rank whose copy of stage s is the model's

    @property
    def first_stage(self) -> bool:
        return self.stage == 0

    @property
    def last_stage(self) -> bool:
        return self.stage == self.stages - 1


class WallClock:
    """A CPU's clock for the chunks (perf_counter): CPU operators return when done, so a
    mark after a call is its end."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class EventClock:
    """A GPU's clock for the chunks: CUDA events recorded on the stage's stream (the
    current one), so that a chunk's time is its kernels' on the device and the host waits
    for nothing while the schedule runs; read once a step (EventClock.seconds syncs on the
    end event, which the step's last read makes complete). Synchronising the whole device
    around each chunk, as this did before (issue 67, item 10), also waited for the
    point-to-point transfers on NCCL's streams: the split modes paid for transfers that
    overlap compute."""

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0    # elapsed_time is in ms


def clock(device_type: str):
    """The chunks' clock on a device of `device_type`: CUDA events on a GPU, perf_counter elsewhere."""
    return EventClock() if device_type == "cuda" else WallClock()


class Busy:
    """Seconds a PipelineStage spends computing its chunks (forward and backward), summed:
    the rest of a step is its idle share (the schedule's bubble, the waits for its
    neighbours' activations and gradients). Each chunk is marked at its start and end on
    `clock` (clock(device type)); the marks are read into `seconds` once a step (`read`,
    train.PipelineStep), so that on a GPU no chunk waits for the device."""

    def __init__(self, stage, clock):
        self.seconds, self.clock, self.marks = 0.0, clock, []
        for name in ("forward_one_chunk", "backward_one_chunk"):
            setattr(stage, name, self._timed(getattr(stage, name)))

    def _timed(self, call):
        def timed(*args, **kwargs):
            start = self.clock.mark()
            try:
                return call(*args, **kwargs)
            finally:
                self.marks.append((start, self.clock.mark()))
        return timed

    def read(self) -> None:
        """The step's chunks added to `seconds`, in the order they ran."""
        for start, end in self.marks:
            self.seconds += self.clock.seconds(start, end)
        self.marks = []


class _DenseGradient(torch.autograd.Function):
    """The identity, whose backward hands the gradient on contiguous."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class Part(nn.Sequential):
    """A stage's blocks in turn; what crosses to a neighbour stage dense (contiguous): a
    point-to-point send and its receive buffer need one, and a channels-last model's
    convolutions (models.channels_last_on: every 2-D model on a GPU, digits on CPUs) hand
    back strided tensors, forward (its outputs) and backward (its inputs' gradients, which
    go back to the previous stage: pipelining lays the receive buffer out as the gradient
    is, and Gloo's irecv refused a channels-last one)."""

    def forward(self, *args):
        args = tuple(_DenseGradient.apply(a) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)
        out = args[0] if len(args) == 1 else args
        for block in self:
            out = block(out)
        return out.contiguous() if isinstance(out, torch.Tensor) else tuple(t.contiguous() for t in out)


class Split:
    """A job's model cut into stages, as this rank holds it: the groups (COLLECTIVE: made
    here), the stages of the FLOP-balanced cut (the same on every rank: profiled from the
    workload's module alone), this rank's part of the model."""

    def __init__(self, module, data, r: parallelism.Resolved):
        self.module, self.mode = module, r
        chain = blocks(module, data)
        self.stages = parallelism.stages(chain, r.stages)
        self.trainable = sum(b.trainable for b in chain)    # the model's gradients, what data parallelism averages
        self.groups = Groups(r)

    @property
    def reads(self) -> bool:
        """Whether this rank reads training batches: a pipeline's first stage (its inputs)
        and last (its targets)."""
        return self.groups.first_stage or self.groups.last_stage

    def _links(self, model, stage: int) -> list[nn.Module]:
        s = self.stages[stage]
        return chain(self.module, model)[s.first:s.last + 1]

    def part(self, model) -> "Part":
        """This rank's stage of `model`: its blocks (the model's own modules, so that
        training the part trains the model)."""
        return Part(*self._links(model, self.groups.stage))

    def assemble(self, model) -> None:
        """COLLECTIVE over the job: every rank's `model` made the trained one, each stage's
        weights and buffers broadcast from its owner (replica 0), so that any rank can
        predict with the whole model (the evaluation's rows are split over the job's
        ranks as in data parallelism) and the digests compare whole models."""
        for k in range(len(self.stages)):
            for link in self._links(model, k):
                for t in [*link.parameters(), *link.buffers()]:
                    dist.broadcast(t.data, src=self.groups.owner(k))

    def replica_diff(self, model) -> float:
        """COLLECTIVE over the job: the largest difference between this rank's stage and its
        owner's copy (mixed: the replicas a stage's all-reduce keeps equal); 0.0 with one
        replica a stage, which has nothing to disagree with."""
        if self.groups.replicas == 1:
            return 0.0
        mine = torch.cat([p.detach().double().flatten() for p in self.part(model).parameters()])
        root = mine.clone()
        dist.broadcast(root, src=self.groups.owner(self.groups.stage), group=self.groups.replicas_group)
        return float((mine - root).abs().max()) if mine.numel() else 0.0

    def epoch_loss(self, losses: list, device) -> float:
        """COLLECTIVE over this rank's pipeline: the mean of an epoch's losses, which only
        the last stage computes, on every stage of the pipeline."""
        mean = float(torch.stack(losses).double().mean()) if self.groups.last_stage else 0.0
        value = torch.tensor([mean], dtype=torch.float64, device=device)
        dist.broadcast(value, src=self.groups.last, group=self.groups.pipeline)
        return float(value)
