"""AdEMAMix (--optimizer ademamix): Adam plus a slow, uncorrected momentum m2 weighted by alpha, as swiss-ai's
Megatron-LM fork steps it, operation for operation, with its alpha and beta3 warmups. The step counts per parameter (as
PyTorch's AdamW), since the offloaded host step steps only pieces that have a gradient."""

from __future__ import annotations

import math
from typing import Iterable

import torch

# Elements stepped at once: three fp32 temporaries of this size at the peak.
WINDOW = 1 << 20
TEMPORARIES = 3


def linear_warmup(step: int, end: float, start: float = 0.0, warmup: int = 1) -> float:
    """The fork's linear_warmup_scheduler: alpha from `start` to `end` over `warmup` steps."""
    if step < warmup:
        a = step / float(warmup)
        return (1.0 - a) * start + a * end
    return end


def half_life_warmup(step: int, end: float, start: float = 0.0, warmup: int = 1) -> float:
    """The fork's linear_hl_warmup_scheduler: beta3 warmed up linearly in the half-life."""
    def half_life(beta: float, eps: float = 1e-8) -> float:
        return math.log(0.5) / math.log(beta + eps) - 1

    def beta_of(t: float) -> float:
        return math.pow(0.5, 1 / (t + 1))

    if step < warmup:
        a = step / float(warmup)
        return beta_of((1.0 - a) * half_life(start) + a * half_life(end))
    return end


class AdEMAMix(torch.optim.Optimizer):
    """The fork's AdEMAMix over states "exp_avg" (m1), "exp_avg_slow" (m2), "exp_avg_sq" (nu) the caller set."""

    STATE_KEYS = ("exp_avg", "exp_avg_slow", "exp_avg_sq")

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float, float], alpha: float,
                 beta3_warmup: int, alpha_warmup: int, eps: float, weight_decay: float = 0.0) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), alpha=alpha, beta3_warmup=beta3_warmup,
                        alpha_warmup=alpha_warmup, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2, beta3_final = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                state["step"] += 1
                step = int(state["step"].item())
                alpha = linear_warmup(step, group["alpha"], 0.0, group["alpha_warmup"])
                beta3 = half_life_warmup(step, beta3_final, beta1, group["beta3_warmup"])
                flat = [param.view(-1), param.grad.view(-1)] + [state[key].view(-1) for key in self.STATE_KEYS]
                for start in range(0, param.numel(), WINDOW):
                    _ademamix_window(*(t[start:start + WINDOW] for t in flat), step=step, lr=group["lr"],
                                     beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=group["eps"],
                                     weight_decay=group["weight_decay"])
        return None


def _ademamix_window(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_slow: torch.Tensor,
                     exp_avg_sq: torch.Tensor, *, step: int, lr: float, beta1: float, beta2: float, beta3: float,
                     alpha: float, eps: float, weight_decay: float) -> None:
    """One window of the fork's AdEMAMix.step, in its order (same roundings)."""
    bias_correction1 = 1.0 - (beta1 ** step)
    bias_correction2 = 1.0 - (beta2 ** step)
    if beta1 != 0.0:
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        fast = exp_avg
    else:  # the fork keeps no fast EMA then
        fast = grad
    exp_avg_slow.mul_(beta3).add_(grad, alpha=1 - beta3)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = exp_avg_sq.sqrt().div_(math.sqrt(bias_correction2)).add_(eps)
    update = fast.div(bias_correction1).add_(alpha * exp_avg_slow).div_(denom)
    del denom
    update.add_(p, alpha=weight_decay)
    p.add_(update, alpha=-lr)
