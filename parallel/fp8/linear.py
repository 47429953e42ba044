"""The FP8 linear y = x W^T + b, forward, dgrad and wgrad, in each recipe's formats, as TransformerEngine's Linear runs
it: GEMMs accumulate in fp32, and each tensor is cast once for every GEMM that takes it (the weight once per
iteration)."""

from __future__ import annotations

from typing import Optional

import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8 import casts
from parallel.fp8.block_gemm import block_scaled_matmul, outer_major, square_block_scale
from parallel.fp8.guard import LayerGuard, output_bound_limit
from parallel.fp8.kernel import ALIGNMENT, scaled_matmul
from parallel.fp8.recipes import GRAD_OUTPUT, INPUT, WEIGHT, DelayedScaling, Fp8Recipe
from parallel.fp8.weight_cache import WeightCache
from parallel.grad_accumulation_fusion import LinearIntoMainGrad, MainGradients, accumulate_weight_gradient
from parallel.regathered_input import gather_slice, keep_slice, regathered_state


class Fp8LinearState:
    """What one FP8 linear keeps between steps: its recipe, delayed scaling's histories and scales, and its weight's FP8
    copies. Sequence-parallel inputs are gathered in high precision, so no amax is reduced over TP."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu", guard: Optional[LayerGuard] = None,
                 fused: bool = False, cache_weight: bool = False, compiled: bool = False):
        self.recipe = recipe
        self.delayed = DelayedScaling(recipe, device) if recipe.recipe == "delayed" else None
        self.guard = guard
        # --fp8-param-gather's e4m3 weight as ZeRO gathered it; None: the forward casts it
        self.fp8_weight = None
        self.fused = fused
        # TE's is_first_microbatch: later micro-batches reuse the weight's casts
        self.cache_weight = cache_weight
        self.weight_cache = WeightCache(in_graph=cache_weight and compiled, device=device)
        # who holds the fp32 main gradient the backward adds into; None: autograd gets it
        self.main_grads: Optional[MainGradients] = None

    def cast_per_tensor(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, transpose: bool,
                        figures: Optional[torch.Tensor], iteration: Optional[tuple] = None,
                        bounds: Optional[tuple] = None):
        fused, finite = self.fused, role == WEIGHT
        if self.delayed is not None:
            history, scale, column = self.delayed.role_tensors(role)
            return casts.cast_delayed(tensor, scale, history, column, dtype, transpose, figures, role == INPUT,
                                      iteration, bounds, finite, fused=fused)
        return casts.cast_current(tensor, dtype, transpose, figures, role == INPUT, iteration, bounds, finite,
                                  fused=fused)

    def cached_weight(self, weights: tuple, cast):
        """The weight's FP8 copies, cast by `cast(iteration)` in the iteration's first micro-batch and reused after."""
        if self.weight_cache.iteration is not None:
            return cast(self.weight_cache.iteration)
        if not self.cache_weight or torch.compiler.is_compiling():
            return cast(None)
        copies = self.weight_cache.get(weights)
        if copies is None:
            self.weight_cache.forget()
            copies = cast(None)
            self.weight_cache.put(weights, copies)
        return copies


def fp8_states(module: torch.nn.Module) -> dict[str, Fp8LinearState]:
    """{name: state} of the FP8 linears inside `module`, each state once."""
    states, seen = {}, set()
    for name, inner in module.named_modules():
        state = getattr(inner, "fp8_state", None)
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        if hasattr(inner, "fp8_state_name"):
            name = f"{name.rpartition('.')[0]}.{inner.fp8_state_name}"
        states[name] = state
    return states


def shape_rule_broken(in_features: int, out_features: int, tokens: int, recipe: str) -> str | None:
    """Why a linear of this shape cannot run its three FP8 GEMMs, or None."""
    multiple = blocks.MX_BLOCK if recipe == "mxfp8" else ALIGNMENT
    odd = [f"{name} {size}" for name, size in (("in_features", in_features), ("out_features", out_features),
                                               ("tokens", tokens)) if size % multiple]
    return f"{', '.join(odd)} not a multiple of {multiple}" if odd else None


def joined(weights: tuple) -> torch.Tensor:
    """The weight a linear casts: one weight, or several's rows concatenated, detached."""
    if len(weights) == 1:
        return weights[0].detach()
    return torch.cat([weight.detach() for weight in weights])


# each recipe's forward returns (output, tensors saved through autograd, the weight operands); plain functions of
# tensors, so torch.compile traces them

