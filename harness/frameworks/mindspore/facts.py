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
REQUIRES = (("mindspore", "mindspore (requirements-mindspore.txt, a venv of its own: make venv"
                          " VENV=.venv-mindspore FRAMEWORKS=mindspore)"),)
# The environment variables only MindSpore reads: a run without it leaves them out of its record
OWN_VARIABLES = ("MS_", "GLOG_")
ENVIRONMENT = {}   # nothing to set before MindSpore is imported
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
BUILT = ("digits", "ic", "cosmoflow", "deepcam")
SPLIT = ()
RING = "all-reduce over MPI, host memory"   # line 22's ring in a job's Exchange line
FEED = "on the host between steps (the workloads' numpy batches, channels first)"
WARM_UP = "MindSpore's graph compilation (mindspore.jit) and the first MPI exchange"
COMPILERS = {}     # line 33: none; its graph mode is how it always runs
NO_COMPILER = "graph mode, mindspore.jit of the forward and backward pass"
# The exchange runs on the host over MPI: ranks may share a device
GPU_OF_ITS_OWN = False


def compiler_missing(compiler: str, environ) -> str | None:
    """Line 33's compilers are all refused in MindSpore (REFUSES): nothing to find."""
    return None


def carriers(allreduce: str) -> set[str]:
    """What carries a job's gradients: the job's MPI communicator."""
    return {"MPI"}


def option_lines(cfg) -> list[str]:
    """What the Table 2 choices of this input mean in MindSpore, stated in the report."""
    lines = ["MindSpore: graph mode; each step's forward and backward pass one mindspore.jit graph, on the CPU"
             " (device_target CPU); each job's gradients averaged over the job's MPI communicator (mpi4py,"
             " host memory: flattened into one buffer, one all-reduce a step, divided by P) before the"
             " optimizer, not by MindSpore's own communication (its cluster cannot be formed twice in one"
             " process: harness/frameworks/mindspore/facts.py); the job's ranks start from the root's weights"
             " (an MPI broadcast); the optimizers are mindspore.nn's with Keras' defaults (Adam's epsilon"
             " 1e-7, AdaGrad's initial accumulator 0.1, MindSpore's AdaGrad has no epsilon; SGD's momentum"
             " applied as v = m v + g); weight decay on kernels only (never biases or batch norm)"]
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
    """The report's lines on how MindSpore trains this input (the same in every schema)."""
    return option_lines(cfg)


def stated(cfg, schema: tuple[int, int]) -> list[list[str]]:
    """For --verify: the lines of `conventions`, which follow from the input alone."""
    return [option_lines(cfg)]
