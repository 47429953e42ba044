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

from typing import Optional

import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.guard import CastCounts, LayerGuard
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
    scales (state_dict / load_state_dict for the checkpoint), reduced and updated once per pass
    (parallel/fp8/delayed_updates.py). The stateless recipes reduce nothing: TE's current-scaling and block
    quantizers cast each rank's own tensor (a weight shard with its own amax), except the input of a
    column-parallel linear and the output gradient of a row-parallel one under sequence parallelism, whose amax TE
    reduces over the TP group before an FP8 all-gather (module/linear.py, set_quantizer_amax_reduction_group). The
    TP layers here gather those in high precision before the linear, so casting the gathered tensor is that same
    cast."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu", guard: Optional[LayerGuard] = None):
        self.recipe = recipe
        self.delayed = DelayedScaling(recipe, device) if recipe.recipe == "delayed" else None
        self.guard = guard  # --fp8-guard (parallel/fp8/guard.py); None: no counts, no fallback
        # --fp8-param-gather (parallel/fp8/param_gather.py): the weight as ZeRO gathered it, already in e4m3 with
        # its scale; None: the forward casts the weight.
        self.fp8_weight = None

    def quantize_per_tensor(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, counts=None):
        if self.delayed is not None:
            return self.delayed.quantize(tensor, role, dtype, counts)
        # Float8CurrentScaling: the scale from this tensor's own amax (TE's default: no power-of-two scales).
        scale = current_scale(amax_of(tensor), FP8_MAX[dtype], False, input_type_max(tensor))
        return quantize_tensorwise(tensor, scale, dtype, counts)


def shape_rule_broken(in_features: int, out_features: int, tokens: int, recipe: str) -> str | None:
    """Why a linear of this shape cannot run its three FP8 GEMMs (each of in, out and tokens is a GEMM's K
    once), or None: CUDA's multiple of 16 (kernel.py), and MXFP8's 32-wide blocks."""
    multiple = blocks.MX_BLOCK if recipe == "mxfp8" else ALIGNMENT
    odd = [f"{name} {size}" for name, size in (("in_features", in_features), ("out_features", out_features),
                                               ("tokens", tokens)) if size % multiple]
    return f"{', '.join(odd)} not a multiple of {multiple}" if odd else None


# Each recipe's forward: (x2, the weight parameter, state, counts, the GEMM's output dtype) -> (output, the tensors the
# backward needs, ZeRO's gathered FP8 weight or None); its backward: (those tensors, the gathered weight, the output
# gradient, state, counts, the input's and the weight's dtypes) -> (data gradient, weight gradient). Plain functions
# of tensors and the state's tensors, so that torch.compile traces them into the block's graph.

def _per_tensor_forward(x2, weight, state, counts, out_dtype):
    recipe = state.recipe
    x_q, x_scale = state.quantize_per_tensor(x2, INPUT, recipe.forward_dtype, counts)
    gathered = None
    if state.fp8_weight is None:
        w_q, w_scale = state.quantize_per_tensor(weight.detach(), WEIGHT, recipe.forward_dtype, counts)
        saved_w_q = w_q
    else:  # cast after the optimizer step and gathered as bytes: no second cast (the guard does not count that one)
        w_q, w_scale = state.fp8_weight.data, state.fp8_weight.scale_inv.clone()
        # ZeRO's gathered weight (gathered again for the backward), not an activation: kept beside the saved tensors
        gathered, saved_w_q = w_q, None
    saved = (x_q, x_scale) + ((saved_w_q,) if saved_w_q is not None else ()) + (w_scale,)
    if not recipe.wgrad_in_fp8:
        saved += (x2,)
    return scaled_matmul(x_q, w_q.t(), x_scale, w_scale, out_dtype), saved, gathered