def _bounds(limits: Optional[tuple], *other_scales: torch.Tensor) -> Optional[tuple]:
    return None if limits is None else tuple(zip(other_scales, limits))


def _per_tensor_forward(x2, weights, state, figures, out_dtype, limits):
    recipe = state.recipe
    if state.fp8_weight is None:
        w_q, w_t, w_scale = state.cached_weight(weights, lambda iteration: state.cast_per_tensor(
            joined(weights), WEIGHT, recipe.forward_dtype, True, figures, iteration))
    else:
        w_q, w_t, w_scale = state.fp8_weight.data, None, state.fp8_weight.scale_inv.clone()
    x_q, x_t, x_scale = state.cast_per_tensor(x2, INPUT, recipe.forward_dtype, recipe.wgrad_in_fp8, figures,
                                              bounds=_bounds(limits, w_scale))
    # wgrad takes x's transposed copy, or x itself under --no-fp8-wgrad
    saved = (x_t, x_scale) if recipe.wgrad_in_fp8 else (x2,)
    return scaled_matmul(x_q, w_q.t(), x_scale, w_scale, out_dtype), saved, (w_q, w_t, w_scale)


def _high_precision_wgrad(g2: torch.Tensor, x_high: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """--no-fp8-wgrad's dW = dy^T x in x's dtype (fp32 for a main gradient)."""
    if out_dtype == x_high.dtype:
        return g2.t().to(x_high.dtype) @ x_high
    grad_w = torch.zeros(g2.shape[1], x_high.shape[1], dtype=out_dtype, device=x_high.device)
    accumulate_weight_gradient(grad_w, g2.to(x_high.dtype), x_high)
    return grad_w


def _per_tensor_backward(saved, weight_operands, g2, state, figures, x_dtype, weight_dtype, limits):
    recipe = state.recipe
    w_q, w_t, w_scale = weight_operands
    if w_t is None:
        w_t = w_q.t().contiguous()
    g_q, g_t, g_scale = state.cast_per_tensor(g2, GRAD_OUTPUT, recipe.backward_dtype, recipe.wgrad_in_fp8, figures,
                                              bounds=_bounds(limits, w_scale, saved[-1]))
    # wgrad's GEMM first, so inductor fuses dy's cast and transpose into one kernel
    if recipe.wgrad_in_fp8:
        x_t, x_scale = saved
        grad_w = scaled_matmul(g_t, x_t.t(), g_scale, x_scale, weight_dtype)
    else:
        (x_high,) = saved
        grad_w = _high_precision_wgrad(g2, x_high, weight_dtype)
    grad_x = scaled_matmul(g_q, w_t.t(), g_scale, w_scale, x_dtype)
    return grad_x, grad_w


def _blockwise_forward(x2, weights, state, figures, out_dtype, limits):
    fused, dtype = state.fused, state.recipe.forward_dtype
    if state.fp8_weight is None:
        w_q, w_t, w_scale, w_t_scale = state.cached_weight(weights, lambda iteration: casts.cast_block_weight(
            joined(weights), dtype, figures, iteration, fused=fused))
    else:
        w_q, w_t, w_t_scale = state.fp8_weight.data, None, None
        w_scale = square_block_scale(state.fp8_weight.scale_inv)
    x_rows, x_rows_scale, x_cols, x_cols_scale = casts.cast_blocks_both_ways(x2, dtype, figures, True,
                                                                              _bounds(limits, w_scale), fused=fused)
    out = block_scaled_matmul(x_rows, x_rows_scale, w_q.t(), w_scale, blocks.BLOCK, True, out_dtype)
    return out, (x_cols, x_cols_scale), (w_q, w_t, w_t_scale)


def _blockwise_backward(saved, weight_operands, g2, state, figures, x_dtype, weight_dtype, limits):
    recipe = state.recipe
    x_cols, x_cols_scale = saved
    w_q, w_t, w_t_scale = weight_operands
    if w_t is None:
        w_t, w_t_scale = w_q.t().contiguous(), square_block_scale(state.fp8_weight.scale_inv.t())
    g_rows, g_rows_scale, g_cols, g_cols_scale = casts.cast_blocks_both_ways(
        g2, recipe.backward_dtype, figures, False, _bounds(limits, w_t_scale, x_cols_scale), fused=state.fused)
    grad_w = block_scaled_matmul(g_cols, g_cols_scale, x_cols.t(), x_cols_scale, blocks.BLOCK, False, weight_dtype)
    grad_x = block_scaled_matmul(g_rows, g_rows_scale, w_t.t(), w_t_scale, blocks.BLOCK, True, x_dtype)
    return grad_x, grad_w


def _mx_forward(x2, weights, state, figures, out_dtype, limits):
    fused, dtype = state.fused, state.recipe.forward_dtype
    if state.fp8_weight is None:
        w_rows, w_rows_scale, w_cols, w_cols_scale = state.cached_weight(
            weights, lambda iteration: casts.cast_mx_both_ways(joined(weights), dtype, figures, False, iteration,
                                                               finite=True, fused=fused))
    else:
        w_rows, w_rows_scale = state.fp8_weight.data, outer_major(state.fp8_weight.scale_inv)
        w_cols, w_cols_scale = state.fp8_weight.columnwise, None
    x_rows, x_rows_scale, x_cols, x_cols_scale = casts.cast_mx_both_ways(
        x2, dtype, figures, True, bounds=_bounds(limits, w_rows_scale), fused=fused)
    out = block_scaled_matmul(x_rows, x_rows_scale, w_rows.t(), w_rows_scale, blocks.MX_BLOCK, False, out_dtype)
    return out, (x_cols, x_cols_scale), (w_cols, w_cols_scale)


def _mx_backward(saved, weight_operands, g2, state, figures, x_dtype, weight_dtype, limits):
    recipe = state.recipe
    (x_cols, x_cols_scale), (w_cols, w_cols_scale) = saved, weight_operands
    if w_cols_scale is None:
        w_cols, w_cols_scale = w_cols.t().contiguous(), outer_major(state.fp8_weight.columnwise_scale_inv)
    g_rows, g_rows_scale, g_cols, g_cols_scale = casts.cast_mx_both_ways(
        g2, recipe.backward_dtype, figures, False, bounds=_bounds(limits, w_cols_scale, x_cols_scale),
        fused=state.fused)
    grad_w = block_scaled_matmul(g_cols, g_cols_scale, x_cols.t(), x_cols_scale, blocks.MX_BLOCK, False,
                                 weight_dtype)
    grad_x = block_scaled_matmul(g_rows, g_rows_scale, w_cols.t(), w_cols_scale, blocks.MX_BLOCK, False, x_dtype)
    return grad_x, grad_w


_FORWARD = {"delayed": _per_tensor_forward, "tensorwise": _per_tensor_forward, "blockwise": _blockwise_forward,
            "mxfp8": _mx_forward}
_BACKWARD = {"delayed": _per_tensor_backward, "tensorwise": _per_tensor_backward,
             "blockwise": _blockwise_backward, "mxfp8": _mx_backward}


def _checks_in_casts(state: Fp8LinearState, figures: Optional[torch.Tensor], *out_dtypes: torch.dtype) -> bool:
    """Whether a guarded pass checks its outputs in its last cast rather than an epilogue."""
    return figures is not None and state.fp8_weight is None and \
        all(dtype in (torch.bfloat16, torch.float32) for dtype in out_dtypes)


class _Fp8LinearFunction(torch.autograd.Function):
    """The linear's forward and backward; nothing is read back, so torch.compile traces it whole."""

    @staticmethod
    def forward(ctx, x, bias, state, main_grads, *weights):
        x2 = x.detach().reshape(-1, x.size(-1))
        guard = state.guard
        figures = None if guard is None else guard.forward_figures
        out_dtype = torch.float32 if bias is not None else x.dtype
        fp8 = state.recipe.forward_dtype
        limits = (output_bound_limit(x2.shape[1], fp8, fp8, x.dtype),) \
            if _checks_in_casts(state, figures, x.dtype) and bias is None else None
        out, saved, weight_operands = _FORWARD[state.recipe.recipe](x2, weights, state, figures, out_dtype, limits)
        result = out
        if bias is not None or (figures is not None and limits is None) or out.dtype != x.dtype:
            result = casts.finish_forward(out, None if bias is None else bias.detach(), x.dtype,
                                          figures if limits is None else None, fused=state.fused)
        high_precision = guard is not None and guard.in_high_precision
        kept = ()
        if high_precision:
            # high precision this iteration: x and a copy of W kept for the backward
            weight = joined(weights)
            kept = (x2, weight.clone() if len(weights) == 1 else weight)
            result = torch.nn.functional.linear(x2, weight.to(x2.dtype),
                                                None if bias is None else bias.detach().to(x2.dtype))
        # under SP a per-tensor cast keeps this rank's rows; the backward gathers the FP8 bytes again
        ctx.regathered = regathered_state(x) if state.recipe.recipe in ("delayed", "tensorwise") and \
            state.recipe.wgrad_in_fp8 else None
        if ctx.regathered is not None:
            x_t, x_scale = saved
            saved = (keep_slice(x_t.t(), x.shape[0], ctx.regathered), x_scale)
        # saved through autograd, so the saved-tensor meter measures them
        ctx.save_for_backward(*saved, *kept)
        ctx.fp8_saved, ctx.high_precision, ctx.weight_operands = len(saved), high_precision, weight_operands
        ctx.state, ctx.x_shape, ctx.has_bias = state, x.shape, bias is not None
        ctx.x_dtype, ctx.weight_dtype = x.dtype, weights[0].dtype
        ctx.main_grads, ctx.params = main_grads, weights
        return result.reshape(*x.shape[:-1], sum(weight.size(0) for weight in weights))

    @staticmethod
    def backward(ctx, grad_out):
        g2 = grad_out.reshape(-1, grad_out.size(-1))
        state, guard = ctx.state, ctx.state.guard
        saved = ctx.saved_tensors
        if ctx.regathered is not None:
            saved = (gather_slice(saved[0], ctx.regathered).t().contiguous(), *saved[1:])
        figures = None if guard is None else guard.backward_figures
        main_grad = None if ctx.main_grads is None else tuple(map(ctx.main_grads.main_grad, ctx.params))
        into = None if ctx.high_precision else main_grad
        wgrad_dtype = ctx.weight_dtype if main_grad is None else torch.float32
        # under the guard the FP8 backward runs even in high precision: it is the check
        recipe = state.recipe
        limits = None
        if _checks_in_casts(state, figures, ctx.x_dtype, wgrad_dtype) and recipe.wgrad_in_fp8:
            bwd, fwd = recipe.backward_dtype, recipe.forward_dtype
            limits = (output_bound_limit(g2.shape[1], bwd, fwd, ctx.x_dtype),
                      output_bound_limit(g2.shape[0], bwd, fwd, wgrad_dtype))
        grad_x, grad_w = _BACKWARD[recipe.recipe](saved[:ctx.fp8_saved], ctx.weight_operands, g2, state,
                                                  figures, ctx.x_dtype, wgrad_dtype, limits)
        checked = figures is None or limits is not None
        if not checked or grad_x.dtype != ctx.x_dtype or grad_w.dtype != ctx.weight_dtype or into is not None:
            grad_x, grad_w = casts.finish_backward(grad_x, grad_w, ctx.x_dtype, ctx.weight_dtype,
                                                   None if checked else figures, into, fused=state.fused)
        if ctx.high_precision:
            x2, weight = saved[ctx.fp8_saved:]
            g = g2.to(x2.dtype)
            grad_x = (g @ weight.to(x2.dtype)).to(ctx.x_dtype)
            if main_grad is None:
                grad_w = _high_precision_wgrad(g, x2, ctx.weight_dtype)
            else:
                for part, rows in zip(main_grad, _row_slices(ctx.params)):
                    accumulate_weight_gradient(part, g[:, rows], x2)
                grad_w = None
        grad_bias = g2.sum(0) if ctx.has_bias else None
        # the gradient went into the main gradient; ZeRO's hook still counts it
        grad_ws = (None,) * len(ctx.params) if grad_w is None else \
            tuple(grad_w[rows] for rows in _row_slices(ctx.params))
        return grad_x.reshape(ctx.x_shape), grad_bias, None, None, *grad_ws


def _row_slices(weights: tuple) -> list:
    slices, start = [], 0
    for weight in weights:
        slices.append(slice(start, start + weight.size(0)))
        start += weight.size(0)
    return slices


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | tuple, bias: torch.Tensor | None,
               state: Fp8LinearState) -> torch.Tensor:
    """F.linear(x, weight, bias) with its three GEMMs in FP8; `weight` may be a tuple run as one linear (`joined`)."""
    weights = tuple(weight) if isinstance(weight, (tuple, list)) else (weight,)
    main_grads = state.main_grads if state.main_grads is not None and \
        all(map(LinearIntoMainGrad.fuses, weights)) else None
    return _Fp8LinearFunction.apply(x, bias, state, main_grads, *weights)
