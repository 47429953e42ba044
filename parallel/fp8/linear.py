"""The FP8 linear, y = x W^T + b, forward and backward (dgrad and wgrad), in each recipe's formats, as
TransformerEngine's Linear runs it (transformer_engine/pytorch/module/linear.py):

- forward (fprop): x and W cast to e4m3, one GEMM;
- dgrad: dx = dy W, dy cast to the gradients' format (e5m2 under hybrid, e4m3 under e4m3);
- wgrad: dW = dy^T x, from the same casts (per-tensor recipes: a tensor and its transpose share one scale)
  or from casts along the token dimension (block recipes: TE quantizes each direction from the high
  precision tensor, "to avoid double quantization errors"); in high precision under --no-fp8-wgrad
  (delayed scaling only, as Megatron passes it to TE); under gradient accumulation fusion (a main-gradient holder,
  `Fp8LinearState.main_grads`) written in fp32 and added into the weight's fp32 main gradient in the backward's
  epilogue region, autograd handed no weight gradient (TE's fuse_wgrad_accumulation, as Megatron passes its
  gradient_accumulation_fusion).
Every GEMM accumulates in fp32 and the result is cast to the tensor's own dtype once (bias added in fp32
first, TE's GEMM epilogue). Each tensor is cast once, in one region (casts.py: fused, TE's few kernels), for every
GEMM that takes it: x for the forward and, as its transposed or column-wise copy, the one saved for the weight
gradient (TE saves x's columnwise FP8 data, not x); the weight once per iteration (weight_cache.py, TE's
is_first_microbatch), its transpose with it; the output gradient for both backward GEMMs.
"""

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
    """What one FP8 linear keeps between steps: its recipe and, for delayed scaling, the amax histories and
    scales (state_dict / load_state_dict for the checkpoint), reduced and updated once per pass
    (parallel/fp8/delayed_updates.py); and its weight's FP8 copies, cast once per iteration (weight_cache.py). The
    stateless recipes reduce nothing: TE's current-scaling and block quantizers cast each rank's own tensor (a weight
    shard with its own amax), except the input of a column-parallel linear and the output gradient of a row-parallel
    one under sequence parallelism, whose amax TE reduces over the TP group before an FP8 all-gather
    (module/linear.py, set_quantizer_amax_reduction_group). The TP layers here gather those in high precision before
    the linear, so casting the gathered tensor is that same cast."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu", guard: Optional[LayerGuard] = None,
                 fused: bool = False, cache_weight: bool = False, compiled: bool = False):
        self.recipe = recipe
        self.delayed = DelayedScaling(recipe, device) if recipe.recipe == "delayed" else None
        self.guard = guard  # --fp8-guard (parallel/fp8/guard.py); None: no counts, no fallback
        # --fp8-param-gather (parallel/fp8/param_gather.py): the weight as ZeRO gathered it, already in e4m3 with
        # its scale; None: the forward casts the weight.
        self.fp8_weight = None
        # --fp8-fused-casts, resolved for the device (parallel/fp8/fused.py): the casts as compiled regions
        self.fused = fused
        # TE's is_first_microbatch (weight_cache.py): a model's linears (gpt/fp8.py apply_fp8) keep the weight's
        # casts for the iteration's later micro-batches, as Megatron-Core's TE linears do; without it (TE's
        # is_first_microbatch=None) every call casts the weight. `compiled`: in compiled blocks (--compile), where
        # the cache's semantics are kept in the graph (weight_cache.py).
        self.cache_weight = cache_weight
        self.weight_cache = WeightCache(in_graph=cache_weight and compiled, device=device)
        # --gradient-accumulation-fusion (zero/fused_accumulation.py): who holds the weight's fp32 main gradient, which
        # the backward adds the weight gradient into; None: autograd gets the weight gradient
        self.main_grads: Optional[MainGradients] = None

    def cast_per_tensor(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, transpose: bool,
                        figures: Optional[torch.Tensor], iteration: Optional[tuple] = None,
                        bounds: Optional[tuple] = None):
        """One per-tensor role's cast region (casts.py): (data, transposed copy or None, dequantizing scale);
        `iteration`: a compiled block's weight (weight_cache.py); `bounds`: the pass's check made in this cast
        (casts.py _checks); the weight's cast records its finiteness."""
        fused, finite = self.fused, role == WEIGHT
        if self.delayed is not None:
            history, scale, column = self.delayed.role_tensors(role)
            return casts.cast_delayed(tensor, scale, history, column, dtype, transpose, figures, role == INPUT,
                                      iteration, bounds, finite, fused=fused)
        # Float8CurrentScaling: the scale from this tensor's own amax (TE's default: no power-of-two scales).
        return casts.cast_current(tensor, dtype, transpose, figures, role == INPUT, iteration, bounds, finite,
                                  fused=fused)

    def cached_weight(self, weights: tuple, cast):
        """The weight's FP8 copies (`weights`: the one weight, or those cast as one, `joined`): cast
        (`cast(iteration)`, counted by the guard and, delayed, recorded in the history) in the iteration's first
        micro-batch, reused by the others (weight_cache.py); every call without `cache_weight`. In compiled blocks,
        cast in every call with the iteration's flags (`iteration`), as the cache's key is read on the host."""
        if self.weight_cache.iteration is not None:
            return cast(self.weight_cache.iteration)
        if not self.cache_weight or torch.compiler.is_compiling():  # a host-side cache is not dynamo's to read
            return cast(None)
        copies = self.weight_cache.get(weights)
        if copies is None:
            self.weight_cache.forget()  # the old copies go before the new ones are made
            copies = cast(None)
            self.weight_cache.put(weights, copies)
        return copies


