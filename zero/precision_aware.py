"""Adam with moments stored in bf16: Megatron-LM's precision-aware optimizer (--use-precision-aware-optimizer with
--exp-avg-dtype bf16 and/or --exp-avg-sq-dtype bf16).

Megatron-Core hands the dtypes to TransformerEngine's FusedAdam (megatron/core/optimizer/__init__.py,
`_get_megatron_optimizer_based_on_param_groups`: exp_avg_dtype, exp_avg_sq_dtype, master_weight_dtype;
transformer_engine/pytorch/optimizers/fused_adam.py). Its kernel (transformer_engine/common/multi_tensor/adam.cu,
AdamFunctor / AdamFunctorMaster with adam_w_mode) loads each moment with static_cast<float>, computes the AdamW update
in fp32 (MATH_T = float) and stores the moment back with static_cast<MOMENT_T>, which for __nv_bfloat16 is
__float2bfloat16: round to nearest, ties to even, as a tensor's .to(torch.bfloat16) rounds. A bf16 moment has no scale
(fp16 and fp8 ones carry a per-tensor scale, not implemented here). Per element, at step t (ADAM_MODE_1):

    m = beta1 m + (1 - beta1) g                 in fp32, m read from its stored dtype
    v = beta2 v + (1 - beta2) g^2
    p -= lr ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + wd p)
    m, v written back in their stored dtype      a bf16 store rounds to nearest, ties to even

The same operations in the same order, each rounded to fp32 (a GPU kernel may fuse a multiply-add, so the last bit of
a CUDA run can differ). The master p and the gradient stay fp32. The step runs over windows of WINDOW elements, so the fp32 temporaries
(the upcast moments, reused for the denominator and the update) are two windows, not copies of the partition.
"""

from __future__ import annotations

from typing import Iterable

import torch

# Elements stepped at once: 4 MiB fp32 windows, two temporaries of that size at the step's peak.
WINDOW = 1 << 20
TEMPORARIES = 2


class PrecisionAwareAdamW(torch.optim.Optimizer):
    """AdamW over parameters whose states ("step", "exp_avg", "exp_avg_sq", either moment fp32 or bf16) the caller
    has put in `self.state`; every update computed in fp32."""

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
    """One window of the update: the moments upcast to fp32 (in place when they are fp32), updated and written
    back; the update reads the fp32 values, not the rounded ones. An upcast copy, once written back, is reused for
    the denominator or the update, so at most two fp32 windows are alive at once (TEMPORARIES)."""
    m = exp_avg.float()
    v = exp_avg_sq.float()
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    m_copied, v_copied = m.data_ptr() != exp_avg.data_ptr(), v.data_ptr() != exp_avg_sq.data_ptr()
    if v_copied:
        exp_avg_sq.copy_(v)  # round to nearest even
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
