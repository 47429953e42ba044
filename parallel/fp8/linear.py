"""The FP8 linear, y = x W^T + b, forward and backward (dgrad and wgrad), in each recipe's formats, as
TransformerEngine's Linear runs it (transformer_engine/pytorch/module/linear.py):

- forward (fprop): x and W cast to e4m3, one GEMM;
- dgrad: dx = dy W, dy cast to the gradients' format (e5m2 under hybrid, e4m3 under e4m3);
- wgrad: dW = dy^T x, from the same casts (per-tensor recipes: a tensor and its transpose share one scale)
  or from casts along the token dimension (block recipes: TE quantizes each direction from the high
  precision tensor, "to avoid double quantization errors"); in high precision under --no-fp8-wgrad
  (delayed scaling only, as Megatron passes it to TE).
Every GEMM accumulates in fp32 and the result is cast to the tensor's own dtype once (bias added in fp32
first, TE's GEMM epilogue). The block recipes keep x (and, for mxfp8, W) in high precision for the backward
and cast it there: the same bits TE casts in the forward, at the memory of the high-precision copy.
"""

from __future__ import annotations

import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.kernel import ALIGNMENT, scaled_matmul
from parallel.fp8.recipes import (
    FP8_MAX,
    GRAD_OUTPUT,
    INPUT,
    WEIGHT,
    DelayedScaling,
    Fp8Recipe,
    amax_of,
    current_scale,
    input_type_max,
    quantize_tensorwise,
)


