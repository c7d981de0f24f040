"""The training frameworks, one package each behind one interface (issues 34, 47).

Table 2 of HPC AI500 V3.0 lets a user choose the framework (lines 34-35 of the input
file, a sweep like the workloads). This module is the registry: REGISTERED, each
framework's facts (harness/frameworks/<name>/facts.py, plain Python: its keyword, T/V code,
requirements, the Table 2 choices it refuses and why, the workloads it builds and cuts into
stages, its report lines, the environment it needs before import; `Facts` names them all),
the rules the core derives from them (`missing`, found without importing anything, so that
`--check` refuses the input before any rank imports a framework; `builds`,
`split_problem`, `roofline_key`, ...), the interface every framework's package gives
(`Framework`) and `get`, which imports one. The core asks here and never compares a
framework's name (tests/test_structure.py keeps it so). No framework is imported by this file.

Each package holds everything its framework trains with, the workloads' models included
(one module a workload, behind <name>/models.py's interface), while harness/workloads/
holds each workload's data, numpy feed and quality once for every framework. TensorFlow's
package holds its training step, optimizers, int8/torus ops, Keras walker and the workloads'
Keras models, losses, tf.data feeds and predictions; its roofline micro-kernels stay in the
top-level kernels/ (the benchmark's own folder, with its command line), which its interface
reaches. No module outside harness/frameworks/tensorflow/ imports TensorFlow or Horovod,
none outside harness/frameworks/pytorch/ torch, none outside
harness/frameworks/mindspore/ MindSpore.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Protocol

from harness import workloads
from harness.frameworks.mindspore import facts as mindspore_facts
from harness.frameworks.pytorch import facts as pytorch_facts
from harness.frameworks.tensorflow import facts as tensorflow_facts


class Facts(Protocol):
    """What each framework's package states about itself in <name>/facts.py, plain Python
    (no framework imported): the core reads these and never names a framework."""
    NAME: str                   # line 35's keyword
    TITLE: str                  # its name in the report's sentences
    CODE: str                   # its T/V code
    MEANING: str                # line 35's choice in words
    REQUIRES: tuple             # ((module, the pip requirement that brings it), ...): what training imports
    VENV: object                # the venv of its own it runs from (a folder beside hpcai500.py), or None: the main one
    OWN_VARIABLES: tuple        # prefixes of the environment variables only its libraries read
    ENVIRONMENT: dict           # variables hpcai500.py sets (where unset) before any framework is imported
    REFUSES: dict               # {(Config field, value): why}: the Table 2 choices it cannot carry
    NO_PIPELINE: object         # why it cuts no model into stages (line 37), or None
    BUILT: tuple                # the workloads whose model it builds
    SPLIT: tuple                # those it cuts into stages
    RING: str                   # line 22's ring in a job's Exchange line
    FEED: str                   # where the workloads' feed runs (the conventions' Devices line)
    WARM_UP: str                # what its warm-up step takes out of the clock (the Warm-up line)
    USES_GPUS: bool             # computes on the node's GPUs where it sees some (False: a CPU build)
    KEEPS_GPU_MEMORY: bool      # its allocator keeps the GPU memory it grew to the process's end (nothing gives it back)
    COMPILERS: dict             # line 33's compilers it offers -> the parameter block's words
    NO_COMPILER: str            # how it runs a step without one (COMPILER : none (...))

    def compiler_missing(self, compiler: str, environ) -> str | None:
        """What line 33's compiler needs on this node that is not here (PATH only), or None."""

    def carriers(self, allreduce: str) -> set:
        """Every library that can carry a job's gradients (a job's Exchange line names one)."""

    def conventions(self, cfg, environment: dict, schema: tuple) -> list:
        """The report's lines on how it trains this input (results.json's environment: its
        build), as results schema `schema` (the run's) states them."""

    def stated(self, cfg, schema: tuple) -> list:
        """For --verify: the lines of conventions() that follow from the input alone, a list
        for each build they may have been stated for, as results schema `schema` stated them."""


# The registry: every framework's facts, line 35's keywords in this order. The first is the
# default: every run before line 35 trained it, so its T/V code is empty, its roofline keys
# bare and its scaling lines unnamed. A framework is one more package and one more entry here.
REGISTERED = tuple(workloads.checked_module(f.__name__, workloads.required_members(Facts, {}), {},
                                            "the framework facts ") for f in (tensorflow_facts, pytorch_facts,
                                                                                     mindspore_facts))
