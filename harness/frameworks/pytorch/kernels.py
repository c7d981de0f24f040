"""The roofline micro-kernels in PyTorch (issue 34, item 6): GEMM, convolution and the
STREAM triad timed with the library that trains, so that a PyTorch test's utilisation is
measured against PyTorch's own GEMM and convolution, as a TensorFlow test's is against
TensorFlow's (kernels/).

The kernels' definitions are kernels/'s: the same shapes, default and quick sizes, FLOP
and byte counts (kernels.gemm.flop, kernels.conv.flop_per_sample, kernels.stream.ARRAYS),
the same timing discipline (kernels.timing.measure: a warm-up call excluded, chains
sized to ~50 ms, the median of the repeats), with PyTorch's sync: CUDA kernels are
queued asynchronously, so a sample ends with torch.cuda.synchronize(); CPU operators
return when done. Differences, stated in each result: the convolution runs NCHW
(PyTorch's default layout, the one its models train in; TensorFlow's is NHWC), and fp32
"math" says what PyTorch's backend flags allow on the GPU (TF32 for matmuls off by
default, for cuDNN convolutions on), where TensorFlow enables TF32 for both. The triad is
one fused operator, torch.add(b, c, alpha=s, out=a): 3 arrays of traffic.
"""
from __future__ import annotations

import torch

import kernels
from kernels import conv, device, gemm, stream, timing

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def roofline(precision: str, quick: bool = False) -> dict:
    """This rank's GEMM, convolution and triad figures in `precision`, the dict
    kernels.roofline gives (the harness's roofline lines and charts read either)."""
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(DTYPES)}")
    dev, name = where()
    return kernels.measured(precision, quick, name, lambda n, p, r: run_gemm(n, p, r, dev, name),
                            lambda shape, p, r: run_conv(shape, p, r, dev, name), lambda mib, r: run_stream(mib, r, dev, name))


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


def _math(precision: str, dev: torch.device, tf32: bool) -> str:
    return "tf32" if precision == "fp32" and dev.type == "cuda" and tf32 else precision


def run_gemm(n, precision: str, repeats: int, dev, name: str) -> dict:
    n = n or gemm.DEFAULT_N[_kind(dev)]
    a = (torch.rand(n, n, device=dev) * 2 - 1).to(DTYPES[precision])
    b = (torch.rand(n, n, device=dev) * 2 - 1).to(DTYPES[precision])
    t = timing.measure(lambda: torch.mm(a, b), repeats, sync)
    return {"n": n, "precision": precision, "math": _math(precision, dev, torch.backends.cuda.matmul.allow_tf32),
            "device": name, "seconds": t.seconds, "flop": gemm.flop(n), "flops": gemm.flop(n) / t.seconds,
            "repeats": repeats, "chain": t.chain, "samples": t.samples}


def run_conv(shape: dict, precision: str, repeats: int, dev, name: str) -> dict:
    s = {**conv.SHAPE, **{k: v for k, v in shape.items() if k != "batch"}}
    batch = shape.get("batch") or conv.DEFAULT_BATCH[_kind(dev)]
    k, hw, cin, cout = s["k"], s["hw"], s["cin"], s["cout"]
    x = (torch.rand(batch, cin, hw, hw, device=dev) * 2 - 1).to(DTYPES[precision])
    w = (torch.rand(cout, cin, k, k, device=dev) * 2 - 1).to(DTYPES[precision])
    t = timing.measure(lambda: torch.nn.functional.conv2d(x, w, padding="same"), repeats, sync)
    work = batch * conv.flop_per_sample(k, cin, hw, hw, cout)    # "same", stride 1: output is hw x hw
    return {"batch": batch, "height": hw, "width": hw, "cin": cin, "cout": cout, "kernel": k, "layout": "NCHW",
            "precision": precision, "math": _math(precision, dev, torch.backends.cudnn.allow_tf32),
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
