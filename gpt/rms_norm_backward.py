"""RMSNorm keeping its input and per-token rsqrt for backward (as Transformer Engine's keeps rsigma), instead of
autograd's fp32 copy and normed values. The backward is autograd's written out op for op, so values and gradients are
bit-identical."""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable


class _RMSNormKeepingInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scaled: torch.Tensor, squared: Optional[torch.Tensor], weight: torch.Tensor, eps: float,
                zero_centered: bool) -> torch.Tensor:
        # rms_norm_math's ops, the rsqrt kept
        as_float = scaled.float()
        rsqrt = torch.rsqrt((as_float if squared is None else squared.float()).pow(2).mean(-1, keepdim=True) + eps)
        normed = as_float * rsqrt
        if zero_centered:
            output = (normed * (1.0 + weight.float())).to(scaled.dtype)
        else:
            output = weight * normed.to(scaled.dtype)
        ctx.save_for_backward(scaled, weight, rsqrt)
        ctx.zero_centered, ctx.twice = zero_centered, squared is not None
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        hidden, weight, rsqrt = ctx.saved_tensors
        needs_input = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # bf16 enters the fp32 products as it is (promotion casts exactly); fp16 is cast first, as its doubling could
        # overflow
        as_float = hidden if hidden.dtype == torch.bfloat16 else hidden.float()
        normed = as_float * rsqrt
        grad_weight = grad_normed = None
        if ctx.zero_centered:
            grad_float = grad.float()
            if ctx.needs_input_grad[2]:
                grad_weight = (grad_float * normed).sum_to_size(weight.shape).to(weight.dtype)
            if needs_input:
                grad_normed = grad_float * (1.0 + weight.float())
        else:
            if ctx.needs_input_grad[2]:
                grad_weight = (grad * normed.to(hidden.dtype)).sum_to_size(weight.shape)
            if needs_input:
                grad_normed = (grad * weight).float()
        if not needs_input:
            return None, None, grad_weight, None, None
        grad_product = grad_normed * rsqrt
        grad_rsqrt = (grad_normed * as_float).sum_to_size(rsqrt.shape)
        grad_mean = grad_rsqrt * -0.5 * rsqrt.pow(3)
        grad_squares = grad_mean.expand(as_float.shape) / as_float.shape[-1]
        grad_of_squares = grad_squares * (as_float * 2.0)
        if ctx.twice:  # fp32: the product's and the squares' gradients reach the input apart, in that order
            return grad_product, grad_of_squares, grad_weight, None, None
        return (grad_product + grad_of_squares).to(hidden.dtype), None, grad_weight, None, None


def rms_norm_keeping_input(hidden: torch.Tensor, weight: torch.Tensor, eps: float,
                           zero_centered: bool = False) -> torch.Tensor:
    """rms_norm_math's values and gradients, keeping the input and the rsqrt."""
    squared = hidden if hidden.dtype == torch.float32 else None
    return _RMSNormKeepingInput.apply(hidden, squared, weight, eps, zero_centered)
