"""Where a tensor lives: one record per parameter, written where its layout is decided.

A `ShardingRecord` says what part of which whole tensor a rank's parameter is: the whole (global) shape, the
global offset of the slice this rank holds, the grid dimension the slice is cut over (TP for the dense layers,
the experts' own TP for expert tensor parallelism), and how many rows of the whole are real where the rest is
vocabulary padding. It is Megatron-Core's `ShardedTensor` (megatron/core/dist_checkpointing/mapping.py: global
shape, global offset) and torchtitan's per-module placements, kept on the parameter itself (`param.sharding`),
so it travels with the parameter through ZeRO's materialization (parallel/init.py replace_parameters keeps a
parameter's attributes).

The layers that split a tensor write its record (parallel/layers.py, the experts in gpt/moe/experts.py); a
parameter without one is whole on every rank that holds it (norms, a row-parallel layer's bias, the router).
Whoever asks "which elements of which tensor are here" reads `record_of(param)`: the checkpoint's loader at any
layout (checkpoint/global_load.py) and the save plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

TENSOR_PARALLEL, EXPERT_TENSOR_PARALLEL = "tp", "etp"  # the grid dimensions a slice may be cut over


@dataclass(frozen=True)
class ShardingRecord:
    """This rank's slice of a whole tensor (module docstring)."""
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]       # where the slice starts in the whole tensor, per dimension
    local_shape: tuple[int, ...]         # the slice's shape: the parameter's
    split_dim: Optional[int] = None      # the dimension cut over `split_over`; None: the tensor is whole here
    split_over: Optional[str] = None     # TENSOR_PARALLEL or EXPERT_TENSOR_PARALLEL
    # Rows of dimension 0 that are real (the vocabulary) where the rest are padding the run adds for its own TP
    # size (Megatron pads to --make-vocab-size-divisible-by x TP): a load carries over the real rows only.
    real_rows: Optional[int] = None

    @property
    def region(self) -> tuple[slice, ...]:
        """The slice this rank holds, in the whole tensor's coordinates."""
        return tuple(slice(offset, offset + size) for offset, size in zip(self.global_offset, self.local_shape))

    @property
    def is_split(self) -> bool:
        return self.split_dim is not None


def whole_record(shape: torch.Size | tuple[int, ...], real_rows: Optional[int] = None) -> ShardingRecord:
    """A tensor held whole (on every rank that holds it at all)."""
    shape = tuple(shape)
    return ShardingRecord(shape, (0,) * len(shape), shape, real_rows=real_rows)


def split_record(local_shape: torch.Size | tuple[int, ...], dim: int, parts: int, index: int, over: str,
                 real_rows: Optional[int] = None) -> ShardingRecord:
    """Slice `index` of `parts` equal slices along `dim` (`over`: the grid dimension whose ranks hold them); with
    one part, the whole tensor."""
    local_shape = tuple(local_shape)
    if parts == 1:
        return whole_record(local_shape, real_rows)
    whole = list(local_shape)
    whole[dim] *= parts
    offset = [0] * len(local_shape)
    offset[dim] = index * local_shape[dim]
    return ShardingRecord(tuple(whole), tuple(offset), local_shape, dim, over, real_rows)


def record_of(param: torch.Tensor) -> ShardingRecord:
    """The record a layer gave `param`; a parameter without one is whole."""
    record = getattr(param, "sharding", None)
    return record if record is not None else whole_record(param.shape)


def set_record(param: torch.Tensor, record: ShardingRecord) -> torch.Tensor:
    if tuple(param.shape) != record.local_shape:
        raise ValueError(f"a sharding record of local shape {list(record.local_shape)} given to a parameter of "
                         f"shape {list(param.shape)}")
    param.sharding = record
    return param
