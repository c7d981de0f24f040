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


def test_tf32_is_each_kernels_own_switch_on_an_ampere_gpu_and_never_on_a_cpu():
    """Issue 67, item 5: a kernel's fp32 runs on TF32 only behind its switch, on compute
    capability 8.0 or newer, NVIDIA_TF32_OVERRIDE not 0; the peak is TF32's where either
    switch is on (the fastest math the step may use: utilisation cannot pass 1), FP32's where
    both are off (torch's matmul default, which the A100's 156 Tflops made look 8x slow)."""
    math, held = tkernels.tf32_math, tkernels.peak_tf32
    assert math("fp32", True, (8, 0), {}) and math("fp32", True, (9, 0), {})
    assert not math("fp32", False, (8, 0), {})                            # the switch off: FP32
    assert not math("fp32", True, (7, 0), {})                             # Volta has no TF32
    assert not math("fp32", True, None, {})                               # a CPU
    assert not math("fp16", True, (8, 0), {}) and not math("bf16", True, (9, 0), {})
    assert not math("fp32", True, (8, 0), {"NVIDIA_TF32_OVERRIDE": "0"})
    on = {"matmul_tf32": True, "conv_tf32": True, "cudnn_benchmark": True}
    assert held(on, {}) and held({**on, "matmul_tf32": False}, {})        # convolutions alone: TF32 still
    assert not held({**on, "matmul_tf32": False, "conv_tf32": False}, {})
    assert not held(on, {"NVIDIA_TF32_OVERRIDE": "0"}) and not held({}, {})   # {}: a CPU


def test_the_switches_are_set_and_read_back_on_a_gpu_and_left_alone_on_a_cpu(monkeypatch):
    """`switched` sets SWITCHES (matmul and convolution TF32, cuDNN's autotuning) where the
    device is CUDA and records them as read back; on a CPU it touches nothing and records {}.
    (torch's flags are plain settings: a CPU build sets and reads them too.)"""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.benchmark = False
        assert tkernels.switched(torch.device("cpu")) == {}
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark) == (False, False)
        assert tkernels.switched(torch.device("cuda", 0)) == {"matmul_tf32": True, "conv_tf32": True,
                                                             "cudnn_benchmark": True}
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.backends.cudnn.benchmark) == (True, True, True)
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = flags


def test_the_convolution_runs_channels_last_where_the_models_train_so():
    """On a GPU every 2-D model trains channels-last (models.channels_last_on): so does the
    roofline's convolution; on CPUs it stays NCHW (the CPU figures unchanged)."""
    assert tkernels.conv_layout(torch.device("cuda", 0)) is torch.channels_last
    assert tkernels.conv_layout(torch.device("cpu")) is torch.contiguous_format


def test_the_pytorch_gpu_line_renders_the_recorded_switches_and_none_for_a_cpu_or_an_old_record():
    from harness.frameworks.pytorch import facts
    assert facts.gpu_lines({}) == [] and facts.gpu_lines({"torch_math": {}}) == []
    math = {"matmul_tf32": False, "conv_tf32": True, "cudnn_benchmark": True, "tf32_peak": True}
    line, = facts.gpu_lines({"torch_math": math, "library_settings": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}})
    assert ("fp32 matmuls on TF32 tensor cores off, fp32 cuDNN convolutions on TF32 on" in line
            and "cuDNN autotuning (cudnn.benchmark) on" in line and "held to the TF32 peak; " in line
            and "from pinned memory, non-blocking" in line
            and line.endswith("(TORCH_NCCL_ASYNC_ERROR_HANDLING=2) aborts the communicators and keeps the process:"
                              " a lost rank fails its job's survivors' step, and they go on (--on-fault)"))
    line, = facts.gpu_lines({"torch_math": math, "library_settings": {}})     # torch's default: 3
    assert line.endswith("(TORCH_NCCL_ASYNC_ERROR_HANDLING=3) ends the process: a lost rank takes its job's survivors")
