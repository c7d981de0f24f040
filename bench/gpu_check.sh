#!/usr/bin/env bash
# bench/gpu_check.sh: the benchmark's first meeting with a GPU (issue 34 item 10, issue 67 item 12), run
# from the source tree on a node that has PyTorch (one H100 or H200 or more, NGC-like images): what it
# can prove, each step timed, each failure reported and the next step run, the whole within BUDGET
# seconds (default 540: a 10-minute device lease with room to spare; a step that would start past it
# is skipped, said so).
#   bash bench/gpu_check.sh [OUT]      # OUT: a folder for the runs and gpu_check.txt (default $OUT or /tmp)
# Steps, with the figures expected on one H100 SXM (H200: the same but for memory):
#  (1) the node (GPUs, driver, PyTorch, CUDA, NCCL, mpi4py, h5py, NVML);
#  (2) mpirun: the python's own venv's (bin/ beside it), else PATH's, and a 2-rank launch that must
#      give one world of 2 (a PATH mpirun of another MPI starts two worlds of 1: the multi-rank steps
#      are then skipped, saying why);
#  (3) the GPU roofline in PyTorch (fp32 GEMM ~50 Tflops with TF32 off (peak 67), bf16 GEMM 600-800
#      (peak 989 dense), triad 2.5-3.0 TB/s (HBM3 3.35));
#  (4) the gradient exchanges on the GPU in a 1-rank NCCL group (line 21's fp16 and int8, the int8
#      hook's arithmetic on CUDA tensors): the average of one rank is its gradient, int8 within
#      scale/2 = max|g|/254 of it, fp16 within fp16's rounding;
#  (4b) the GPU pinned: the driver's PCI bus id and NVML's UUID as the harness records them equal
#      nvidia-smi's, whether CUDA_VISIBLE_DEVICES is unset or names the GPU by index or UUID; PyTorch's
#      math switches (TF32 matmul and conv, cudnn.benchmark) all on; bf16 no problem on Hopper;
#  (5) the shipped sweep in PyTorch on the GPU (digits: 1 rank; 2 ranks with mpirun: two base models
#      of one rank sharing the GPU), NVML energy and VFLOPS per watt in its report; --verify of each
#      run (exit 0);
#  (6) with 2 GPUs or more (and mpirun): P = 2 jobs on NCCL: line 21 fp32, fp16 and int8 (DDP's hooks:
#      Exchange says NCCL, --verify 0), a Horovod NCCL all-reduce of GPU tensors on 2 GPUs where
#      Horovod is installed, and one rank SIGKILLed under --on-fault drop (NCCL's error path: the run
#      ends well within the watchdog, never at NCCL's 30-minute timeout; --status 6); on one GPU
#      instead, a P = 2 test refused at set-up, naming the GPU;
#  (7) ResNet-50 v1.5 bf16 at 224 px in PyTorch (the ic workload), images/s against NVIDIA's published
#      2,470 a GPU (A100; the Pillow feed may bound it: the telemetry line says how busy the GPU was).
# Not built yet, said so when reached: the harness against a bare DDP loop (bench/peers.py's PyTorch
# cases). Where no GPU is found it says so and runs the same steps on the CPU (Gloo), so the script is
# checked wherever it runs. Needs Python with torch, numpy, mpi4py, h5py, psutil (nvidia-ml-py for
# energy, matplotlib for charts, mlperf-logging for --verify's MLLOG check: each one missing is named).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-${OUT:-/tmp}}/gpu_check
PY=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3 )}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.txt"
: > "$LOG"
say() { echo "gpu_check: $*" | tee -a "$LOG"; }
BUDGET=${BUDGET:-540}   # s for the whole script: a device lease's call is 10 minutes at most
step() {   # step NAME SECONDS CMD...: run with a time limit, its output to the log, its status said
    local name=$1 limit=$2; shift 2
    if (( SECONDS + 30 > BUDGET )); then say "== $name: skipped, ${SECONDS} s of the ${BUDGET} s budget spent"; return 124; fi
    (( SECONDS + limit > BUDGET )) && limit=$((BUDGET - SECONDS))
    local t0=$SECONDS
    say "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    say "   $name: exit $rc after $((SECONDS - t0)) s"
    return $rc
}
# PMIX_MCA_gds=hash: as the Makefile sets (PMIx 5.0.8's shared-memory job store sometimes fails a start)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 PMIX_MCA_gds=hash

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