def _per_tensor_backward(saved, gathered, g2, state, counts, x_dtype, weight_dtype):
    recipe = state.recipe
    if gathered is None:
        x_q, x_scale, w_q, w_scale, *x_high = saved
    else:
        (x_q, x_scale, w_scale, *x_high), w_q = saved, gathered
    g_q, g_scale = state.quantize_per_tensor(g2, GRAD_OUTPUT, recipe.backward_dtype, counts)
    # Each GEMM's fp32 sum rounded once, in the cuBLASLt epilogue, to the dtype the caller casts it to (the same bits
    # as an fp32 output cast afterwards, without writing and reading the fp32 matrix: measured on an H100, docs/fp8.md)
    grad_x = scaled_matmul(g_q, w_q.t().contiguous().t(), g_scale, w_scale, x_dtype)
    if not x_high:
        grad_w = scaled_matmul(g_q.t().contiguous(), x_q.t().contiguous().t(), g_scale, x_scale, weight_dtype)
    else:
        grad_w = g2.t().to(x_high[0].dtype) @ x_high[0]
    return grad_x, grad_w


def _blockwise_forward(x2, weight, state, counts, out_dtype):
    x_q, x_scale = blocks.quantize_blocks_1d(x2, state.recipe.forward_dtype, counts=counts)
    gathered = None
    if state.fp8_weight is None:
        w_q, w_scale = blocks.quantize_blocks_2d(weight.detach(), state.recipe.forward_dtype, counts=counts)
        saved = (x2, w_q, w_scale)
    else:  # --fp8-param-gather: the 128x128 blocks cast from the master and gathered as bytes, with their scales
        w_q, w_scale = state.fp8_weight.data, state.fp8_weight.scale_inv.clone()
        gathered, saved = w_q, (x2, w_scale)  # ZeRO's gathered weight, gathered again for the backward
    out = blocks.block_scaled_matmul(x_q, x_scale, w_q, blocks.expand_2d_scales(w_scale, weight.size(0)),
                                     blocks.BLOCK, torch.float32)
    return out, saved, gathered


def _blockwise_backward(saved, gathered, g2, state, counts, x_dtype, weight_dtype):
    recipe = state.recipe
    if gathered is None:
        x2, w_q, w_scale = saved
    else:
        (x2, w_scale), w_q = saved, gathered
    g_rows, g_rows_scale = blocks.quantize_blocks_1d(g2, recipe.backward_dtype, counts=counts)
    grad_x = blocks.block_scaled_matmul(g_rows, g_rows_scale, w_q.t().contiguous(),
                                        blocks.expand_2d_scales(w_scale.t(), w_q.size(1)), blocks.BLOCK,
                                        torch.float32)
    g_cols, g_cols_scale = blocks.quantize_blocks_1d(g2.t(), recipe.backward_dtype, counts=counts)
    x_cols, x_cols_scale = blocks.quantize_blocks_1d(x2.t(), recipe.forward_dtype, counts=counts)
    grad_w = blocks.block_scaled_matmul(g_cols, g_cols_scale, x_cols, x_cols_scale, blocks.BLOCK, torch.float32)
    return grad_x, grad_w


def _mx_forward(x2, weight, state, counts, out_dtype):
    x_q, x_scale = blocks.quantize_mx(x2, state.recipe.forward_dtype, counts)
    w_q, w_scale = blocks.quantize_mx(weight.detach(), state.recipe.forward_dtype, counts)
    # the parameter itself (a model state, not an activation) for the backward's casts along the other dimension
    return blocks.block_scaled_matmul(x_q, x_scale, w_q, w_scale, blocks.MX_BLOCK, torch.float32), (x2, weight), None


def _mx_backward(saved, gathered, g2, state, counts, x_dtype, weight_dtype):
    recipe = state.recipe
    x2, weight = saved
    g_rows, g_rows_scale = blocks.quantize_mx(g2, recipe.backward_dtype, counts)
    w_cols, w_cols_scale = blocks.quantize_mx(weight.detach().t(), recipe.forward_dtype, counts)
    grad_x = blocks.block_scaled_matmul(g_rows, g_rows_scale, w_cols, w_cols_scale, blocks.MX_BLOCK, torch.float32)
    g_cols, g_cols_scale = blocks.quantize_mx(g2.t(), recipe.backward_dtype, counts)
    x_cols, x_cols_scale = blocks.quantize_mx(x2.t(), recipe.forward_dtype, counts)
    grad_w = blocks.block_scaled_matmul(g_cols, g_cols_scale, x_cols, x_cols_scale, blocks.MX_BLOCK, torch.float32)
    return grad_x, grad_w


