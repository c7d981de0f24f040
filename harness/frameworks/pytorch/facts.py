"""PyTorch's facts: what the benchmark's core asks of this framework, in plain Python.
Importing this module imports no torch: the registry (harness/frameworks/__init__.py)
reads it on every rank, and --check and --verify on nodes without torch. Each member is
one of the registry's `Facts`; the core reads them there and never names the framework
itself.
"""
from __future__ import annotations

import shutil

from harness import communication

NAME = "pytorch"        # line 35's keyword
TITLE = "PyTorch"       # in the report's sentences
CODE = "PT"             # T/V code
MEANING = "PyTorch with torch.distributed (DistributedDataParallel)"
REQUIRES = (("torch", "torch (requirements-pytorch.txt)"),)   # (module, the pip requirement that brings it)
VENV = None   # installed in the main venv (make venv FRAMEWORKS=...)
# The environment variables only torch reads: a run without PyTorch leaves them out of its record
OWN_VARIABLES = ("TORCH", "PYTORCH_")
# Set where unset before torch is imported: NCCL's watchdog aborts a group's communicators
# at a timeout or an asynchronous error and leaves the process alive (CleanUpOnly), so that a
# lost rank fails its job's survivors' collective instead of hanging them or ending them
# (harness/frameworks/pytorch/distributed.py; torch's default, 3, ends the process)
ENVIRONMENT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
REFUSES = {
    ("allreduce", "hierarchical"): "torch.distributed has no hierarchical mode of its own (NCCL picks its"
                                   " algorithm inside a node); use ring",
    ("allreduce", "adasum"): "Adasum is Horovod's; PyTorch's DDP averages",
    ("allreduce", "torus"): "the 2D torus is built on Horovod's process sets; not yet in PyTorch",
    ("compiler", "xla"): "XLA is TensorFlow's compiler; PyTorch's (torch.compile) is line 33's inductor"}
NO_PIPELINE = None   # torch.distributed.pipelining cuts the models of SPLIT
# The workloads whose model is built in PyTorch (harness/frameworks/pytorch/models.py, one module each)
BUILT = ("digits", "ic", "cosmoflow", "deepcam", "ewa")
# Those whose PyTorch model is a chain of blocks that line 37's model, pipeline and mixed modes cut into stages
SPLIT = ("digits", "ic", "cosmoflow", "deepcam")
RING = "DDP all-reduce"   # line 22's ring in a job's Exchange line
FEED = ("in PyTorch on the rank's own threads, no DataLoader workers (ic: Pillow decodes in as many"
        " threads as the step has, that many batches ahead; the other workloads' batches are made"
        " between steps)")
WARM_UP = "PyTorch's first allocations and, in a job of 2 or more ranks, DDP's buckets"   # one rank: no DDP (train.Step)
# Line 33's compilers it offers, as the parameter block says them, and how it runs without one
COMPILERS = {"inductor": "torch.compile, TorchInductor (forward and backward pass)"}
NO_COMPILER = "eager"
# It computes on the node's GPUs where it sees some (a GPU node where it finds none is said at set-up).
# Whether its ranks need a GPU each is its set-up record's "nccl" (train.setup_devices; plan.shared_gpu_problem)
USES_GPUS = True
# Its caching allocator's blocks go back to the device after each job (interface.release_cached_memory)
KEEPS_GPU_MEMORY = False


def compiler_missing(compiler: str, environ) -> str | None:
    """What line 33's compiler needs on this node that is not here, or None: torch.compile's
    TorchInductor builds its kernels with a C++ compiler (TorchInductor's own choice: $CXX,
    else g++), on GPU nodes too (its host-side code); found by PATH alone, nothing run.
    `environ`: the node's environment (frameworks.compiler_missing gives os.environ's)."""
    if compiler != "inductor":
        return None
    cxx = environ.get("CXX") or "g++"
    if shutil.which(cxx, path=environ.get("PATH")):
        return None
    return f"{cxx} (TorchInductor's C++ compiler: $CXX, else g++)"