# mpirun: the one beside the python (its venv's Open MPI, which mpi4py was built against), else PATH's;
# either must start one world of 2 ranks, or the multi-rank steps are skipped.
. bench/gpu_mpirun.sh
MPIRUN=$(pick_mpirun "$PY")
if [[ -n "$MPIRUN" ]] && step "mpirun $MPIRUN: one world of 2 ranks" 60 \
    bash -c '. bench/gpu_mpirun.sh && one_world "$@"' one_world "$MPIRUN" "$PY"; then
    say "mpirun: $MPIRUN"
else
    say "no mpirun that starts one world of 2 ranks for $PY (found: ${MPIRUN:-none}): the multi-rank steps are skipped"
    MPIRUN=
fi

step "roofline" 240 "$PY" - <<'EOF'
import sys
sys.path.insert(0, ".")
from harness.frameworks.pytorch import kernels
import os
for prec in ("fp32", "bf16", "fp16"):
    r = kernels.roofline(prec, quick=os.environ["QUICK"] == "1")
    print(f"{prec}: {r['device']}: GEMM {r['gemm']['flops'] / 1e12:.1f} Tflops, CONV {r['conv']['flops'] / 1e12:.1f}"
          f" Tflops, triad {r['stream']['bandwidth'] / 1e9:.0f} GB/s; peak {r['peak']}")
EOF

# Line 21's exchanges on the device, one rank: NCCL (Gloo on a CPU) in a group of 1, the arithmetic
# the int8 hook and a split stage's average run. Expected: fp32 exact, fp16 within 1e-3 of max|g|,
# int8 within max|g| / 254 of each tensor; a non-finite gradient makes its tensor NaN.
step "gradient exchanges on the device (fp32, fp16, int8)" 120 "$PY" - <<'EOF'
import os, sys, tempfile
sys.path.insert(0, ".")
import torch, torch.distributed as dist
from harness.frameworks.pytorch import communication
cuda = torch.cuda.is_available()
dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(0)
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
g = torch.Generator(device="cpu").manual_seed(1)
grads = [torch.randn(*s, generator=g).to(dev) for s in ((256, 128), (1000,), (3, 3, 64, 64))]
for prec in ("fp32", "fp16", "int8"):
    mine = [x.clone() for x in grads]
    communication.average(mine, prec, None)
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(mine, grads))
    bound = {"fp32": 0.0, "fp16": 1e-3, "int8": 1 / 254}[prec]
    print(f"{prec}: {dev}, worst |avg - g| / max|g| = {worst:.2e} (bound {bound:.2e}):"
          f" {'ok' if worst <= bound else 'WRONG'}")
    assert worst <= bound
bad = [grads[0].clone(), grads[1].clone()]
bad[1][0] = float("inf")
communication.average(bad, "int8", None)   # the scale is per tensor: the other stays finite
assert torch.isnan(bad[1]).all() and torch.isfinite(bad[0]).all(), "an inf must make its tensor NaN, only it"
print("int8: a non-finite gradient makes its tensor NaN (the fp16 scaler then skips the step): ok")
dist.destroy_process_group()
EOF

# The shipped sweep, framework pytorch, results under $OUT; roofline on (full sizes), 10 epochs.
sed -e "s#^runs          results#$(printf '%-13s' "$OUT/runs") results#" -e 's/^tensorflow    frameworks/pytorch       frameworks/' \
    HPCAI500.dat > "$OUT/pytorch.dat"
# The GPU each rank pins, as the harness records it (harness/gpus.py: the driver's PCI bus id, NVML's
# UUID), against nvidia-smi, with CUDA_VISIBLE_DEVICES unset and set to the same GPU by index and by
# UUID; PyTorch's math switches as set for the micro-kernels and every job; bf16 on this GPU.
# Expected on an H100: the same bus id and UUID each time, every switch True, bf16 no problem (None).
step "the GPU pinned (bus id, UUID) against nvidia-smi; PyTorch's switches; bf16" 120 "$PY" - <<'EOF'
import os, subprocess, sys
sys.path.insert(0, ".")
import torch
if not torch.cuda.is_available():
    print("no GPU: nothing to compare")
    raise SystemExit(0)
