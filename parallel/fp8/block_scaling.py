"""The block recipes: TE's Float8BlockScaling (DeepSeek-V3's scaling: 1x128 blocks for activations and
gradients, 128x128 for weights, power-of-two fp32 scales) and MXFP8BlockScaling (1x32 blocks, E8M0 scales,
i.e. powers of two), and their GEMM.

The GEMM (block_gemm.py) is torch's native block-scaled GEMM where the device has one (blockwise on Hopper), else
one K block at a time through the one kernel path (kernel.scaled_matmul, unit scales, fp32 out), the blocks' scales
applied to each fp32 partial before adding it: the promotion DeepSeek-V3 describes and TE's blockwise GEMM performs
(split accumulation, which Float8BlockScaling requires). The loop is an emulation of the hardware's block-scaled
GEMMs and is named so in the start-up line: the products and sums are the same, but a device kernel may order the
fp32 additions inside a block differently.
"""

from __future__ import annotations

import torch

from parallel.fp8.recipes import FP8_MAX, current_scale, input_type_max, saturating_cast

BLOCK = 128  # Float8BlockScaling's block length
MX_BLOCK = 32  # MXFP8's block length
E8M0_BIAS = 127


def _blocks(tensor: torch.Tensor, block: int) -> torch.Tensor:
    """[rows, cols] -> [rows, cols / block, block] in fp32 (cols a multiple of block: MXFP8's)."""
    rows, cols = tensor.shape
    return tensor.float().reshape(rows, -1, block)


def _block_amax(values: torch.Tensor, block: int) -> torch.Tensor:
    """Each 1 x block block's amax along the last dimension, [rows, blocks]: the whole blocks', then the last partial
    one's over its values (the zeros of a padding would add nothing)."""
    rows, cols = values.shape
    whole = cols - cols % block
    amaxes = [values[:, :whole].reshape(rows, -1, block).abs().amax(dim=-1)] if whole else []
    if whole < cols:
        amaxes.append(values[:, whole:].abs().amax(dim=-1, keepdim=True))
    return torch.cat(amaxes, dim=1)


