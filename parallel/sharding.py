"""Where a tensor lives: one record per parameter, written where its layout is decided, and the one rule over them.

A `ShardingRecord` says what part of which whole tensor a rank's parameter is: the whole shape, the global offset
of this rank's slice, the grid dimension it is cut over (TP, or the experts' own TP), the grid dimensions whose
ranks hold identical copies, and how many rows of the whole are real beside vocabulary padding. It is
Megatron-Core's `ShardedTensor` (dist_checkpointing/mapping.py: global shape, global offset, replica id) and
torchtitan's placements, kept on the parameter (`param.sharding`) through ZeRO's materialization. The dimensions are
the mesh's ("pp", "dp", "cp", "tp", parallel/mesh.py) and the experts' ("edp", "etp", "ep"): a dense parameter is
replicated over "dp" and "cp", and "tp" when whole; an expert over "edp" (and "etp" when whole), which also tells
ZeRO to build its state over the expert DP group (zero/experts.py); the last stage's tied embedding copy over "pp".

The rule, Megatron-Core's replica id: **a rank writes a slice when it is the first replica of it, coordinate 0 on
every dimension the slice is replicated over.** So a TP-split weight is written by each TP rank of the first DP
rank, a whole norm by TP rank 0, an expert by the first rank of its expert DP group, the tied embedding by the
first stage: each element once (checkpoint/save_plan.py). A load asks each record's region of the whole tensor
(checkpoint/global_state.py), so any layout loads at any other and no rank reads the whole model. The rule is told
here; the checkpoint modules point here. Every layer records its parameters where it makes them, whole ones too
(`whole_record`); a parameter without one is refused when the model is built (`check_recorded`), as torchtitan's
resolve_placements raises. Readers of `record_of(param)`: the initializer, ZeRO's layout, the save plan and loader,
the HF import, gpt/shape.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import nn

from base.errors import ConfigError

TENSOR_PARALLEL, EXPERT_TENSOR_PARALLEL = "tp", "etp"  # the grid dimensions a slice may be cut over
DENSE_DATA = ("dp", "cp")  # the ranks holding a dense parameter's same slice (besides TP when whole)
EXPERT_DATA = ("edp",)     # the ranks holding an expert's same slice: its expert data-parallel group


@dataclass(frozen=True)
class ShardingRecord:
    """This rank's slice of a whole tensor (module docstring)."""
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]       # where the slice starts in the whole tensor, per dimension
    local_shape: tuple[int, ...]         # the slice's shape: the parameter's
    split_dim: Optional[int] = None      # the dimension cut over `split_over`; None: the tensor is whole here
    split_over: Optional[str] = None     # TENSOR_PARALLEL or EXPERT_TENSOR_PARALLEL
    replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)  # grid dimensions holding the same slice
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

    @property
    def is_expert(self) -> bool:
        """Held by an expert data-parallel group (ZeRO builds its state there: zero/experts.py)."""
        return EXPERT_DATA[0] in self.replicated_over


def whole_record(shape: torch.Size | tuple[int, ...], real_rows: Optional[int] = None,
                 replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)) -> ShardingRecord:
    """A tensor held whole by every rank that holds it at all (a dense one: every rank of its stage)."""
    shape = tuple(shape)
    return ShardingRecord(shape, (0,) * len(shape), shape, replicated_over=replicated_over, real_rows=real_rows)


def split_record(local_shape: torch.Size | tuple[int, ...], dim: int, parts: int, index: int, over: str,
                 real_rows: Optional[int] = None, data: tuple[str, ...] = DENSE_DATA) -> ShardingRecord:
    """Slice `index` of `parts` equal slices along `dim`, `over` the grid dimension whose ranks hold them, each
    slice replicated over `data`. With one part the slice is the whole tensor, still recorded as cut along `dim`
    (a TP layer at TP 1): ZeRO's layout orders parameters by whether they are cut (zero/flat_buffer.py), and
    that order must not depend on the TP size."""
    local_shape = tuple(local_shape)
    whole = list(local_shape)
    whole[dim] *= parts
    offset = [0] * len(local_shape)
    offset[dim] = index * local_shape[dim]
    return ShardingRecord(tuple(whole), tuple(offset), local_shape, dim, over, data, real_rows)


def also_replicated_over(param: torch.Tensor, *dims: str) -> torch.Tensor:
    """`param`'s record with more grid dimensions holding the same slice (a tied copy on another stage)."""
    record = record_of(param)
    return set_record(param, replace(record, replicated_over=record.replicated_over + dims))


def record_whole(param: torch.Tensor, replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)
                 ) -> torch.Tensor:
    """`param` recorded as held whole (a norm's gain, a router), replicated over `replicated_over`."""
    return set_record(param, whole_record(param.shape, replicated_over=replicated_over))


def check_recorded(model: nn.Module) -> None:
    """Refuse a parameter of `model` that no layer gave a record, naming it and the module class that holds it."""
    for prefix, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if getattr(param, "sharding", None) is None:
                made_by = f"{type(module).__module__}.{type(module).__qualname__}"
                raise ConfigError(f"the model's parameter {prefix + '.' if prefix else ''}{name} (made by {made_by}) "
                                  f"has no sharding record: the layer that makes it must say how it is split, or "
                                  f"that it is whole (parallel/sharding.py)")


def record_of(param: torch.Tensor) -> ShardingRecord:
    """The record a layer gave `param`. A built model has one on every parameter (check_recorded); a module
    made elsewhere (a test's toy model) is read as whole."""
    record = getattr(param, "sharding", None)
    return record if record is not None else whole_record(param.shape)


def set_record(param: torch.Tensor, record: ShardingRecord) -> torch.Tensor:
    if tuple(param.shape) != record.local_shape:
        raise ValueError(f"a sharding record of local shape {list(record.local_shape)} given to a parameter of "
                         f"shape {list(param.shape)}")
    param.sharding = record
    return param
