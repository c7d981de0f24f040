"""The training frameworks, one package each behind one interface (issue 34).

Table 2 of HPC AI500 V3.0 lets a user choose the framework: TensorFlow by default, PyTorch
beside it (lines 34-35 of the input file, a sweep like the workloads). This module is
the registry: CHOICES (the input file's keywords, their T/V codes and meanings), what
each framework needs installed (`missing`, found without importing anything, so that
`--check` refuses the input before any rank imports a framework), which workloads and
Table 2 choices it carries (`builds`, UNSUPPORTED: harness/plan.py refuses the rest on
their line), the interface every framework's package gives (`Framework`) and `get`,
which imports one. No framework is imported by this file.

Each package holds everything its framework trains with, the workloads' models included
(one module a workload, behind <name>/models.py's interface), while harness/workloads/
holds each workload's data, numpy feed and quality once for both. PyTorch trains the
workloads of pytorch/models.BUILT (all five). TensorFlow's package holds its training
step, optimizers, int8/torus ops, Keras walker and the workloads' Keras models, losses,
tf.data feeds and predictions; its roofline micro-kernels stay in the top-level kernels/
(the benchmark's own folder, with its command line), which its interface reaches. No
module outside harness/frameworks/tensorflow/ imports TensorFlow or Horovod, none outside
harness/frameworks/pytorch/ torch.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from typing import Protocol

from harness import workloads
from harness.frameworks.pytorch import models as pytorch_models   # plain Python: torch is not imported

# Line 35's choices: name -> (T/V code, meaning). TensorFlow's code is empty, so that the
# T/V codes of every run from before the framework line read as they did.
CHOICES = {"tensorflow": ("", "TensorFlow 2 (tf.keras) with Horovod for the gradient exchange"),
           "pytorch": ("PT", "PyTorch with torch.distributed (DistributedDataParallel)")}

# What each framework's training imports: name -> (module, the pip requirement that brings it).
REQUIRES = {"tensorflow": (("tensorflow", "tensorflow (requirements.txt)"),
                           ("horovod", "horovod (requirements.txt, built by make venv)")),
            "pytorch": (("torch", "torch (requirements-pytorch.txt)"),)}

# The environment variables only a framework's own libraries read (settings.LIBRARY_PREFIXES
# holds them with the shared ones: NCCL_, OMP_, ...): a run without that framework imports
# none of them, so they cannot change its figures and its record leaves them out
# (hpcai500.py and `make` set TF_USE_LEGACY_KERAS and TF_CPP_MIN_LOG_LEVEL for every run).
OWN_VARIABLES = {"tensorflow": ("TF_", "XLA_", "HOROVOD_"), "pytorch": ("TORCH", "PYTORCH_")}


def unread_variables(names) -> tuple[str, ...]:
    """The prefixes of OWN_VARIABLES of the frameworks not in `names` (line 35's)."""
    return tuple(p for name, prefixes in OWN_VARIABLES.items() if name not in names for p in prefixes)


# The Table 2 choices a framework cannot carry (yet): framework -> {(Config field, value): why}.
# harness/plan.py refuses them on their line, with the reason.
UNSUPPORTED = {"pytorch": {
    ("allreduce", "hierarchical"): "torch.distributed has no hierarchical mode of its own (NCCL picks its"
                                   " algorithm inside a node); use ring",
    ("allreduce", "adasum"): "Adasum is Horovod's; PyTorch's DDP averages",
    ("allreduce", "torus"): "the 2D torus is built on Horovod's process sets; not yet in PyTorch",
    ("compiler", "xla"): "XLA is TensorFlow's compiler; PyTorch's (torch.compile) is line 33's inductor"},
    "tensorflow": {
    ("compiler", "inductor"): "torch.compile (TorchInductor) is PyTorch's compiler; TensorFlow's is line 33's xla"}}


# Why a framework cannot cut any model into stages (line 37's model, pipeline and mixed modes).
NO_PIPELINE = {"tensorflow": "TensorFlow 2 has no pipeline-parallel machinery (a home-made one would be a toy);"
                             " PyTorch's torch.distributed.pipelining carries the model, pipeline and mixed modes:"
                             " name pytorch on line 35"}
# Why a workload's model cannot be cut into stages.
UNSPLIT = {"ewa": "ewa's Faster-RCNN is not a chain of layers: the RPN's proposals and the backbone's features"
                  " meet again in the ROI head, with the proposals' NMS on the host between them"}


def split_problem(framework: str, workload: str) -> str | None:
    """Why `workload`'s model cannot train cut into stages in `framework`, or None (the
    framework's reason first: NO_PIPELINE; then the workload's)."""
    if framework in NO_PIPELINE:
        return NO_PIPELINE[framework]
    if workload in UNSPLIT:
        return UNSPLIT[workload]
    if workload not in pytorch_models.SPLIT:
        return (f"{workload}'s PyTorch model is not yet cut into stages (cut so far:"
                f" {', '.join(pytorch_models.SPLIT) or 'none'})")
    return None


def builds(framework: str, workload: str) -> bool:
    """Whether `workload`'s model is built in `framework` (TensorFlow: every workload)."""
    return framework == "tensorflow" or workload in pytorch_models.BUILT


def missing(name: str) -> list[str]:
    """The requirements of framework `name` that this Python cannot import (found
    without importing them: importlib's finder only), e.g. ['torch (requirements-
    pytorch.txt)']; [] where it can run."""
    return [need for module, need in REQUIRES[name] if importlib.util.find_spec(module) is None]


def compiler_missing(framework: str, compiler: str, environ=None) -> str | None:
    """What line 33's compiler needs on this node that is not here, or None: torch.compile's
    TorchInductor builds its kernels with a C++ compiler (TorchInductor's own choice: $CXX,
    else g++), on GPU nodes too (its host-side code); found by PATH alone, nothing run."""
    if framework != "pytorch" or compiler != "inductor":
        return None
    environ = os.environ if environ is None else environ
    cxx = environ.get("CXX") or "g++"
    if shutil.which(cxx, path=environ.get("PATH")):
        return None
    return f"{cxx} (TorchInductor's C++ compiler: $CXX, else g++)"


def roofline_key(framework: str, precision: str) -> str:
    """The key of results.json's `roofline` (and the run's ceilings) for the micro-kernels
    of one framework in one precision: the precision alone for TensorFlow (as every run
    before the framework line keyed them), "pytorch/fp32" for another framework."""
    return precision if framework == "tensorflow" else f"{framework}/{precision}"


class Framework(Protocol):
    """What a framework's package provides in its interface module
    (harness/frameworks/<name>/interface.py): the seam between
    the benchmark and the library that trains. Everything else (input, plan, sampler,
    topology, staging, ensemble, metrics, results, report, verify, MLLOG, telemetry,
    driver) is written once, for every framework."""
    NAME: str

    def setup_devices(self, local_rank: int, sharing: int) -> dict:
        """Pin this rank (threads: harness/train.threads; a GPU: local_rank % GPUs) before
        the framework's runtime starts: {"threads", "inter_op", "device", "gpus_on_node"}."""

    def software(self) -> dict:
        """The framework's versions and build, for results.json's environment."""

    def conventions(self, cfg, environment: dict) -> list:
        """The report's lines on how this framework trains: its gradient exchange and the
        Table 2 options of the input as it carries them."""

    def roofline(self, precision: str, quick: bool) -> dict:
        """The GEMM, convolution and triad micro-kernels in this framework (kernels.roofline's dict)."""

    def blocks(self, workload, data) -> list:
        """Only a framework that cuts models (split_problem None for it): the model's chain
        of harness/parallelism.Block, for --check's stages (line 37)."""

    def open_job(self, part):
        """This rank's part of a job (harness/run.Part): the framework's group of the job's
        ranks (Horovod's world, a torch.distributed process group), and what trains on it: a
        `Job` with build(workload, data, seed, job, precision) -> model; train(workload, data,
        model, indices, recipe, **hooks) -> harness/train.TrainResult; predict(workload, model,
        data, rows) -> scores; count(workload, model, data) -> harness/flops.FlopCount;
        exchange() -> the gradient exchange in words (communication.exchange); close(); abandon():
        leave a group that lost a member without a collective (harness/elastic.py)."""


def get(name: str) -> Framework:
    """The interface of framework `name` (line 35), imported now: only the frameworks a
    run names are ever imported. Checked to give every member of `Framework` (`blocks` only
    where the framework cuts models: NO_PIPELINE does not name it), by the one check of
    every interface of modules (workloads.checked_module: TypeError naming what it lacks)."""
    if name not in CHOICES:
        raise KeyError(f"unknown framework {name!r} (built: {', '.join(CHOICES)})")
    required = tuple(m for m in workloads.required_members(Framework, {}) if m != "blocks" or name not in NO_PIPELINE)
    return workloads.checked_module(f"harness.frameworks.{name}.interface", required, {}, "the framework interface ")