_FORWARD = {"delayed": _per_tensor_forward, "tensorwise": _per_tensor_forward, "blockwise": _blockwise_forward,
            "mxfp8": _mx_forward}
_BACKWARD = {"delayed": _per_tensor_backward, "tensorwise": _per_tensor_backward,
             "blockwise": _blockwise_backward, "mxfp8": _mx_backward}


class _Fp8LinearFunction(torch.autograd.Function):
    """The linear's forward and backward. Everything that changes between calls is a tensor (the delayed
    scales and histories, the guard's figures, written in place) or host state read once per call (the guard's
    path, fixed for an iteration): no value is read back, and torch.compile traces it whole (docs/fp8.md)."""

    @staticmethod
    def forward(ctx, x, weight, bias, state):
        x2 = x.detach().reshape(-1, x.size(-1))
        guard = state.guard
        counts = None if guard is None else CastCounts()
        # The per-tensor recipes' forward GEMM writes x's dtype at once where no bias is added in fp32 after it
        out_dtype = torch.float32 if bias is not None else x.dtype
        out, saved, gathered = _FORWARD[state.recipe.recipe](x2, weight, state, counts, out_dtype)
        if bias is not None:
            out = out + bias.detach().float()
        result = out.to(x.dtype)
        high_precision = guard is not None and guard.in_high_precision
        kept = ()
        if guard is not None:
            # The check of this forward (parallel/fp8/guard.py): the output as the model sees it, and the casts.
            guard.record_forward(counts, result, x2.abs().amax())
            if high_precision:
                # The layer runs in high precision this iteration: x and a copy of W (a ZeRO-3 parameter may be
                # released before the backward) kept for the backward's GEMMs.
                kept = (x2, weight.detach().clone())
                result = torch.nn.functional.linear(x2, weight.detach().to(x2.dtype),
                                                    None if bias is None else bias.detach().to(x2.dtype))
        # Through autograd's saved tensors, so what a step keeps for the backward (the FP8 copies of x and W) is
        # what the saved-tensor meter measures, live and in the planner's dry run.
        ctx.save_for_backward(*saved, *kept)
        ctx.fp8_saved, ctx.high_precision, ctx.gathered_weight = len(saved), high_precision, gathered
        ctx.state, ctx.x_shape, ctx.has_bias = state, x.shape, bias is not None
        ctx.x_dtype, ctx.weight_dtype = x.dtype, weight.dtype
        return result.reshape(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad_out):
        g2 = grad_out.reshape(-1, grad_out.size(-1))
        state, guard = ctx.state, ctx.state.guard
        saved = ctx.saved_tensors
        counts = None if guard is None else CastCounts()
        # Under the guard the FP8 backward runs even in high precision: it is the check, and delayed scaling's
        # gradient history and amax reduction see every cast as without the guard.
        grad_x, grad_w = _BACKWARD[state.recipe.recipe](saved[:ctx.fp8_saved], ctx.gathered_weight, g2, state,
                                                        counts, ctx.x_dtype, ctx.weight_dtype)
        if guard is not None:
            guard.record_backward(counts, (grad_x.to(ctx.x_dtype), grad_w.to(ctx.weight_dtype)))
            if ctx.high_precision:
                x2, weight = saved[ctx.fp8_saved:]
                g = g2.float()
                grad_x, grad_w = g @ weight.float(), g.t() @ x2.float()
        grad_bias = g2.sum(0) if ctx.has_bias else None
        return grad_x.to(ctx.x_dtype).reshape(ctx.x_shape), grad_w.to(ctx.weight_dtype), grad_bias, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               state: Fp8LinearState) -> torch.Tensor:
    """F.linear(x, weight, bias) with its three GEMMs in FP8 as state's recipe says."""
    return _Fp8LinearFunction.apply(x, weight, bias, state)
