"""Adam with moments stored in bf16 (--use-precision-aware-optimizer, --exp-avg-dtype, --exp-avg-sq-dtype), computed as
TransformerEngine's FusedAdam does: each moment upcast to fp32, the AdamW update in fp32, the moment stored back rounded
to nearest even. The step runs over windows, so its fp32 temporaries are two windows."""

from __future__ import annotations

from typing import Iterable

import torch

# Elements stepped at once: two fp32 temporaries of this size at the peak.
WINDOW = 1 << 20
TEMPORARIES = 2


class PrecisionAwareAdamW(torch.optim.Optimizer):
    """AdamW over the states ("step", "exp_avg", "exp_avg_sq"; fp32 or bf16) the caller set."""

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                state["step"] += 1
                step = int(state["step"].item())
                flat = [param.view(-1), param.grad.view(-1), state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)]
                for start in range(0, param.numel(), WINDOW):
                    adamw_window(*(t[start:start + WINDOW] for t in flat), step=step, lr=group["lr"], beta1=beta1,
                                 beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
        return None


def adamw_window(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                 step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One window: the moments upcast to fp32, updated, written back; two fp32 windows at most."""
    m = exp_avg.float()
    v = exp_avg_sq.float()
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    m_copied, v_copied = m.data_ptr() != exp_avg.data_ptr(), v.data_ptr() != exp_avg_sq.data_ptr()
    if v_copied:
        exp_avg_sq.copy_(v)
        denom = v.div_(1.0 - beta2 ** step).sqrt_().add_(eps)
    else:
        denom = v.div(1.0 - beta2 ** step).sqrt_().add_(eps)
    if m_copied:
        exp_avg.copy_(m)
        update = m.div_(1.0 - beta1 ** step).div_(denom)
    else:
        update = m.div(1.0 - beta1 ** step).div_(denom)
    del denom
    update.add_(p, alpha=weight_decay)
    p.add_(update, alpha=-lr)