def fp8_states(module: torch.nn.Module) -> dict[str, Fp8LinearState]:
    """{name: state} of the FP8 linears inside `module` (gpt/fp8.py apply_fp8 sets their `fp8_state`), each state once:
    a joined gate and up share one, named by the first's `fp8_state_name` beside it."""
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
    """Why a linear of this shape cannot run its three FP8 GEMMs (each of in, out and tokens is a GEMM's K
    once), or None: CUDA's multiple of 16 (kernel.py), and MXFP8's 32-wide blocks."""
    multiple = blocks.MX_BLOCK if recipe == "mxfp8" else ALIGNMENT
    odd = [f"{name} {size}" for name, size in (("in_features", in_features), ("out_features", out_features),
                                               ("tokens", tokens)) if size % multiple]
    return f"{', '.join(odd)} not a multiple of {multiple}" if odd else None


def joined(weights: tuple) -> torch.Tensor:
    """The weight a linear casts: its one weight, or its weights' rows one after the other (gate and up as Megatron's
    one linear_fc1 weight, gpt/fp8.py), detached. The copy is made where the weight is cast, once an iteration."""
    if len(weights) == 1:
        return weights[0].detach()
    return torch.cat([weight.detach() for weight in weights])


# Each recipe's forward: (x2, the weight parameters (a tuple, `joined`), state, figures, the GEMM's output dtype, its output bound's limit
# in a tuple or None) -> (output, the tensors the backward needs through autograd, the weight operands kept beside
# them); the weight is cast first, so that x's cast region makes the forward's check against its scales (`limits`,
# guard.py record_output_bounds). Its backward: (those tensors, the weight operands, the output gradient, state,
# figures, the input's dtype and the weight gradient's GEMM's output dtype, the two GEMMs' output bound limits (data
# gradient's, weight gradient's) or None: dy's cast makes the check) -> (data gradient, weight gradient). The weight
# operands are the cached copies (or ZeRO's gathered weight), model-state-like working sets the planner counts as such
# (weight_cache.py), not activations. Plain functions of tensors and the state's tensors, so that torch.compile
# traces them into the block's graph.

def _bounds(limits: Optional[tuple], *other_scales: torch.Tensor) -> Optional[tuple]:
    """The cast region's `bounds` (casts.py _checks): per GEMM, the other operand's scales and its limit; None where
    the pass checks its outputs in its epilogue."""
    return None if limits is None else tuple(zip(other_scales, limits))


