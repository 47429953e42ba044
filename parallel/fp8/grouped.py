"""The experts' grouped GEMMs in FP8, as TransformerEngine's GroupedLinear runs them under TEGroupedMLP: one FP8 GEMM
and one set of scales per expert, each expert's rows zero-padded to Megatron's FP8 alignment. An expert with no rows
still runs on one alignment of zero rows, so every rank's amax reductions stay in step."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.kernel import ALIGNMENT
from parallel.fp8.linear import Fp8LinearState, fp8_linear


def alignment(recipe: str) -> int:
    """Megatron's get_fp8_align_size: the multiple each expert's row count is padded to."""
    return blocks.MX_BLOCK if recipe == "mxfp8" else ALIGNMENT


def padded_rows(rows: int, align: int) -> int:
    """Fp8Padding's ceil to a multiple of `align`; an empty expert gets one multiple."""
    return max(align, (rows + align - 1) // align * align)


def fp8_grouped_linear(rows: torch.Tensor, sizes: Sequence[int], weights: Sequence[torch.Tensor],
                       biases: Sequence[Optional[torch.Tensor]], states: Sequence[Fp8LinearState],
                       align: int) -> torch.Tensor:
    """rows [N, in] grouped by expert (`sizes` summing to N) -> [N, out]: expert e's rows times weights[e]^T plus
    biases[e], each GEMM in FP8 with states[e]."""
    outputs = []
    for chunk, size, weight, bias, state in zip(torch.split(rows, list(sizes)), sizes, weights, biases, states):
        padding = padded_rows(size, align) - size
        padded = F.pad(chunk, (0, 0, 0, padding)) if padding else chunk
        outputs.append(fp8_linear(padded, weight, bias, state)[:size])
    return torch.cat(outputs) if outputs else rows.new_empty(0, weights[0].size(0) if weights else rows.size(1))
