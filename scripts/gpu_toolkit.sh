#!/bin/bash
# The CUDA toolkit and NCCL for `make venv GPU=1`: Horovod's build with HOROVOD_GPU_OPERATIONS=NCCL.
#   scripts/gpu_toolkit.sh VENV > VENV/horovod-gpu.env
# Run after TensorFlow (tensorflow[and-cuda]) is in VENV. Prints on stdout the shell `export` lines
# that Horovod's build reads (HOROVOD_CUDA_HOME, HOROVOD_NCCL_*, HOROVOD_BUILD_CUDA_CC_LIST, PATH);
# everything else goes to stderr. The Makefile sources that file for `pip install horovod` and
# keeps it in the venv as the record of how Horovod was built.
#
# Where the toolkit comes from: CUDA=auto (default) | site | pypi (environment; the Makefile passes
# its variable of that name).
#   site: $HOROVOD_CUDA_HOME, else $CUDA_HOME, else the toolkit of the `nvcc` on PATH (a module's).
#   pypi: NVIDIA's wheels installed into VENV/cuda-toolkit (build only: nothing imports it).
#   auto: site if one of those three is there, else pypi.
# NCCL: the site's where HOROVOD_NCCL_HOME (or HOROVOD_NCCL_INCLUDE + HOROVOD_NCCL_LIB, or NCCL_HOME)
# is set and CUDA is not pypi; else nvidia-nccl-cu12, the NCCL that tensorflow[and-cuda] installed
# (so the process has one NCCL, TensorFlow's).
# Architectures: HOROVOD_BUILD_CUDA_CC_LIST (Horovod's own variable, comma-separated, e.g. 80,90) is
# taken as given; unset, 70,80,90 (V100, A100, H100: SASS for each, PTX of the last for newer GPUs)
# trimmed to what this nvcc can build.
set -euo pipefail

# PyPI has no CUDA 12 compiler: the nvidia-cuda-nvcc-cu12 wheels (12.0 to 12.9, including the
# 12.5.82 that tensorflow[and-cuda]==2.18.1 pins for XLA) hold ptxas, libnvvm and headers, but no
# nvcc driver, cicc, cudafe++ or fatbinary. The CUDA 13 wheels are a whole compiler; 13.0 is the
# oldest, whose code asks the least of the driver (R580 or newer, as any CUDA 13). Only the kernels
# and the headers are CUDA 13: at run time Horovod calls the CUDA runtime that TensorFlow exports
# (libtensorflow_framework.so.2 carries the cuda* entry points, over nvidia-cuda-runtime-cu12's
# libcudart.so.12), and the runtime functions it calls have the same signatures in 12.5 and 13.0
# (cudaPointerAttributes grew in 13.0: the 12.5 runtime fills a prefix of Horovod's larger one).
PYPI_CUDA_TOOLKIT="cuda-toolkit[nvcc,crt,nvvm,cudart,cccl,nvtx]==13.0.2"
DEFAULT_CC_LIST=70,80,90

die() { echo "gpu_toolkit.sh: $*" >&2; exit 1; }
note() { echo "gpu_toolkit.sh: $*" >&2; }

