"""The layer-wise optimizers of Table 2, LARS and LAMB, as plain numpy references: one step
of one tensor, in float64. Each framework implements them with its own ops
(harness/frameworks/tensorflow/optimizers.py, harness/frameworks/pytorch/optimizers.py);
tests/test_conformance.py holds every one to these rules, non-finite gradients included.
Pure functions.

    LARS (MLPerf's ResNet variant): trust = eta ||w|| / (||g|| + wd ||w||)
        v = momentum v + lr trust (g + wd w);   w = w - v
    LAMB: Adam's bias-corrected moments, u = m_hat / (sqrt(v_hat) + eps) + wd w,
        w = w - lr (||w|| / ||u||) u

A trust ratio is 1 where ||w|| or the other norm is 0 or not a number (a zero-initialised
layer, a zero or non-finite gradient): there it would be 0, inf or NaN and freeze or blow
up the layer. A NaN element of a gradient so stays in its own element of the step (the
frameworks' do the same; fp16's loss scaling skips such a step before it). Excluded
tensors, those of one dimension or none (biases, batch norm's gamma and beta), take no
trust ratio and no weight decay: LARS is then momentum SGD, LAMB Adam.
"""
from __future__ import annotations

import numpy as np


def trust(numerator: float, denominator: float, w_norm: float, other_norm: float) -> float:
    """numerator / denominator, or 1 unless both norms are > 0 (a NaN norm is not)."""
    return numerator / denominator if w_norm > 0 and other_norm > 0 else 1.0


def excluded(w: np.ndarray) -> bool:
    """Biases and batch norm's gamma and beta (one dimension or none): no ratio, no decay."""
    return w.ndim <= 1


def lars_step(w, g, v, lr: float, wd: float, momentum: float = 0.9, eta: float = 0.001,
              exclude: bool = True, layerwise: bool = True):
    """(w, v, the trust ratio used) after one LARS step of tensor `w` with gradient `g` and
    velocity `v`. `exclude=False` treats every tensor as a kernel; `layerwise=False` fixes
    the ratio at 1 (what the rule is without it)."""
    ratio = 1.0
    if not (exclude and excluded(w)):
        wn, gn = np.linalg.norm(w), np.linalg.norm(g)
        ratio = trust(eta * wn, gn + wd * wn, wn, gn) if layerwise else 1.0
        g = ratio * (g + wd * w)
    v = momentum * v + lr * g
    return w - v, v, ratio


def lamb_step(w, g, m, v, step: int, lr: float, wd: float, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-6, exclude: bool = True, layerwise: bool = True):
    """(w, m, v, the trust ratio used) after LAMB's step number `step` (from 1) of tensor `w`
    with gradient `g` and moments `m`, `v`; `exclude` and `layerwise` as lars_step's."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
    ratio = 1.0
    if not (exclude and excluded(w)):
        u = u + wd * w
        wn, un = np.linalg.norm(w), np.linalg.norm(u)
        ratio = trust(wn, un, wn, un) if layerwise else 1.0
        u = ratio * u
    return w - lr * u, m, v, ratio
