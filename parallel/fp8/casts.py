"""The FP8 linear's regions (parallel/fp8/fused.py): one per tensor cast, one per GEMM pass's epilogue. Each takes
tensors and constants, mutates the guard's figures and delayed scaling's history in place, and returns the tensors
the GEMMs take, so that fused it is the few kernels TransformerEngine launches for the same work:

- a per-tensor cast (TE's cast_transpose with its amax): amax, scale, saturating quantize, the transposed contiguous
  copy where a backward GEMM takes the tensor the other way round, the guard's counts; delayed scaling casts with the
  role's scale and records the amax in its history's row 0 instead of computing a scale;
- a block cast: both directions the GEMMs need (rows for one GEMM, columns along the tokens for the weight
  gradient's; the weight's 128x128 blocks and their transpose), each block's scale in the GEMM's layout;
- an epilogue: the bias added in fp32 and the cast to the activations' dtype (forward), the guard's check of the
  pass's outputs (finite or not; a pass with no epilogue of its own makes that check in its last cast instead, from
  bounds on its outputs, guard.py record_output_bounds), and under gradient accumulation fusion the weight
  gradient's add into its fp32 main gradient (backward).

`figures` is the layer's forward_figures or backward_figures (parallel/fp8/guard.py), None with the guard off."""

from __future__ import annotations

from typing import Optional

import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.block_gemm import outer_major, square_block_scale
from parallel.fp8.fused import fused_region
from parallel.fp8.guard import CastCounts, record_finite, record_input_amax, record_output_bounds, record_outputs
from parallel.fp8.recipes import FP8_MAX, amax_of, current_scale, input_type_max, quantize_delayed, quantize_tensorwise


def _counts(figures: Optional[torch.Tensor], iteration: Optional[tuple] = None) -> Optional[CastCounts]:
    """The guard's counter of a cast into `figures`; a compiled block's weight cast (`iteration`: (first, ...),
    weight_cache.py) counted in the iteration's first micro-batch only, as the cached cast is."""
    if figures is None:
        return None
    return CastCounts(figures, None if iteration is None else iteration[0])


def _checks(figures: Optional[torch.Tensor], amax: torch.Tensor, scales: tuple, input_amax: bool,
            bounds: Optional[tuple], finite: bool) -> None:
    """The guard's figures a cast records besides its counts: the forward input's amax (`input_amax`); its pass's
    check made here (`bounds`: per GEMM the cast tensor enters, the other operand's dequantizing scales and the
    limit, guard.py record_output_bounds; `scales`: this cast's scales for those GEMMs, in order); a weight's
    finiteness (`finite`)."""
    if figures is None:
        return
    if input_amax:
        record_input_amax(figures, amax)
    if bounds is not None:
        record_output_bounds(figures, amax, tuple((own, other, limit) for own, (other, limit) in zip(scales, bounds)))
    if finite:
        record_finite(figures, amax)


def _first_done(iteration: Optional[tuple]) -> None:
    """A compiled block's weight cast done: the iteration's later micro-batches are not its first."""
    if iteration is not None:
        iteration[0].zero_()


@fused_region
def cast_current(tensor: torch.Tensor, dtype: torch.dtype, transpose: bool, figures: Optional[torch.Tensor],
                 input_amax: bool, iteration: Optional[tuple] = None, bounds: Optional[tuple] = None,
                 finite: bool = False):
    """Float8CurrentScaling (TE's default: no power-of-two scales): the scale from this tensor's own amax
    (recipes.current_scale), the cast, and (`transpose`) its transposed contiguous copy. Returns (data, transposed
    or None, dequantizing scale); `input_amax`: the amax is the forward's input amax the guard tracks; `iteration`:
    a compiled block's weight (weight_cache.py); `bounds`, `finite`: the guard's checks (_checks)."""
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
    """DelayedScaling's cast of one role: with scale[column], its amax recorded in history[0, column] in place
    (recipes.quantize_delayed, which takes `iteration`); otherwise as cast_current."""
    data, scale_inv, amax = quantize_delayed(tensor, scale, history, column, dtype, _counts(figures, iteration),
                                             iteration)
    _checks(figures, amax, (scale_inv, scale_inv), input_amax, bounds, finite)
    _first_done(iteration)
    return data, data.t().contiguous() if transpose else None, scale_inv


