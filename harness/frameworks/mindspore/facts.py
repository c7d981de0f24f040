"""MindSpore's facts: what the benchmark's core asks of this framework, in plain Python.
Importing this module imports no MindSpore: the registry (harness/frameworks/__init__.py)
reads it on every rank, and --check and --verify on nodes without MindSpore. Each member
is one of the registry's `Facts`; the core reads them there and never names the framework
itself.

How a job's ranks train together here, and why: MindSpore forms its communication group
from a cluster of its own (a scheduler process and MS_ROLE workers, what msrun starts);
tried under mpirun, a cluster per job formed, but `mindspore.communication.init()` cannot
run a second time in one process (its second call fails, then segfaults), so a rank could
not re-form its group for the next test's layout, and `create_group` is not supported on
CPUs (MindSpore's documentation, r2.2 to r2.5). So each job averages its gradients over
the job's own MPI communicator (mpi4py, host memory), once a step, as Horovod does on
CPUs: a job is exactly its ranks, in every test of a sweep.
"""
from __future__ import annotations

from harness import communication, workloads

NAME = "mindspore"      # line 35's keyword
TITLE = "MindSpore"     # in the report's sentences
CODE = "MS"             # T/V code
MEANING = "MindSpore with each job's gradients averaged over its MPI communicator"
REQUIRES = (("mindspore", "mindspore (requirements-mindspore.txt)"),)
# Its venv of its own, beside hpcai500.py (MindSpore 2.10 needs protobuf >= 7.34, TensorFlow 2.18 < 6: the
# Makefile's `make venv VENV=.venv-mindspore FRAMEWORKS=mindspore`); a refusal says to run with its python
VENV = ".venv-mindspore"
# The environment variables only MindSpore reads: a run without it leaves them out of its record
OWN_VARIABLES = ("MS_", "GLOG_")
ENVIRONMENT = {}   # nothing to set for every framework before any is imported (before_import: MindSpore's runs alone)
# oneDNN, MindSpore's CPU kernels, capped at AVX2 on x86-64 where the user has not capped it
# (interface.py sets it before MindSpore is imported, so in MindSpore's runs only): MindSpore 2.10's
# oneDNN 3.10 runs MindSpore's convolutions (plain NCHW tensors) on an AVX-512 CPU through
# jit_uni_ncsp with a reference kernel inside (ONEDNN_VERBOSE: "jit_uni_ncsp:conv+ref:any"). Measured
# 2026-11-28 on an AMD EPYC with AVX-512 (Zen 5), one thread: a 64-channel 3 x 3 convolution at 56 x 56,
# batch 8, 1.0 GFLOPS, 66 under AVX2 (oneDNN's gemm convolution; PyTorch's oneDNN on that CPU: 137);
# the shipped digits sweep's step 27 x faster; a 1024 matrix product 151 GFLOPS, 88 under AVX2. Every
# model MindSpore builds here is convolutional. PyTorch's and TensorFlow's oneDNN pick fast kernels on
# that CPU: the cap is not theirs (ENVIRONMENT would set it for every framework).
ISA_CAP = ("ONEDNN_MAX_CPU_ISA", "AVX2")
ISA_NAMES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")   # oneDNN reads either (DNNL_: its older name)
# MindSpore's operators dispatched from the calling thread, where the user has not chosen (set
# before MindSpore is imported, in its runs only, as ISA_CAP). By default a PyNative operator, and
# a mindspore.jit graph's launch, goes through queues served by threads of MindSpore's own that
# wait spinning (perf: 47 % of a rank's samples in runtime::AsyncRQueue::Wait, with sched_yield),
# on the cores the kernels need. Measured 2026-11-29 on a 2-vCPU Intel Xeon (AVX-512, under
# ISA_CAP), samples/s of one rank's training step, the default against this: CosmoFlow's CNN
# (width 8, 32^3, B 4) bound to one core 5.0 against 39 (the update in the step's graph; 31 against
# 38 outside it), on both cores 23 against 41; digits (B 32) bound 2800 against 3600, on both
# cores 1800 against 2700. MindSpore's own documentation names it (1: "single-threaded dispatch").
DISPATCH = ("MS_DEV_HOST_BLOCKING_RUN", "1")
REFUSES = {
    ("allreduce", "hierarchical"): "a MindSpore job averages over its MPI communicator in one all-reduce;"
                                   " use ring",
    ("allreduce", "adasum"): "Adasum is Horovod's; a MindSpore job averages",
    ("allreduce", "torus"): "the 2D torus is built on Horovod's process sets; not in MindSpore",
    ("compiler", "xla"): "XLA is TensorFlow's compiler; MindSpore compiles its own graphs (mindspore.jit)",
    ("compiler", "inductor"): "torch.compile (TorchInductor) is PyTorch's compiler; MindSpore compiles its own"
                              " graphs (mindspore.jit)",
    ("precision", "bf16"): "MindSpore 2.10's CPU kernels refuse BF16 (its mixed precision's step fails with a"
                           " TypeError); use fp16"}
