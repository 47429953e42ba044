"""The one kernel path: every FP8 GEMM of the FP8 linear goes through `scaled_matmul`, a single call of
torch._scaled_mm, and CUDA's operand rules are checked here on every device, so what the CPU ran and a
test checked is exactly what an H100 runs.

CUDA's rules (torch's `_scaled_mm_out_cuda`, aten/src/ATen/native/cuda/Blas.cpp, and cuBLASLt's FP8 requirements;
the CPU kernel accepts more): A row-major and B column-major ("TN", cuBLASLt's only FP8 layout); every dimension a
multiple of 16 (the older, stricter rule, so no torch version refuses what passed here); both operands float8,
never both e5m2; tensorwise scales as fp32 singletons (row-wise scaling returns bf16 only on sm90, and the block
recipes accumulate fp32 partials per K block, block_scaling.py).

On the CPU torch has two _scaled_mm implementations (aten/src/ATen/native/Blas.cpp): oneDNN's, for two operands of
one float8 dtype on a CPU with AMX-int8, and the emulated one (each operand upcast to fp32 times its scale, an fp32
matmul, one cast to out_dtype), for mixed dtypes or with oneDNN off. oneDNN's FP8 GEMM is a reference loop on this
machine: 1.9 s for one 512x128x384 e4m3 GEMM against 1.0 ms emulated (1 thread, measured; a 4-layer GPT of hidden
128 took 30 s an iteration). So every CPU call runs the emulated implementation (oneDNN off for the call alone):
exact float8 products summed in fp32, one implementation for every dtype pair. It differs from oneDNN's by the
fp32 rounding of the sums (CUDA applies the scales to the fp32 sum): 5.7e-6 absolute on outputs of magnitude ~1e2."""

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
    """Why an (m x k) @ (k x n) FP8 GEMM breaks CUDA's size rule, or None when it keeps it."""
    odd = [f"{name}={size}" for name, size in (("M", m), ("K", k), ("N", n)) if size % ALIGNMENT]
    return f"{', '.join(odd)} not a multiple of {ALIGNMENT}" if odd else None


def check_operands(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype) -> None:
    """Raise Fp8OperandError naming the first of CUDA's rules (module docstring) the operands break."""
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
    """(a * scale_a) @ (b * scale_b) in out_dtype: a row-major (m x k), b column-major (k x n), float8; the
    scales are the dequantizing ones (TransformerEngine's scale_inv, 1 / the quantizing scale)."""
    check_operands(a, b, scale_a, scale_b, out_dtype)
    if a.device.type != "cpu":
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    return cpu_emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)


@torch.library.custom_op("fp8_kernel::cpu_emulated_scaled_mm", mutates_args=(), device_types="cpu")
def cpu_emulated_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                           out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm on the CPU through torch's emulated implementation (the module's docstring says why):
    oneDNN is off for this call only, then restored as it was. A custom operator, so that torch.compile keeps
    it as one opaque call in the compiled graph (dynamo cannot trace the switch, and a compiled _scaled_mm would
    take whichever implementation the switch says when it runs): the same kernel, eager or compiled."""
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
    """Why this device runs the blockwise GEMM as the per-K-block loop, or None where torch's native 1x128 /
    128x128 GEMM runs (Hopper, sm90, with cuBLASLt 12.9+: torch's _check_deepseek_support)."""
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
    """How a recipe's GEMMs run on a device, for the start-up line (block_gemm.py runs the block recipes')."""
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
