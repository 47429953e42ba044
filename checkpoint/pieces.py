"""A saved tensor's elements spread over files: the pieces each file holds, and a region of the whole tensor read from
them, a contiguous stretch at a time. This project's optimizer partitions (checkpoint/ours/source.py) and Megatron-Core's
dp_reshardable buckets (checkpoint/torch_dist/source.py) both hold flat stretches of parameters flattened at a saving
rank's local shape; an element no piece holds is an incomplete checkpoint, named in one line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from base.errors import CheckpointError
from checkpoint.regions import Box, box_numel, box_runs, flat_range_boxes, intersect, relative, shift


@dataclass(frozen=True)
class Piece:
    """Elements [param_offset, param_offset + numel) of a saved slice (local shape, at a global offset) of one
    parameter, at `partition_offset` of `file`'s flat tensors."""
    file: str
    param_offset: int
    partition_offset: int
    numel: int
    local_shape: tuple[int, ...]
    global_offset: tuple[int, ...]

    def boxes(self) -> list[Box]:
        """The piece as boxes of the whole tensor."""
        return [shift(box, self.global_offset)
                for box in flat_range_boxes(self.local_shape, self.param_offset, self.param_offset + self.numel)]


def read_pieces(pieces: list[Piece], name: str, region: tuple[slice, ...], dtype: torch.dtype, fetch,
                where: Path) -> torch.Tensor:
    """`region` of tensor `name` from the flat `pieces` holding it, each overlapping stretch read with
    `fetch(file, begin, end)` (flat positions in that file's tensor); an element no piece holds is an incomplete
    checkpoint, named in one line (before allocating, where the pieces together hold fewer elements: a parameter
    table whose shape was edited would otherwise ask for more memory than exists)."""
    refuse_short(pieces, name, region, where)
    out = torch.empty([part.stop - part.start for part in region], dtype=dtype)
    filled = 0
    for piece in pieces:
        for box in piece.boxes():
            overlap = intersect(box, region)
            if overlap is None:
                continue
            values = torch.empty(box_numel(overlap), dtype=dtype)
            local = shift(overlap, [-o for o in piece.global_offset])
            for start, at, length in box_runs(piece.local_shape, local):
                begin = piece.partition_offset + start - piece.param_offset
                values[at:at + length] = fetch(piece.file, begin, begin + length)
            out[relative(overlap, region)] = values.view([p.stop - p.start for p in overlap])
            filled += values.numel()
    if filled != out.numel():
        _incomplete(where, name, filled, out.numel(), region)
    return out


def refuse_short(pieces: list[Piece], name: str, region: tuple[slice, ...], where: Path) -> None:
    """Refuse `region` of `name` when its pieces together hold fewer elements, before anything is allocated."""
    available = sum(piece.numel for piece in pieces)
    if box_numel(region) > available:
        _incomplete(where, name, available, box_numel(region), region)


def _incomplete(where: Path, name: str, found: int, needed: int, region: tuple[slice, ...]) -> None:
    shown = ", ".join(f"{p.start}:{p.stop}" for p in region)
    raise CheckpointError(f"{where}: found {found} of the {needed} elements of {name}[{shown}] asked for; "
                          f"the checkpoint is incomplete")
