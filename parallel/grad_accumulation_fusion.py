"""A linear whose weight gradient is added straight into an fp32 `weight.main_grad` (issue 40's lever
"weight-gradient GEMMs accumulating straight into the fp32 main gradient"; Megatron-Core's
gradient_accumulation_fusion).

Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication.backward
(megatron/core/tensor_parallel/layers.py) calls fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(
total_input, grad_output, weight.main_grad): main_grad += grad_output^T @ input, with no 16-bit
weight gradient materialised and no separate add; autograd then gets no weight gradient. This is that
contract in plain PyTorch: the GEMM runs in main_grad's dtype (fp32) and adds in place (addmm_), so a
micro-batch's contribution is never rounded to 16 bits before it is accumulated.

Status: a layer option (ColumnParallelLinear / RowParallelLinear `gradient_accumulation_fusion=True`),
off by default and not yet wired into ZeRO's reducer (zero/grad_reducer.py reduces `param.grad` from
hooks; reducing from main_grad buffers instead is the GPU session's work). No speed is claimed: on CUDA
the fp32 GEMM here upcasts its 16-bit inputs, which Megatron's fused kernel does not.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


class _LinearWithMainGradAccumulation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        input, weight = ctx.saved_tensors
        grad_input = grad_output @ weight if ctx.needs_input_grad[0] else None
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        flat_input = input.reshape(-1, input.shape[-1])
        main_grad = weight.main_grad
        main_grad.addmm_(flat_grad.t().to(main_grad.dtype), flat_input.to(main_grad.dtype))
        grad_bias = flat_grad.sum(dim=0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        # As in Megatron, autograd receives no weight gradient: main_grad already holds it.
        return grad_input, None, grad_bias


def linear_with_main_grad_accumulation(input: torch.Tensor, weight: torch.Tensor,
                                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear whose weight gradient is added into `weight.main_grad` (which the caller allocates,
    usually fp32, and zeroes between optimizer steps) instead of `weight.grad`."""
    if getattr(weight, "main_grad", None) is None:
        raise ValueError("gradient accumulation fusion needs weight.main_grad (an fp32 buffer of the weight's "
                         "shape) to accumulate into")
    return _LinearWithMainGradAccumulation.apply(input, weight, bias)