FACTS = {f.NAME: f for f in REGISTERED}
DEFAULT = REGISTERED[0].NAME
# Line 35's choices: name -> (T/V code, meaning)
CHOICES = {f.NAME: (f.CODE, f.MEANING) for f in REGISTERED}


def facts(name: str) -> Facts:
    """The facts of framework `name` (line 35's keyword)."""
    if name not in FACTS:
        raise KeyError(f"unknown framework {name!r} (built: {', '.join(FACTS)})")
    return FACTS[name]


def environment() -> dict:
    """The variables every framework sets before any is imported (hpcai500.py sets them where unset)."""
    return {k: v for f in REGISTERED for k, v in f.ENVIRONMENT.items()}


def own_variables() -> tuple[str, ...]:
    """The prefixes of every framework's OWN_VARIABLES (the libraries' variables a run records)."""
    return tuple(p for f in REGISTERED for p in f.OWN_VARIABLES)


def unread_variables(names) -> tuple[str, ...]:
    """The prefixes of the OWN_VARIABLES of the frameworks not in `names` (line 35's)."""
    return tuple(p for f in REGISTERED if f.NAME not in names for p in f.OWN_VARIABLES)


# Why a workload's model cannot be cut into stages in any framework.
UNSPLIT = {"ewa": "ewa's Faster-RCNN is not a chain of layers: the RPN's proposals and the backbone's features"
                  " meet again in the ROI head, with the proposals' NMS on the host between them"}


def split_problem(framework: str, workload: str) -> str | None:
    """Why `workload`'s model cannot train cut into stages in `framework`, or None (the
    framework's reason first: NO_PIPELINE; then the workload's)."""
    f = facts(framework)
    if f.NO_PIPELINE:
        return f.NO_PIPELINE
    if workload in UNSPLIT:
        return UNSPLIT[workload]
    if workload not in f.SPLIT:
        return (f"{workload}'s {f.TITLE} model is not yet cut into stages (cut so far:"
                f" {', '.join(f.SPLIT) or 'none'})")
    return None


def builds(framework: str, workload: str) -> bool:
    """Whether `workload`'s model is built in `framework`."""
    return workload in facts(framework).BUILT


def missing(name: str) -> list[str]:
    """The requirements of framework `name` that this Python cannot import (found
    without importing them: importlib's finder only), e.g. ['torch (requirements-
    pytorch.txt)']; [] where it can run."""
    return [need for module, need in facts(name).REQUIRES if importlib.util.find_spec(module) is None]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # where hpcai500.py is


def own_venv_hint(name: str, input_path: str, prefix: str | None = None, root: str | None = None) -> str | None:
    """For framework `name` that this Python (`prefix`: its sys.prefix) cannot import: where the
    framework has a venv of its own (VENV), what to do, or None where it has none (the main venv's
    frameworks: install their requirement). That venv built here (the Makefile's stamp, .installed:
    a venv still building has its bin/python already): run with its python; not built: build it,
    then so; this Python its own: build it again."""
    venv = facts(name).VENV
    if venv is None:
        return None
    place = os.path.join(ROOT if root is None else root, venv)
    build = f"make venv VENV={venv} FRAMEWORKS={name}"
    title = facts(name).TITLE
    if os.path.realpath(sys.prefix if prefix is None else prefix) == os.path.realpath(place):
        return f"this Python is {title}'s own venv, {place}, and lacks it: build it again, {build}"
    run = (f"run with its python (one rank: {place}/bin/python hpcai500.py {input_path}; N ranks, with its mpirun:"
           f" PATH={place}/bin:$PATH mpirun -np N python hpcai500.py {input_path})")
    if os.path.isfile(os.path.join(place, ".installed")):
        return f"{title} runs from a venv of its own, built here: {run}"
    return f"{title} runs from a venv of its own, not built here: {build}, then {run}"


def compiler_missing(framework: str, compiler: str, environ=None) -> str | None:
    """What line 33's compiler needs in `framework` on this node that is not here, or None
    (the framework's facts: found by PATH alone, nothing run)."""
    return facts(framework).compiler_missing(compiler, os.environ if environ is None else environ)


def compiler_words(compiler: str, names) -> str:
    """The parameter block's COMPILER value: line 33's compiler as the framework that
    offers it says it, or for none how each framework of `names` (line 35's) runs."""
    for f in REGISTERED:
        if compiler in f.COMPILERS:
            return f.COMPILERS[compiler]
    return f"none ({'; '.join(f'{facts(n).TITLE}: {facts(n).NO_COMPILER}' for n in names)})"


