"""The block recipes' GEMM: torch's native block-scaled GEMM on Hopper for blockwise (checked here against torch's meta
kernel only), else a loop of one _scaled_mm per K block, scaled and summed in fp32 (split accumulation), named at
start-up; on the CPU that loop is one custom operator. Scales come in cuBLASLt's layouts."""

from __future__ import annotations

import torch

from parallel.fp8 import kernel
from parallel.fp8.block_scaling import BLOCK, expand_2d_scales
from parallel.fp8.kernel import ALIGNMENT, E5M2, FP8_DTYPES, Fp8OperandError, scaled_matmul

PADDED_K_BLOCKS = 4  # cuBLASLt pads a 128x128 scale's K blocks to a multiple of 4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_k_blocks(k_blocks: int) -> int:
    return ceil_div(k_blocks, PADDED_K_BLOCKS) * PADDED_K_BLOCKS


def outer_major(scale: torch.Tensor) -> torch.Tensor:
    """A [rows, K blocks] scale in cuBLASLt's 1 x block layout: strides (1, rows)."""
    return scale.t().contiguous().t()


def square_block_scale(scale: torch.Tensor) -> torch.Tensor:
    """The 128 x 128 scale of b = W^T from W's [row blocks, col blocks] scale: [round_up(K blocks, 4), N blocks],
    strides (1, round_up(K blocks, 4)), zero-padded."""
    k_blocks = scale.size(1)
    # contiguous: a pad of nothing may keep a transposed input's layout
    return torch.nn.functional.pad(scale, (0, padded_k_blocks(k_blocks) - k_blocks)).contiguous().t()


def _size_stride(scale: torch.Tensor, dim: int, size: int, stride: int) -> bool:
    """torch's check_size_stride: a dimension of one element has no meaningful stride."""
    return scale.size(dim) == size and (size <= 1 or scale.stride(dim) == stride)


def check_block_operands(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                         block: int, b_square: bool) -> None:
    """Raise Fp8OperandError naming the first of CUDA's rules the operands break; `b_square`: b's scale per 128 x
    128."""
    if a.dim() != 2 or b.dim() != 2 or a.size(1) != b.size(0):
        raise Fp8OperandError(f"block GEMM needs (m x k) @ (k x n), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES or (a.dtype == E5M2 and b.dtype == E5M2):
        raise Fp8OperandError(f"block GEMM needs float8 operands, not both e5m2: got {a.dtype} and {b.dtype}")
    if not (a.stride(1) == 1 and a.stride(0) == a.size(1)) or not (b.stride(0) == 1 and b.stride(1) == b.size(0)):
        raise Fp8OperandError(f"block GEMM needs A row-major and B column-major, got strides {a.stride()} and "
                              f"{b.stride()}")
    m, k = a.shape
    n = b.size(1)
    if m % ALIGNMENT or k % ALIGNMENT or n % ALIGNMENT:
        raise Fp8OperandError(f"block GEMM on CUDA: M={m}, K={k}, N={n} must be multiples of {ALIGNMENT}")
    k_blocks = ceil_div(k, block)
    if a_scale.dtype != torch.float32 or not (_size_stride(a_scale, 0, m, 1) and _size_stride(a_scale, 1, k_blocks, m)):
        raise Fp8OperandError(f"scale_a must be fp32 [{m}, {k_blocks}] with strides (1, {m}), got {a_scale.dtype} "
                              f"{tuple(a_scale.shape)} strides {a_scale.stride()}")
    if b_square:
        rows = padded_k_blocks(k_blocks)
        want = (rows, ceil_div(n, block)), rows
    else:
        want = (n, k_blocks), n
    (size0, size1), stride1 = want
    if b_scale.dtype != torch.float32 or not (_size_stride(b_scale, 0, size0, 1)
                                              and _size_stride(b_scale, 1, size1, stride1)):
        raise Fp8OperandError(f"scale_b must be fp32 [{size0}, {size1}] with strides (1, {stride1}), got "
                              f"{b_scale.dtype} {tuple(b_scale.shape)} strides {b_scale.stride()}")


def _runs_natively(a: torch.Tensor, b: torch.Tensor, block: int, b_square: bool) -> bool:
    if block != BLOCK or kernel.native_block_gemm_missing(a.device) is not None:
        return False
    # torch's native block GEMM takes e4m3 only (an H200 refused hybrid's e5m2): the loop runs those
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return False
    return a.size(1) % BLOCK == 0 and (not b_square or b.size(1) % BLOCK == 0)


def _rows_scale(b_scale: torch.Tensor, k_blocks: int, n: int, block: int, b_square: bool) -> torch.Tensor:
    """b's scale per (column of b, K block): [N, K blocks]."""
    if not b_square:
        return b_scale
    return expand_2d_scales(b_scale[:k_blocks].t(), n, block)


def per_block_loop(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, block: int,
                   b_square: bool, out_dtype: torch.dtype, gemm=scaled_matmul) -> torch.Tensor:
    """The K-block loop; `gemm` runs one block's unit-scaled _scaled_mm."""
    k = a.size(1)
    k_blocks = ceil_div(k, block)
    rows_scale = _rows_scale(b_scale, k_blocks, b.size(1), block, b_square)
    b_t = b.t()
    unit = torch.ones((), dtype=torch.float32, device=a.device)
    out = None
    for index, start in enumerate(range(0, k, block)):
        stop = min(start + block, k)
        partial = gemm(a[:, start:stop].contiguous(), b_t[:, start:stop].contiguous().t(), unit, unit, torch.float32)
        partial = partial * (a_scale[:, index:index + 1] * rows_scale[:, index].unsqueeze(0))
        out = partial if out is None else out + partial
    return out.to(out_dtype)


def block_scaled_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, block: int,
                        b_square: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """(a scaled per 1 x block) @ (b scaled per 1 x block or, `b_square`, per 128 x 128) in out_dtype."""
    check_block_operands(a, a_scale, b, b_scale, block, b_square)
    if a.device.type == "cpu":
        return cpu_emulated_block_scaled_mm(a, a_scale, b, b_scale, block, b_square, out_dtype)
    if _runs_natively(a, b, block, b_square):
        from torch.nn.functional import ScalingType, scaled_mm

        return scaled_mm(a, b, a_scale, ScalingType.BlockWise1x128, b_scale,
                         ScalingType.BlockWise128x128 if b_square else ScalingType.BlockWise1x128,
                         output_dtype=out_dtype)
    return per_block_loop(a, a_scale, b, b_scale, block, b_square, out_dtype)


def _cpu_block(a, b, scale_a, scale_b, out_dtype):
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


@torch.library.custom_op("fp8_kernel::cpu_emulated_block_scaled_mm", mutates_args=(), device_types="cpu")
def cpu_emulated_block_scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                                 block: int, b_square: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """The K-block loop on the CPU through the emulated _scaled_mm, as one operator, eager or compiled."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        return per_block_loop(a, a_scale, b, b_scale, block, b_square, out_dtype, gemm=_cpu_block)
    finally:
        torch.backends.mkldnn.enabled = previous


@cpu_emulated_block_scaled_mm.register_fake
def _cpu_emulated_block_scaled_mm_shape(a, a_scale, b, b_scale, block, b_square, out_dtype):
    return a.new_empty((a.size(0), b.size(1)), dtype=out_dtype)
