"""Theoretical peak FLOP/s of this rank's device: the denominator of utilisation.

In order: the user's HPCAI500_PEAK_TFLOPS (per rank; "19.5" for every precision, or
"fp32=19.5,fp16=312,bf16=312"), else NVIDIA's datasheet figure for the GPU model NVML
names, else (None, "unknown"). CPUs have no entry: their peak depends on the cores, the
vector units and the clock a rank gets; give it in the variable.

Figures are dense tensor-core peaks in Tflops at boost clock (the datasheets print the
2:4-sparsity figure for Hopper; we halve it). fp32 maps to the TF32 peak on GPUs that have
one where the framework that measures runs fp32 on TF32 tensor cores: TensorFlow does by
default for matmuls and convolutions (unless
tf.config.experimental.enable_tensor_float_32_execution(False)), PyTorch where its switches
say so (harness/frameworks/pytorch/kernels.SWITCHES), and NVIDIA_TF32_OVERRIDE=0 turns it
off for all.
"""
from __future__ import annotations

import os
import re
import sys

ENV = "HPCAI500_PEAK_TFLOPS"

# (NVML name pattern, first match wins; peaks in Tflops; source)
TABLE = [
    (r"V100S", {"fp32": 16.4, "fp16": 130}, "NVIDIA V100S Tensor Core GPU datasheet (PCIe)"),
    (r"V100.*PCIE", {"fp32": 14.0, "fp16": 112}, "NVIDIA Tesla V100 datasheet, V100 PCIe"),
    (r"V100", {"fp32": 15.7, "fp16": 125}, "NVIDIA Tesla V100 datasheet, V100 SXM2"),
    (r"\bT4\b", {"fp32": 8.1, "fp16": 65}, "NVIDIA T4 Tensor Core GPU datasheet"),
    (r"A100", {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
     "NVIDIA A100 Tensor Core GPU datasheet (PCIe and SXM alike)"),
    (r"\bA30\b", {"fp32": 10.3, "tf32": 82, "fp16": 165, "bf16": 165}, "NVIDIA A30 Tensor Core GPU datasheet"),
    (r"H100.*NVL", {"fp32": 60, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
     "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL"),
    (r"H100.*PCIE", {"fp32": 51, "tf32": 378, "fp16": 756.5, "bf16": 756.5},
     "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe"),
    # NVML names the SXM5 board "NVIDIA H100 80GB HBM3": any other H100 is taken as SXM.
    (r"H100", {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
     "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
    # Also matches GH200, whose GPU has the H100 SXM's peaks.
    (r"H200", {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
     "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM"),
]


def theoretical(precision: str, gpu: int | None = None, tf32: bool | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s of this rank's device in `precision`, where the figure comes from).
    `gpu`: NVML index of this rank's GPU; by default any GPU of the node, if all are one
    model. `tf32`: whether the framework that measures runs fp32 on TF32 tensor cores (its
    own switches: each framework looks its peak up with its own, issue 67); None:
    TensorFlow's (tf32_enabled). Never raises for a missing pynvml or driver; raises
    ValueError for a malformed HPCAI500_PEAK_TFLOPS, since a silently ignored peak would
    give a wrong utilisation."""
    user = os.environ.get(ENV, "").strip()
    if user:
        tflops = _parse_env(user, precision)
        if tflops is not None:
            return tflops * 1e12, f"{ENV}={user}"
    names = gpu_names()
    if not names:
        return None, "unknown"
    if gpu is not None:
        name = names[gpu % len(names)]
    elif len(set(names)) == 1:
        name = names[0]
    else:
        return None, f"unknown: GPUs of several models on this node ({', '.join(sorted(set(names)))}); set {ENV}"
    return lookup(name, precision, tf32_enabled() if tf32 is None else tf32)


def lookup(name: str, precision: str, tf32: bool = True) -> tuple[float | None, str]:
    """The table's peak for a GPU model name as NVML prints it."""
    for pattern, peaks, source in TABLE:
        if re.search(pattern, name.upper()):
            key = "tf32" if precision == "fp32" and tf32 and "tf32" in peaks else precision
            if key not in peaks:
                return None, f"unknown: no {precision} peak for {name} in kernels/peak.py; set {ENV}"
            return peaks[key] * 1e12, f"{name}: {key} dense peak {peaks[key]} Tflops ({source})"
    return None, f"unknown: {name} is not in kernels/peak.py; set {ENV}"


def parse(text: str) -> dict[str, float]:
    """"19.5" -> 19.5 Tflops for every precision; "fp32=19.5,fp16=312" -> those. ValueError
    saying what is expected otherwise (also for the harness's table of settings)."""
    try:
        if "=" not in text:
            peaks = dict.fromkeys(("fp32", "fp16", "bf16"), float(text))
        else:
            peaks = {k: float(v) for k, v in (item.split("=") for item in text.replace(" ", "").split(",") if item)}
            if not peaks or not set(peaks) <= {"fp32", "fp16", "bf16"}:
                raise ValueError
    except ValueError:
        peaks = {}
    if not peaks or not all(0 < v < float("inf") for v in peaks.values()):
        raise ValueError("Tflops per rank, a positive number (e.g. 19.5) or per precision "
                         "(e.g. fp32=19.5,fp16=312,bf16=312)")
    return peaks


def _parse_env(text: str, precision: str) -> float | None:
    """The peak the user gave for `precision`, or None if the spec names others only."""
    try:
        return parse(text).get(precision)
    except ValueError as e:
        raise ValueError(f"{ENV}={text!r}: expected {e}") from None


def gpu_names() -> list[str]:
    """NVML's names of the node's GPUs; [] where pynvml, the driver or a GPU is absent."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:                  # noqa: BLE001 -- ImportError, NVMLError_LibraryNotFound, ...
        return []
    try:
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        return [n.decode() if isinstance(n, bytes) else n for n in names]
    except Exception:                  # noqa: BLE001
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:              # noqa: BLE001
            pass


def tf32_off(environ=None) -> bool:
    """Whether NVIDIA_TF32_OVERRIDE=0 turns TF32 off in cuBLAS and cuDNN, under every framework."""
    return (os.environ if environ is None else environ).get("NVIDIA_TF32_OVERRIDE") == "0"


def tf32_enabled() -> bool:
    """Whether TensorFlow runs fp32 matmuls as TF32: its switch if it is loaded, else its
    default (on). TensorFlow's alone: another framework passes its own to `theoretical`
    (PyTorch's default for matmuls is off; before issue 67 its figures were held to the
    TF32 peak through this)."""
    if tf32_off():
        return False
    tf = sys.modules.get("tensorflow")
    return bool(tf.config.experimental.tensor_float_32_execution_enabled()) if tf else True
