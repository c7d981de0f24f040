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
communication: the TensorFlow functions' twins); `int8_hook` adds torch.distributed's two
collectives around them, on the job's process group (the default group of the job's
ranks, harness/frameworks/pytorch/distributed.py).
"""
import torch
import torch.distributed as dist

from harness.communication import LEVELS


def maxima(grads) -> torch.Tensor:
    """(tensors,) FP32: max |g| of each tensor, +inf where one is not finite (a Max keeps
    an inf, which dequantised_mean turns into NaN on every rank)."""
    return torch.stack([torch.where(torch.isfinite(g).all(), g.detach().abs().max().float(),
                                    torch.tensor(float("inf"), device=g.device)) for g in grads])


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


def int8_hook(group, bucket) -> torch.futures.Future[torch.Tensor]:   # DDP checks this annotation: no
    # `from __future__ import annotations` in this module, which would make it a string
    """DDP's communication hook for one bucket (register_comm_hook(group, int8_hook)):
    the bucket's gradients replaced by the job's int8-exchanged average."""
    grads = bucket.gradients()
    m = maxima(grads)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = scales(m)
    mine = torch.cat([quantise(g, s[i]).flatten() for i, g in enumerate(grads)])
    ranks = dist.get_world_size(group)
    gathered = [torch.empty_like(mine) for _ in range(ranks)]
    dist.all_gather(gathered, mine, group=group)
    rows, at, means = torch.stack(gathered), 0, []
    for i, g in enumerate(grads):   # the buffer is the gradients flattened in this order
        means.append(dequantised_mean(rows[:, at:at + g.numel()], s[i], ranks))
        at += g.numel()
    buffer = bucket.buffer()
    buffer.copy_(torch.cat(means).to(buffer.dtype))
    done = torch.futures.Future()
    done.set_result(buffer)      # DDP writes the future's tensor back into the gradients
    return done
