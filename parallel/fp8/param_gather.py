"""--fp8-param-gather's casts: an FP8 linear's weight kept as e4m3 bytes and a dequantizing scale, cast from the
fp32 master weights after each optimizer step, so that ZeRO gathers 1 byte per weight element and the FP8 GEMM
takes the gathered bytes with no second cast (zero/fp8_params.py keeps the bytes and gathers them).

Megatron-Core (megatron/core/fp8_utils.py, quantize_param_shard; with TE 2.2+ TE's cast_master_weights_to_fp8 in
transformer_engine/pytorch/tensor/utils.py) casts each data-parallel rank's shard of the master weight:
- the master is first cast to the model's dtype ("to keep numerical consistency" with the run without the flag,
  whose forward casts the 16-bit weight), then scaled and cast to e4m3 (saturating, TE's casts);
- current scaling (tensorwise): the amax of each shard, all-reduced (max) over the data-parallel group, is the
  whole tensor's; scale = fp8_max / amax as TE's compute_scale_from_amax, the forward's own formula, so the
  bytes are those the run without the flag casts in its forward;
- delayed scaling: the shard is cast with the weight's current scale (from its history) and the cast's amax,
  all-reduced (max) over the data-parallel group, goes to the history's newest row; the history is updated at
  the end of the next forward (TE's autocast exit), as when the forward cast the weight itself. With several
  micro-batches per step the weight is cast once per step, where without the flag each micro-batch's forward
  casts it again with the scale the previous one updated: TE's behaviour with FP8 parameters, said at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parallel.fp8.kernel import E4M3
from parallel.fp8.recipes import FP8_MAX, WEIGHT, current_scale, saturating_cast

# The recipes whose weights are cast per tensor here; blockwise and MXFP8 weights (block scales) are not built.
GATHERED_RECIPES = ("delayed", "tensorwise")


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
