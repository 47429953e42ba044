"""The experts' grouped GEMMs in FP8, as TransformerEngine's GroupedLinear runs them under Megatron-Core's
TEGroupedMLP (megatron/core/transformer/moe/experts.py; transformer_engine/pytorch/module/grouped_linear.py):

- one FP8 GEMM per local expert over that expert's rows, each expert with its own quantizers (GroupedLinear
  keeps num_gemms x 3 FP8 tensors: an input, weight and grad-output scale per expert), so here one
  Fp8LinearState per expert and projection, every GEMM through fp8_linear and so through parallel/fp8/kernel.py;
- each expert's rows padded with zero rows to a multiple of the recipe's alignment before the GEMM and the
  padding dropped after it: TE's Fp8Padding / Fp8Unpadding (module/fp8_padding.py), which TEGroupedMLP applies
  whenever FP8 is on, with Megatron's align size (fp8_utils.py get_fp8_align_size: 32 for MXFP8, 16 otherwise).
  Zero rows change no amax and no block's scale, their outputs are dropped and their gradients are zero, so the
  padding changes nothing but the GEMMs' shapes.

One difference, in cost only: an expert that received no rows is padded to one alignment's worth of zero rows,
where TE skips its GEMM. TE still casts that expert's weight, and its empty input and output gradient record
an amax of 0 (no scale moves), which is what the zero rows give here; running the casts keeps every rank's
delayed-scaling amax reductions (one collective per cast, parallel/fp8/recipes.py) in step however the tokens
were routed.
"""

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
    """Fp8Padding's ceil to a multiple of `align`; an empty expert gets one multiple (module docstring)."""
    return max(align, (rows + align - 1) // align * align)


def fp8_grouped_linear(rows: torch.Tensor, sizes: Sequence[int], weights: Sequence[torch.Tensor],
                       biases: Sequence[Optional[torch.Tensor]], states: Sequence[Fp8LinearState],
                       align: int) -> torch.Tensor:
    """rows [N, in] grouped by expert (`sizes`, one per expert, summing to N) -> [N, out]: expert e's rows times
    weights[e]^T plus biases[e], each GEMM in FP8 with states[e], its rows padded to `align` (module docstring)."""
    outputs = []
    for chunk, size, weight, bias, state in zip(torch.split(rows, list(sizes)), sizes, weights, biases, states):
        padding = padded_rows(size, align) - size
        padded = F.pad(chunk, (0, 0, 0, padding)) if padding else chunk
        outputs.append(fp8_linear(padded, weight, bias, state)[:size])
    return torch.cat(outputs) if outputs else rows.new_empty(0, weights[0].size(0) if weights else rows.size(1))
