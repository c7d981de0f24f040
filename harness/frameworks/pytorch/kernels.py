"""The roofline micro-kernels in PyTorch (issue 34, item 6): GEMM, convolution and the
STREAM triad timed with the library that trains, so that a PyTorch test's utilisation is
measured against PyTorch's own GEMM and convolution, as a TensorFlow test's is against
TensorFlow's (kernels/).

The kernels' definitions are kernels/'s: the same shapes, default and quick sizes, FLOP
and byte counts (kernels.gemm.flop, kernels.conv.flop_per_sample, kernels.stream.ARRAYS),
the same timing discipline (kernels.timing.measure: a warm-up call excluded, chains
sized to ~50 ms, the median of the repeats), with PyTorch's sync: CUDA kernels are
queued asynchronously, so a sample ends with torch.cuda.synchronize(); CPU operators
return when done. The kernels run as the training step does (issue 67, item 5): on a GPU
under the same torch.backends switches (SWITCHES, set by `switched` for the kernels and
every job alike) and with the convolution channels-last, the layout every 2-D model
trains in there (models.channels_last_on); on CPUs NCHW, as the models but digits train
there. Each result's "math" says whether its fp32 ran on TF32 tensor cores, and "layout"
the convolution's memory layout. The peak is looked up with PyTorch's own switches
(peak_tf32), not TensorFlow's. The triad is one fused operator, torch.add(b, c, alpha=s,
out=a): 3 arrays of traffic.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

import kernels
from harness import gpus
from harness.frameworks.pytorch import models
from kernels import conv, device, gemm, peak, stream, timing

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Switches:
    """torch.backends' switches that change a GPU's figures: set by the harness on every
    GPU rank (`switched`), never left to the installed torch's defaults, and recorded
    (results.json's environment.torch_math, echoed in the report's PyTorch lines)."""
    matmul_tf32: bool       # cuBLAS fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32; torch's default off)
    conv_tf32: bool         # cuDNN fp32 convolutions on TF32 (torch.backends.cudnn.allow_tf32; torch's default on)
    cudnn_benchmark: bool   # cuDNN times its algorithms for each new convolution shape, keeps the fastest (default off)


# TF32 for matmuls and convolutions, as TensorFlow runs fp32 by default (a framework sweep
# compares like with like) and as NVIDIA's PyTorch references trained (matmul TF32 was torch's
# default until 1.12); cuDNN's autotuning, as NVIDIA's ResNet-50 sets it. The legacy
# allow_tf32 flags throughout: torch 2.13 refuses to read them once the fp32_precision API
# has set one, so the two are never mixed here.
SWITCHES = Switches(matmul_tf32=True, conv_tf32=True, cudnn_benchmark=True)


def switched(dev: torch.device) -> dict:
    """SWITCHES set on a GPU (`dev` a CUDA device) and read back as they are now in force;
    {} on a CPU, where they change nothing and are left alone. Idempotent: the roofline,
    every job and the software record call it."""
    if dev.type != "cuda":
        return {}
    torch.backends.cuda.matmul.allow_tf32 = SWITCHES.matmul_tf32
    torch.backends.cudnn.allow_tf32 = SWITCHES.conv_tf32
    torch.backends.cudnn.benchmark = SWITCHES.cudnn_benchmark
    return asdict(Switches(bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32),
                           bool(torch.backends.cudnn.benchmark)))


def tf32_math(precision: str, switch: bool, capability: tuple | None, environ) -> bool:
    """Whether a kernel of `precision` behind `switch` (a Switches TF32 flag) runs on TF32
    tensor cores: fp32, the switch on, a GPU of compute capability `capability` Ampere or
    newer (None: a CPU), and NVIDIA_TF32_OVERRIDE not 0. Pure."""
    return (precision == "fp32" and switch and capability is not None and tuple(capability) >= gpus.AMPERE
            and not peak.tf32_off(environ))


def peak_tf32(switches: dict, environ) -> bool:
    """Whether PyTorch's fp32 figures are held to the TF32 peak: where either TF32 switch is
    on (`switches`: switched's record; {} on a CPU), the step's matmuls or convolutions may
    run on TF32, and the ceiling is the fastest math the step may use, so that utilisation
    cannot pass 1; NVIDIA_TF32_OVERRIDE=0 turns TF32 off. A GPU without TF32 has no TF32
    peak (peak.lookup falls back to fp32). Pure."""
    return bool(switches) and bool(switches["matmul_tf32"] or switches["conv_tf32"]) and not peak.tf32_off(environ)


def precision_problem(precision: str) -> str | None:
    """gpus.bf16_problem on this rank's device (kernels.where), as its GPU says."""
    dev, _ = where()
    if dev.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(dev)
    gpu = f"GPU {torch.cuda.get_device_name(dev)} (compute capability {major}.{minor})"
    return gpus.bf16_problem(precision, gpu, torch.cuda.is_bf16_supported(including_emulation=False))


def roofline(precision: str, quick: bool = False) -> dict:
    """This rank's GEMM, convolution and triad figures in `precision`, the dict
    kernels.roofline gives (the harness's roofline lines and charts read either)."""
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(DTYPES)}")
    dev, name = where()
    tf32 = peak_tf32(switched(dev), os.environ)
    return kernels.measured(precision, quick, name, lambda n, p, r: run_gemm(n, p, r, dev, name),
                            lambda shape, p, r: run_conv(shape, p, r, dev, name),
                            lambda mib, r: run_stream(mib, r, dev, name), tf32=tf32)


