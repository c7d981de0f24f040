"""TensorFlow's facts: what the benchmark's core asks of this framework, in plain Python.
Importing this module imports neither TensorFlow nor Horovod: the registry
(harness/frameworks/__init__.py) reads it on every rank, and --check and --verify on
nodes without either. Each member is one of the registry's `Facts`; the core reads them
there and never names the framework itself.
"""
from __future__ import annotations

from harness import communication, workloads
from harness.workloads import deepcam

NAME = "tensorflow"     # line 35's keyword
TITLE = "TensorFlow"    # in the report's sentences
CODE = ""               # T/V code: empty, so that the codes of runs from before line 35 read as they did
MEANING = "TensorFlow 2 (tf.keras) with Horovod for the gradient exchange"
# What training imports: (module, the pip requirement that brings it)
REQUIRES = (("tensorflow", "tensorflow (requirements.txt)"), ("horovod", "horovod (requirements.txt, built by make venv)"))
VENV = None   # installed in the main venv (make venv)
# The environment variables only TensorFlow, XLA and Horovod read: a run without TensorFlow
# cannot have its figures changed by them, and its record leaves them out
OWN_VARIABLES = ("TF_", "XLA_", "HOROVOD_")
# Set where unset by hpcai500.py before anything imports TensorFlow: the Keras 2 API (tf-keras)
# is the one Horovod's DistributedGradientTape and broadcast_variables work with; TF's C++
# start-up log quiet
ENVIRONMENT = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
# The Table 2 choices it cannot carry: (Config field, value) -> why (harness/plan.py refuses them on their line)
REFUSES = {("compiler", "inductor"): "torch.compile (TorchInductor) is PyTorch's compiler; TensorFlow's is line 33's"
                                     " xla"}
# Why it cuts no model into stages (line 37's model, pipeline and mixed modes); None where it can
NO_PIPELINE = ("TensorFlow 2 has no pipeline-parallel machinery (a home-made one would be a toy);"
               " PyTorch's torch.distributed.pipelining carries the model, pipeline and mixed modes:"
               " name pytorch on line 35")
BUILT = tuple(workloads.CHOICES)   # the workloads whose model it builds: every one
SPLIT = ()                         # those it cuts into stages
RING = "Horovod all-reduce"        # line 22's ring in a job's Exchange line
# Where the workloads' feed runs (the conventions' Devices line)
FEED = "in TensorFlow on tf.data's threads where the feed is a tf.data pipeline"
# What its warm-up step takes out of the clock (the conventions' Warm-up line)
WARM_UP = "TensorFlow's graph optimisation and XLA compilation, Horovod's first negotiation"
# Line 33's compilers it offers, as the parameter block says them, and how it runs without one
COMPILERS = {"xla": "XLA (forward and backward pass)"}
NO_COMPILER = "graph, tf.function"
# It computes on the node's GPUs where it sees some (a GPU node where it finds none is said at set-up).
# Whether its ranks need a GPU each is its set-up record's "nccl": Horovod built with NCCL (train.setup_devices;
# plan.shared_gpu_problem)
USES_GPUS = True
# Its allocator grows into the GPU (memory growth) and keeps what it grew to the process's end: no
# call gives it back (plan.gpu_memory_problem)
KEEPS_GPU_MEMORY = True


def compiler_missing(compiler: str, environ) -> str | None:
    """What line 33's compiler needs on this node that is not here: XLA comes inside TensorFlow."""
    return None


def library(allreduce: str, gpu: bool, nccl: bool, mpi: bool) -> str:
    """The library that carried a job's gradients, as Horovod reports its build: NCCL where
    the tensors live on a GPU and Horovod has NCCL (built with HOROVOD_GPU_OPERATIONS=NCCL:
    `make venv GPU=1`), NCCL within a node and MPI across for hierarchical and Adasum;
    otherwise Horovod's CPU path, MPI (Gloo where Horovod runs without MPI), and
    hierarchical is then Horovod's flat all-reduce."""
    cpu = "MPI" if mpi else "Gloo"
    if gpu and nccl:
        return f"NCCL within a node, {cpu} across" if allreduce in ("hierarchical", "adasum") else "NCCL"
    return f"{cpu} (flat: hierarchical needs NCCL)" if allreduce == "hierarchical" else cpu


def carriers(allreduce: str) -> set[str]:
    """Every library Horovod's build may report as carrying a job's gradients (`library`)."""
    return {library(allreduce, gpu, nccl, mpi) for gpu in (False, True) for nccl in (False, True)
            for mpi in (False, True)}


def build_line(build: dict) -> str:
    """Horovod's build as it reports it, and what it means for the gradients' carrier."""
    code = build["nccl"]
    nccl = f"NCCL {code // 10000}.{code // 100 % 100}.{code % 100}" if code else "no NCCL"
    ops = ", ".join(n for n, on in (("MPI", build["mpi"]), ("Gloo", build["gloo"])) if on)
    return (f"Horovod build: {ops}, {nccl}{', CUDA' if build['cuda'] else ''}: " +
            ("a GPU tensor's collectives go through NCCL, a CPU tensor's through " + ops if code else
             f"every collective goes through {ops} (GPU tensors by way of host memory unless the MPI is"
             " CUDA-aware; `make venv GPU=1` builds NCCL in)") + "; each test's Exchange line says what carried its jobs")


