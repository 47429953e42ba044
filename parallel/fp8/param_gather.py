"""--fp8-param-gather's casts: an FP8 linear's weight kept as e4m3 bytes and a dequantizing scale, cast from the
fp32 master weights after each optimizer step, so that ZeRO gathers 1 byte per weight element and the FP8 GEMM
takes the gathered bytes with no second cast (zero/fp8_params.py keeps the bytes and gathers them).

Megatron-Core (fp8_utils.py quantize_param_shard; with TE 2.2+ TE's cast_master_weights_to_fp8) casts each DP rank's
shard of the master weight, first cast to the model's dtype (as the run without the flag casts the 16-bit weight):
- current scaling (tensorwise): each shard's amax, max all-reduced over DP, is the whole tensor's; scale = fp8_max /
  amax (TE's compute_scale_from_amax), so the bytes are those the forward would cast;
- delayed scaling: the shard is cast with the weight's current scale and the cast's amax (max over DP) goes to the
  history's newest row, updated at the end of the next forward. With several micro-batches a step the weight is cast
  once per step, not once per micro-batch: TE's behaviour with FP8 parameters, said at start-up;
- blockwise (Float8BlockScaling's 128x128 weight blocks; TE's _cast_master_weights_to_fp8_blockwise_scaling, called
  from core_v0.13 with TE 2.3+): each block's amax over the rank's elements of the fp32 master (0 for a block it holds
  none of), max over DP; power-of-two scales from it (multi_tensor_compute_scale_and_scale_inv; the fp32 maximum
  where it overflows); the fp32 master times its block's scale cast to e4m3, with no cast to the model's dtype
  first. In an fp32 run the bytes and scales are the forward's (block_scaling.py quantize_blocks_2d); in a 16-bit one
  a byte or scale may differ by the 16-bit rounding of a value or amax, said at start-up.
- mxfp8 (1x32 blocks, E8M0 scales; the section below): both casts of the shard in the model's dtype, rowwise and
  columnwise, from each block's amax max over DP: ZeRO 0's bytes in any dtype, 2 a weight element."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from parallel.fp8.block_scaling import BLOCK, MX_BLOCK, e8m0_exponent, e8m0_to_reciprocal, e8m0_to_scale
from parallel.fp8.kernel import E4M3
from parallel.fp8.recipes import FP8_MAX, FP32_MAX, WEIGHT, current_scale, saturating_cast

# The recipes whose weights are cast from the master here: all the run's recipes but the refused custom one.
GATHERED_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


@dataclass
class Fp8Weight:
    """A weight as the FP8 GEMM takes it: `data`, e4m3 (out x in, row-major; a view of the gathered bytes, valid
    while ZeRO holds them gathered), and `scale_inv`, the dequantizing scale (an fp32 scalar, rewritten in place
    at each cast). MXFP8 has its 1x32 row blocks' scales [out, in / 32] there, and the column blocks' cast beside:
    `columnwise` (out x in, each column's 32-row blocks cast on their own scale) and their scales [in, out / 32]."""
    data: torch.Tensor
    scale_inv: torch.Tensor
    columnwise: Optional[torch.Tensor] = None
    columnwise_scale_inv: Optional[torch.Tensor] = None


def weight_scale(state, amax: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """The scale a weight's shards are cast with, from the whole weight's amax (already reduced over the shard
    owners). Delayed scaling records the amax in the history (max with what its newest row holds) and casts with
    the current scale; current scaling computes the scale from the amax with TE's formula, value_for_inf the
    model dtype's largest value (the forward casts a weight of that dtype)."""
    if state.delayed is not None:
        state.delayed.record_amax(WEIGHT, amax)
        return state.delayed.scale_of(WEIGHT)
    return current_scale(amax, FP8_MAX[E4M3], False, torch.finfo(model_dtype).max)


def cast_shard(master_piece: torch.Tensor, scale: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """A piece of the fp32 master cast as the forward casts the model's weight: to the model dtype, then
    (x * scale) saturated to e4m3; returned as bytes (uint8) for the gather."""
    return saturating_cast(master_piece.to(model_dtype).float() * scale, E4M3).view(torch.uint8)


# ---- blockwise: one scale per 128 x 128 block of the (row-major, 2-D) weight ---------------------------------------

def scale_shape(recipe: str, shape: torch.Size) -> tuple[int, ...]:
    """The dequantizing scale a gathered weight carries: a scalar, blockwise one per 128 x 128 block, MXFP8 one per
    1 x 32 block of each row."""
    if recipe == "mxfp8":
        return mx_scale_shapes(shape)[0]
    if recipe != "blockwise":
        return ()
    rows, cols = shape
    return (-(-rows // BLOCK), -(-cols // BLOCK))


def block_index(param_offset: int, numel: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """The block (row-major over the [row blocks, col blocks] scales) of each element param_offset ..
    param_offset + numel - 1 of the flattened weight of `shape`."""
    cols = shape[1]
    flat = torch.arange(param_offset, param_offset + numel, device=device)
    return (flat // cols // BLOCK) * -(-cols // BLOCK) + flat % cols // BLOCK


def block_amax(master_piece: torch.Tensor, index: torch.Tensor, blocks: int) -> torch.Tensor:
    """fp8_block_scaling_compute_partial_amax: each block's amax over this piece of the fp32 master, 0 where the
    piece holds none of its elements ([blocks], fp32)."""
    amax = torch.zeros(blocks, dtype=torch.float32, device=master_piece.device)
    return amax.scatter_reduce_(0, index, master_piece.float().abs(), "amax")


def block_scale(amax: torch.Tensor) -> torch.Tensor:
    """TE's multi_tensor_compute_scale_and_scale_inv for the weight's quantizer: power-of-two scales (Float8BlockScaling's
    default), amax_epsilon 0, the fp32 maximum where fp8_max / amax overflows."""
    return current_scale(amax, FP8_MAX[E4M3], True, FP32_MAX)


def cast_block_shard(master_piece: torch.Tensor, index: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8_block_scaling_partial_cast: each fp32 master element times its block's scale, saturated to e4m3;
    returned as bytes (uint8) for the gather."""
    return saturating_cast(master_piece.float() * scale.reshape(-1)[index], E4M3).view(torch.uint8)


def dequantized(weight: Fp8Weight) -> torch.Tensor:
    """The gathered weight's values in fp32: its bytes times their scale (the tensor's, or each one's block's)."""
    scale_inv = weight.scale_inv
    if weight.columnwise is not None:  # MXFP8: the rowwise cast, each 1x32 block's scale over its columns
        return weight.data.float() * scale_inv.repeat_interleave(MX_BLOCK, 1)
    if scale_inv.dim() == 2:  # blockwise: each block's scale over its rows and columns
        rows, cols = weight.data.shape
        scale_inv = scale_inv.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return weight.data.float() * scale_inv


# ---- mxfp8: 1 x 32 blocks along each row (the forward GEMM's) and along each column (the data gradient's) ----------
# MXFP8BlockScaling's weight: each shard, first cast to the model's dtype as the forward casts the weight, gives each
# block's amax in both directions (0 for a block it holds none of), max over DP; every rank computes all the E8M0
# scales from them (block_scaling.quantize_mx's formula) and casts its elements both ways, so the gathered rowwise and
# columnwise bytes are quantize_mx(W)'s and quantize_mx(W.t())'s. Megatron-Core 0.16's distributed optimizer gathers
# MXFP8 weights in bf16 and casts each whole weight after the gather: in a bf16 run, the same bytes.

def mx_scale_shapes(shape: torch.Size) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rowwise scales [rows, cols / 32] and the columnwise ones [cols, rows / 32] (those of W^T's rows, as
    block_scaling.quantize_mx(W.t()) gives them)."""
    rows, cols = shape
    return (rows, cols // MX_BLOCK), (cols, rows // MX_BLOCK)


def mx_block_index(param_offset: int, numel: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """[2, numel]: each element's rowwise block (row-major over [rows, cols / 32]) and its columnwise block (over
    [cols, rows / 32], after the rowwise ones), for elements param_offset .. + numel - 1 of the flattened weight."""
    rows, cols = shape
    flat = torch.arange(param_offset, param_offset + numel, device=device)
    row, col = flat // cols, flat % cols
    rowwise = row * (cols // MX_BLOCK) + col // MX_BLOCK
    columnwise = rows * cols // MX_BLOCK + col * (rows // MX_BLOCK) + row // MX_BLOCK
    return torch.stack([rowwise, columnwise])


def mx_exponents(amax: torch.Tensor) -> torch.Tensor:
    """Each block's E8M0 exponent from its amax, quantize_mx's formula (amax times fp32 1 / fp8_max, rounded up)."""
    return e8m0_exponent(amax * torch.tensor(1.0 / FP8_MAX[E4M3], dtype=torch.float32, device=amax.device))


def cast_mx_shard(values: torch.Tensor, index: torch.Tensor, exponent: torch.Tensor) -> tuple:
    """Both casts of a shard's elements (already in the model's dtype, as fp32): times their row block's and their
    column block's quantizing multiplier 2^(127 - e), saturated to e4m3; (rowwise, columnwise) bytes (uint8)."""
    multiplier = e8m0_to_reciprocal(exponent)
    return tuple(saturating_cast(values * multiplier[index[direction]], E4M3).view(torch.uint8)
                 for direction in (0, 1))


def mx_dequantizing_scales(exponent: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """The rowwise and columnwise dequantizing scales 2^(e - 127), in mx_scale_shapes' shapes."""
    rowwise, columnwise = mx_scale_shapes(shape)
    scale = e8m0_to_scale(exponent)
    return scale[:rowwise[0] * rowwise[1]].reshape(rowwise), scale[rowwise[0] * rowwise[1]:].reshape(columnwise)
