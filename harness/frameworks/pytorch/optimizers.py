"""LARS and LAMB in PyTorch, with the update rules of harness/frameworks/tensorflow/optimizers.py (TensorFlow's).

    opt = LARS(params, lr=0.2, momentum=0.9, weight_decay=0.0, l2=3e-5)
    opt = LAMB(params, lr=2e-3, weight_decay=1e-2, eps=1e-6)

PyTorch has neither. The maintained libraries that have them do not run the same
update as our TensorFlow ones, so a run would train a different optimizer in each
framework under one name: timm's cannot be imported without torchvision (which pins
another torch); pytorch-optimizer's LAMB drops the second moment's bias correction and
clamps ||w|| at 10 (a ResNet-50 3x3 kernel starts near 22, so its step would be halved).
These follow harness/frameworks/tensorflow/optimizers.py line for line (tests/test_pytorch_optimizers.py replays
both against the same numpy rules):

    LARS (MLPerf's ResNet variant): trust = eta ||w|| / (||g|| + wd ||w||)   (1 if ||w|| or ||g|| is 0)
        v = momentum v + lr trust (g + wd w);   w = w - v
    LAMB: Adam's bias-corrected moments, u = m_hat / (sqrt(v_hat) + eps) + wd w,
        w = w - lr (||w|| / ||u||) u                                          (1 if either norm is 0)

Excluded tensors, those of one dimension or none (biases, batch norm's gamma and beta), take
no trust ratio and no weight decay: LARS then is momentum SGD, LAMB Adam. `l2` is the
model's coupled decay (its Keras twin's L2 kernel regularizer, which TensorFlow adds to
the loss): l2 w joins the gradient of the kernels before either rule, as the regularizer's
gradient does in TensorFlow. No host synchronisation: the norms stay on the device.
"""
from __future__ import annotations

import math

import torch


def _trust(numerator, denominator, w_norm, other_norm):
    """numerator / denominator, or 1 where ||w|| or the other norm is 0 (a zero-initialised
    layer, a zero gradient): there the ratio is 0, inf or nan and would freeze or blow up the layer."""
    ok = (w_norm > 0) & (other_norm > 0)
    return torch.where(ok, numerator / torch.where(ok, denominator, torch.ones_like(denominator)),
                       torch.ones_like(numerator))


def _gradient(p, l2: float):
    """The gradient the rule sees: a kernel's with the coupled l2 w added."""
    g = p.grad
    return g + l2 * p if l2 and p.dim() >= 2 else g


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, l2: float = 0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta,
                                  "l2": l2})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _gradient(p, group["l2"])
                if p.dim() >= 2:
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    g = _trust(group["eta"] * w_norm, g_norm + wd * w_norm, w_norm, g_norm) * (g + wd * p)
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                v = state["velocity"]
                v.mul_(group["momentum"]).add_(g, alpha=lr)
                p.sub_(v)
        return loss


class LAMB(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, l2: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "l2": l2})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _gradient(p, group["l2"])
                state = self.state[p]
                if not state:
                    state["step"], state["m"], state["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["m"], state["v"], state["step"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                # 1 - b**t as -expm1(t log b): exact where 1 - 0.999**t would cancel digits
                u = (m / -math.expm1(t * math.log(b1))) / ((v / -math.expm1(t * math.log(b2))).sqrt() + group["eps"])
                if p.dim() >= 2:
                    u = u + group["weight_decay"] * p
                    w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
                    u = _trust(w_norm, u_norm, w_norm, u_norm) * u
                p.sub_(u, alpha=group["lr"])
        return loss