@fused_region
def cast_blocks_both_ways(tensor: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor],
                          input_amax: bool, bounds: Optional[tuple] = None):
    """Float8BlockScaling's 1x128 casts of an activation or gradient, both the GEMMs need: along its rows (the
    forward's or the data gradient's GEMM) and along its columns, the tokens (the weight gradient's), each from the
    high-precision tensor as TE quantizes each direction ("to avoid double quantization errors"). Returns (rows,
    rows' scales, columns [cols, rows], columns' scales), the scales in cuBLASLt's layout (block_gemm.py); `bounds`:
    the pass's check (_checks), for the GEMM taking the rows, then the one taking the columns."""
    rows, rows_scale = blocks.quantize_blocks_1d(tensor, dtype, counts=_counts(figures))
    cols, cols_scale = blocks.quantize_blocks_1d(tensor.t(), dtype, counts=_counts(figures))
    if input_amax or bounds is not None:
        _checks(figures, amax_of(tensor), (rows_scale, cols_scale), input_amax, bounds, False)
    return rows, outer_major(rows_scale), cols, outer_major(cols_scale)


@fused_region
def cast_block_weight(weight: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor],
                      iteration: Optional[tuple] = None):
    """Float8BlockScaling's 128x128 cast of a weight [out, in]: a square block quantizes W and W^T alike, so one
    cast serves both GEMMs. Returns (data, its transpose [in, out], the forward GEMM's scale, the data gradient's
    scale), the scales in cuBLASLt's 128x128 layout for b = W^T and b = W."""
    data, scale_inv = blocks.quantize_blocks_2d(weight, dtype, counts=_counts(figures, iteration))
    _checks(figures, amax_of(weight), (), False, None, True)
    _first_done(iteration)
    return data, data.t().contiguous(), square_block_scale(scale_inv), square_block_scale(scale_inv.t())


@fused_region
def cast_mx_both_ways(tensor: torch.Tensor, dtype: torch.dtype, figures: Optional[torch.Tensor], input_amax: bool,
                      iteration: Optional[tuple] = None, bounds: Optional[tuple] = None, finite: bool = False):
    """MXFP8's 1x32 casts along both dimensions (TE's MXFP8 quantizer makes rowwise and columnwise data): rows and
    columns (the transposed tensor's rows), each with its E8M0 scales (fp32 here), in cast_blocks_both_ways' order."""
    rows, rows_scale = blocks.quantize_mx(tensor, dtype, _counts(figures, iteration))
    cols, cols_scale = blocks.quantize_mx(tensor.t(), dtype, _counts(figures, iteration))
    if input_amax or bounds is not None or finite:
        _checks(figures, amax_of(tensor), (rows_scale, cols_scale), input_amax, bounds, finite)
    _first_done(iteration)
    # row-major for the GEMMs (a transposed input's blocks keep its layout through the cast)
    return rows.contiguous(), outer_major(rows_scale), cols.contiguous(), outer_major(cols_scale)


@fused_region
def finish_forward(out: torch.Tensor, bias: Optional[torch.Tensor], dtype: torch.dtype,
                   figures: Optional[torch.Tensor]):
    """The forward GEMM's epilogue: the bias added in fp32 (TE's GEMM epilogue), one cast to the activations'
    dtype, and the guard's check of the output the model sees."""
    if bias is not None:
        out = out + bias.float()
    result = out.to(dtype)
    if figures is not None:
        record_outputs(figures, (result,))
    return result


@fused_region
def finish_backward(grad_x: torch.Tensor, grad_w: torch.Tensor, x_dtype: torch.dtype, weight_dtype: torch.dtype,
                    figures: Optional[torch.Tensor], main_grads: Optional[tuple] = None):
    """The backward's epilogue: the gradients in their tensors' dtypes, and the guard's check of them. With
    `main_grads` (gradient accumulation fusion, parallel/grad_accumulation_fusion.py: the main gradient of each weight
    of the linear, linear.py `joined`) the weight gradient, fp32 from its GEMM, is checked as it is and its rows added
    into them in place, and None comes back in its place: no 16-bit copy of it is made, as TE's
    fuse_wgrad_accumulation adds its GEMM's fp32 result into main_grad."""
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
