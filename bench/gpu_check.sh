#!/usr/bin/env bash
# bench/gpu_check.sh: the benchmark's first meeting with a GPU (issue 34, item 10), run from the
# source tree on a node that has PyTorch and no TensorFlow or Horovod (one H100 or H200, NGC-like
# images): what it can prove today, each step timed, each failure reported and the next step run.
#   bash bench/gpu_check.sh [OUT]      # OUT: a folder for the runs and gpu_check.txt (default $OUT or /tmp)
# Steps: (1) what the node has (GPUs, driver, PyTorch, CUDA, NCCL, mpi4py, h5py, NVML); (2) the GPU
# roofline in PyTorch (GEMM, convolution, triad; fp32, bf16, fp16); (3) the shipped sweep in PyTorch
# on the GPU (digits: 1 rank; with mpirun, 2 ranks: two base models sharing one GPU), NVML energy
# and VFLOPS per watt in its report; (4) --verify of each run. Not built yet, said so when reached:
# ResNet-50 bf16 at 224 px in PyTorch (the ic workload's PyTorch model) and the harness against a
# bare DDP loop (bench/peers.py's PyTorch cases). Where no GPU is found it says so and runs the same
# steps on the CPU, so the script is checked wherever it runs. Needs Python with torch, numpy,
# mpi4py, h5py, psutil (nvidia-ml-py for energy, matplotlib for charts, mlperf-logging for --verify's
# MLLOG check: each one missing is named).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-${OUT:-/tmp}}/gpu_check
PY=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3 )}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.txt"
: > "$LOG"
say() { echo "gpu_check: $*" | tee -a "$LOG"; }
step() {   # step NAME SECONDS CMD...: run with a time limit, its output to the log, its status said
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    say "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    say "   $name: exit $rc after $((SECONDS - t0)) s"
    return $rc
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2

step "node" 120 "$PY" - <<'EOF'
import importlib.util, platform
print("python", platform.python_version())
for m in ("torch", "numpy", "mpi4py", "h5py", "psutil", "pynvml", "matplotlib", "mlperf_logging", "tensorflow",
          "horovod"):
    print(f"{m:15s}", "found" if importlib.util.find_spec(m) else "MISSING")
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("nccl", torch.cuda.nccl.version())
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
else:
    print("NO GPU FOUND: the steps below run on the CPU")
EOF
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
QUICK=0
if [[ "$GPUS" -gt 0 ]]; then say "GPUs: $GPUS"; else
    QUICK=1   # the micro-kernels at test sizes: the CPU run checks the script, not the machine
    say "no GPU found: every step below runs on the CPU, the micro-kernels at test sizes"; fi
export HPCAI500_ROOFLINE_QUICK=$QUICK QUICK

step "roofline" 300 "$PY" - <<'EOF'
import sys
sys.path.insert(0, ".")
from harness.frameworks.pytorch import kernels
import os
for prec in ("fp32", "bf16", "fp16"):
    r = kernels.roofline(prec, quick=os.environ["QUICK"] == "1")
    print(f"{prec}: {r['device']}: GEMM {r['gemm']['flops'] / 1e12:.1f} Tflops, CONV {r['conv']['flops'] / 1e12:.1f}"
          f" Tflops, triad {r['stream']['bandwidth'] / 1e9:.0f} GB/s; peak {r['peak']}")
EOF

# The shipped sweep, framework pytorch, results under $OUT; roofline on (full sizes), 10 epochs.
sed -e "s#^runs          results#$(printf '%-13s' "$OUT/runs") results#" -e 's/^tensorflow    frameworks/pytorch       frameworks/' \
    HPCAI500.dat > "$OUT/pytorch.dat"
MPIRUN=$(command -v mpirun || { [[ -x .venv/bin/mpirun ]] && echo .venv/bin/mpirun; } || true)
step "shipped sweep, 1 rank" 300 "$PY" hpcai500.py "$OUT/pytorch.dat"
if [[ -n "$MPIRUN" ]]; then
    step "shipped sweep, 2 ranks (two base models sharing the GPU)" 300 "$MPIRUN" --oversubscribe -np 2 "$PY" hpcai500.py "$OUT/pytorch.dat"
else
    say "no mpirun on PATH: the 2-rank run (two base models on one GPU) is skipped"
fi
for run in "$OUT"/runs/2*; do
    [[ -d "$run" ]] || continue
    step "verify $(basename "$run")" 120 "$PY" hpcai500.py --verify "$run"
    grep -h -E "^(B32|Telemetry|Utilisation|Exchange|Replica)" "$run/report.txt" | tee -a "$LOG"
done
say "not built yet (issue 34): ResNet-50 bf16 at 224 px in PyTorch; the harness against a bare DDP loop"
say "log: $LOG"
