"""Line 21's int8 gradient exchange in PyTorch: a DDP communication hook with the scheme of
harness/communication.py (its docstring has the reasoning and the bytes): per gradient
tensor, a scale the job's ranks agree on (max |g| over the ranks / 127, one Max all-reduce
of the bucket's per-tensor maxima), each rank's tensor rounded to int8, the int8 tensors
all-gathered (int8 cannot be summed on the wire without overflow), summed in FP32 on every
rank and divided by P: the job's ranks average their gradients, each element within
scale / 2 of the FP32 average. A gradient that is not finite on any rank makes every
element NaN on every rank (an infinite scale), as through the FP32 exchange, so that the
fp16 gradient scaler skips the step.

`maxima`, `scales`, `quantise` and `dequantised_mean` are the arithmetic (torch ops, no
communication: the TensorFlow functions' twins); `int8_average` adds torch.distributed's
two collectives around them, on a process group (the job's: the default group of the
job's ranks, harness/frameworks/pytorch/distributed.py; or a stage's replicas');
`int8_hook` is it as DDP's hook, `average` line 21's average of a split model's stage.
"""
import torch
import torch.distributed as dist

from harness.communication import LEVELS


def maxima(grads) -> torch.Tensor:
    """(tensors,) FP32: max |g| of each tensor, +inf where one is not finite (a Max keeps
    an inf, which dequantised_mean turns into NaN on every rank). All on the gradients'
    device: an inf is already inf after abs, a NaN propagates through amax and becomes inf
    here, with the inf a scalar argument of the kernel. (A torch.tensor(inf, device=...) a
    tensor, as this was, is a blocking host-to-device copy inside DDP's hook: ~160 a
    ResNet-50 step, issue 67.)"""
    inf = float("inf")
    return torch.stack([g.detach().abs().amax().float() for g in grads]).nan_to_num(nan=inf, posinf=inf)


def scales(m: torch.Tensor) -> torch.Tensor:
    """max / 127, and 1 where a tensor is zero on every rank (any scale quantises zeros)."""
    return torch.where(m > 0, m / LEVELS, torch.ones_like(m))


def quantise(g: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """round(g / scale) as int8, clipped to [-127, 127]; 0 where g / scale is not finite
    (an infinite scale: the NaN comes back through dequantised_mean)."""
    q = torch.round(g.detach().float() / scale)
    return torch.where(torch.isfinite(q), q.clamp(-LEVELS, LEVELS), torch.zeros_like(q)).to(torch.int8)


def dequantised_mean(gathered: torch.Tensor, scale: torch.Tensor, ranks: int) -> torch.Tensor:
    """The average of the ranks' int8 rows of `gathered` (ranks, n), summed in FP32 and
    scaled back; 0 x inf = NaN everywhere for an infinite scale."""
    return gathered.float().sum(0) * (scale / ranks)


def int8_average(grads, group) -> torch.Tensor:
    """COLLECTIVE over `group`: the group's int8-exchanged average of `grads`, flattened
    and concatenated in their order (FP32)."""
    m = maxima(grads)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = scales(m)
    mine = torch.cat([quantise(g, s[i]).flatten() for i, g in enumerate(grads)])
    ranks = dist.get_world_size(group)
    gathered = [torch.empty_like(mine) for _ in range(ranks)]
    dist.all_gather(gathered, mine, group=group)
    rows, at, means = torch.stack(gathered), 0, []
    for i, g in enumerate(grads):
        means.append(dequantised_mean(rows[:, at:at + g.numel()], s[i], ranks))
        at += g.numel()
    return torch.cat(means)


def int8_hook(group, bucket) -> torch.futures.Future[torch.Tensor]:   # DDP checks this annotation: no
    # `from __future__ import annotations` in this module, which would make it a string
    """DDP's communication hook for one bucket (register_comm_hook(group, int8_hook)):
    the bucket's gradients replaced by the job's int8-exchanged average."""
    buffer = bucket.buffer()     # the bucket's gradients flattened in their order
    buffer.copy_(int8_average(bucket.gradients(), group).to(buffer.dtype))
    done = torch.futures.Future()
    done.set_result(buffer)      # DDP writes the future's tensor back into the gradients
    return done


def average(grads, comm_precision: str, group) -> None:
    """COLLECTIVE over `group`: `grads` (tensors) replaced in place by the group's average,
    in line 21's precision: fp32 and fp16 one all-reduce of them flattened (fp16: cast for
    the wire, back after), int8 int8_average. A split model's replicas of a stage (line
    37's mixed) average so, once a step after the pipeline's schedule: DDP's reducer
    under torch.distributed.pipelining failed with as many micro-batches as stages."""
    if not grads:
        return
    if comm_precision == "int8":
        flat = int8_average(grads, group)
    else:
        flat = torch.cat([g.flatten() for g in grads])
        wire = flat.half() if comm_precision == "fp16" else flat
        dist.all_reduce(wire, group=group)
        flat = wire.to(flat.dtype) / dist.get_world_size(group)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
