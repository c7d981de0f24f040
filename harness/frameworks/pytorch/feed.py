"""The training batches' way from the host to the device (issue 67, item 9).

On a GPU every batch went host to device with a plain `.to(device)`: a copy from pageable
memory, which the driver stages through a bounce buffer and the host waits for, issued
only when the step asks for the batch, so that the step's kernels waited for it (DeepCAM
moves 54 MiB a sample). Now, on a GPU only (`transfer`): each host array is copied into
page-locked (pinned) memory and sent with non_blocking=True, and the training feed issues
the next batch's copies on a side CUDA stream before the step runs on the current one
(`batches`: one batch ahead, within an epoch), so that the transfer overlaps the step; an
event a batch orders the step after its own batch's copy, and record_stream keeps the
allocator from reusing a batch's memory before the step is done with it. On CPUs nothing
changes: the same tensors, made when the step asks for them.

The batches and samples are the feed's, in its order: what is trained, and so the FLOPs
and samples counted, do not change; only when each copy is issued does. `transfer` and
`ahead` are pure; `to_device` and `batches` are the edges.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Transfer:
    """How a batch reaches a device."""
    pinned: bool         # copied into page-locked host memory first (a DMA the host need not wait for)
    non_blocking: bool   # the host-to-device copy queued, the host going on
    ahead: bool          # the next batch's copies issued on a side stream before the step (one batch ahead)


def transfer(device_type: str) -> Transfer:
    """The transfer to a device of `device_type`: pinned, non-blocking and one batch ahead to a
    GPU ("cuda"); a plain tensor elsewhere (a CPU's batch is the host array itself). Pure."""
    on = device_type == "cuda"
    return Transfer(pinned=on, non_blocking=on, ahead=on)


def to_device(array: np.ndarray, device) -> torch.Tensor:
    """A host array as a tensor on `device`, as `transfer` says (on a CPU: the array's own memory)."""
    device = torch.device(device)
    how = transfer(device.type)
    t = torch.from_numpy(array)
    if how.pinned:
        t = t.pin_memory()
    return t.to(device, non_blocking=how.non_blocking)


def ahead(items, load, every: int):
    """load(item) of each of `items`, yielded in order, the next item's load made before the
    current one is yielded (so that its copies are under way while the consumer's step runs),
    except after every `every`-th: an epoch's last batch, so that the next epoch is not read
    before this one's evaluation, nor at all by a run that stops there. Pure (`load` aside)."""
    end = object()
    it = iter(items)
    loaded, k = None, 0
    while True:
        if loaded is None:
            item = next(it, end)
            if item is end:
                return
            loaded = load(item)
        current, loaded, k = loaded, None, k + 1
        if k % every:
            item = next(it, end)
            if item is not end:
                loaded = load(item)
        yield current


def tensors(batch) -> list:
    """The tensors of a batch: a tensor, or tuples, lists and dicts of them (ewa's inputs)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        return [t for b in batch for t in tensors(b)]
    return []


def batches(pairs, load, steps: int, device: torch.device):
    """The step's batches: load(pair) of each host (x, y) pair of the feed (the workload
    module's inputs and targets on `device`). On a CPU made as the step asks for them, as
    before; on a GPU one batch ahead on a side stream (`transfer`), each ordered before its step."""
    if not transfer(device.type).ahead:
        return (load(p) for p in pairs)
    return _on_side_stream(pairs, load, steps, device)


def _on_side_stream(pairs, load, steps: int, device: torch.device):
    side, main = torch.cuda.Stream(device), torch.cuda.current_stream(device)

    def issued(pair):
        with torch.cuda.stream(side):
            batch = load(pair)
            done = torch.cuda.Event()
            done.record(side)
        return batch, done

    for batch, done in ahead(pairs, issued, steps):
        main.wait_event(done)            # the step's kernels wait for this batch's copies, not the next's
        for t in tensors(batch):
            t.record_stream(main)        # made on the side stream, used on the step's
        yield batch
