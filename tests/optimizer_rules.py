"""LARS's and LAMB's update rules replayed in numpy (float64), the reference both
frameworks' optimizers are held to (tests/test_optimizers.py: TensorFlow's,
tests/test_pytorch_optimizers.py: PyTorch's). No framework imported."""
import numpy as np

LRS = (2.0, 1.0, 0.5)  # a different LR each step, assigned the way the training steps do
WD = 0.1


def trust(ratio_num, ratio_den, w_norm, other_norm):
    return ratio_num / ratio_den if w_norm > 0 and other_norm > 0 else 1.0


def lars_numpy(start, grads, wd, momentum=0.9, eta=0.001, exclude=True, layerwise=True, ratios=None):
    out = []
    for i, w in enumerate(start):
        w, v = w.copy(), np.zeros_like(w)
        for lr, gs in zip(LRS, grads):
            g = gs[i]
            if not (exclude and w.ndim <= 1):
                wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                t = trust(eta * wn, gn + wd * wn, wn, gn) if layerwise else 1.0
                if ratios is not None:
                    ratios.append(t)
                g = t * (g + wd * w)
            v = momentum * v + lr * g
            w = w - v
        out.append(w)
    return out


def lamb_numpy(start, grads, wd, b1=0.9, b2=0.999, eps=1e-6, exclude=True, layerwise=True, ratios=None):
    out = []
    for i, w in enumerate(start):
        w, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
        for t, (lr, gs) in enumerate(zip(LRS, grads), 1):
            g = gs[i]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            if not (exclude and w.ndim <= 1):
                u = u + wd * w
                wn, un = np.linalg.norm(w), np.linalg.norm(u)
                r = trust(wn, un, wn, un) if layerwise else 1.0
                if ratios is not None:
                    ratios.append(r)
                u = r * u
            w = w - lr * u
        out.append(w)
    return out


def assert_close(got, want):
    """1e-5 relative, an entry near 0 (a weight that crossed 0) against its variable's scale."""
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


def far(got, want):
    """True if some variable differs from `want` by much more than the tolerance."""
    return any(not np.allclose(g, w, rtol=1e-3, atol=1e-3) for g, w in zip(got, want))
