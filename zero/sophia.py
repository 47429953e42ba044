"""Sophia-G as ALCF's Megatron-DeepSpeed fork steps it (--optimizer sophiag): decoupled decay, momentum, then p -= lr
sign(m) min(|m| / (rho bs h + 1e-15), 1). The fork never updates the Hessian estimate h, so it stays zero; it is kept in
the `exp_avg_sq` slot so ZeRO partitions and checkpoints it as Adam's second moment."""

from __future__ import annotations

from typing import Iterable

import torch

# The fork's SophiaG.step(bs=5120), never passed by its training.
BATCH = 5120
# Elements stepped at once: two fp32 temporaries of this size.
WINDOW = 1 << 20
TEMPORARIES = 2


class SophiaG(torch.optim.Optimizer):
    """The fork's SophiaG over states "exp_avg" and "exp_avg_sq" (its `hessian`) the caller set."""

    STATE_KEYS = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], rho: float,
                 weight_decay: float = 0.0, batch: int = BATCH) -> None:
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or rho < 0.0:
            raise ValueError(f"SophiaG: betas must be in [0, 1) and rho >= 0, got {betas} and {rho}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), rho=rho, weight_decay=weight_decay, batch=batch))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, _ = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                state["step"] += 1
                flat = [param.view(-1), param.grad.view(-1)] + [state[key].view(-1) for key in self.STATE_KEYS]
                for start in range(0, param.numel(), WINDOW):
                    _sophiag_window(*(t[start:start + WINDOW] for t in flat), lr=group["lr"], beta1=beta1,
                                    rho=group["rho"], batch=group["batch"], weight_decay=group["weight_decay"])
        return None


def _sophiag_window(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, hessian: torch.Tensor, *,
                    lr: float, beta1: float, rho: float, batch: int, weight_decay: float) -> None:
    """One window of the fork's _single_tensor_sophiag, in its order."""
    p.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    ratio = (exp_avg.abs() / (rho * batch * hessian + 1e-15)).clamp(None, 1)
    p.addcmul_(exp_avg.sign(), ratio, value=-lr)