# From results schema 2.16 the conventions say where TensorFlow's DeepLabv3+ skips taps its count credits
TAPS_STATED = (2, 16)


def taps_line() -> str:
    """DeepCAM in TensorFlow: the dilated convolutions' taps that read only padding, left out of
    the computation (deeplab._atrous_conv2d) and counted (Table 3's arithmetic)."""
    rates = deepcam.ASPP_RATES[1:]
    side = deepcam.OUTPUT_STRIDE * max(rates)
    return (f"DeepCAM in TensorFlow: where a side of the encoder's map (the input / {deepcam.OUTPUT_STRIDE}) is no"
            f" longer than a dilation rate (the ASPP's {', '.join(map(str, rates))}: inputs of {side} px or less"
            " on a side), a dilated convolution leaves out the taps that can only read padding, with the same"
            " output and gradients (harness/frameworks/tensorflow/deeplab.py); the FLOPs count every tap (Table"
            " 3's arithmetic), so there TensorFlow is credited with multiplications by padding that it skips. At"
            " the reference's 768 x 1152 (a 48 x 72 map) every tap is computed")


def option_lines(cfg, nccl: bool, schema: tuple[int, int]) -> list[str]:
    """What the Table 2 choices of this input mean in TensorFlow with Horovod (`nccl`: its
    build has NCCL), stated in the report (as results schema `schema` stated them)."""
    lines = [taps_line()] if "deepcam" in cfg.workloads and schema >= TAPS_STATED else []
    if set(cfg.precisions) - {"fp32"}:
        lines.append("Mixed precision (fp16, bf16): Keras policy, FP32 master weights, logits/softmax/loss"
                     " in FP32, fp16 with dynamic loss scaling; FLOPs counted as for fp32")
    if cfg.comm_precision == "fp16":
        lines.append("Communication fp16: gradients cast to FP16 for the all-reduce (Horovod Compression.fp16)")
    if cfg.comm_precision == "int8":
        lines.append("Communication int8: " + communication.INT8 + " (harness/frameworks/tensorflow/communication.py)")
    if cfg.allreduce == "hierarchical":
        lines.append("All-reduce hierarchical: HOROVOD_HIERARCHICAL_ALLREDUCE=1; Horovod implements it with NCCL"
                     " (intra-node NCCL, inter-node MPI) " + ("and this build has NCCL" if nccl else
                     "and this build has none: its flat MPI all-reduce ran"))
    if cfg.allreduce == "torus":
        lines.append("All-reduce torus: the 2D-torus all-reduce (Mikami et al.) over an X x Y grid of each job's ranks,"
                     " on Horovod process sets: the gradients flattened into one buffer (padded to a multiple of X),"
                     " reduce-scatter along the row, all-reduce along the column, all-gather along the row, each an"
                     " average: the job's mean, as the ring's. Grid: a row is a node's ranks where the job has the"
                     " same number (2 or more) on each of 2 or more nodes, else the most-square X x Y = P (X >= Y)"
                     " over consecutive ranks; a prime P is one row (reduce-scatter and all-gather: the ring's two"
                     " halves). Each test's Exchange line gives the grids")
    if cfg.allreduce == "adasum":
        lines.append("All-reduce adasum: Horovod's Adasum (op=hvd.Adasum) combines the job's gradients by adaptive"
                     " summation instead of averaging them; the LR follows Horovod's convention: the base LR x 1"
                     " where MPI reduces on the CPU, x the ranks of a node with NCCL (train.lr_scale), not x P; P"
                     " must be a power of 2")
    if cfg.optimizer != "sgd":
        lines.append(f"Optimizer {cfg.optimizer}: see harness/frameworks/tensorflow/optimizers.py (LARS/LAMB"
                     " exclude rank <= 1 variables, i.e. biases and batch-norm, from trust ratio and weight decay)")
    if cfg.compiler == "xla":
        lines.append("Compiler xla: each step's forward and backward pass is one XLA cluster"
                     " (tf.function(jit_compile=True)); Horovod's all-reduce (no XLA kernel) and the update run"
                     " outside it; its compilation happens in the warm-up, before the clock")
    return lines


def conventions(cfg, environment: dict, schema: tuple[int, int]) -> list[str]:
    """The report's lines on how TensorFlow trains this input: Horovod's build (results.json's
    environment), then what the input's Table 2 choices mean with it, as results schema
    `schema` states them."""
    build = environment["horovod_build"]
    return [build_line(build), *option_lines(cfg, bool(build["nccl"]), schema)]


def stated(cfg, schema: tuple[int, int]) -> list[list[str]]:
    """For --verify: the lines of `conventions` that follow from the input alone, one list
    for each build they may have been stated for (with NCCL or without); results schema
    `schema` stated the same."""
    return [option_lines(cfg, nccl, schema) for nccl in (False, True)]
