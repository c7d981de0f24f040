"""Every framework's implementation of the shared arithmetic held to one numpy reference:
line 21's int8 exchange (harness/communication.int8_quantised, int8_mean) and the layer-wise
optimizers LARS and LAMB (harness/optimizers.py), on finite, all-zero and non-finite
gradients. In-process, no MPI: the ranks of a job are simulated by their tensors, the Max
all-reduce of the scale by a max over them, as the frameworks' own unit tests do. A framework
whose package cannot be imported here is skipped, saying so: MindSpore's venv has neither
of the other two, and the suite's venv no MindSpore, so tests/test_mindspore.py runs this
file again in MindSpore's venv."""
import numpy as np
import pytest

from harness import communication, optimizers

FRAMEWORKS = ("tensorflow", "pytorch", "mindspore")
RNG = np.random.default_rng(47)
# three ranks' gradients of one tensor: finite and ragged (one element exactly at the max,
# halves that round to even), all zero, a NaN on one rank, an inf on another
CASES = {
    "finite": [RNG.normal(size=11).astype(np.float32) for _ in range(3)],
    "halves": [np.array([1.27, 0.005, -0.015, 0.025], np.float32), np.zeros(4, np.float32),
               np.array([-0.635, 0.0, 0.0, 0.0], np.float32)],
    "zero": [np.zeros(5, np.float32)] * 3,
    "nan": [np.ones(4, np.float32), np.array([0.5, np.nan, 0.1, 0.2], np.float32), np.ones(4, np.float32)],
    "inf": [np.ones(4, np.float32), np.ones(4, np.float32), np.array([np.inf, 0.0, -1.0, 2.0], np.float32)],
}


class _TensorFlow:
    def __init__(self):
        self.tf = pytest.importorskip("tensorflow")
        from harness.frameworks.tensorflow import communication, optimizers
        self.c, self.opt = communication, optimizers

    def int8(self, per_rank):
        tf, c = self.tf, self.c
        scale = c.scales(tf.reduce_max(tf.stack([c.maximum(tf.constant(g)) for g in per_rank])))
        q = tf.stack([c.quantise(tf.constant(g), scale) for g in per_rank])
        return q.numpy(), c.dequantised_mean(q, scale, len(per_rank)).numpy()

    def steps(self, name, start, grads, lrs, wd):
        tf = self.tf
        var = [tf.Variable(w.astype(np.float32)) for w in start]
        opt = self.opt.make(name, lrs[0], weight_decay=wd)
        for lr, gs in zip(lrs, grads):
            opt.learning_rate.assign(lr)
            opt.apply_gradients(zip([tf.constant(g.astype(np.float32)) for g in gs], var))
        return [v.numpy() for v in var]


class _PyTorch:
    def __init__(self):
        self.torch = pytest.importorskip("torch")
        from harness.frameworks.pytorch import communication, optimizers
        self.c, self.opt = communication, optimizers

    def int8(self, per_rank):
        torch, c = self.torch, self.c
        tensors = [torch.from_numpy(g.copy()) for g in per_rank]
        scale = c.scales(torch.stack([c.maxima([t]) for t in tensors]).max(0).values)[0]
        q = torch.stack([c.quantise(t, scale) for t in tensors])
        return q.numpy(), c.dequantised_mean(q, scale, len(per_rank)).numpy()

    def steps(self, name, start, grads, lrs, wd):
        torch = self.torch
        params = [torch.nn.Parameter(torch.from_numpy(w.astype(np.float32))) for w in start]
        opt = {"lars": self.opt.LARS, "lamb": self.opt.LAMB}[name](params, lr=lrs[0], weight_decay=wd)
        for lr, gs in zip(lrs, grads):
            for group in opt.param_groups:
                group["lr"] = lr
            for p, g in zip(params, gs):
                p.grad = torch.from_numpy(g.astype(np.float32))
            opt.step()
        return [p.detach().numpy() for p in params]


