"""A saved tensor's elements spread over files (our partitions, Megatron-Core's dp_reshardable buckets): the pieces each
file holds, and a region of the whole tensor read from them a contiguous stretch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from base.errors import CheckpointError
from checkpoint.regions import Box, box_numel, box_runs, flat_range_boxes, intersect, relative, shift


@dataclass(frozen=True)
class Piece:
    """Elements [param_offset, param_offset + numel) of a saved slice of one parameter, at `partition_offset` of `file`.
    """
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
    """`region` of tensor `name` from its flat `pieces`, each stretch read with `fetch(file, begin, end)`; an element no
    piece holds is named in one line, before allocating."""
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
