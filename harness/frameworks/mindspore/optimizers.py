"""LARS and LAMB in MindSpore, with the update rules of harness/optimizers.py (the numpy
references every framework is held to: tests/test_conformance.py), and Adam with
decoupled weight decay (AdamW, deepcam's adam), PyTorch's torch.optim.AdamW rule.

    opt = LARS(params, lr=0.2, momentum=0.9, weight_decay=0.0, l2=3e-5)
    opt = LAMB(params, lr=2e-3, weight_decay=1e-2, eps=1e-6)
    opt = AdamW(params, lr=1e-3, weight_decay=1e-2, eps=1e-6)
    opt(grads)          # one step, the gradients in the order of opt.parameters
    opt = LAMB(params, lr=[1e-3, 2e-3, 1e-3])   # one LR a step, read at opt.global_step (nn.Optimizer's dynamic LR)

MindSpore's own nn.LARS wraps another optimizer with its own trust-ratio rule (no
weight decay inside the ratio's denominator as MLPerf's LARS has it), and its nn.Lamb
clips the trust ratio's norms at 10 like pytorch-optimizer's: a run would train another
optimizer under the same name. These follow the references line for line:

    LARS (MLPerf's ResNet variant): trust = eta ||w|| / (||g|| + wd ||w||)   (1 unless both norms > 0)
        v = momentum v + lr trust (g + wd w);   w = w - v
    LAMB: Adam's bias-corrected moments, u = m_hat / (sqrt(v_hat) + eps) + wd w,
        w = w - lr (||w|| / ||u||) u                                          (1 unless both norms > 0)
    AdamW: the same u, w = w - lr u (no trust ratio): PyTorch's w (1 - lr wd) then Adam's step

MindSpore's nn.AdamWeightDecay divides m by sqrt(v) + eps without the bias corrections
(its first steps are another optimizer's) and its nn.Adam's weight_decay is the coupled
kind: neither is AdamW.

Excluded tensors, those of one dimension or none (biases, batch norm's gamma and beta), take
no trust ratio and no weight decay (AdamW's too). `l2` is the model's coupled decay (its Keras twin's L2
kernel regularizer): l2 w joins a kernel's gradient before either rule. Each runs eagerly,
tensor by tensor (MindSpore's PyNative operators: the 2-rank digits sweep's LAMB steps took
11x SGD's there; one mindspore.jit graph of the whole update was 2e-6 off the reference
after 3 steps, past tests/test_conformance.py's tolerance, with the norms summed in float64
too, and is not used), every write an ops.assign into the
state's own memory (train.put says why); the slots and the steps are Parameters, so
that the undone warm-up finds them in get_parameters(). Two steps, as in nn.Optimizer and
Keras: `global_step` indexes the LR schedule and counts the steps fp16 skips too (the Step
adds them), `step` counts the updates applied (Adam's bias correction).
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import ops


def _trust(numerator, denominator, w_norm, other_norm):
    """numerator / denominator, or 1 unless both norms are > 0 (a NaN norm is not)."""
    ok = ops.logical_and(w_norm > 0, other_norm > 0)
    one = ops.ones_like(numerator)
    return ops.where(ok, numerator / ops.where(ok, denominator, one), one)


class _Layerwise:
    """What LARS and LAMB share: the parameters, the LR (one, or one a step), the steps and the slots."""

    def __init__(self, params, lr, slots: tuple, l2: float):
        self.parameters = tuple(params)
        self.lrs = np.atleast_1d(np.asarray(lr, np.float32))   # host-side: the update is eager, read there
        self.global_step = ms.Parameter(ms.Tensor([0], ms.int32), name="global_step")
        self.step = ms.Parameter(ms.Tensor(0, ms.int32), name="layerwise_step")
        self.slots = {s: [ms.Parameter(ops.zeros_like(p), name=f"{s}.{p.name}") for p in self.parameters]
                      for s in slots}
        self.l2 = l2

    def get_parameters(self):
        return [self.global_step, self.step, *(p for slot in self.slots.values() for p in slot)]

    def _gradient(self, p, g):
        return g + self.l2 * p if self.l2 and p.ndim >= 2 else g

    def __call__(self, grads) -> None:
        at = int(self.global_step.asnumpy()[0])
        lr = float(self.lrs[min(at, len(self.lrs) - 1)])   # one LR: every step's
        ops.assign(self.global_step, self.global_step + 1)
        ops.assign(self.step, self.step + 1)
        t = int(self.step.asnumpy())
        for i, (p, g) in enumerate(zip(self.parameters, grads)):
            ops.assign(p, p - self.update(i, p, self._gradient(p, g), lr, t))


class LARS(_Layerwise):
    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, l2: float = 0.0):
        super().__init__(params, lr, ("velocity",), l2)
        self.momentum, self.wd, self.eta = momentum, weight_decay, eta

    def update(self, i, p, g, lr: float, t: int):
        if p.ndim >= 2:
            w_norm, g_norm = ops.norm(p), ops.norm(g)
            g = _trust(self.eta * w_norm, g_norm + self.wd * w_norm, w_norm, g_norm) * (g + self.wd * p)
        v = self.slots["velocity"][i]
        ops.assign(v, self.momentum * v + lr * g)
        return v


class LAMB(_Layerwise):
    TRUST = True     # LAMB scales each kernel's step by ||w|| / ||u||; AdamW does not

    def __init__(self, params, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, l2: float = 0.0):
        super().__init__(params, lr, ("m", "v"), l2)
        (self.b1, self.b2), self.eps, self.wd = betas, eps, weight_decay

    def update(self, i, p, g, lr: float, t: int):
        m, v = self.slots["m"][i], self.slots["v"][i]
        ops.assign(m, self.b1 * m + (1 - self.b1) * g)
        ops.assign(v, self.b2 * v + (1 - self.b2) * g * g)
        # 1 - b**t as -expm1(t log b): exact where 1 - 0.999**t would cancel digits
        u = (m / -math.expm1(t * math.log(self.b1))) / (ops.sqrt(v / -math.expm1(t * math.log(self.b2))) + self.eps)
        if p.ndim >= 2:
            u = u + self.wd * p
            if self.TRUST:
                w_norm, u_norm = ops.norm(p), ops.norm(u)
                u = _trust(w_norm, u_norm, w_norm, u_norm) * u
        return lr * u


class AdamW(LAMB):
    """LAMB's u without its trust ratio: w - lr (m_hat / (sqrt(v_hat) + eps) + wd w), which is
    torch.optim.AdamW's w (1 - lr wd) followed by Adam's step (the decay reads the old w)."""
    TRUST = False