def _per_tensor_forward(x2, weights, state, figures, out_dtype, limits):
    recipe = state.recipe
    if state.fp8_weight is None:
        w_q, w_t, w_scale = state.cached_weight(weights, lambda iteration: state.cast_per_tensor(
            joined(weights), WEIGHT, recipe.forward_dtype, True, figures, iteration))
    else:  # cast after the optimizer step and gathered as bytes: no second cast (the guard does not count that one)
        w_q, w_t, w_scale = state.fp8_weight.data, None, state.fp8_weight.scale_inv.clone()
    x_q, x_t, x_scale = state.cast_per_tensor(x2, INPUT, recipe.forward_dtype, recipe.wgrad_in_fp8, figures,
                                              bounds=_bounds(limits, w_scale))
    # wgrad takes x's transposed copy (TE saves its columnwise data), or x itself in high precision (--no-fp8-wgrad)
    saved = (x_t, x_scale) if recipe.wgrad_in_fp8 else (x2,)
    return scaled_matmul(x_q, w_q.t(), x_scale, w_scale, out_dtype), saved, (w_q, w_t, w_scale)


def _high_precision_wgrad(g2: torch.Tensor, x_high: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """--no-fp8-wgrad's dW = dy^T x in x's dtype; in fp32 for a main gradient (out_dtype fp32 and x 16-bit), the fp32
    sum of the exact 16-bit products without a 16-bit rounding, by LinearIntoMainGrad's one op into a zeroed tensor."""
    if out_dtype == x_high.dtype:
        return g2.t().to(x_high.dtype) @ x_high
    grad_w = torch.zeros(g2.shape[1], x_high.shape[1], dtype=out_dtype, device=x_high.device)
    accumulate_weight_gradient(grad_w, g2.to(x_high.dtype), x_high)
    return grad_w


def _per_tensor_backward(saved, weight_operands, g2, state, figures, x_dtype, weight_dtype, limits):
    recipe = state.recipe
    w_q, w_t, w_scale = weight_operands
    if w_t is None:  # ZeRO's gathered weight: transposed here, as it is gathered again for the backward
        w_t = w_q.t().contiguous()
    g_q, g_t, g_scale = state.cast_per_tensor(g2, GRAD_OUTPUT, recipe.backward_dtype, recipe.wgrad_in_fp8, figures,
                                              bounds=_bounds(limits, w_scale, saved[-1]))
    # Each GEMM's fp32 sum rounded once, in the cuBLASLt epilogue, to the dtype the caller casts it to (the same bits
    # as an fp32 output cast afterwards, without writing and reading the fp32 matrix: measured on an H100, docs/fp8.md).
    # The weight gradient's GEMM first: compiled whole (--compile), inductor then makes dy's cast and its transposed
    # copy one kernel (with the data gradient's first it left the copy to a kernel of its own between the GEMMs: 8
    # launches for the linear without the guard, 7 this way; tests/parallel/test_fp8_launch_counts.py).
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
    else:  # --fp8-param-gather: the 128x128 blocks cast from the master and gathered as bytes, with their scales;
        # their transposes made in the backward, as the weight is gathered again for it
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
    if w_t is None:  # ZeRO's gathered weight (--fp8-param-gather)
        w_t, w_t_scale = w_q.t().contiguous(), square_block_scale(state.fp8_weight.scale_inv.t())
    g_rows, g_rows_scale, g_cols, g_cols_scale = casts.cast_blocks_both_ways(
        g2, recipe.backward_dtype, figures, False, _bounds(limits, w_t_scale, x_cols_scale), fused=state.fused)
    grad_w = block_scaled_matmul(g_cols, g_cols_scale, x_cols.t(), x_cols_scale, blocks.BLOCK, False, weight_dtype)
    grad_x = block_scaled_matmul(g_rows, g_rows_scale, w_t.t(), w_t_scale, blocks.BLOCK, True, x_dtype)
    return grad_x, grad_w


def _mx_forward(x2, weights, state, figures, out_dtype, limits):
    fused, dtype = state.fused, state.recipe.forward_dtype
    # the weight along both dimensions: its rows for the forward GEMM, its columns for the data gradient's
    if state.fp8_weight is None:
        w_rows, w_rows_scale, w_cols, w_cols_scale = state.cached_weight(
            weights, lambda iteration: casts.cast_mx_both_ways(joined(weights), dtype, figures, False, iteration,
                                                               finite=True, fused=fused))
    else:  # --fp8-param-gather: both casts made from the master and gathered as bytes; the columnwise one (out x in)
        # transposed in the backward, as ZeRO 3 gathers the weight again for it
        w_rows, w_rows_scale = state.fp8_weight.data, outer_major(state.fp8_weight.scale_inv)
        w_cols, w_cols_scale = state.fp8_weight.columnwise, None
    x_rows, x_rows_scale, x_cols, x_cols_scale = casts.cast_mx_both_ways(
        x2, dtype, figures, True, bounds=_bounds(limits, w_rows_scale), fused=fused)
    out = block_scaled_matmul(x_rows, x_rows_scale, w_rows.t(), w_rows_scale, blocks.MX_BLOCK, False, out_dtype)
    return out, (x_cols, x_cols_scale), (w_cols, w_cols_scale)


def _mx_backward(saved, weight_operands, g2, state, figures, x_dtype, weight_dtype, limits):
    recipe = state.recipe
    (x_cols, x_cols_scale), (w_cols, w_cols_scale) = saved, weight_operands
    if w_cols_scale is None:  # ZeRO's gathered columnwise bytes (--fp8-param-gather): quantize_mx(W.t())'s layout
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
    """Whether a guarded pass makes its check in its last cast (guard.py record_output_bounds) rather than reading its
    outputs in an epilogue: where its outputs' dtypes have fp32's range (a healthy fp16 output may come near fp16's
    largest value) and the weight was cast here (ZeRO's gathered FP8 weight's cast, after the optimizer step, is not
    checked)."""
    return figures is not None and state.fp8_weight is None and \
        all(dtype in (torch.bfloat16, torch.float32) for dtype in out_dtypes)


class _Fp8LinearFunction(torch.autograd.Function):
    """The linear's forward and backward. Everything that changes between calls is a tensor (the delayed
    scales and histories, the guard's figures, written in place) or host state read once per call (the guard's
    path, fixed for an iteration): no value is read back, and torch.compile traces it whole (docs/fp8.md)."""

    @staticmethod
    def forward(ctx, x, bias, state, main_grads, *weights):
        x2 = x.detach().reshape(-1, x.size(-1))
        guard = state.guard
        figures = None if guard is None else guard.forward_figures
        # The GEMM writes x's dtype at once where no bias is added in fp32 after it
        out_dtype = torch.float32 if bias is not None else x.dtype
        # Where no epilogue runs for anything else, the forward's check is made in x's cast region, a bound on the
        # output from the two casts' scales (guard.py record_output_bounds): no launch of its own.
        fp8 = state.recipe.forward_dtype
        limits = (output_bound_limit(x2.shape[1], fp8, fp8, x.dtype),) \
            if _checks_in_casts(state, figures, x.dtype) and bias is None else None
        out, saved, weight_operands = _FORWARD[state.recipe.recipe](x2, weights, state, figures, out_dtype, limits)
        result = out
        if bias is not None or (figures is not None and limits is None) or out.dtype != x.dtype:
            # The epilogue and the check of this forward (parallel/fp8/guard.py): the output as the model sees it.
            result = casts.finish_forward(out, None if bias is None else bias.detach(), x.dtype,
                                          figures if limits is None else None, fused=state.fused)
        high_precision = guard is not None and guard.in_high_precision
        kept = ()
        if high_precision:
            # The layer runs in high precision this iteration: x and a copy of W (a ZeRO-3 parameter may be
            # released before the backward) kept for the backward's GEMMs.
            weight = joined(weights)
            kept = (x2, weight.clone() if len(weights) == 1 else weight)
            result = torch.nn.functional.linear(x2, weight.to(x2.dtype),
                                                None if bias is None else bias.detach().to(x2.dtype))
        # Under sequence parallelism x is an entry's gathered input: a per-tensor cast keeps this rank's rows only, and
        # the backward gathers the FP8 bytes again (parallel/regathered_input.py; TE's FP8 all-gather of its input)
        ctx.regathered = regathered_state(x) if state.recipe.recipe in ("delayed", "tensorwise") and \
            state.recipe.wgrad_in_fp8 else None
        if ctx.regathered is not None:
            x_t, x_scale = saved
            saved = (keep_slice(x_t.t(), x.shape[0], ctx.regathered), x_scale)
        # Through autograd's saved tensors, so what a step keeps for the backward (the FP8 copies of x) is what the
        # saved-tensor meter measures, live and in the planner's dry run; the weight's copies are the cache's.
        ctx.save_for_backward(*saved, *kept)
        ctx.fp8_saved, ctx.high_precision, ctx.weight_operands = len(saved), high_precision, weight_operands
        ctx.state, ctx.x_shape, ctx.has_bias = state, x.shape, bias is not None
        ctx.x_dtype, ctx.weight_dtype = x.dtype, weights[0].dtype
        # the parameters themselves (leaves): the keys their main gradients are held under, as LinearIntoMainGrad keeps
        # them
        ctx.main_grads, ctx.params = main_grads, weights
        return result.reshape(*x.shape[:-1], sum(weight.size(0) for weight in weights))

    @staticmethod
    def backward(ctx, grad_out):
        g2 = grad_out.reshape(-1, grad_out.size(-1))
        state, guard = ctx.state, ctx.state.guard
        saved = ctx.saved_tensors
        if ctx.regathered is not None:  # x's transposed FP8 copy, its rows gathered again: the forward's bytes
            saved = (gather_slice(saved[0], ctx.regathered).t().contiguous(), *saved[1:])
        figures = None if guard is None else guard.backward_figures
        # Gradient accumulation fusion: the weight gradient's GEMM writes fp32 and the epilogue adds it into the main
        # gradient (fetched here, in the backward, as LinearIntoMainGrad does: a ZeRO 2-3 bucket is taken then); in
        # high precision the FP8 pass is the check only, and the high-precision gradient is the one added.
        main_grad = None if ctx.main_grads is None else tuple(map(ctx.main_grads.main_grad, ctx.params))
        into = None if ctx.high_precision else main_grad
        wgrad_dtype = ctx.weight_dtype if main_grad is None else torch.float32
        # Under the guard the FP8 backward runs even in high precision: it is the check, and delayed scaling's
        # gradient history and amax reduction see every cast as without the guard.
        # The backward's check in dy's cast region (bounds on both GEMMs' outputs, as the forward's), where the weight
        # gradient is an FP8 GEMM's
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
            # The GEMMs a layer without FP8 runs: x's dtype, fp32 accumulation, the weight gradient added into the
            # main gradient as the fp32 sum of the exact 16-bit products. (In fp32, as this once ran, a GPU takes
            # SIMT kernels: 2 ms each for a 1.2B model's linear on an H200, docs/performance.md.)
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
        # no weight gradient where it went into the main gradient: the weight's AccumulateGrad node and ZeRO's hook
        # still run, and the hook counts it as arrived (parallel/grad_accumulation_fusion.py)
        grad_ws = (None,) * len(ctx.params) if grad_w is None else \
            tuple(grad_w[rows] for rows in _row_slices(ctx.params))
        return grad_x.reshape(ctx.x_shape), grad_bias, None, None, *grad_ws


def _row_slices(weights: tuple) -> list:
    """Each weight's rows in the joined weight (`joined`)."""
    slices, start = [], 0
    for weight in weights:
        slices.append(slice(start, start + weight.size(0)))
        start += weight.size(0)
    return slices


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | tuple, bias: torch.Tensor | None,
               state: Fp8LinearState) -> torch.Tensor:
    """F.linear(x, weight, bias) with its three GEMMs in FP8 as state's recipe says; with `state.main_grads` the
    weight gradient goes into its main gradient where LinearIntoMainGrad would fuse (in autograd, not compiling).
    `weight` may be a tuple of weights run as one linear of their rows one after the other (`joined`: one cast, one
    scale, three GEMMs; gate and up as Megatron's linear_fc1), each getting its rows' gradient."""
    weights = tuple(weight) if isinstance(weight, (tuple, list)) else (weight,)
    main_grads = state.main_grads if state.main_grads is not None and \
        all(map(LinearIntoMainGrad.fuses, weights)) else None
    return _Fp8LinearFunction.apply(x, bias, state, main_grads, *weights)
