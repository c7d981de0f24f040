"""LARS's and LAMB's update rules (harness/optimizers.py, the numpy reference) replayed over
a few steps, which both frameworks' optimizers are held to (tests/test_optimizers.py:
TensorFlow's, tests/test_pytorch_optimizers.py: PyTorch's; tests/test_conformance.py: every
framework's, non-finite gradients included). No framework imported."""
import numpy as np

from harness import optimizers

LRS = (2.0, 1.0, 0.5)  # a different LR each step, assigned the way the training steps do
WD = 0.1


def lars_numpy(start, grads, wd, momentum=0.9, eta=0.001, exclude=True, layerwise=True, ratios=None):
    """Each tensor of `start` after one harness/optimizers.lars_step a step of `grads`, at LRS."""
    out = []
    for i, w in enumerate(start):
        w, v = w.copy(), np.zeros_like(w)
        for lr, gs in zip(LRS, grads):
            w, v, t = optimizers.lars_step(w, gs[i], v, lr, wd, momentum, eta, exclude, layerwise)
            if ratios is not None and not (exclude and w.ndim <= 1):
                ratios.append(t)
        out.append(w)
    return out


def lamb_numpy(start, grads, wd, b1=0.9, b2=0.999, eps=1e-6, exclude=True, layerwise=True, ratios=None):
    """Each tensor of `start` after one harness/optimizers.lamb_step a step of `grads`, at LRS."""
    out = []
    for i, w in enumerate(start):
        w, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
        for t, (lr, gs) in enumerate(zip(LRS, grads), 1):
            w, m, v, r = optimizers.lamb_step(w, gs[i], m, v, t, lr, wd, b1, b2, eps, exclude, layerwise)
            if ratios is not None and not (exclude and w.ndim <= 1):
                ratios.append(r)
        out.append(w)
    return out


def assert_close(got, want):
    """1e-5 relative, an entry near 0 (a weight that crossed 0) against its variable's scale."""
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


def far(got, want):
    """True if some variable differs from `want` by much more than the tolerance."""
    return any(not np.allclose(g, w, rtol=1e-3, atol=1e-3) for g, w in zip(got, want))
