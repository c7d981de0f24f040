"""harness/frameworks/pytorch/kernels.py: the roofline micro-kernels in PyTorch, at test
sizes on this machine's CPU (no GPU here: the CUDA path waits for a GPU node), giving the
dict kernels.roofline gives, with the same sizes and FLOP and byte counts."""
import pytest

torch = pytest.importorskip("torch")

from harness.frameworks.pytorch import kernels as tkernels  # noqa: E402
from kernels import conv, gemm, stream  # noqa: E402


def test_the_roofline_in_pytorch_has_the_tensorflow_kernels_shape_and_counts():
    r = tkernels.roofline("fp32", quick=True)
    assert set(r) == {"precision", "device", "gemm", "conv", "stream", "peak"} and r["device"].startswith("CPU: ")
    g, c, s = r["gemm"], r["conv"], r["stream"]
    assert g["n"] == gemm.QUICK_N and g["flop"] == 2 * 256 ** 3 and g["math"] == "fp32"
    assert g["flops"] == pytest.approx(g["flop"] / g["seconds"]) and g["repeats"] == 3 and len(g["samples"]) == 3
    # quick conv: 1 x 64 x 28 x 28, 3x3 to 64, "same": 2 x 9 x 64 x 28 x 28 x 64 per sample
    assert (c["batch"], c["cin"], c["cout"], c["height"], c["layout"]) == (1, 64, 64, 28, "NCHW")
    assert c["flop"] == 2 * 9 * 64 * 28 * 28 * 64 == conv.flop_per_sample(3, 64, 28, 28, 64)
    assert s["bytes"] == 3 * stream.QUICK_MIB * 2 ** 20 and s["bandwidth"] == pytest.approx(s["bytes"] / s["seconds"])
    assert min(g["flops"], c["flops"], s["bandwidth"]) > 0


def test_an_unknown_precision_is_refused_before_any_timing():
    with pytest.raises(ValueError, match="precision 'fp64': expected one of fp32, fp16, bf16"):
        tkernels.roofline("fp64", quick=True)