def carriers(allreduce: str) -> set[str]:
    """torch.distributed's backends that carry a job's gradients: Gloo on CPUs, NCCL on GPUs."""
    return {"Gloo", "NCCL"}


# The layout clause of the PyTorch line, by the results schema that wrote it (--verify
# reads a run against its own): 2.8 states the CPUs' layout (models.channels_last_on).
LAYOUT = {(2, 0): "on a GPU the models and their 4-D inputs are channels-last in memory (cuDNN's fast layout for"
                  " convolutions, as NVIDIA's PyTorch references train)",
          (2, 8): "on a GPU the 2-D models and their 4-D inputs are channels-last in memory (cuDNN's fast layout"
                  " for convolutions, as NVIDIA's PyTorch references train); on CPUs channels-first, but digits"
                  " channels-last (oneDNN trains its small convolutions faster so: bench/layout.py)"}

# A job's exchange as each results schema stated it: from 2.15 a job of one rank has no DDP (train.Step)
ALONE = {(2, 0): "", (2, 15): " (a job of one rank exchanges nothing: no DDP)"}
INDUCTOR_ALONE = {(2, 0): "", (2, 15): "; of the model itself in a job of one rank, which has no DDP"}


def _as_of(stated: dict, schema: tuple[int, int]) -> str:
    return stated[max(v for v in stated if v <= schema)]


def option_lines(cfg, schema: tuple[int, int]) -> list[str]:
    """What the Table 2 choices of this input mean in PyTorch, stated in the report (as
    results schema `schema` stated them)."""
    layout = _as_of(LAYOUT, schema)
    lines = ["PyTorch: each job's ranks are one torch.distributed process group (Gloo on CPUs, NCCL on GPUs), wired"
             " from MPI (the job root's TCPStore, its address broadcast over the job's communicator; no torchrun);"
             " DistributedDataParallel averages the gradients in buckets during the backward pass"
             f"{_as_of(ALONE, schema)}; the optimizers"
             " are torch.optim's with Keras' defaults (Adam's and AdaGrad's epsilon 1e-7, AdaGrad's initial"
             " accumulator 0.1; SGD's momentum applied as PyTorch does, v = m v + g); weight decay on kernels only"
             f" (never biases or batch norm); {layout}"]
    if set(cfg.precisions) - {"fp32"}:
        lines.append("Mixed precision in PyTorch (fp16, bf16): torch.autocast, FP32 master weights, the loss in FP32,"
                     " fp16 with a dynamic gradient scaler (torch.amp.GradScaler); FLOPs counted as for fp32")
    if cfg.comm_precision == "fp16":
        lines.append("Communication fp16 in PyTorch: DDP's fp16_compress_hook (gradients cast to FP16 for the"
                     " all-reduce, back to FP32 after)")
    if cfg.comm_precision == "int8":
        lines.append("Communication int8 in PyTorch, a DDP communication hook"
                     " (harness/frameworks/pytorch/communication.py): " + communication.INT8)
    if set(cfg.modes) - {"data"}:
        lines.append(MODES)
    if cfg.optimizer in ("lars", "lamb"):
        lines.append(f"Optimizer {cfg.optimizer} in PyTorch: harness/frameworks/pytorch/optimizers.py, TensorFlow's"
                     " update rule (harness/frameworks/tensorflow/optimizers.py) step for step, the same exclusions;"
                     " a workload's global gradient clipping by torch.nn.utils.clip_grad_norm_ on the job's averaged"
                     " gradients")
    if cfg.compiler == "inductor":
        lines.append("Compiler inductor: torch.compile of the DDP-wrapped model (TorchInductor: C++ on CPUs, Triton on"
                     f" GPUs{_as_of(INDUCTOR_ALONE, schema)}); forward and backward pass compiled, graphs split at"
                     " DDP's buckets so each bucket's all-reduce starts during the backward pass; loss, update and"
                     " evaluation run eagerly;"
                     " compilation happens in the warm-up, before the clock")
    return lines