def _times_block_scales(values: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """`values` [rows, cols] times their 1 x block block's scale ([rows, blocks]), each scale expanded over its block.
    Not the values padded to whole blocks, scaled and sliced back, nor scaled block piece by piece and concatenated:
    torch 2.13's inductor miscompiles both on the CPU with static shapes (a read past the slice's padding; a
    transposed bf16 input's 32-wide last piece), garbage FP8 data under --compile (tests/parallel/test_fp8_fused.py)."""
    rows, cols = values.shape
    whole = cols - cols % block
    per_value = [scale[:, :whole // block].unsqueeze(-1).expand(rows, whole // block, block).reshape(rows, whole)] \
        if whole else []
    if whole < cols:
        per_value.append(scale[:, -1:].expand(rows, cols - whole))
    return values * torch.cat(per_value, dim=1)


def quantize_blocks_1d(tensor: torch.Tensor, dtype: torch.dtype, block: int = BLOCK, counts=None):
    """1 x block scaling along the last dimension: per block, TE's compute_scale_from_amax with power-of-two
    scales (Float8BlockScaling's default, QParams(power_2_scale=True, amax_epsilon=0)). Returns the FP8 data
    [rows, cols] and the dequantizing scales [rows, blocks]."""
    values = tensor.float()
    scale = current_scale(_block_amax(values, block), FP8_MAX[dtype], True, input_type_max(tensor))
    data = saturating_cast(_times_block_scales(values, scale, block), dtype, counts).contiguous()
    return data, torch.reciprocal(scale)


def quantize_blocks_2d(tensor: torch.Tensor, dtype: torch.dtype, block: int = BLOCK, counts=None):
    """block x block scaling (the weights' 128x128): FP8 data [rows, cols] and dequantizing scales
    [ceil(rows / block), ceil(cols / block)]. A square block quantizes a matrix and its transpose alike, so
    one copy serves the forward and the data-gradient GEMMs. Each tile's amax is the max of its rows' 1 x block
    amaxes (a max in any order is exact)."""
    rows = tensor.size(0)
    values = tensor.float()
    row_amax = _block_amax(values, block)  # [rows, col blocks]
    whole = rows - rows % block
    tiles = [row_amax[:whole].reshape(-1, block, row_amax.size(1)).amax(dim=1)] if whole else []
    if whole < rows:
        tiles.append(row_amax[whole:].amax(dim=0, keepdim=True))
    scale = current_scale(torch.cat(tiles), FP8_MAX[dtype], True, input_type_max(tensor))
    scaled = _times_block_scales(values, expand_2d_scales(scale, rows, block), block)
    data = saturating_cast(scaled, dtype, counts).contiguous()  # counted over the values, not the padding
    return data, torch.reciprocal(scale)


def expand_2d_scales(scale_inv: torch.Tensor, rows: int, block: int = BLOCK) -> torch.Tensor:
    """[row blocks, col blocks] -> [rows, col blocks]: each row's scale per K block, for the GEMM. Each row block's
    scales repeated over its rows and the blocks concatenated, not repeat_interleave'd and sliced: torch 2.13's
    inductor reads past a gather whose index `row // block` ends in a partial block on the CPU (garbage scales for
    the rows of a weight's last, partial 128-row tile, under --compile)."""
    return torch.cat([scale_inv[index:index + 1].expand(min(block, rows - start), -1)
                      for index, start in enumerate(range(0, rows, block))])


def e8m0_exponent(value: torch.Tensor) -> torch.Tensor:
    """TE's float_to_e8m0 (transformer_engine/common/util/ptx_arch_spec.cuh, the non-Blackwell branch; the
    Blackwell one is cvt.rp.satfinite.ue8m0x2): the biased exponent of fp32 `value` rounded up to a power
    of two, saturating at 254; 255 for nan, 254 for inf, 0 for 0. Returns int32."""
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
    """TE's exp2f(e8m0): 2^(e - 127), the dequantizing scale (2^-127, a subnormal, for e = 0; nan for 255)."""
    scale = _float_from_bits(exponent << 23)
    scale = torch.where(exponent == 0, _float_from_bits(torch.full_like(exponent, 0x00400000)), scale)
    return torch.where(exponent == 0xFF, torch.full_like(scale, float("nan")), scale)


def e8m0_to_reciprocal(exponent: torch.Tensor) -> torch.Tensor:
    """TE's exp2f_rcp(e8m0): 2^(127 - e), the quantizing multiplier (2^-127 for e = 254, nan for 255)."""
    scale = _float_from_bits((254 - exponent).clamp(min=0) << 23)
    scale = torch.where(exponent == 254, _float_from_bits(torch.full_like(exponent, 0x00400000)), scale)
    return torch.where(exponent == 0xFF, torch.full_like(scale, float("nan")), scale)


def quantize_mx(tensor: torch.Tensor, dtype: torch.dtype, counts=None):
    """MXFP8 (TE's quantize_mxfp8.cuh): per 1x32 block along the last dimension, the E8M0 exponent of
    amax * (1 / fp8_max) rounded up, the values multiplied by 2^(127 - e) and cast with saturation. Returns
    the FP8 data and the dequantizing scales 2^(e - 127) as fp32 [rows, cols / 32] (E8M0 emulated in fp32:
    every power of two it holds is exact there)."""
    rows, cols = tensor.shape
    if cols % MX_BLOCK:
        raise ValueError(f"MXFP8 quantizes blocks of {MX_BLOCK} along the last dimension; {cols} is not a multiple")
    blocks = _blocks(tensor, MX_BLOCK)
    max_norm_reciprocal = torch.tensor(1.0 / FP8_MAX[dtype], dtype=torch.float32)
    exponent = e8m0_exponent(blocks.abs().amax(dim=-1) * max_norm_reciprocal)
    data = saturating_cast(blocks * e8m0_to_reciprocal(exponent).unsqueeze(-1), dtype, counts).reshape(rows, cols)
    return data, e8m0_to_scale(exponent)
