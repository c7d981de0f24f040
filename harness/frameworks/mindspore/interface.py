"""MindSpore's interface: MindSpore behind the framework interface (harness/frameworks.Framework): each
job's gradients averaged over the job's MPI communicator (communication.py; facts.py says
why not MindSpore's own communication), the base model trained in graph mode (train.py),
the workloads' models one module each (models.py), Table 3 cell by cell (flops.py), the
roofline micro-kernels (kernels.py). Imports MindSpore, never TensorFlow, Horovod or PyTorch.
"""
from __future__ import annotations

import os
import platform

from harness.frameworks.mindspore import facts

# Before MindSpore (and its oneDNN) is imported, in MindSpore's runs only: the ISA cap and the
# dispatch from the calling thread (facts.ISA_CAP and facts.DISPATCH say why)
os.environ.update(facts.before_import(os.environ, platform.machine()))

import mindspore as ms  # noqa: E402

from harness import communication  # noqa: E402
from harness.frameworks.mindspore import flops, kernels, models, train  # noqa: E402

NAME = facts.NAME


def setup_devices(local_rank: int, sharing: int) -> dict:
    return train.setup_devices(local_rank, sharing)


def software() -> dict:
    return {"mindspore": ms.__version__, "mindspore_device": "CPU"}


def roofline(precision: str, quick: bool) -> dict:
    return kernels.roofline(precision, quick=quick)


def open_job(spec) -> "Job":
    return Job(spec)


class Job:
    """One job of MindSpore training: its MPI communicator is its group (nothing to form)."""

    def __init__(self, spec):
        self.spec = spec

    def build(self, workload, data, seed: int, job: int, precision: str):
        return train.build(workload, data, seed, job, precision)

    def train(self, workload, data, model, indices, recipe, **hooks):
        return train.train_base_model(workload, data, model, indices, recipe, comm=self.spec.comm, **hooks)

    def predict(self, workload, model, data, rows):
        return models.get(workload.NAME).predict(model, data, rows)

    def count(self, workload, model, data):
        return flops.count_built(models.get(workload.NAME), data)

    def exchange(self) -> str:
        spec = self.spec
        return communication.exchange(spec.comm_precision, spec.allreduce, spec.comm.size, None, "MPI", facts.RING)

    def close(self) -> None:
        pass   # no group of MindSpore's own: the job's communicator is the driver's

    def abandon(self) -> None:
        """The job lost a rank (harness/elastic.py): nothing of MindSpore's to leave."""