MODES = ("Parallel modes in PyTorch (line 37): the model's chain of blocks cut into S consecutive stages"
         " where the costliest stage's Table 3 FLOPs are least; job rank r is stage r // R, replica r % R;"
         " torch.distributed.pipelining runs a pipeline's batch (B x S samples) in m micro-batches on"
         " 1F1B or GPipe (model: one), activations and their gradients point-to-point between stages, the"
         " loss the mean over the pipeline's batch; mixed: a stage's R replicas average its gradients"
         " (one all-reduce after the schedule, line 21's precision). The FLOPs are the whole model's"
         " (Eq. 6) x the samples trained, as for data parallelism. Idle: per stage, 1 - its forward and"
         " backward compute seconds / the seconds of its schedule's steps (the replicas' average and the"
         " update apart)"
         " (the bubble and the waits for its neighbours), mean over its ranks, beside the theory (S - 1) /"
         " (m + S - 1) for equal stages; bytes between stages: activations forward and gradients back,"
         " FP32, a pipeline a step; batch norm sees one micro-batch at a time; the evaluation predicts with"
         " the whole model, its stages assembled on every rank; replica consistency compares a stage's"
         " replicas (none to compare with one replica)")


def conventions(cfg, environment: dict, schema: tuple[int, int]) -> list[str]:
    """The report's lines on how PyTorch trains this input, as results schema `schema` states them,
    and how it ran on GPUs (gpu_lines: from results.json's environment)."""
    return [*option_lines(cfg, schema), *gpu_lines(environment)]


def _on(flag: bool) -> str:
    return "on" if flag else "off"


# What NCCL's watchdog does at a collective's timeout or error, by TORCH_NCCL_ASYNC_ERROR_HANDLING
ASYNC_ERRORS = {"0": "nothing: a lost rank hangs its job's survivors until the run's watchdog ends them",
                "1": "aborts the communicators and ends the process: a lost rank takes its job's survivors",
                "2": "aborts the communicators and keeps the process: a lost rank fails its job's survivors'"
                     " step, and they go on (--on-fault)",
                "3": "ends the process: a lost rank takes its job's survivors"}


def gpu_lines(environment: dict) -> list[str]:
    """The PyTorch GPU line: the torch.backends switches in force on world rank 0's GPU
    (results.json's environment.torch_math, harness/frameworks/pytorch/kernels.switched;
    schema 2.20), which the micro-kernels and training share, the feed, and what a lost rank
    does under NCCL (its TORCH_NCCL_ASYNC_ERROR_HANDLING, as library_settings recorded it);
    none on a CPU ({}) or for a run recorded before them (absent)."""
    math = environment.get("torch_math")
    if not math:
        return []
    errors = environment.get("library_settings", {}).get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")   # torch's default
    return [f"PyTorch on GPUs (torch.backends, set alike for the micro-kernels and every job): fp32 matmuls on TF32"
            f" tensor cores {_on(math['matmul_tf32'])}, fp32 cuDNN convolutions on TF32 {_on(math['conv_tf32'])}"
            " (TF32 needs Ampere or newer; NVIDIA_TF32_OVERRIDE=0 turns it off), cuDNN autotuning (cudnn.benchmark)"
            f" {_on(math['cudnn_benchmark'])}; the roofline's convolution runs channels-last, as the models train,"
            f" and its fp32 figures are held to the {'TF32' if math['tf32_peak'] else 'FP32'} peak; the training"
            " batches go host to device from pinned memory, non-blocking, each one's copies issued on a side stream"
            " before the step before it (within an epoch: harness/frameworks/pytorch/feed.py); bf16 tests are"
            " skipped on a GPU before Ampere; a job's NCCL collectives time out, from the timed epochs on, after a"
            " step's time (distributed.step_timeout: 4 x the slowest warm-up step, at least 2 min, at most half the"
            f" watchdog limit), when NCCL's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING={errors})"
            f" {ASYNC_ERRORS.get(errors, 'does what that value says')}"]


def stated(cfg, schema: tuple[int, int]) -> list[list[str]]:
    """For --verify: the lines of `conventions` that results schema `schema` stated."""
    return [option_lines(cfg, schema)]
