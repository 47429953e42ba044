"""The one kernel path: every FP8 GEMM goes through `scaled_matmul`, one torch._scaled_mm call, and CUDA's operand rules
(TN layout, multiples of 16, never two e5m2, fp32 singleton scales) are checked on every device. On the CPU it runs
torch's emulated implementation (oneDNN off for the call), since oneDNN's FP8 GEMM is a reference loop ~1000x slower."""

from __future__ import annotations

import functools
from typing import Optional

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
FP8_DTYPES = (E4M3, E5M2)
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ALIGNMENT = 16


class Fp8OperandError(ValueError):
    """An operand that CUDA's _scaled_mm would refuse (the message names the rule)."""


def _is_row_major(matrix: torch.Tensor) -> bool:
    return matrix.stride(1) == 1 and matrix.stride(0) == matrix.size(1)


def _is_column_major(matrix: torch.Tensor) -> bool:
    return matrix.stride(0) == 1 and matrix.stride(1) == matrix.size(0)


def shape_rule_broken(m: int, k: int, n: int) -> str | None:
    """Why an (m x k) @ (k x n) FP8 GEMM breaks CUDA's size rule, or None."""
    odd = [f"{name}={size}" for name, size in (("M", m), ("K", k), ("N", n)) if size % ALIGNMENT]
    return f"{', '.join(odd)} not a multiple of {ALIGNMENT}" if odd else None


def check_operands(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype) -> None:
    """Raise Fp8OperandError naming the first of CUDA's rules the operands break."""
    if a.dim() != 2 or b.dim() != 2 or a.size(1) != b.size(0):
        raise Fp8OperandError(f"_scaled_mm needs matrices (m x k) @ (k x n), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES:
        raise Fp8OperandError(f"_scaled_mm needs float8 operands, got {a.dtype} and {b.dtype}")
    if a.dtype == E5M2 and b.dtype == E5M2:
        raise Fp8OperandError("_scaled_mm: multiplication of two float8_e5m2 matrices is not supported on CUDA")
    if not _is_row_major(a):
        raise Fp8OperandError(f"_scaled_mm needs A row-major, got strides {a.stride()} for shape {tuple(a.shape)}")
    if not _is_column_major(b):
        raise Fp8OperandError(f"_scaled_mm needs B column-major, got strides {b.stride()} for shape {tuple(b.shape)}")
    broken = shape_rule_broken(a.size(0), a.size(1), b.size(1))
    if broken:
        raise Fp8OperandError(f"_scaled_mm on CUDA: {broken}")
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if scale.dtype != torch.float32 or scale.numel() != 1:
            raise Fp8OperandError(f"_scaled_mm {name} must be an fp32 singleton, got {scale.dtype} "
                                  f"{tuple(scale.shape)}")
    if out_dtype not in OUT_DTYPES:
        raise Fp8OperandError(f"_scaled_mm out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """(a * scale_a) @ (b * scale_b) in out_dtype: a row-major, b column-major, float8; dequantizing scales."""
    check_operands(a, b, scale_a, scale_b, out_dtype)
    if a.device.type != "cpu":
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    return cpu_emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)


@torch.library.custom_op("fp8_kernel::cpu_emulated_scaled_mm", mutates_args=(), device_types="cpu")
def cpu_emulated_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                           out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm on the CPU through the emulated implementation, oneDNN off for this call only. A custom operator
    so torch.compile keeps it opaque: the same kernel, eager or compiled."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    finally:
        torch.backends.mkldnn.enabled = previous


@cpu_emulated_scaled_mm.register_fake
def _cpu_emulated_scaled_mm_shape(a, b, scale_a, scale_b, out_dtype):
    return a.new_empty((a.size(0), b.size(1)), dtype=out_dtype)


@functools.lru_cache(maxsize=None)
def native_block_gemm_missing(device: torch.device) -> Optional[str]:
    """Why this device runs the blockwise GEMM as the per-K-block loop, or None where torch's native one runs (Hopper
    with cuBLASLt 12.9+)."""
    if device.type != "cuda":
        return f"no native block-scaled GEMM on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"torch's 1x128/128x128 scaled_mm runs on sm90 only; this device is sm{major}{minor}"
    version = tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])
    if version < (12, 9):
        return f"torch's 1x128/128x128 scaled_mm needs cuBLASLt 12.9+; this torch is built with CUDA {torch.version.cuda}"
    return None


def kernel_name(device: torch.device, recipe: str) -> str:
    """How a recipe's GEMMs run on a device, for the start-up line."""
    gemm = "CUDA _scaled_mm" if device.type == "cuda" else "CPU _scaled_mm (torch's fp32 emulation)"
    if recipe in ("delayed", "tensorwise"):
        return gemm
    block = 128 if recipe == "blockwise" else 32
    loop = f"one {gemm} per {block}-wide K block, block scales applied in fp32"
    if device.type != "cuda":
        return (f"emulated: {loop}, the loop inside one operator per GEMM (fp8_kernel::cpu_emulated_block_scaled_mm: "
                f"one call where a GPU launches one block-scaled GEMM)")
    missing = native_block_gemm_missing(device) if recipe == "blockwise" else \
        "MXFP8's native GEMM is Blackwell's, with swizzled E8M0 scales: not built"
    if missing is None:
        return ("CUDA scaled_mm with native 1x128 / 128x128 block scaling, one GEMM each, where both operands are "
                f"e4m3 (hybrid's e5m2 gradients: not) and K and a 128x128 operand's N are multiples of 128; else {loop}")
    return f"emulated: {loop} ({missing})"