NO_PIPELINE = ("MindSpore's pipeline parallelism is its auto-parallel on its own cluster, not wired from MPI"
               " here; PyTorch's torch.distributed.pipelining carries the model, pipeline and mixed modes:"
               " name pytorch on line 35")
# The workloads whose model is built in MindSpore (harness/frameworks/mindspore/models.py, one module each)
BUILT = ("digits", "ic", "cosmoflow", "deepcam", "ewa")
SPLIT = ()
RING = "all-reduce over MPI, host memory"   # line 22's ring in a job's Exchange line
FEED = "on the host between steps (the workloads' numpy batches, channels first)"
WARM_UP = "MindSpore's graph compilation (mindspore.jit) and the first MPI exchange"
COMPILERS = {}     # line 33: none; its graph mode is how it always runs
NO_COMPILER = "graph mode, mindspore.jit of the forward and backward pass"
# Its PyPI wheel is its CPU build: a GPU node's GPUs stay idle (no set-up warning), and its exchange runs on
# the host over MPI (its set-up record's "nccl" is False: ranks may share a device)
USES_GPUS = False
KEEPS_GPU_MEMORY = False   # it trains on CPUs here


def isa_cap(environ, machine: str) -> dict[str, str]:
    """The variable to set before MindSpore is imported: ISA_CAP on x86-64 (`machine`:
    platform.machine()), nothing where the user has set either of ISA_NAMES or oneDNN's
    ISAs are not x86's. Pure."""
    if machine.lower() not in ("x86_64", "amd64") or any(n in environ for n in ISA_NAMES):
        return {}
    return dict([ISA_CAP])


def before_import(environ, machine: str) -> dict[str, str]:
    """Every variable to set before MindSpore is imported, where the user has set none of
    its names: isa_cap's and DISPATCH. Pure."""
    return {**isa_cap(environ, machine), **({} if DISPATCH[0] in environ else dict([DISPATCH]))}


def isa_lines(environment: dict) -> list[str]:
    """The report's line on the oneDNN ISA MindSpore ran with: the value in force on rank 0
    (results.json: environment.library_settings; the LIB ENV lines), and why the harness caps it."""
    settings = environment.get("library_settings", {})
    named = [f"{n}={settings[n]}" for n in ISA_NAMES if n in settings]
    why = (f"the harness sets {ISA_CAP[0]}={ISA_CAP[1]} on x86-64 where neither is set: oneDNN 3.10 runs"
           " MindSpore's NCHW convolutions on AVX-512 CPUs through a reference kernel (1.0 against 66 GFLOPS"
           " under AVX2, a 3 x 3 convolution of 64 channels at 56 x 56, AMD EPYC Zen 5), while AVX2 costs its"
           " matrix products (151 against 88 GFLOPS at 1024); set either to choose another ISA:"
           " harness/frameworks/mindspore/facts.py")
    in_force = ", ".join(named) if named else "neither set, oneDNN's own choice of ISA"
    return [f"MindSpore's CPU kernels (oneDNN): {in_force} ({why})"]


def dispatch_lines(environment: dict) -> list[str]:
    """The report's line on how MindSpore dispatched its operators: DISPATCH's variable as in
    force on rank 0 (results.json: environment.library_settings), and why the harness sets it."""
    name, value = DISPATCH
    found = environment.get("library_settings", {}).get(name)
    how = ("one thread, the caller's" if found == value else "MindSpore's dispatch threads" if found is None
           else "as MindSpore reads that value")
    in_force = f"{name}={found}" if found is not None else f"{name} not set"
    return [f"MindSpore's operator dispatch: {in_force}, {how} (the harness sets {name}={value} where it is not"
            " set: MindSpore's dispatch threads wait spinning on the cores its kernels need, CosmoFlow's step"
            " 5.0 against 39 samples/s on one core; set it to choose: harness/frameworks/mindspore/facts.py)"]


def compiler_missing(compiler: str, environ) -> str | None:
    """Line 33's compilers are all refused in MindSpore (REFUSES): nothing to find."""
    return None


