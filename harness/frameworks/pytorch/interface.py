"""PyTorch's interface: PyTorch behind the framework interface (harness/frameworks.Framework): each job's
ranks a torch.distributed process group wired from MPI (distributed.py), the base model
trained through DistributedDataParallel (train.py), the workloads' models one module each
(models.py), Table 3 at the operator level (flops.py), the roofline micro-kernels
(kernels.py). Imports torch, never TensorFlow or Horovod.
"""
from __future__ import annotations

import gc
import os

import torch
# torch.optim imports torch._dynamo at a job's first optimizer and at every step (PyTorch 2.13): imported
# here, with torch, it loads while the driver holds the garbage collector off (driver._collector_off)
import torch._dynamo  # noqa: F401
import torch.distributed as dist

from harness import communication, parallelism
from harness.frameworks.pytorch import distributed, facts, flops, kernels, models, pipeline, train

NAME = facts.NAME


def setup_devices(local_rank: int, sharing: int) -> dict:
    return train.setup_devices(local_rank, sharing)


def software() -> dict:
    """Versions, and `torch_math`: the torch.backends switches in force on this rank's GPU
    and whether its fp32 figures are held to the TF32 peak ({} on a CPU: kernels.switched,
    kernels.peak_tf32), which change a GPU's figures (the report's PyTorch GPU line)."""
    switches = kernels.switched(train.device())
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "torch_nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "torch_gloo": bool(dist.is_gloo_available()),
            "torch_math": {**switches, "tf32_peak": kernels.peak_tf32(switches, os.environ)} if switches else {}}


def roofline(precision: str, quick: bool) -> dict:
    return kernels.roofline(precision, quick=quick)


def precision_problem(precision: str) -> str | None:
    return kernels.precision_problem(precision)


def blocks(workload, data) -> list:
    """The chain of blocks of `workload`'s model for `data` (line 37's split modes;
    pipeline.blocks: profiled on the meta device)."""
    return pipeline.blocks(models.get(workload.NAME), data)


def open_job(spec) -> "Job":
    return Job(spec)


class Job:
    """One job's process group (Gloo on CPUs, NCCL on GPUs) and what trains on it."""

    def __init__(self, spec):
        self.spec, self.device = spec, train.device()
        kernels.switched(self.device)   # the micro-kernels' switches (a run without them sets them here)
        self._group = distributed.job_group(spec.comm, "nccl" if self.device.type == "cuda" else "gloo")
        self.group = self._group.__enter__()

    def build(self, workload, data, seed: int, job: int, precision: str):
        return train.build(workload, data, seed, job, self.device)

    def train(self, workload, data, model, indices, recipe, **hooks):
        return train.train_base_model(workload, data, model, indices, recipe, comm=self.spec.comm, dev=self.device,
                                      watchdog=self.spec.watchdog, **hooks)

    def predict(self, workload, model, data, rows):
        return models.get(workload.NAME).predict(model, data, rows, self.device)

    def count(self, workload, model, data):
        return flops.count_built(models.get(workload.NAME), data)

    def exchange(self) -> str:
        spec = self.spec
        carrier = {"gloo": "Gloo", "nccl": "NCCL"}[self.group.backend]
        if spec.mode == "data":
            return communication.exchange(spec.comm_precision, spec.allreduce, spec.comm.size, None, carrier,
                                          facts.RING)
        r = parallelism.resolve(parallelism.parse(spec.mode), spec.P, spec.batch)
        return communication.split_exchange(spec.comm_precision, spec.allreduce, r.stages, r.replicas, carrier)

    def close(self) -> None:
        # the job's DDP wrappers and pipeline stages hold its process groups, whose Gloo threads
        # run until those objects go; a cycle would keep them to the interpreter's exit, where a
        # thread calling back into Python aborts the process: collected before the groups go
        gc.collect()
        self._group.__exit__(None, None, None)
        release_cached_memory(self.device)

    def abandon(self) -> None:
        """The job lost a rank (harness/elastic.py): the group goes without the barriers of
        close (a dead member would fail them), this process's alone: NCCL's communicators
        aborted, a Gloo group destroyed (distributed.leave)."""
        gc.collect()
        self._group.gen.close()   # the context manager's generator ends here, its barriers skipped
        distributed.leave(self.group.backend)


def release_cached_memory(device) -> None:
    """A job's GPU memory back to the device once it is closed: PyTorch's caching allocator
    keeps every block it freed for the next allocation, so the next test, or a test's next
    framework, would find the GPU full of this one's cache (issue 67 item 3). Nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