def where() -> tuple[torch.device, str]:
    """The device this rank computes on (its current CUDA device, else the CPU) and its name."""
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return torch.device("cuda", index), f"GPU {index}: {torch.cuda.get_device_name(index)}"
    threads = torch.get_num_threads()
    return torch.device("cpu"), f"CPU: {device.cpu_model()} ({threads} thread{'s' * (threads > 1)})"


def sync(tensor) -> None:
    """Wait until `tensor` is computed (timing.measure's sync for PyTorch)."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def _kind(dev: torch.device) -> str:
    return "GPU" if dev.type == "cuda" else "CPU"


def _math(precision: str, dev: torch.device, switch: bool) -> str:
    capability = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    return "tf32" if tf32_math(precision, switch, capability, os.environ) else precision


def run_gemm(n, precision: str, repeats: int, dev, name: str) -> dict:
    n = n or gemm.DEFAULT_N[_kind(dev)]
    a = (torch.rand(n, n, device=dev) * 2 - 1).to(DTYPES[precision])
    b = (torch.rand(n, n, device=dev) * 2 - 1).to(DTYPES[precision])
    t = timing.measure(lambda: torch.mm(a, b), repeats, sync)
    return {"n": n, "precision": precision, "math": _math(precision, dev, SWITCHES.matmul_tf32),
            "device": name, "seconds": t.seconds, "flop": gemm.flop(n), "flops": gemm.flop(n) / t.seconds,
            "repeats": repeats, "chain": t.chain, "samples": t.samples}


def conv_layout(dev: torch.device) -> torch.memory_format:
    """The convolution kernel's memory layout: channels-last where the 2-D models train so
    (models.channels_last_on: every GPU), else PyTorch's contiguous NCHW."""
    return torch.channels_last if models.channels_last_on(dev, False) else torch.contiguous_format


def run_conv(shape: dict, precision: str, repeats: int, dev, name: str) -> dict:
    s = {**conv.SHAPE, **{k: v for k, v in shape.items() if k != "batch"}}
    batch = shape.get("batch") or conv.DEFAULT_BATCH[_kind(dev)]
    k, hw, cin, cout = s["k"], s["hw"], s["cin"], s["cout"]
    layout = conv_layout(dev)
    x = (torch.rand(batch, cin, hw, hw, device=dev) * 2 - 1).to(DTYPES[precision]).contiguous(memory_format=layout)
    w = (torch.rand(cout, cin, k, k, device=dev) * 2 - 1).to(DTYPES[precision]).contiguous(memory_format=layout)
    t = timing.measure(lambda: torch.nn.functional.conv2d(x, w, padding="same"), repeats, sync)
    work = batch * conv.flop_per_sample(k, cin, hw, hw, cout)    # "same", stride 1: output is hw x hw
    return {"batch": batch, "height": hw, "width": hw, "cin": cin, "cout": cout, "kernel": k,
            "layout": "NHWC" if layout is torch.channels_last else "NCHW",
            "precision": precision, "math": _math(precision, dev, SWITCHES.conv_tf32),
            "device": name, "seconds": t.seconds, "flop": work, "flops": work / t.seconds,
            "repeats": repeats, "chain": t.chain, "samples": t.samples}


def run_stream(mib, repeats: int, dev, name: str) -> dict:
    mib = mib or stream.DEFAULT_MIB[_kind(dev)]
    n = mib * 2 ** 20 // 4
    b, c, a = torch.rand(n, device=dev), torch.rand(n, device=dev), torch.empty(n, device=dev)
    t = timing.measure(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, sync)
    moved = stream.ARRAYS * n * 4
    return {"array_bytes": n * 4, "bytes": moved, "dtype": "fp32", "fused": True, "device": name,
            "seconds": t.seconds, "bandwidth": moved / t.seconds, "repeats": repeats, "chain": t.chain,
            "samples": t.samples}
