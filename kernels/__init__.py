"""Roofline micro-kernels: GEMM and convolution (the two kernels that dominate AI
workloads, HPC AI500 V2.0) and a STREAM triad, timed on this rank's device.

    kernels.roofline("fp16")            -> this rank's figures (the harness calls it on every rank)
    kernels.peak.theoretical("fp16")    -> (peak FLOP/s or None, where it comes from)
    mpirun -np N python -m kernels.gemm | kernels.conv | kernels.stream   -> per-rank table

The API does not pin devices or threads: the harness has done so before TensorFlow
started. Only the `python -m` path pins, the same way.
"""
from __future__ import annotations

from kernels import peak  # noqa: F401 -- kernels.peak.theoretical; light, no TensorFlow import

REPEATS = 5


def measured(precision: str, quick: bool, name: str, run_gemm, run_conv, run_stream, *, tf32: bool) -> dict:
    """A framework's roofline dict (kernels.roofline's layout) from its own kernels:
    run_gemm(n, precision, repeats), run_conv(shape, precision, repeats) and
    run_stream(mib, repeats) at the default sizes (None, {}) or `quick`'s, on device `name`;
    the peak looked up with the framework's own TF32 switch `tf32` (peak.theoretical)."""
    from kernels import conv, gemm, stream
    repeats = 3 if quick else REPEATS
    g = run_gemm(gemm.QUICK_N if quick else None, precision, repeats)
    c = run_conv(conv.QUICK if quick else {}, precision, repeats)
    s = run_stream(stream.QUICK_MIB if quick else None, repeats)
    peak_flops, source = peak.theoretical(precision, tf32=tf32)
    return {"precision": precision, "device": name, "gemm": g, "conv": c, "stream": s,
            "peak": {"flops": peak_flops, "source": source}}


def roofline(precision: str, quick: bool = False) -> dict:
    """Time GEMM, convolution and STREAM triad on this rank's device in `precision`
    (fp32, fp16, bf16), default sizes by device; `quick`: small sizes, for tests.
    Rates: gemm/conv "flops" in FLOP/s, stream "bandwidth" in bytes/s; "peak" is
    peak.theoretical(precision) as {"flops", "source"}. Not collective: no MPI calls."""
    from kernels import conv, device, gemm, stream
    device.dtype(precision)                       # an unknown precision fails before any timing
    repeats = 3 if quick else REPEATS
    g = gemm.run(gemm.QUICK_N if quick else None, precision, repeats)
    c = conv.run(**(conv.QUICK if quick else {}), precision=precision, repeats=repeats)
    s = stream.run(stream.QUICK_MIB if quick else None, repeats)
    name = [r.pop("device") for r in (g, c, s)][0]
    peak_flops, source = peak.theoretical(precision)
    return {"precision": precision, "device": name, "gemm": g, "conv": c, "stream": s,
            "peak": {"flops": peak_flops, "source": source}}