[[ $# -eq 1 ]] || die "usage: scripts/gpu_toolkit.sh VENV"
VENV=$(realpath -m "$1")      # absolute: the paths below end up in Horovod's RPATH
PY=$VENV/bin/python
[[ -x $PY ]] || die "no $PY: create the venv and install requirements first"
MODE=${CUDA:-auto}
[[ $MODE =~ ^(auto|site|pypi)$ ]] || die "CUDA=$MODE: expected auto, site or pypi"

# nvcc's own idea of its toolkit root (TOP in its dry run): sees through wrapper scripts.
nvcc_top() {
    "$1" --dryrun -v -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | tail -n 1
}
nvcc_release() { "$1" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p'; }

# --- the toolkit ----------------------------------------------------------------------------
site_root=
if [[ $MODE != pypi ]]; then
    if [[ -n ${HOROVOD_CUDA_HOME:-} ]]; then site_root=$HOROVOD_CUDA_HOME; why="HOROVOD_CUDA_HOME"
    elif [[ -n ${CUDA_HOME:-} ]]; then site_root=$CUDA_HOME; why="CUDA_HOME"
    elif command -v nvcc >/dev/null; then
        site_root=$(nvcc_top "$(command -v nvcc)")
        why="nvcc on PATH ($(command -v nvcc))"
        [[ -n $site_root ]] || die "cannot tell the toolkit of $(command -v nvcc); set CUDA_HOME, or CUDA=pypi"
    fi
    [[ -n $site_root || $MODE == auto ]] || die "CUDA=site: set HOROVOD_CUDA_HOME or CUDA_HOME, or put nvcc on PATH"
fi

if [[ -n $site_root ]]; then
    CUDA_ROOT=$(realpath -e "$site_root" 2>/dev/null) || die "$why: $site_root does not exist"
    note "CUDA toolkit of the site: $CUDA_ROOT (from $why)"
    # What Horovod's CMake needs of it: bin/nvcc (HOROVOD_CUDA_HOME/bin/nvcc becomes the CUDA
    # compiler), include/cuda_runtime.h and a libcudart (its FindCUDAToolkit), and
    # libcudart_static.a (CMAKE_CUDA_RUNTIME_LIBRARY=Static, Horovod's default: CMake's test of
    # nvcc links with it, and so does Horovod beside a static NCCL).
    [[ -x $CUDA_ROOT/bin/nvcc ]] || die "no $CUDA_ROOT/bin/nvcc"
    [[ -f $CUDA_ROOT/include/cuda_runtime.h ]] || die "no $CUDA_ROOT/include/cuda_runtime.h"
    compgen -G "$CUDA_ROOT/lib*/libcudart_static.a" >/dev/null \
        || compgen -G "$CUDA_ROOT/targets/*/lib/libcudart_static.a" >/dev/null \
        || die "no libcudart_static.a under $CUDA_ROOT (lib64/, lib/ or targets/*/lib/)"
else
    TK=$VENV/cuda-toolkit
    CUDA_ROOT=$TK/nvidia/cu13
    # A separate --target directory, not site-packages: the CUDA 13 runtime must not sit where
    # TensorFlow or anything else imports or dlopens from; it is needed only to compile.
    if [[ ! -x $CUDA_ROOT/bin/nvcc ]] \
        || ! grep -qx "Version: ${PYPI_CUDA_TOOLKIT##*==}" "$TK"/cuda_toolkit-*.dist-info/METADATA 2>/dev/null; then
        note "installing $PYPI_CUDA_TOOLKIT into $TK"
        rm -rf "$TK"
        "$PY" -m pip install --target "$TK" "$PYPI_CUDA_TOOLKIT" >&2
    fi
    [[ -x $CUDA_ROOT/bin/nvcc ]] || die "$PYPI_CUDA_TOOLKIT has no $CUDA_ROOT/bin/nvcc"
    # The wheels lay the toolkit out flat (bin, include, lib, nvvm). Without a targets/ directory
    # nvcc.profile takes -I$(TOP)/include and -L$(TOP)/lib64 (nvcc --dryrun -v shows it): lib64
    # must exist, or nvcc (and CMake's test of it) cannot link libcudart_static.a. CMake's
    # FindCUDAToolkit then requires a libcudart by that name (the wheel has libcudart.so.13 only).
    ln -sfn lib "$CUDA_ROOT/lib64"
    cudart=$(cd "$CUDA_ROOT/lib" && ls libcudart.so.* | head -n 1)
    ln -sfn "$cudart" "$CUDA_ROOT/lib/libcudart.so"
    # VENV/cuda: a short, stable name for it (e.g. PATH=VENV/cuda/bin:$PATH to use this nvcc).
    ln -sfn "$CUDA_ROOT" "$VENV/cuda"
    CUDA_ROOT=$VENV/cuda
    note "CUDA toolkit from PyPI: $CUDA_ROOT -> $(realpath "$CUDA_ROOT")"
fi

release=$(nvcc_release "$CUDA_ROOT/bin/nvcc")
note "nvcc: CUDA $release (TensorFlow 2.18.1 runs on CUDA 12.5)"
case ${release%%.*} in
    12) ;;
    13) note "CUDA 13: Horovod's GPU kernels will need an NVIDIA driver R580 or newer" ;;
    *) note "warning: CUDA ${release%%.*} is not CUDA 12 nor 13; the build may fail or not run" ;;
esac

# nvcc's host compiler is CMake's C++ compiler (gcc, c++ on PATH); nvcc refuses one newer than
# it supports (CUDA 12.0-12.3: gcc 12 at most; 12.4+: 13; 13.0: 15). Check it here, in words.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo 'int main() { return 0; }' > "$tmp/t.cu"
if ! "$CUDA_ROOT/bin/nvcc" -c "$tmp/t.cu" -o "$tmp/t.o" 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    die "$CUDA_ROOT/bin/nvcc cannot compile with the host compiler $(command -v c++) ($(c++ -dumpfullversion 2>/dev/null))"
fi