def carriers(allreduce: str) -> set[str]:
    """What carries a job's gradients: the job's MPI communicator."""
    return {"MPI"}


# From results schema 2.16 MindSpore builds ewa, and its conventions say how that model steps
EWA_STATED = (2, 16)


def option_lines(cfg, schema: tuple[int, int]) -> list[str]:
    """What the Table 2 choices of this input mean in MindSpore, stated in the report (as
    results schema `schema` stated them)."""
    lines = ["MindSpore: graph mode; each step's forward and backward pass one mindspore.jit graph, on the CPU"
             " (device_target CPU); each job's gradients averaged over the job's MPI communicator (mpi4py,"
             " host memory: flattened into one buffer, one all-reduce a step, divided by P) before the"
             " optimizer, not by MindSpore's own communication (its cluster cannot be formed twice in one"
             " process: harness/frameworks/mindspore/facts.py); the job's ranks start from the root's weights"
             " (an MPI broadcast); the optimizers are mindspore.nn's with Keras' defaults (Adam's epsilon"
             " 1e-7, AdaGrad's initial accumulator 0.1, MindSpore's AdaGrad has no epsilon; SGD's momentum"
             " applied as v = m v + g); weight decay on kernels only (never biases or batch norm)"]
    if "ewa" in cfg.workloads and schema >= EWA_STATED:
        lines.append("ewa in MindSpore: eager steps (PyNative), not one mindspore.jit graph: the proposals (decode,"
                     " top-k, greedy NMS) and the loss's matching and sampling run on the host in numpy inside the"
                     " forward pass (harness/frameworks/mindspore/ewa.py); the gradient flows through the RPN's and"
                     " the head's outputs and the ROI crop (mindspore.ops.grid_sample) into the backbone, as in the"
                     " other two frameworks; under fp16 the RPN's and the head's output layers and the ROI crop"
                     " compute in FP32, as Keras' float32 layers (MindSpore 2.10's CPU grid_sample does not finish"
                     " in FP16)")
    if "fp16" in cfg.precisions:
        lines.append("Mixed precision in MindSpore (fp16): mindspore.amp's O2, as Keras' mixed_float16 (every cell"
                     " computes in FP16 but batch norm, FP32 master weights, the output and the loss in FP32); a"
                     " dynamic loss scale on the job's averaged gradients (2^15 to start, halved and the step skipped"
                     " where they are not finite, doubled after 2000 finite steps: Keras' rule); FLOPs counted as"
                     " for fp32")
    if cfg.comm_precision == "fp16":
        lines.append("Communication fp16 in MindSpore: the flattened gradients cast to FP16 for the MPI all-reduce,"
                     " summed in FP16 on the wire, back to FP32 after")
    if cfg.comm_precision == "int8":
        lines.append("Communication int8 in MindSpore, over MPI on the host (harness/frameworks/mindspore/"
                     "communication.py): " + communication.INT8)
    # Adam is AdamW where a workload's own options decouple its weight decay (train.make_optimizer)
    for name in cfg.workloads if cfg.optimizer == "adam" else ():
        decay = workloads.get(name).OPTIMIZER_OPTIONS.get("adam", {}).get("weight_decay")
        if decay:   # written 1e-2, as README writes deepcam's
            lines.append(f"Optimizer adam in MindSpore for {name}: AdamW (its decoupled weight decay"
                         f" {f'{decay:.0e}'.replace('e-0', 'e-')} on the"
                         " kernels), harness/frameworks/mindspore/optimizers.py, torch.optim.AdamW's rule, eagerly"
                         " tensor by tensor (MindSpore's AdamWeightDecay has no bias correction)")
    if cfg.optimizer in ("lars", "lamb"):
        lines.append(f"Optimizer {cfg.optimizer} in MindSpore: harness/frameworks/mindspore/optimizers.py, the rule"
                     " of harness/optimizers.py (every framework's), the same exclusions, eagerly tensor by tensor;"
                     " a workload's global gradient clipping on the job's averaged gradients")
    return lines


def conventions(cfg, environment: dict, schema: tuple[int, int]) -> list[str]:
    """The report's lines on how MindSpore trains this input, as results schema `schema`
    states them, then the oneDNN ISA and the dispatch it ran with (from the run's environment)."""
    return option_lines(cfg, schema) + isa_lines(environment) + dispatch_lines(environment)


def stated(cfg, schema: tuple[int, int]) -> list[list[str]]:
    """For --verify: the lines of `conventions` that follow from the input alone (not the
    ISA line: it follows from the run's environment, which --verify prints, not re-derives)."""
    return [option_lines(cfg, schema)]
