"""harness/frameworks/pytorch/optimizers.py: LARS and LAMB in PyTorch against the numpy
replay of their rules that TensorFlow's are held to (tests/optimizer_rules.py), on the
same small model with the same weights: both frameworks run one optimizer under each name."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from harness import mllog  # noqa: E402
from harness.frameworks.pytorch import optimizers, train  # noqa: E402
from harness.workloads import deepcam  # noqa: E402
from tests.optimizer_rules import LRS, WD, assert_close, far, lamb_numpy, lars_numpy  # noqa: E402

MAKE = {"lars": optimizers.LARS, "lamb": optimizers.LAMB}


def small_model():
    """tests/test_optimizers.small_model in PyTorch: batch norm (gamma, beta: excluded), then a
    linear layer (kernel: layer-wise; bias: excluded), with the same weights (the kernel
    transposed: PyTorch keeps it out x in), far from the usual init so that every trust
    ratio, taken or wrongly skipped, is far from 1."""
    model = nn.Sequential(nn.BatchNorm1d(4, eps=1e-3), nn.Linear(4, 3)).double()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([3.0, 2.5, 4.0, 3.5]))
        model[0].bias.copy_(torch.tensor([-2.0, 3.0, 1.5, -4.0]))
        model[1].weight.copy_(torch.from_numpy(5 * np.random.default_rng(1).normal(size=(4, 3)).T))
        model[1].bias.copy_(torch.tensor([3.0, -2.0, 4.0]))
    return model


def run_torch(name, regulariser=0.0, **kw):
    """Three steps at LRS; returns the initial weights, each step's gradients, the final
    weights. `regulariser`: l2 / 2 ||kernel||^2 added to the loss, as Keras' L2 does."""
    model = small_model()
    opt = MAKE[name](model.parameters(), lr=LRS[0], **kw)
    rng = np.random.default_rng(2)
    x, y = torch.from_numpy(rng.normal(size=(8, 4))), torch.from_numpy(rng.normal(size=(8, 3)))
    start = [p.detach().numpy().copy() for p in model.parameters()]
    grads = []
    for lr in LRS:
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() + regulariser / 2 * (model[1].weight ** 2).sum()
        loss.backward()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
    return start, grads, [p.detach().numpy() for p in model.parameters()]


@pytest.mark.parametrize("wd", [0.0, WD])
@pytest.mark.parametrize("name, replay", [("lars", lars_numpy), ("lamb", lamb_numpy)])
def test_matches_the_rule_tensorflows_optimizer_follows(name, replay, wd):
    start, grads, got = run_torch(name, weight_decay=wd)
    ratios = []
    want = replay(start, grads, wd, ratios=ratios)
    assert_close(got, want)
    assert far(got, start)
    # teeth: the kernel's ratio is far from 1 at every step; without the ratio, or without
    # the exclusion of the vectors, the replay lands far from what PyTorch did
    assert len(ratios) == 3 and all(r < 0.5 or r > 2 for r in ratios), ratios
    assert far(got, replay(start, grads, wd, layerwise=False))
    assert far(got, replay(start, grads, wd, exclude=False))


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_l2_is_the_keras_regulariser_on_the_kernels(name):
    """l2 = 0.3 in the optimizer trains as 0.3 / 2 ||kernel||^2 in the loss (TensorFlow's
    ic: the L2 regulariser in the loss, the optimizer's decay 0), and differs from none."""
    _, _, coupled = run_torch(name, l2=0.3, weight_decay=WD)
    _, _, in_loss = run_torch(name, regulariser=0.3, weight_decay=WD)
    _, _, neither = run_torch(name, weight_decay=WD)
    assert_close(coupled, in_loss)
    assert far(coupled, neither)


@pytest.mark.parametrize("name, wd", [("lars", WD), ("lamb", 0.0)])
def test_zero_norms_give_ratio_one(name, wd):
    """As tests/test_optimizers.py's: a zero weight, and a zero gradient (LARS) or update (LAMB
    without decay), take ratio 1, no nan."""
    zero, two = torch.zeros(2, 2, requires_grad=True), torch.full((2, 2), 2.0, requires_grad=True)
    zero.grad, two.grad = torch.ones(2, 2), torch.zeros(2, 2)
    MAKE[name]([zero, two], lr=0.5, weight_decay=wd).step()
    if name == "lars":  # w -= lr * (g + wd w)
        assert torch.allclose(zero, torch.full((2, 2), -0.5))
        assert torch.allclose(two, torch.full((2, 2), 2.0 - 0.5 * WD * 2.0))
    else:               # w -= lr * g / (|g| + eps) on the first step; nothing for a zero gradient
        assert torch.allclose(zero, torch.full((2, 2), -0.5 / (1 + 1e-6)))
        assert torch.equal(two.detach(), torch.full((2, 2), 2.0))


def test_deepcams_lamb_is_the_references():
    """deepcam's LAMB options (apex FusedLAMB's as the MLPerf reference sets them): decay
    1e-2 in the rule, eps 1e-6, global clipping at 1, recorded under MLPerf's keys."""
    model = nn.Sequential(nn.Linear(4, 3))
    opt, config = train.make_optimizer("lamb", model, 0.01, 0.9, deepcam.OPTIMIZER_OPTIONS["lamb"])
    assert isinstance(opt, optimizers.LAMB)
    assert opt.defaults["weight_decay"] == 0.01 and opt.defaults["eps"] == 1e-6 and opt.defaults["l2"] == 0.0
    keys = mllog.recipe("lamb", config, 0.01, 10, 100)
    assert keys["opt_max_grad_norm"] == 1.0 and keys["opt_weight_decay"] == 0.01 and keys["opt_eps"] == 1e-6
    opt, config = train.make_optimizer("lars", model, 0.1, 0.875, {}, l2=3e-5)
    assert opt.defaults["l2"] == 3e-5 and opt.defaults["weight_decay"] == 0.0 and config["momentum"] == 0.875
