"""Where a tensor lives: a `ShardingRecord` per parameter (Megatron-Core's ShardedTensor: whole shape, offset, split and
replicated dimensions) and the one rule over them: a rank writes a slice when it is coordinate 0 on every dimension the
slice is replicated over, so each element is saved once and any layout loads at any other."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import nn

from base.errors import ConfigError

TENSOR_PARALLEL, EXPERT_TENSOR_PARALLEL = "tp", "etp"
DENSE_DATA = ("dp", "cp")
EXPERT_DATA = ("edp",)


@dataclass(frozen=True)
class ShardingRecord:
    """This rank's slice of a whole tensor."""
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    split_dim: Optional[int] = None
    split_over: Optional[str] = None
    replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)
    # real vocabulary rows; the rest this run's padding, not carried by a load
    real_rows: Optional[int] = None

    @property
    def region(self) -> tuple[slice, ...]:
        return tuple(slice(offset, offset + size) for offset, size in zip(self.global_offset, self.local_shape))

    @property
    def is_split(self) -> bool:
        return self.split_dim is not None

    @property
    def is_expert(self) -> bool:
        return EXPERT_DATA[0] in self.replicated_over


def whole_record(shape: torch.Size | tuple[int, ...], real_rows: Optional[int] = None,
                 replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)) -> ShardingRecord:
    shape = tuple(shape)
    return ShardingRecord(shape, (0,) * len(shape), shape, replicated_over=replicated_over, real_rows=real_rows)


def split_record(local_shape: torch.Size | tuple[int, ...], dim: int, parts: int, index: int, over: str,
                 real_rows: Optional[int] = None, data: tuple[str, ...] = DENSE_DATA) -> ShardingRecord:
    """Slice `index` of `parts` along `dim`, cut over `over` and replicated over `data`. With one part it is still
    recorded as cut, so ZeRO's layout order does not depend on the TP size."""
    local_shape = tuple(local_shape)
    whole = list(local_shape)
    whole[dim] *= parts
    offset = [0] * len(local_shape)
    offset[dim] = index * local_shape[dim]
    return ShardingRecord(tuple(whole), tuple(offset), local_shape, dim, over, data, real_rows)


def also_replicated_over(param: torch.Tensor, *dims: str) -> torch.Tensor:
    """`param`'s record with more dimensions holding the same slice (a tied copy)."""
    record = record_of(param)
    return set_record(param, replace(record, replicated_over=record.replicated_over + dims))


def record_whole(param: torch.Tensor, replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)
                 ) -> torch.Tensor:
    return set_record(param, whole_record(param.shape, replicated_over=replicated_over))


def check_recorded(model: nn.Module) -> None:
    """Refuse a parameter that no layer gave a record, naming it and its module class."""
    for prefix, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if getattr(param, "sharding", None) is None:
                made_by = f"{type(module).__module__}.{type(module).__qualname__}"
                raise ConfigError(f"the model's parameter {prefix + '.' if prefix else ''}{name} (made by {made_by}) "
                                  f"has no sharding record: the layer that makes it must say how it is split, or "
                                  f"that it is whole (parallel/sharding.py)")


def record_of(param: torch.Tensor) -> ShardingRecord:
    """The record a layer gave `param`; a module made elsewhere reads as whole."""
    record = getattr(param, "sharding", None)
    return record if record is not None else whole_record(param.shape)


def set_record(param: torch.Tensor, record: ShardingRecord) -> torch.Tensor:
    if tuple(param.shape) != record.local_shape:
        raise ValueError(f"a sharding record of local shape {list(record.local_shape)} given to a parameter of "
                         f"shape {list(param.shape)}")
    param.sharding = record
    return param