from harness import gpus
from harness.frameworks.pytorch import kernels
smi = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout
rows = [[x.strip() for x in line.split(",")] for line in smi.strip().splitlines()]
print("nvidia-smi:", rows)
first = rows[0]
for visible in (None, first[0], first[2]):   # unset, the index, the UUID: each names nvidia-smi's first GPU
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = ("import sys, json; sys.path.insert(0, '.'); from harness import gpus; print(json.dumps(gpus.pinned(0)))")
    rec = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    print(f"CUDA_VISIBLE_DEVICES={visible}: {rec.stdout.strip() or rec.stderr[-500:]}")
    import json
    got = json.loads(rec.stdout)
    assert got["bus_id"] == gpus.bus_id(first[1]), (got["bus_id"], first[1])
    assert got["uuid"] in (None, first[2]), (got["uuid"], first[2])
print("switches:", kernels.switched(torch.device("cuda", 0)))
print("bf16 problem:", kernels.precision_problem("bf16"))
EOF
step "shipped sweep, 1 rank" 180 "$PY" hpcai500.py "$OUT/pytorch.dat"
if [[ -n "$MPIRUN" ]]; then
    step "shipped sweep, 2 ranks (two base models sharing the GPU)" 180 "$MPIRUN" --oversubscribe -np 2 "$PY" hpcai500.py "$OUT/pytorch.dat"
fi

# P = 2 on NCCL (two GPUs: NCCL refuses two ranks of one communicator on one GPU; on a CPU node the
# same on Gloo, which checks the script). Digits, M = 1, roofline off,
# P = 2, 3 epochs, one test per line-21 precision; then rank 1 SIGKILLed by the fault injector at
# step 20 under drop: its partner must raise (NCCL's asynchronous error handling), not wait out the
# process group's timeout.
p2() {   # p2 NAME COMM_PRECISION: the P = 2 digits input, $OUT/p2-NAME.dat
    sed -e "s#^runs          results#$(printf '%-13s' "$OUT/p2-runs") results#" -e 's/^tensorflow    frameworks/pytorch       frameworks/' \
        -e '9s/^3 /1 /' -e '10s/^1 2 4       /1            /' -e '11s/^1 1 1       /2            /' \
        -e '15s/^10           /3            /' -e "21s/^fp32         /$(printf '%-13s' "$2")/" -e '30s/^1 /0 /' \
        HPCAI500.dat > "$OUT/p2-$1.dat"
}
if [[ -n "$MPIRUN" && ( "$GPUS" -ge 2 || "$GPUS" -eq 0 ) ]]; then   # no GPU: the same on Gloo, to check the script
    for prec in fp32 fp16 int8; do
        p2 "$prec" "$prec"
        step "P = 2 on NCCL, line 21 $prec" 150 "$MPIRUN" --oversubscribe -np 2 "$PY" hpcai500.py "$OUT/p2-$prec.dat"
    done
    grep -h "^Exchange" "$OUT"/p2-runs/2*/report.txt | tee -a "$LOG"
    if "$PY" -c "import horovod.torch as h; h.nccl_built()" >/dev/null 2>&1; then   # imports without its extension
        step "Horovod NCCL all-reduce of GPU tensors, 2 GPUs" 120 "$MPIRUN" -np 2 "$PY" - <<'EOF'
import horovod.torch as hvd, torch
hvd.init(); torch.cuda.set_device(hvd.local_rank())
x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
y = hvd.allreduce(x, op=hvd.Sum)
print(f"rank {hvd.rank()}: nccl_built {hvd.nccl_built()}, sum {float(y[0])} (expected 3.0)")
assert float(y[0]) == 3.0 and hvd.nccl_built()
EOF
    else
        say "no horovod.torch for this python: Horovod's NCCL all-reduce is not checked here (its TensorFlow build: make venv GPU=1 FRAMEWORKS=tensorflow)"
    fi
    p2 kill fp32
    t0=$SECONDS
    HPCAI500_FAULT=1:20:kill step "P = 2 on NCCL, rank 1 killed under --on-fault drop" 240 \
        "$MPIRUN" --oversubscribe -np 2 -x HPCAI500_FAULT "$PY" hpcai500.py --on-fault drop --watchdog 120 "$OUT/p2-kill.dat"
    say "   the kill's run ended after $((SECONDS - t0)) s (expected: well under the watchdog's 120 s)"
    "$PY" hpcai500.py --status "$OUT/p2-runs" | tee -a "$LOG"