class Fp8LinearState:
    """What one FP8 linear keeps between steps: its recipe and, for delayed scaling, the amax histories and
    scales (state_dict / load_state_dict for the checkpoint), reduced by `reduce_amax` (DelayedScaling).
    The stateless recipes reduce nothing: TE's current-scaling and block quantizers cast each rank's own
    tensor (a weight shard with its own amax), except the input of a column-parallel linear and the output
    gradient of a row-parallel one under sequence parallelism, whose amax TE reduces over the TP group
    before an FP8 all-gather (module/linear.py, set_quantizer_amax_reduction_group). The TP layers here
    gather those in high precision before the linear, so casting the gathered tensor is that same cast."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu", reduce_amax=None):
        self.recipe = recipe
        self.delayed = DelayedScaling(recipe, device, reduce_amax) if recipe.recipe == "delayed" else None

    def quantize_per_tensor(self, tensor: torch.Tensor, role: int, dtype: torch.dtype):
        if self.delayed is not None:
            return self.delayed.quantize(tensor, role, dtype)
        # Float8CurrentScaling: the scale from this tensor's own amax (TE's default: no power-of-two scales).
        scale = current_scale(amax_of(tensor), FP8_MAX[dtype], False, input_type_max(tensor))
        return quantize_tensorwise(tensor, scale, dtype)


def shape_rule_broken(in_features: int, out_features: int, tokens: int, recipe: str) -> str | None:
    """Why a linear of this shape cannot run its three FP8 GEMMs (each of in, out and tokens is a GEMM's K
    once), or None: CUDA's multiple of 16 (kernel.py), and MXFP8's 32-wide blocks."""
    multiple = blocks.MX_BLOCK if recipe == "mxfp8" else ALIGNMENT
    odd = [f"{name} {size}" for name, size in (("in_features", in_features), ("out_features", out_features),
                                               ("tokens", tokens)) if size % multiple]
    return f"{', '.join(odd)} not a multiple of {multiple}" if odd else None


def _per_tensor_forward(ctx, x2, weight, state):
    recipe = state.recipe
    x_q, x_scale = state.quantize_per_tensor(x2, INPUT, recipe.forward_dtype)
    w_q, w_scale = state.quantize_per_tensor(weight, WEIGHT, recipe.forward_dtype)
    ctx.saved = (x_q, x_scale, w_q, w_scale, None if recipe.wgrad_in_fp8 else x2)
    return scaled_matmul(x_q, w_q.t(), x_scale, w_scale, torch.float32)


def _per_tensor_backward(ctx, g2, state):
    recipe = state.recipe
    x_q, x_scale, w_q, w_scale, x_high = ctx.saved
    g_q, g_scale = state.quantize_per_tensor(g2, GRAD_OUTPUT, recipe.backward_dtype)
    grad_x = scaled_matmul(g_q, w_q.t().contiguous().t(), g_scale, w_scale, torch.float32)
    if x_high is None:
        grad_w = scaled_matmul(g_q.t().contiguous(), x_q.t().contiguous().t(), g_scale, x_scale, torch.float32)
    else:
        grad_w = g2.t().to(x_high.dtype) @ x_high
    return grad_x, grad_w


def _blockwise_forward(ctx, x2, weight, state):
    x_q, x_scale = blocks.quantize_blocks_1d(x2, state.recipe.forward_dtype)
    w_q, w_scale = blocks.quantize_blocks_2d(weight, state.recipe.forward_dtype)
    ctx.saved = (x2, w_q, w_scale)
    return blocks.block_scaled_matmul(x_q, x_scale, w_q, blocks.expand_2d_scales(w_scale, weight.size(0)),
                                      blocks.BLOCK, torch.float32)


def _blockwise_backward(ctx, g2, state):
    recipe = state.recipe
    x2, w_q, w_scale = ctx.saved
    g_rows, g_rows_scale = blocks.quantize_blocks_1d(g2, recipe.backward_dtype)
    grad_x = blocks.block_scaled_matmul(g_rows, g_rows_scale, w_q.t().contiguous(),
                                        blocks.expand_2d_scales(w_scale.t(), w_q.size(1)), blocks.BLOCK,
                                        torch.float32)
    g_cols, g_cols_scale = blocks.quantize_blocks_1d(g2.t(), recipe.backward_dtype)
    x_cols, x_cols_scale = blocks.quantize_blocks_1d(x2.t(), recipe.forward_dtype)
    grad_w = blocks.block_scaled_matmul(g_cols, g_cols_scale, x_cols, x_cols_scale, blocks.BLOCK, torch.float32)
    return grad_x, grad_w


def _mx_forward(ctx, x2, weight, state):
    x_q, x_scale = blocks.quantize_mx(x2, state.recipe.forward_dtype)
    w_q, w_scale = blocks.quantize_mx(weight, state.recipe.forward_dtype)
    ctx.saved = (x2, weight)
    return blocks.block_scaled_matmul(x_q, x_scale, w_q, w_scale, blocks.MX_BLOCK, torch.float32)


def _mx_backward(ctx, g2, state):
    recipe = state.recipe
    x2, weight = ctx.saved
    g_rows, g_rows_scale = blocks.quantize_mx(g2, recipe.backward_dtype)
    w_cols, w_cols_scale = blocks.quantize_mx(weight.t(), recipe.forward_dtype)
    grad_x = blocks.block_scaled_matmul(g_rows, g_rows_scale, w_cols, w_cols_scale, blocks.MX_BLOCK, torch.float32)
    g_cols, g_cols_scale = blocks.quantize_mx(g2.t(), recipe.backward_dtype)
    x_cols, x_cols_scale = blocks.quantize_mx(x2.t(), recipe.forward_dtype)
    grad_w = blocks.block_scaled_matmul(g_cols, g_cols_scale, x_cols, x_cols_scale, blocks.MX_BLOCK, torch.float32)
    return grad_x, grad_w


_FORWARD = {"delayed": _per_tensor_forward, "tensorwise": _per_tensor_forward, "blockwise": _blockwise_forward,
            "mxfp8": _mx_forward}
_BACKWARD = {"delayed": _per_tensor_backward, "tensorwise": _per_tensor_backward,
             "blockwise": _blockwise_backward, "mxfp8": _mx_backward}


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, state):
        x2 = x.detach().reshape(-1, x.size(-1))
        out = _FORWARD[state.recipe.recipe](ctx, x2, weight.detach(), state)
        if bias is not None:
            out = out + bias.detach().float()
        ctx.state, ctx.x_shape, ctx.x_dtype, ctx.has_bias = state, x.shape, x.dtype, bias is not None
        ctx.weight_dtype = weight.dtype
        return out.to(x.dtype).reshape(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad_out):
        g2 = grad_out.reshape(-1, grad_out.size(-1))
        grad_x, grad_w = _BACKWARD[ctx.state.recipe.recipe](ctx, g2, ctx.state)
        grad_bias = g2.sum(0) if ctx.has_bias else None
        ctx.saved = None
        return grad_x.to(ctx.x_dtype).reshape(ctx.x_shape), grad_w.to(ctx.weight_dtype), grad_bias, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               state: Fp8LinearState) -> torch.Tensor:
    """F.linear(x, weight, bias) with its three GEMMs in FP8 as state's recipe says."""
    return _Fp8LinearFunction.apply(x, weight, bias, state)