class _MindSpore:
    """MindSpore's int8 arithmetic is numpy on the host (its exchange runs there, over MPI)."""

    def __init__(self):
        self.ms = pytest.importorskip("mindspore")
        from harness.frameworks.mindspore import communication, optimizers
        self.c, self.opt = communication, optimizers

    def int8(self, per_rank):
        c = self.c
        scale = c.scales(np.max([c.maxima([g]) for g in per_rank], axis=0))[0]
        q = np.stack([c.quantise(g, scale) for g in per_rank])
        return q, c.dequantised_mean(q, scale)

    def steps(self, name, start, grads, lrs, wd):
        ms = self.ms
        params = [ms.Parameter(ms.Tensor(w.astype(np.float32)), name=f"w{i}") for i, w in enumerate(start)]
        opt = {"lars": self.opt.LARS, "lamb": self.opt.LAMB}[name](params, lr=lrs, weight_decay=wd)   # one a step
        for gs in grads:
            opt([ms.Tensor(g.astype(np.float32)) for g in gs])
        return [p.asnumpy() for p in params]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def framework(request):
    return {"tensorflow": _TensorFlow, "pytorch": _PyTorch, "mindspore": _MindSpore}[request.param]()


@pytest.mark.parametrize("case", CASES)
def test_the_int8_exchange_is_the_references_to_the_bit(framework, case):
    per_rank = CASES[case]
    want_q, scale = communication.int8_quantised(per_rank)
    want = communication.int8_mean(per_rank)
    q, mean = framework.int8(per_rank)
    assert q.dtype == np.int8 and np.array_equal(q, want_q), (q, want_q)
    np.testing.assert_array_equal(np.isnan(mean), np.isnan(want))
    np.testing.assert_allclose(mean, want, rtol=1e-6, atol=0)
    if case in ("nan", "inf"):   # a non-finite gradient on one rank: NaN on every rank, the step skipped
        assert np.isinf(scale) and np.isnan(mean).all() and not q.any()


def test_the_int8_reference_by_hand():
    # scale 1.27 / 127 = 0.01: 0.005 / 0.01 = 0.5 and -0.015 / 0.01 = -1.5 round half to even
    q, scale = communication.int8_quantised(CASES["halves"])
    assert scale == np.float32(np.float32(1.27) / np.float32(127))
    assert q.tolist() == [[127, 0, -2, 2], [0, 0, 0, 0], [-64, 0, 0, 0]]
    assert communication.int8_quantised(CASES["zero"])[1] == 1.0   # every rank's zero: any scale
    assert np.isnan(communication.int8_mean(CASES["nan"])).all()


def _start_and_grads(nonfinite: bool):
    """A 3 x 2 kernel and a bias, three steps of gradients; the second step's kernel
    gradient holds a NaN where `nonfinite`."""
    start = [np.array([[0.8, -1.1], [0.3, 2.0], [-0.6, 0.9]]), np.array([0.05, -0.02])]
    grads = [[RNG.normal(size=(3, 2)) * 0.1, RNG.normal(size=2) * 0.1] for _ in range(3)]
    if nonfinite:
        grads[1][0][1, 0] = np.nan
    return start, grads


@pytest.mark.parametrize("name", ["lars", "lamb"])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_lars_and_lamb_are_the_references(framework, name, nonfinite):
    start, grads = _start_and_grads(nonfinite)
    lrs, wd = (0.5, 0.25, 0.125), 0.01
    want = []
    for w in start:
        w, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
        i = len(want)
        for step, (lr, gs) in enumerate(zip(lrs, grads), 1):
            if name == "lars":
                w, v, _ = optimizers.lars_step(w, gs[i], v, lr, wd)
            else:
                w, m, v, _ = optimizers.lamb_step(w, gs[i], m, v, step, lr, wd)
        want.append(w)
    got = framework.steps(name, start, grads, lrs, wd)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    if nonfinite:   # the NaN's norm fails "> 0": the ratio falls back to 1, the NaN stays in its element
        assert np.isnan(got[0]).sum() == 1 and np.isnan(got[0][1, 0]) and np.isfinite(got[1]).all()
