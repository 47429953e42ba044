"""--fp8-param-gather's casts: an FP8 linear's weight cast from the fp32 master shards after each step to e4m3 bytes and
a dequantizing scale, amaxes reduced over DP, so ZeRO gathers 1 byte an element and the GEMM takes the forward's bytes
with no second cast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from parallel.fp8.block_scaling import BLOCK, MX_BLOCK, e8m0_exponent, e8m0_to_reciprocal, e8m0_to_scale
from parallel.fp8.kernel import E4M3
from parallel.fp8.recipes import FP8_MAX, FP32_MAX, WEIGHT, current_scale, saturating_cast

GATHERED_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


@dataclass
class Fp8Weight:
    """A weight as the FP8 GEMM takes it: `data`, e4m3 [out, in] (a view of the gathered bytes), and `scale_inv`,
    rewritten in place at each cast; MXFP8 adds `columnwise`."""
    data: torch.Tensor
    scale_inv: torch.Tensor
    columnwise: Optional[torch.Tensor] = None
    columnwise_scale_inv: Optional[torch.Tensor] = None


def weight_scale(state, amax: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """The scale a weight's shards are cast with, from the whole weight's reduced amax."""
    if state.delayed is not None:
        state.delayed.record_amax(WEIGHT, amax)
        return state.delayed.scale_of(WEIGHT)
    return current_scale(amax, FP8_MAX[E4M3], False, torch.finfo(model_dtype).max)


def cast_shard(master_piece: torch.Tensor, scale: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """A piece of the fp32 master cast as the forward casts the weight, as e4m3 bytes."""
    return saturating_cast(master_piece.to(model_dtype).float() * scale, E4M3).view(torch.uint8)


# ---- blockwise: one scale per 128 x 128 block ----

def scale_shape(recipe: str, shape: torch.Size) -> tuple[int, ...]:
    if recipe == "mxfp8":
        return mx_scale_shapes(shape)[0]
    if recipe != "blockwise":
        return ()
    rows, cols = shape
    return (-(-rows // BLOCK), -(-cols // BLOCK))


def block_index(param_offset: int, numel: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    cols = shape[1]
    flat = torch.arange(param_offset, param_offset + numel, device=device)
    return (flat // cols // BLOCK) * -(-cols // BLOCK) + flat % cols // BLOCK


def block_amax(master_piece: torch.Tensor, index: torch.Tensor, blocks: int) -> torch.Tensor:
    """Each block's amax over this piece of the master, 0 where it holds none."""
    amax = torch.zeros(blocks, dtype=torch.float32, device=master_piece.device)
    return amax.scatter_reduce_(0, index, master_piece.float().abs(), "amax")


def block_scale(amax: torch.Tensor) -> torch.Tensor:
    return current_scale(amax, FP8_MAX[E4M3], True, FP32_MAX)


def cast_block_shard(master_piece: torch.Tensor, index: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return saturating_cast(master_piece.float() * scale.reshape(-1)[index], E4M3).view(torch.uint8)


def dequantized(weight: Fp8Weight) -> torch.Tensor:
    scale_inv = weight.scale_inv
    if weight.columnwise is not None:
        return weight.data.float() * scale_inv.repeat_interleave(MX_BLOCK, 1)
    if scale_inv.dim() == 2:
        rows, cols = weight.data.shape
        scale_inv = scale_inv.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return weight.data.float() * scale_inv


# ---- mxfp8: 1 x 32 blocks along rows and columns, amaxes max over DP ----

def mx_scale_shapes(shape: torch.Size) -> tuple[tuple[int, int], tuple[int, int]]:
    rows, cols = shape
    return (rows, cols // MX_BLOCK), (cols, rows // MX_BLOCK)


def mx_block_index(param_offset: int, numel: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    rows, cols = shape
    flat = torch.arange(param_offset, param_offset + numel, device=device)
    row, col = flat // cols, flat % cols
    rowwise = row * (cols // MX_BLOCK) + col // MX_BLOCK
    columnwise = rows * cols // MX_BLOCK + col * (rows // MX_BLOCK) + row // MX_BLOCK
    return torch.stack([rowwise, columnwise])


def mx_exponents(amax: torch.Tensor) -> torch.Tensor:
    return e8m0_exponent(amax * torch.tensor(1.0 / FP8_MAX[E4M3], dtype=torch.float32, device=amax.device))


def cast_mx_shard(values: torch.Tensor, index: torch.Tensor, exponent: torch.Tensor) -> tuple:
    """Both casts of a shard's elements: (rowwise, columnwise) e4m3 bytes."""
    multiplier = e8m0_to_reciprocal(exponent)
    return tuple(saturating_cast(values * multiplier[index[direction]], E4M3).view(torch.uint8)
                 for direction in (0, 1))


def mx_dequantizing_scales(exponent: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    rowwise, columnwise = mx_scale_shapes(shape)
    scale = e8m0_to_scale(exponent)
    return scale[:rowwise[0] * rowwise[1]].reshape(rowwise), scale[rowwise[0] * rowwise[1]:].reshape(columnwise)