# --- architectures --------------------------------------------------------------------------
if [[ -n ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
    cc_list=$HOROVOD_BUILD_CUDA_CC_LIST
    note "architectures: $cc_list (HOROVOD_BUILD_CUDA_CC_LIST, as given)"
else
    # Each default architecture this nvcc can build; one older than its oldest (CUDA 13 has
    # none below 7.5, so no V100) becomes that oldest, so that family's successors keep SASS.
    supported=$("$CUDA_ROOT/bin/nvcc" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p' | sort -n | tr '\n' ' ')
    cc_list=
    if [[ -z $supported ]]; then
        cc_list=$DEFAULT_CC_LIST
    else
        lowest=${supported%% *}
        for cc in ${DEFAULT_CC_LIST//,/ }; do
            (( cc < lowest )) && { note "architecture $cc: too old for CUDA $release, building $lowest"; cc=$lowest; }
            [[ " $supported " == *" $cc "* ]] || { note "architecture $cc: not in CUDA $release, dropped"; continue; }
            [[ ",$cc_list," == *",$cc,"* ]] || cc_list=${cc_list:+$cc_list,}$cc
        done
    fi
    note "architectures: $cc_list (set HOROVOD_BUILD_CUDA_CC_LIST to choose)"
fi

# --- NCCL -----------------------------------------------------------------------------------
declare -A out=(
    [HOROVOD_CUDA_HOME]=$CUDA_ROOT
    [HOROVOD_BUILD_CUDA_CC_LIST]=$cc_list
)
if [[ $MODE != pypi && ( -n ${HOROVOD_NCCL_HOME:-} || -n ${HOROVOD_NCCL_INCLUDE:-} || -n ${NCCL_HOME:-} ) ]]; then
    # The site's NCCL, as Horovod's FindNCCL reads it; libnccl_static.a is preferred there
    # unless HOROVOD_NCCL_LINK=SHARED.
    if [[ -z ${HOROVOD_NCCL_HOME:-} && -z ${HOROVOD_NCCL_INCLUDE:-} ]]; then out[HOROVOD_NCCL_HOME]=$NCCL_HOME; fi
    note "NCCL of the site: ${HOROVOD_NCCL_HOME:-${HOROVOD_NCCL_INCLUDE:-$NCCL_HOME}}"
else
    # nvidia-nccl-cu12: include/nccl.h and lib/libnccl.so.2 only. FindNCCL looks for libnccl.so
    # (libnccl_static.a first, which no wheel has): VENV/nccl holds those names as symlinks. The
    # library is linked shared, found at run time by the RPATH (VENV/nccl/lib) that CMake records,
    # under its SONAME libnccl.so.2: the same file TensorFlow loads.
    nccl_pkg=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null) \
        || die "no nvidia-nccl-cu12 in $VENV (tensorflow[and-cuda] installs it)"
    [[ -f $nccl_pkg/include/nccl.h && -f $nccl_pkg/lib/libnccl.so.2 ]] || die "$nccl_pkg has no include/nccl.h or lib/libnccl.so.2"
    mkdir -p "$VENV/nccl/lib"
    ln -sfn "$nccl_pkg/include" "$VENV/nccl/include"
    ln -sfn "$nccl_pkg/lib/libnccl.so.2" "$VENV/nccl/lib/libnccl.so.2"
    ln -sfn libnccl.so.2 "$VENV/nccl/lib/libnccl.so"
    out[HOROVOD_NCCL_HOME]=$VENV/nccl
    out[HOROVOD_NCCL_INCLUDE]=$VENV/nccl/include
    out[HOROVOD_NCCL_LIB]=$VENV/nccl/lib
    out[HOROVOD_NCCL_LINK]=SHARED
    note "NCCL from PyPI: $(sed -n 's/^Version: //p' "$nccl_pkg"/../../nvidia_nccl_cu12-*.dist-info/METADATA 2>/dev/null) in $nccl_pkg"
fi

# --- the environment for Horovod's build ----------------------------------------------------
echo "# written by scripts/gpu_toolkit.sh (CUDA=$MODE) for Horovod's build"
for k in $(printf '%s\n' "${!out[@]}" | sort); do printf 'export %s=%q\n' "$k" "${out[$k]}"; done
# Horovod's build_utils runs the first `nvcc` on PATH to list architectures: make it this one.
printf 'export PATH=%q:"$PATH"\n' "$CUDA_ROOT/bin"