def roofline_key(framework: str, precision: str) -> str:
    """The key of results.json's `roofline` (and the run's ceilings) for the micro-kernels
    of one framework in one precision: the precision alone for the default framework (as
    every run before the framework line keyed them), "<framework>/<precision>" for another."""
    return precision if framework == DEFAULT else f"{framework}/{precision}"


@dataclass(frozen=True)
class JobSpec:
    """What a framework's Job is told of its job (Framework.open_job): its ranks, group,
    options and device; nothing of the run's internals."""
    comm: object                    # the job's MPI communicator (mpi4py): this rank's rank in it, the job's size
    ranks: tuple[int, ...]          # the job's ranks in the test's world, its root first
    node_of_rank: tuple[int, ...]   # the node index of each rank of the test's world (line 22's torus grid)
    comm_precision: str             # line 21
    allreduce: str                  # line 22
    mode: str                       # line 37, as written (harness/parallelism.py)
    P: int                          # the job's ranks as the test asks (line 11)
    batch: int                      # per-rank batch (line 14)
    gpus_on_node: int               # GPUs this rank's framework sees (0: CPUs only)
    watchdog: float = 0.0           # s: the run's watchdog limit (harness/watchdog.py; 0: off), which a
    #                                 framework's own collective timeouts must stay under


class Framework(Protocol):
    """What a framework's package provides in its interface module
    (harness/frameworks/<name>/interface.py): the seam between
    the benchmark and the library that trains. Everything else (input, plan, sampler,
    topology, staging, ensemble, metrics, results, report, verify, MLLOG, telemetry,
    driver) is written once, for every framework."""
    NAME: str

    def setup_devices(self, local_rank: int, sharing: int) -> dict:
        """Pin this rank (threads: harness/train.threads; a GPU: local_rank % GPUs it sees) before
        the framework's runtime starts: {"threads", "inter_op", "device" (in words),
        "gpus_on_node" (GPUs it sees), "gpu" (the GPU pinned: harness/gpus.pinned, or None),
        "nccl" (its jobs' GPU tensors go through NCCL on this build: a GPU each rank)}."""

    def software(self) -> dict:
        """The framework's versions and build, for results.json's environment."""

    def roofline(self, precision: str, quick: bool) -> dict:
        """The GEMM, convolution and triad micro-kernels in this framework (kernels.roofline's dict)."""

    def precision_problem(self, precision: str) -> str | None:
        """Optional (OPTIONAL: a framework that leaves it out refuses none): why this rank's
        device, as set up, cannot train line 17's `precision` (bf16 on a GPU without bf16
        tensor cores), or None; a test that needs it is skipped (plan.device_skipped)."""

    def blocks(self, workload, data) -> list:
        """Only a framework that cuts models (split_problem None for it): the model's chain
        of harness/parallelism.Block, for --check's stages (line 37)."""

    def open_job(self, spec: JobSpec):
        """This rank's part of a job (`spec`): the framework's group of the job's
        ranks (Horovod's world, a torch.distributed process group), and what trains on it: a
        `Job` with build(workload, data, seed, job, precision) -> model; train(workload, data,
        model, indices, recipe, **hooks) -> harness/train.TrainResult; predict(workload, model,
        data, rows) -> scores; count(workload, model, data) -> harness/flops.FlopCount;
        exchange() -> the gradient exchange in words (communication.exchange); close(); abandon():
        leave a group that lost a member without a collective (harness/elastic.py)."""


def get(name: str) -> Framework:
    """The interface of framework `name` (line 35), imported now: only the frameworks a
    run names are ever imported. Checked to give every member of `Framework` (`blocks` only
    where the framework cuts models: its NO_PIPELINE is None), by the one check of
    every interface of modules (workloads.checked_module: TypeError naming what it lacks)."""
    cuts = facts(name).NO_PIPELINE is None
    required = tuple(m for m in workloads.required_members(Framework, OPTIONAL) if m != "blocks" or cuts)
    return workloads.checked_module(f"harness.frameworks.{name}.interface", required, OPTIONAL,
                                    "the framework interface ")


def _no_problem(precision: str) -> None:
    return None


# The interface's optional members, and what stands in for one a framework leaves out
OPTIONAL = {"precision_problem": _no_problem}
