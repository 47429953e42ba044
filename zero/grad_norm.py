"""A rank's part of the global gradient norm: the sum of the squares of its gradient pieces, in fp64.

The sharded optimizer (zero/optimizer.py) sums the squares of the pieces of the gradient partition this rank
counts, then all-reduces that partial sum over TP, the partition group and the pipeline stages (zero/experts.py
adds the experts' over the expert-parallel group). How the partition is cut decides which elements each rank
sums, so a sum whose error grows with the number of terms makes the logged norm, and the clipping that follows
it, depend on the layout: fp32 `torch._foreach_norm` on a CPU accumulates each tensor in a few running sums, and
is 8.8e-5 (relative) off the exact value for one 4.2M-element tensor and 3.2e-5 for its two halves; one rank and
ZeRO 1 at DP 2 logged norms 1.7e-4 apart, the one rank's the less accurate (issue 77).

Here every square is accumulated in fp64: an fp32 square is exact in fp64 (48 significant bits), and the
running sum's relative error stays below (terms x 2^-53), 3e-11 for a 2^18-element block, so any two cuts of
the same gradient give sums equal to about 1e-12, far below the fp32 rounding of the gradient itself.

Cost. On CUDA `torch._foreach_norm(..., dtype=torch.float64)` reads the fp32 gradient once and accumulates in
fp64 inside its kernel (ForeachReduceOp.cu: its accumulator is the output dtype's opmath type), the same
memory traffic as the fp32 norm, the fp64 adds hidden behind it on a bandwidth-bound pass. On a CPU torch
converts each tensor to fp64 first: the pieces go in blocks of NORM_BLOCK elements, so that copy is one
block (2 MiB) at a time; `block_copy_bytes` is what the planner counts for it among the step's temporaries of a
CPU run. Only a CPU's pieces are cut: elsewhere (CUDA, and the planner's meta tensors, whose sizes may be
anything a user typed) a list of blocks would be Python objects in proportion to the model for no gain.
"""

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
