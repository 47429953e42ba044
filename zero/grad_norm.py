"""A rank's part of the global gradient norm: the sum of the squares of its gradient pieces, accumulated in fp64 so that
any cut of the partition gives the same norm to about 1e-12 (fp32 sums differed by 1e-4 between layouts). On a CPU the
pieces go in blocks of NORM_BLOCK elements to bound torch's fp64 copy."""

from __future__ import annotations

from typing import Sequence

import torch

NORM_BLOCK = 1 << 18  # bounds the fp64 copy to 2 MiB


def sum_of_squares(pieces: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of squares of every element of `pieces`, as an fp64 scalar on `device`."""
    blocks = [block for piece in pieces for block in _blocks(piece)]
    if not blocks:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(torch._foreach_norm(blocks, dtype=torch.float64)).square().sum()


def _blocks(piece: torch.Tensor) -> Sequence[torch.Tensor]:
    return piece.split(NORM_BLOCK) if piece.device.type == "cpu" else (piece,)


def block_copy_bytes(largest_piece: int) -> int:
    """Most `sum_of_squares` allocates at once on a CPU (one block's fp64 copy)."""
    return min(NORM_BLOCK, largest_piece) * torch.float64.itemsize
