"""The FP8 linear's regions, one per tensor cast and one per GEMM pass's epilogue, so that fused they are the few
kernels TransformerEngine launches for the same work. Each returns the tensors the GEMMs take and updates the guard's
figures and delayed scaling's history in place (`figures` None with the guard off)."""

from __future__ import annotations

from typing import Optional

import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.block_gemm import outer_major, square_block_scale
from parallel.fp8.fused import fused_region
from parallel.fp8.guard import CastCounts, record_finite, record_input_amax, record_output_bounds, record_outputs
from parallel.fp8.recipes import FP8_MAX, amax_of, current_scale, input_type_max, quantize_delayed, quantize_tensorwise


def _counts(figures: Optional[torch.Tensor], iteration: Optional[tuple] = None) -> Optional[CastCounts]:
    """The guard's counter of a cast into `figures`; a compiled block's weight cast counted in the first micro-batch
    only."""
    if figures is None:
        return None
    return CastCounts(figures, None if iteration is None else iteration[0])


def _checks(figures: Optional[torch.Tensor], amax: torch.Tensor, scales: tuple, input_amax: bool,
            bounds: Optional[tuple], finite: bool) -> None:
    """The guard's figures a cast records besides its counts: the forward input's amax, its pass's output bounds check,
    a weight's finiteness."""
    if figures is None:
        return
    if input_amax:
        record_input_amax(figures, amax)
    if bounds is not None:
        record_output_bounds(figures, amax, tuple((own, other, limit) for own, (other, limit) in zip(scales, bounds)))
    if finite:
        record_finite(figures, amax)


def _first_done(iteration: Optional[tuple]) -> None:
    if iteration is not None:
        iteration[0].zero_()


@fused_region
def cast_current(tensor: torch.Tensor, dtype: torch.dtype, transpose: bool, figures: Optional[torch.Tensor],
                 input_amax: bool, iteration: Optional[tuple] = None, bounds: Optional[tuple] = None,
                 finite: bool = False):
    """Float8CurrentScaling: the scale from this tensor's own amax, the cast, and (`transpose`) its transposed
    contiguous copy. Returns (data, transposed or None, dequantizing scale)."""
    amax = amax_of(tensor)
    scale = current_scale(amax, FP8_MAX[dtype], False, input_type_max(tensor))
    data, scale_inv = quantize_tensorwise(tensor, scale, dtype, _counts(figures, iteration))
    _checks(figures, amax, (scale_inv, scale_inv), input_amax, bounds, finite)
    _first_done(iteration)
    return data, data.t().contiguous() if transpose else None, scale_inv


@fused_region
def cast_delayed(tensor: torch.Tensor, scale: torch.Tensor, history: torch.Tensor, column: int, dtype: torch.dtype,
                 transpose: bool, figures: Optional[torch.Tensor], input_amax: bool,
                 iteration: Optional[tuple] = None, bounds: Optional[tuple] = None, finite: bool = False):
    """DelayedScaling's cast of one role with scale[column], its amax recorded in history[0, column] in place."""
    data, scale_inv, amax = quantize_delayed(tensor, scale, history, column, dtype, _counts(figures, iteration),
                                             iteration)
    _checks(figures, amax, (scale_inv, scale_inv), input_amax, bounds, finite)
    _first_done(iteration)
    return data, data.t().contiguous() if transpose else None, scale_inv


@fused_region
def cast_blocks_both_ways(tensor: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor],
                          input_amax: bool, bounds: Optional[tuple] = None):
    """Float8BlockScaling's 1x128 casts of an activation or gradient along its rows and along its tokens, each from the
    high-precision tensor as TE quantizes each direction. Returns (rows, their scales, columns, their scales) in
    cuBLASLt's layout."""
    rows, rows_scale = blocks.quantize_blocks_1d(tensor, dtype, counts=_counts(figures))
    cols, cols_scale = blocks.quantize_blocks_1d(tensor.t(), dtype, counts=_counts(figures))
    if input_amax or bounds is not None:
        _checks(figures, amax_of(tensor), (rows_scale, cols_scale), input_amax, bounds, False)
    return rows, outer_major(rows_scale), cols, outer_major(cols_scale)


@fused_region
def cast_block_weight(weight: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor],
                      iteration: Optional[tuple] = None):
    """Float8BlockScaling's 128x128 cast of a weight: one cast serves both GEMMs. Returns (data, transpose, forward
    scale, data-gradient scale)."""
    data, scale_inv = blocks.quantize_blocks_2d(weight, dtype, counts=_counts(figures, iteration))
    _checks(figures, amax_of(weight), (), False, None, True)
    _first_done(iteration)
    return data, data.t().contiguous(), square_block_scale(scale_inv), square_block_scale(scale_inv.t())


@fused_region
def cast_mx_both_ways(tensor: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor], input_amax: bool,
                      iteration: Optional[tuple] = None, bounds: Optional[tuple] = None, finite: bool = False):
    """MXFP8's 1x32 casts along both dimensions, in cast_blocks_both_ways' order."""
    rows, rows_scale = blocks.quantize_mx(tensor, dtype, _counts(figures, iteration))
    cols, cols_scale = blocks.quantize_mx(tensor.t(), dtype, _counts(figures, iteration))
    if input_amax or bounds is not None or finite:
        _checks(figures, amax_of(tensor), (rows_scale, cols_scale), input_amax, bounds, finite)
    _first_done(iteration)
    # row-major for the GEMMs
    return rows.contiguous(), outer_major(rows_scale), cols.contiguous(), outer_major(cols_scale)


@fused_region
def finish_forward(out: torch.Tensor, bias: Optional[torch.Tensor], dtype: torch.dtype,
                   figures: Optional[torch.Tensor]):
    """The forward GEMM's epilogue: the bias added in fp32, one cast to the activations' dtype, the guard's check."""
    if bias is not None:
        out = out + bias.float()
    result = out.to(dtype)
    if figures is not None:
        record_outputs(figures, (result,))
    return result


@fused_region
def finish_backward(grad_x: torch.Tensor, grad_w: torch.Tensor, x_dtype: torch.dtype, weight_dtype: torch.dtype,
                    figures: Optional[torch.Tensor], main_grads: Optional[tuple] = None):
    """The backward's epilogue: the gradients in their dtypes and the guard's check. With `main_grads` the fp32 weight
    gradient is added into them in place and None returned (TE's fuse_wgrad_accumulation)."""
    grad_x = grad_x.to(x_dtype)
    if main_grads is None:
        grad_w = grad_w.to(weight_dtype)
    if figures is not None:
        record_outputs(figures, (grad_x, grad_w))
    if main_grads is None:
        return grad_x, grad_w
    start = 0
    for main_grad in main_grads:
        main_grad.add_(grad_w[start:start + main_grad.size(0)])
        start += main_grad.size(0)
    return grad_x, None
