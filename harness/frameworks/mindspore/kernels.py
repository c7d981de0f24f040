"""The roofline micro-kernels in MindSpore (issue 47): GEMM, convolution and the STREAM
triad timed with the library that trains, so that a MindSpore test's utilisation is
measured against MindSpore's own GEMM and convolution, as TensorFlow's and PyTorch's are.

The kernels' definitions are kernels/'s: the same shapes, default and quick sizes, FLOP
and byte counts (kernels.gemm.flop, kernels.conv.flop_per_sample, kernels.stream.ARRAYS),
the same timing discipline (kernels.timing.measure), with MindSpore's sync: its PyNative
operators are dispatched asynchronously, so a sample ends with a wait for its last
result (`sync`). Differences, stated in each result: the convolution runs NCHW (MindSpore's
CPU layout); the triad is two operators, a = b + s c (MindSpore has no fused one), so it
writes a temporary too: "fused": False, its bytes counted as the triad's 3 arrays, as
STREAM counts them. The PyPI wheel computes on the CPU only.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import ops

import kernels
from kernels import conv, device, gemm, stream, timing

DTYPES = {"fp32": ms.float32, "fp16": ms.float16, "bf16": ms.bfloat16}


def roofline(precision: str, quick: bool = False) -> dict:
    """This rank's GEMM, convolution and triad figures in `precision`, the dict
    kernels.roofline gives (the harness's roofline lines and charts read either)."""
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(DTYPES)}")
    name = where()
    return kernels.measured(precision, quick, name, lambda n, p, r: run_gemm(n, p, r, name),
                            lambda shape, p, r: run_conv(shape, p, r, name), lambda mib, r: run_stream(mib, r, name),
                            tf32=False)   # CPU only: no TF32 (peak.theoretical)


def where() -> str:
    """This rank's device and its CPU threads (MindSpore has no getter: train.setup_devices' record)."""
    threads = PINNED.get("threads")
    return f"CPU: {device.cpu_model()}" + (f" ({threads} thread{'s' * (threads > 1)})" if threads else "")


# What train.setup_devices pinned this process to ({"threads": intra-op threads})
PINNED = {}


def sync(tensor) -> None:
    """Wait until `tensor` is computed (timing.measure's sync for MindSpore): its PyNative
    operators return at dispatch, 0.1 ms for a 2048-GEMM of 350 ms here, and
    mindspore.runtime.synchronize() does not wait on the CPU (it logs "CPU device is not
    supported" and returns)."""
    tensor.data_sync(True)


def _random(shape, precision: str):
    return ms.Tensor((np.random.default_rng(0).random(shape, np.float32) * 2 - 1)).astype(DTYPES[precision])


def run_gemm(n, precision: str, repeats: int, name: str) -> dict:
    n = n or gemm.DEFAULT_N["CPU"]
    a, b = _random((n, n), precision), _random((n, n), precision)
    t = timing.measure(lambda: ops.matmul(a, b), repeats, sync)
    return {"n": n, "precision": precision, "math": precision, "device": name, "seconds": t.seconds,
            "flop": gemm.flop(n), "flops": gemm.flop(n) / t.seconds, "repeats": repeats, "chain": t.chain,
            "samples": t.samples}


def run_conv(shape: dict, precision: str, repeats: int, name: str) -> dict:
    s = {**conv.SHAPE, **{k: v for k, v in shape.items() if k != "batch"}}
    batch = shape.get("batch") or conv.DEFAULT_BATCH["CPU"]
    k, hw, cin, cout = s["k"], s["hw"], s["cin"], s["cout"]
    x, w = _random((batch, cin, hw, hw), precision), _random((cout, cin, k, k), precision)
    t = timing.measure(lambda: ops.conv2d(x, w, pad_mode="same"), repeats, sync)
    work = batch * conv.flop_per_sample(k, cin, hw, hw, cout)    # "same", stride 1: output is hw x hw
    return {"batch": batch, "height": hw, "width": hw, "cin": cin, "cout": cout, "kernel": k, "layout": "NCHW",
            "precision": precision, "math": precision, "device": name, "seconds": t.seconds, "flop": work,
            "flops": work / t.seconds, "repeats": repeats, "chain": t.chain, "samples": t.samples}


def run_stream(mib, repeats: int, name: str) -> dict:
    mib = mib or stream.DEFAULT_MIB["CPU"]
    n = mib * 2 ** 20 // 4
    b, c = _random((n,), "fp32"), _random((n,), "fp32")
    t = timing.measure(lambda: b + c * 3.0, repeats, sync)
    moved = stream.ARRAYS * n * 4
    return {"array_bytes": n * 4, "bytes": moved, "dtype": "fp32", "fused": False, "device": name,
            "seconds": t.seconds, "bandwidth": moved / t.seconds, "repeats": repeats, "chain": t.chain,
            "samples": t.samples}
