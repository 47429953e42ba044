"""The block recipes: TE's Float8BlockScaling (1x128 blocks for activations and gradients, 128x128 for weights,
power-of-two fp32 scales) and MXFP8BlockScaling (1x32 blocks, E8M0 scales), their casts and scale formats."""

from __future__ import annotations

import torch

from parallel.fp8.recipes import FP8_MAX, current_scale, input_type_max, saturating_cast

BLOCK = 128
MX_BLOCK = 32
E8M0_BIAS = 127


def _blocks(tensor: torch.Tensor, block: int) -> torch.Tensor:
    rows, cols = tensor.shape
    return tensor.float().reshape(rows, -1, block)


def _block_amax(values: torch.Tensor, block: int) -> torch.Tensor:
    rows, cols = values.shape
    whole = cols - cols % block
    amaxes = [values[:, :whole].reshape(rows, -1, block).abs().amax(dim=-1)] if whole else []
    if whole < cols:
        amaxes.append(values[:, whole:].abs().amax(dim=-1, keepdim=True))
    return torch.cat(amaxes, dim=1)


def _times_block_scales(values: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """`values` times their block's scale, expanded over the block (padding or piecewise scaling miscompile on the
    CPU)."""
    rows, cols = values.shape
    whole = cols - cols % block
    per_value = [scale[:, :whole // block].unsqueeze(-1).expand(rows, whole // block, block).reshape(rows, whole)] \
        if whole else []
    if whole < cols:
        per_value.append(scale[:, -1:].expand(rows, cols - whole))
    return values * torch.cat(per_value, dim=1)


def quantize_blocks_1d(tensor: torch.Tensor, dtype: torch.dtype, block: int = BLOCK, counts=None):
    """1 x block scaling along the last dimension: FP8 data and dequantizing scales [rows, blocks]."""
    values = tensor.float()
    scale = current_scale(_block_amax(values, block), FP8_MAX[dtype], True, input_type_max(tensor))
    data = saturating_cast(_times_block_scales(values, scale, block), dtype, counts).contiguous()
    return data, torch.reciprocal(scale)


def quantize_blocks_2d(tensor: torch.Tensor, dtype: torch.dtype, block: int = BLOCK, counts=None):
    """block x block scaling (the weights'): FP8 data and dequantizing scales. A square block serves a matrix and its
    transpose alike."""
    rows = tensor.size(0)
    values = tensor.float()
    row_amax = _block_amax(values, block)
    whole = rows - rows % block
    tiles = [row_amax[:whole].reshape(-1, block, row_amax.size(1)).amax(dim=1)] if whole else []
    if whole < rows:
        tiles.append(row_amax[whole:].amax(dim=0, keepdim=True))
    scale = current_scale(torch.cat(tiles), FP8_MAX[dtype], True, input_type_max(tensor))
    scaled = _times_block_scales(values, expand_2d_scales(scale, rows, block), block)
    data = saturating_cast(scaled, dtype, counts).contiguous()
    return data, torch.reciprocal(scale)


def expand_2d_scales(scale_inv: torch.Tensor, rows: int, block: int = BLOCK) -> torch.Tensor:
    """[row blocks, col blocks] -> [rows, col blocks] by concatenation (repeat_interleave miscompiles on the CPU)."""
    return torch.cat([scale_inv[index:index + 1].expand(min(block, rows - start), -1)
                      for index, start in enumerate(range(0, rows, block))])


def e8m0_exponent(value: torch.Tensor) -> torch.Tensor:
    """TE's float_to_e8m0: the biased exponent of fp32 `value` rounded up, saturating at 254; 255 for nan. Returns
    int32."""
    bits = value.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    exponent = exponent + round_up.to(torch.int32)
    exponent = torch.where(torch.isinf(value), torch.full_like(exponent, 0xFE), exponent)
    exponent = torch.where(torch.isnan(value), torch.full_like(exponent, 0xFF), exponent)
    return torch.where(value == 0, torch.zeros_like(exponent), exponent)


def _float_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).contiguous().view(torch.float32)


def e8m0_to_scale(exponent: torch.Tensor) -> torch.Tensor:
    scale = _float_from_bits(exponent << 23)
    scale = torch.where(exponent == 0, _float_from_bits(torch.full_like(exponent, 0x00400000)), scale)
    return torch.where(exponent == 0xFF, torch.full_like(scale, float("nan")), scale)


def e8m0_to_reciprocal(exponent: torch.Tensor) -> torch.Tensor:
    scale = _float_from_bits((254 - exponent).clamp(min=0) << 23)
    scale = torch.where(exponent == 254, _float_from_bits(torch.full_like(exponent, 0x00400000)), scale)
    return torch.where(exponent == 0xFF, torch.full_like(scale, float("nan")), scale)


def quantize_mx(tensor: torch.Tensor, dtype: torch.dtype, counts=None):
    """MXFP8 (TE's quantize_mxfp8.cuh): per 1x32 block an E8M0 scale from the amax, the values cast with saturation.
    Returns the FP8 data and the dequantizing scales as fp32 [rows, cols / 32]."""
    rows, cols = tensor.shape
    if cols % MX_BLOCK:
        raise ValueError(f"MXFP8 quantizes blocks of {MX_BLOCK} along the last dimension; {cols} is not a multiple")
    blocks = _blocks(tensor, MX_BLOCK)
    max_norm_reciprocal = torch.tensor(1.0 / FP8_MAX[dtype], dtype=torch.float32)
    exponent = e8m0_exponent(blocks.abs().amax(dim=-1) * max_norm_reciprocal)
    data = saturating_cast(blocks * e8m0_to_reciprocal(exponent).unsqueeze(-1), dtype, counts).reshape(rows, cols)
    return data, e8m0_to_scale(exponent)
