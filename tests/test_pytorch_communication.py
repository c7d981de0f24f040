"""harness/frameworks/pytorch/communication.py: line 21's int8 exchange as a DDP hook.
The arithmetic by hand; the hook on a one-rank Gloo group in this process (a real DDP
backward through it); two ranks under mpirun: tests/test_pytorch_run.py. A job of one
rank exchanges nothing (train.Step: no DDP), and the conventions say so."""
import gc
import math

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from harness.frameworks.pytorch import communication as c  # noqa: E402


def test_two_ranks_by_hand():
    """Rank 1: [0.5, -1.0, 0.25], rank 2: [1.27, 0.0, -0.5]. The job's max |g| 1.27, scale
    0.01; int8 [50, -100, 25] and [127, 0, -50]; summed [177, -100, -25] x 0.01 / 2 =
    [0.885, -0.5, -0.125], here the FP32 average exactly."""
    g1, g2 = torch.tensor([0.5, -1.0, 0.25]), torch.tensor([1.27, 0.0, -0.5])
    m = torch.maximum(c.maxima([g1]), c.maxima([g2]))          # what the Max all-reduce gives
    s = c.scales(m)
    assert m.tolist() == pytest.approx([1.27]) and s.tolist() == pytest.approx([0.01])
    q1, q2 = c.quantise(g1, s[0]), c.quantise(g2, s[0])
    assert q1.dtype == torch.int8 and q1.tolist() == [50, -100, 25] and q2.tolist() == [127, 0, -50]
    mean = c.dequantised_mean(torch.stack([q1, q2]), s[0], 2)
    assert mean.tolist() == pytest.approx([0.885, -0.5, -0.125], abs=1e-6)


def test_rounding_zeros_and_non_finite_gradients():
    """0.004 at scale 0.01 rounds to 0 (within scale / 2); a tensor zero everywhere gets
    scale 1; an inf anywhere makes the scale inf, every int8 0 and every element NaN."""
    s = c.scales(c.maxima([torch.tensor([1.27, 0.004]), torch.zeros(3)]))
    assert s.tolist() == pytest.approx([0.01, 1.0])
    assert c.quantise(torch.tensor([1.27, 0.004]), s[0]).tolist() == [127, 0]
    bad = torch.tensor([float("inf"), 1.0])
    s = c.scales(c.maxima([bad]))
    assert math.isinf(s[0]) and c.quantise(bad, s[0]).tolist() == [0, 0]
    assert all(math.isnan(v) for v in c.dequantised_mean(torch.zeros(2, 2, dtype=torch.int8), s[0], 2).tolist())


def test_the_hook_replaces_each_gradient_by_its_int8_round_trip(tmp_path):
    """One rank: DDP's backward through int8_hook leaves each parameter's gradient equal to
    its own quantise / dequantise round trip (scale max |g| / 127 a tensor): within scale
    / 2 of the FP32 gradient, and not equal to it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    plain = [p.grad for p in _grads(model, x, y)]
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, c.int8_hook)
        model.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        hooked = [p.grad.clone() for p in model.parameters()]
    finally:
        # as the harness's Job.close: DDP (its Reducer holds the group) freed before the group
        # is destroyed; freed after, its Gloo threads' join hung a fresh-clone suite once
        ddp = None
        gc.collect()
        dist.destroy_process_group()
    for g, h in zip(plain, hooked):
        scale = g.abs().max() / 127
        assert torch.allclose(h, torch.round(g / scale) * scale, rtol=0, atol=1e-7)
        assert (h - g).abs().max() <= scale / 2 + 1e-7
    assert any(not torch.equal(g, h) for g, h in zip(plain, hooked))


def _grads(model, x, y):
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return [p for p in model.parameters()]


@pytest.mark.parametrize("comm", ["fp16", "int8"])
def test_a_job_of_one_rank_exchanges_nothing(tmp_path, comm):
    """A base model of one rank (P = 1, its Exchange line "none (P = 1)"): one training step
    with line 21's fp16 or int8 leaves the weights bit for bit where FP32's leaves them, as
    in TensorFlow and MindSpore. Under DDP the step's hook cast the gradients to FP16 or
    quantised them even with no partner to exchange with."""
    import numpy as np
    from harness import train, workloads
    from harness.frameworks.pytorch import models
    from harness.frameworks.pytorch import train as pt
    from harness.workloads import digits
    data, dev = digits.load(workloads.Dataset.parse("embedded"), str(tmp_path)), torch.device("cpu")
    wl, module = workloads.get("digits"), models.get("digits")
    x, y = module.inputs(data.x_train[:32], dev), module.targets(data.y_train[:32], dev)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        weights = {}
        for precision in ("fp32", comm):
            model = pt.build(wl, data, 42, 0, dev)
            step = pt.Step(wl, module, model, train.Recipe(32, 1, 0.05, 0, comm_precision=precision), dev,
                           lambda taken: 0.05)
            step(x, y)
            weights[precision] = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
            step = None
            gc.collect()     # a DDP wrapper, where one was made, freed before its group goes (as Job.close)
    finally:
        dist.destroy_process_group()
    assert np.array_equal(weights["fp32"], weights[comm])


def test_the_conventions_say_so_from_schema_2_15_and_verify_reads_2_14s_words():
    """--verify holds a run's conventions to the words its results schema stated: 2.15 adds
    the one-rank job's missing DDP to PyTorch's line and to line 33's inductor line, 2.14 had
    neither (harness/frameworks/pytorch/facts.py)."""
    from types import SimpleNamespace
    from harness.frameworks.pytorch import facts
    cfg = SimpleNamespace(precisions=["fp32"], comm_precision="fp32", modes=["data"], optimizer="sgd",
                          compiler="inductor")
    now, before = facts.option_lines(cfg, (2, 15)), facts.option_lines(cfg, (2, 14))
    assert "during the backward pass (a job of one rank exchanges nothing: no DDP); the optimizers" in now[0]
    assert "during the backward pass; the optimizers" in before[0]
    assert now[-1].startswith("Compiler inductor: torch.compile of the DDP-wrapped model (TorchInductor: C++ on CPUs,"
                              " Triton on GPUs; of the model itself in a job of one rank, which has no DDP); ")
    assert before[-1].startswith("Compiler inductor: torch.compile of the DDP-wrapped model (TorchInductor: C++ on"
                                 " CPUs, Triton on GPUs); ")
    assert facts.stated(cfg, (2, 14)) == [before]


def test_the_maxima_build_no_device_constant_a_tensor(monkeypatch):
    """Issue 67, item 8: inside DDP's hook a torch.tensor(value, device=...) is a blocking
    host-to-device copy, once a gradient tensor. The maxima make none (torch.tensor counted),
    run on the meta device (no data, no copy: each op exists there), and keep the rule by
    hand: max |g| of [-3, 2] is 3, a NaN or an inf anywhere gives inf, zeros give 0."""
    made = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    grads = [torch.tensor([-3.0, 2.0]), torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, float("-inf")]),
             torch.zeros(2, 2), torch.tensor([0.5], dtype=torch.float16)]
    made.clear()
    assert c.maxima(grads).tolist() == [3.0, math.inf, math.inf, 0.0, 0.5] and made == []
    m = c.maxima([torch.empty(3, 4, device="meta"), torch.empty(5, device="meta")])
    assert m.is_meta and m.shape == (2,) and m.dtype == torch.float32 and made == []
