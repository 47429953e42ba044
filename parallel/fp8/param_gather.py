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
MXFP8's weights (1x32 blocks along each direction) are not cast from the master here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parallel.fp8.block_scaling import BLOCK
from parallel.fp8.kernel import E4M3
from parallel.fp8.recipes import FP8_MAX, FP32_MAX, WEIGHT, current_scale, saturating_cast

# The recipes whose weights are cast from the master here; MXFP8's (1x32 blocks both ways) are not built.
GATHERED_RECIPES = ("delayed", "tensorwise", "blockwise")


@dataclass
class Fp8Weight:
    """A weight as the FP8 GEMM takes it: `data`, e4m3 (out x in, row-major; a view of the gathered bytes, valid
    while ZeRO holds them gathered), and `scale_inv`, the dequantizing scale (an fp32 scalar, rewritten in place
    at each cast)."""
    data: torch.Tensor
    scale_inv: torch.Tensor


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
    """The dequantizing scale a gathered weight carries: a scalar, or blockwise one per 128 x 128 block."""
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
    if scale_inv.dim() == 2:  # blockwise: each block's scale over its rows and columns
        rows, cols = weight.data.shape
        scale_inv = scale_inv.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return weight.data.float() * scale_inv
