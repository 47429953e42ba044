"""Sophia-G as ALCF's Megatron-DeepSpeed fork steps it (--optimizer sophiag).

argonne-lcf/Megatron-DeepSpeed at ffa3456d: megatron/optimizer/sophia.py `SophiaG` (from Liuhong99/Sophia), built
in megatron/optimizer/__init__.py as `SophiaG(param_groups, lr=--lr, betas=(--sophiag-beta1, --sophiag-beta2),
rho=--sophiag-rho, weight_decay=--weight-decay)` and stepped by DeepSpeed's engine with `optimizer.step()` (its
default `bs=5120`). Per element, `_single_tensor_sophiag`:

    p *= 1 - lr * wd                                  decoupled weight decay first
    m = beta1 m + (1 - beta1) g                       the momentum
    p -= lr * sign(m) * min(|m| / (rho * bs * h + 1e-15), 1)

where h is the Hessian estimate, the state `hessian`, which `SophiaG.update_hessian` would move toward g * g. The
fork's training never calls update_hessian (nor does DeepSpeed's engine), so h stays zero and each update is lr x
sign(m), clipped to 1 wherever |m| >= 1e-15: what AuroraGPT's Sophia-G runs computed. Here h is kept as the fork
keeps it, the second fp32 state (in the partition's `exp_avg_sq` slot, so ZeRO partitions, offloads and checkpoints
it as Adam's second moment), and the clipped ratio reads it. The arithmetic runs over windows of WINDOW elements."""

from __future__ import annotations

from typing import Iterable

import torch

# The fork's SophiaG.step(bs=5120): the batch size in the ratio's denominator, never passed by its training.
BATCH = 5120
# Elements stepped at once: the ratio's temporaries are two fp32 windows at the step's peak.
WINDOW = 1 << 20
TEMPORARIES = 2


class SophiaG(torch.optim.Optimizer):
    """The fork's SophiaG step over parameters whose states ("step", "exp_avg" (the momentum), "exp_avg_sq" (the
    fork's `hessian`)) the caller has put in `self.state` (zeros of the parameter's shape, step 0)."""

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
    """One window of the fork's _single_tensor_sophiag, its operations in its order."""
    p.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    ratio = (exp_avg.abs() / (rho * batch * hessian + 1e-15)).clamp(None, 1)
    p.addcmul_(exp_avg.sign(), ratio, value=-lr)