elif [[ -n "$MPIRUN" ]]; then
    # one GPU: NCCL refuses two ranks of one communicator on it, so the run must refuse the P = 2 test at
    # set-up, naming the GPU (plan.shared_gpu_problem), not crash in its first all-reduce
    p2 refused fp32
    step "P = 2 on one GPU: refused at set-up, naming the GPU" 120 bash -c \
        '! "$@" > "$0" 2>&1 && grep "expected each rank of a PyTorch job on a GPU of its own" "$0"' \
        "$OUT/p2-refused.log" "$MPIRUN" --oversubscribe -np 2 "$PY" hpcai500.py "$OUT/p2-refused.dat"
    say "P = 2 on NCCL, Horovod's NCCL all-reduce, a rank killed under NCCL: skipped, $GPUS GPU (NCCL needs a GPU a rank)"
fi
for run in "$OUT"/runs/2* "$OUT"/p2-runs/2*; do
    [[ -d "$run" ]] || continue
    step "verify $(basename "$run")" 120 "$PY" hpcai500.py --verify "$run"
    grep -h -E "^(B32|Telemetry|Utilisation|Exchange|Replica)" "$run/report.txt" | tee -a "$LOG"
done

# ResNet-50 v1.5 in bf16 at 224 px (the ic workload in PyTorch), one base model on one GPU: synthetic
# ImageNet-layout JPEG shards (written once, 1,920 images: 1,536 training), batch 128, 4 epochs, no
# evaluation before the end, roofline off (it ran above). Images/s = samples trained / training seconds
# of results.json (the timed epochs only; MLPerf's measure). NVIDIA's published A100 figure for this
# model in PyTorch with AMP: 2,470 images/s a GPU. The feed decodes JPEGs with Pillow in the rank's
# threads: if the GPU waits for it, the figure is the feed's, and the telemetry lines say how busy
# the GPU was.
IC_SAMPLES=1920; IC_SIDE=224; IC_B=128; [[ "$QUICK" == 1 ]] && { IC_SAMPLES=80; IC_SIDE=32; IC_B=16; }
sed -e "s#^runs          results#$(printf '%-13s' "$OUT/ic-runs") results#" -e 's/^tensorflow    frameworks/pytorch       frameworks/' \
    -e "7s/^digits       /ic           /" -e "8s/^embedded     /$(printf '%-13s' "synthetic:$IC_SAMPLES:$IC_SIDE")/" \
    -e '9s/^3 /1 /' -e '10s/^1 2 4       /1            /' -e '11s/^1 1 1       /1            /' \
    -e "14s/^32           /$(printf '%-13s' $IC_B)/" -e '15s/^10           /4            /' -e '17s/^fp32         /bf16         /' \
    -e '30s/^1 /0 /' -e '31s/^1 /0 /' HPCAI500.dat > "$OUT/resnet50.dat"
[[ "$QUICK" == 1 ]] && export HPCAI500_IC_WIDTH=8 HPCAI500_IC_STAGES=1,1,1,1   # the CPU check: a small ResNet
step "ResNet-50 bf16 224 px, 1 GPU" 240 "$PY" hpcai500.py "$OUT/resnet50.dat"
unset HPCAI500_IC_WIDTH HPCAI500_IC_STAGES
for run in "$OUT"/ic-runs/2*; do
    [[ -d "$run" ]] || continue
    "$PY" - "$run/results.json" <<'EOF' | tee -a "$LOG"
import json, sys
t = json.load(open(sys.argv[1]))["tests"][0]
print(f"ResNet-50 ({t['precision']}, B {t['B']}, {t['framework']}): {t['samples_trained'] / t['train_seconds']:.0f}"
      f" images/s over {t['train_seconds']:.1f} s of training ({t['samples_trained']} images; goal 2,470 a GPU);"
      f" {t['flops'] / 1e12:.1f} TFLOPS by Table 3")
EOF
    step "verify $(basename "$run")" 120 "$PY" hpcai500.py --verify "$run"
done
say "not built yet (issue 34): the harness against a bare DDP loop (bench/peers.py's PyTorch cases)"
say "log: $LOG ($SECONDS s of the $BUDGET s budget)"
