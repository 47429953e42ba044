"""A rank's part of the global gradient norm: the sum of the squares of its gradient pieces, in fp64.

The sharded optimizer (zero/optimizer.py) sums the squares of the pieces of the partition this rank counts, then
all-reduces that over TP, the partition group and the stages (zero/experts.py adds the experts' over EP). How the
partition is cut decides which elements each rank sums, so a sum whose error grows with its terms makes the logged
norm, and the clipping, depend on the layout: fp32 `torch._foreach_norm` on a CPU is 8.8e-5 (relative) off for one
4.2M-element tensor and 3.2e-5 for its two halves; one rank and ZeRO 1 at DP 2 logged norms 1.7e-4 apart (issue 77).

Here every square is accumulated in fp64: an fp32 square is exact in fp64, and the running sum's relative error
stays below terms x 2^-53 (3e-11 for a 2^18-element block), so any two cuts give sums equal to about 1e-12.

Cost. On CUDA `torch._foreach_norm(..., dtype=torch.float64)` reads the fp32 gradient once and accumulates in fp64
inside its kernel (ForeachReduceOp.cu), the same memory traffic as the fp32 norm. On a CPU torch converts each tensor
to fp64 first, so the pieces go in blocks of NORM_BLOCK elements (2 MiB copied at a time; `block_copy_bytes` is what
the planner counts among a CPU step's temporaries). Only a CPU's pieces are cut: elsewhere (CUDA, the planner's meta
tensors) a list of blocks would be Python objects in proportion to the model for no gain."""

from __future__ import annotations

from typing import Sequence

import torch

NORM_BLOCK = 1 << 18  # elements per fp64 conversion on a CPU: bounds the copy to 2 MiB


def sum_of_squares(pieces: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of the squares of every element of `pieces` (one-dimensional), as an fp64 scalar on `device`."""
    blocks = [block for piece in pieces for block in _blocks(piece)]
    if not blocks:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(torch._foreach_norm(blocks, dtype=torch.float64)).square().sum()


def _blocks(piece: torch.Tensor) -> Sequence[torch.Tensor]:
    return piece.split(NORM_BLOCK) if piece.device.type == "cpu" else (piece,)


def block_copy_bytes(largest_piece: int) -> int:
    """The most `sum_of_squares` allocates at once on a CPU over pieces of at most `largest_piece` elements: the
    fp64 copy of one block (torch's CUDA kernel makes none)."""
    return min(NORM_BLOCK, largest_piece) * torch.float64.itemsize
