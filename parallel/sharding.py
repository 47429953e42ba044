"""Where a tensor lives: one record per parameter, written where its layout is decided, and the one rule over them.

A `ShardingRecord` says what part of which whole tensor a rank's parameter is: the whole (global) shape, the
global offset of the slice this rank holds, the grid dimension the slice is cut over (TP for the dense layers,
the experts' own TP for expert tensor parallelism), the grid dimensions whose ranks hold identical copies of
the slice, and how many rows of the whole are real where the rest is vocabulary padding. It is Megatron-Core's
`ShardedTensor` (megatron/core/dist_checkpointing/mapping.py: global shape, global offset, replica id) and
torchtitan's per-module placements, kept on the parameter itself (`param.sharding`), so it travels with the
parameter through ZeRO's materialization (parallel/init.py replace_parameters keeps a parameter's attributes).

The grid dimensions are the mesh's (parallel/mesh.py: "pp", "dp", "cp", "tp") and the experts' own ("edp",
"etp", "ep"). A dense parameter is replicated over "dp" and "cp" (context-parallel ranks hold the same weights),
and over "tp" when it is whole; an expert held by its expert data-parallel group is replicated over "edp" (and
"etp" when whole); the last pipeline stage's copy of a tied word embedding over "pp" (the first stage's is the
one saved). The replicas of an expert are also what tells ZeRO to build its state over the expert data-parallel
group (zero/experts.py).

The rule, Megatron-Core's replica id (a ShardedTensor whose replica id is not 0 is not saved): **a rank writes a
slice when it is the first replica of it, coordinate 0 on every dimension the slice is replicated over.** So a
TP-split weight is written by each TP rank of the first data-parallel rank, a whole norm by TP rank 0 only, an
expert by the first rank of its expert data-parallel group (and of its expert TP group when whole), the tied word
embedding by the first stage; each element once (checkpoint/save_plan.py). A load asks each record's region of
the whole tensor (checkpoint/global_state.py), so a checkpoint saved at any layout loads at any other and no rank
reads the whole model. This docstring is where the rule is told; the checkpoint modules point here.

Every layer writes its parameters' records where it makes them, a whole tensor's too (norms, a row-parallel
layer's bias, the router: `whole_record`); the split ones in parallel/layers.py and the experts in
gpt/moe/experts.py, the stage's tied copy in gpt/model.py. A parameter without one is refused when the model is
built (`check_recorded`, at the end of GPTModel's construction), as torchtitan's resolve_placements raises: read
as whole, GPT-OSS's attention sinks once loaded whole into a TP half. Whoever asks "which elements of which tensor
are here, and who else holds them" reads `record_of(param)`: the initializer (parallel/init.py), ZeRO's layout
(zero/flat_buffer.py), the checkpoint's save plan and its loader at any layout (checkpoint/save_plan.py,
checkpoint/global_load.py), the HF import and the model's shape counts (gpt/shape.py).
"""

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
