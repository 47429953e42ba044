"""Where every parameter element lives: a flat buffer cut into units, each unit split evenly over the
data-parallel ranks.

A *unit* is the granule of communication: a reduce bucket in stages 0-2, a transformer block's chunk
in stage 3. Its length is padded to a multiple of `parts x alignment`, so it splits into `parts`
equal, aligned shards and one collective per unit moves it (reduce-scatter gives rank r its shard r,
all-gather rebuilds the unit from the shards). Rank r owns shard r of *every* unit, and its
*partition* is those shards laid end to end: the fp32 master weights, Adam moments and (stages 2-3)
reduced gradients are flat tensors in partition coordinates. With `parts = 1` (stage 0) the shard is
the whole unit and the partition is the whole buffer.

Inside a unit the parameters are sorted by `ParamKind` (weight decay or not; TP-sharded or
TP-replicated), so a shard holds at most four runs of one kind. Those runs (`Segment`s) are what
the optimizer sees: one AdamW parameter group per decay setting, and a gradient norm that counts a
TP-replicated element once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from parallel.sharding import record_of

# Shard boundaries fall on multiples of this many elements (128 bytes of bf16), which keeps every
# collective's buffer aligned for vectorised copies and NCCL.
DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True, order=True)
class ParamKind:
    weight_decay: bool      # False for biases and LayerNorm parameters (fewer than 2 dims), unless marked
    tensor_parallel: bool   # True when TP ranks hold different slices (its sharding record is split)

    @classmethod
    def of(cls, param: nn.Parameter) -> "ParamKind":
        """Megatron's rule, weight decay for parameters of 2 dims or more, unless the parameter carries
        `apply_weight_decay` (mark_weight_decay: --apply-wd-to-qk-layernorm's norms)."""
        return cls(weight_decay=getattr(param, "apply_weight_decay", param.dim() >= 2),
                   tensor_parallel=record_of(param).is_split)


def mark_weight_decay(params, decayed: bool = True) -> None:
    """Give `params` weight decay (or none) whatever their dims. Set on the model's parameters before ZeRO
    lays them out: the attribute travels to the parameters that replace them (parallel.init.replace_parameters
    keeps attributes), so the layout over those has the same kinds."""
    for param in params:
        param.apply_weight_decay = decayed


@dataclass(frozen=True)
class Slot:
    """One parameter's place: `start` is its offset inside its unit."""
    param: nn.Parameter
    start: int
    numel: int
    shape: torch.Size

    @property
    def end(self) -> int:
        return self.start + self.numel


@dataclass(frozen=True)
class Segment:
    """A run of one kind inside this rank's partition, [start, end) in partition coordinates."""
    start: int
    end: int
    kind: ParamKind


@dataclass(frozen=True)
class Fragment:
    """Elements [param_offset, param_offset + numel) of a flattened parameter, stored at
    [partition_offset, partition_offset + numel) of a rank's partition. A partition is described
    completely by its fragments, which is what lets a checkpoint be re-cut for another DP size."""
    slot: Slot
    param_offset: int
    partition_offset: int
    numel: int


class Unit:
    """A contiguous piece of the flat buffer, padded to split evenly into `parts` aligned shards."""

    def __init__(self, index: int, params: Sequence[nn.Parameter], parts: int, alignment: int,
                 buffer_offset: int, partition_offset: int) -> None:
        self.index = index
        ordered = sorted(params, key=ParamKind.of)  # stable: forward order within a kind
        self.slots: list[Slot] = []
        cursor = 0
        for param in ordered:
            self.slots.append(Slot(param, cursor, param.numel(), param.shape))
            cursor += param.numel()
        self.used = cursor
        quantum = parts * alignment
        self.numel = max(quantum, -(-cursor // quantum) * quantum)
        self.shard_numel = self.numel // parts
        self.buffer_offset = buffer_offset        # where the unit starts in the full flat buffer
        self.partition_offset = partition_offset  # where its shard starts in a rank's partition

    @property
    def padding(self) -> int:
        return self.numel - self.used

    def in_buffer(self, flat: torch.Tensor) -> torch.Tensor:
        """This unit's piece of a full flat buffer."""
        return flat[self.buffer_offset:self.buffer_offset + self.numel]

    def in_partition(self, partition: torch.Tensor) -> torch.Tensor:
        """This unit's shard inside a rank's partition (master weights, moments, reduced gradients)."""
        return partition[self.partition_offset:self.partition_offset + self.shard_numel]

    def shard_bounds(self, part: int) -> tuple[int, int]:
        """Shard `part` as [start, end) inside the unit."""
        return part * self.shard_numel, (part + 1) * self.shard_numel

    def fragments(self, part: int) -> list["Fragment"]:
        """The pieces of parameters inside shard `part`, in partition coordinates (padding is in none)."""
        lo, hi = self.shard_bounds(part)
        offset = self.partition_offset - lo
        return [Fragment(slot, max(lo, slot.start) - slot.start, max(lo, slot.start) + offset,
                         min(hi, slot.end) - max(lo, slot.start))
                for slot in self.slots if slot.start < hi and slot.end > lo]

    def segments(self, part: int) -> list[Segment]:
        """The runs of one kind inside shard `part`, in partition coordinates (padding belongs to the
        run of the unit's last kind; its gradient is always zero)."""
        shard_start, shard_end = self.shard_bounds(part)
        runs: list[tuple[int, int, ParamKind]] = []
        for slot in self.slots:
            kind = ParamKind.of(slot.param)
            if runs and runs[-1][2] == kind:
                runs[-1] = (runs[-1][0], slot.end, kind)
            else:
                runs.append((slot.start, slot.end, kind))
        if runs:
            runs[-1] = (runs[-1][0], self.numel, runs[-1][2])
        segments = []
        for start, end, kind in runs:
            lo, hi = max(start, shard_start), min(end, shard_end)
            if lo < hi:
                offset = self.partition_offset - shard_start
                segments.append(Segment(lo + offset, hi + offset, kind))
        return segments


class FlatLayout:
    """The units of a model's trainable parameters and the partition of rank `part`."""

    def __init__(self, unit_params: Sequence[Sequence[nn.Parameter]], parts: int, part: int,
                 alignment: int = DEFAULT_ALIGNMENT) -> None:
        if not 0 <= part < parts:
            raise ValueError(f"part {part} is not in [0, {parts})")
        self.parts, self.part, self.alignment = parts, part, alignment
        self.units: list[Unit] = []
        buffer_offset = partition_offset = 0
        for params in unit_params:
            if not params:
                continue
            unit = Unit(len(self.units), params, parts, alignment, buffer_offset, partition_offset)
            self.units.append(unit)
            buffer_offset += unit.numel
            partition_offset += unit.shard_numel
        self.numel = buffer_offset
        self.partition_numel = partition_offset
        self.unit_of = {id(slot.param): unit for unit in self.units for slot in unit.slots}
        self.slot_of = {id(slot.param): slot for unit in self.units for slot in unit.slots}

    @property
    def num_parameters(self) -> int:
        """Parameter elements laid out, without padding (Psi of this TP shard)."""
        return sum(unit.used for unit in self.units)

    @property
    def padding(self) -> int:
        return self.numel - self.num_parameters

    def segments(self) -> list[Segment]:
        return [segment for unit in self.units for segment in unit.segments(self.part)]

    def fragments(self) -> list[Fragment]:
        return [fragment for unit in self.units for fragment in unit.fragments(self.part)]


def bucket_params(params: Sequence[nn.Parameter], bucket_size: int) -> list[list[nn.Parameter]]:
    """Group parameters (given in forward order) into buckets of at most `bucket_size` elements, in
    reverse order: backward produces the last layer's gradients first, so the first bucket fills
    first. A parameter larger than a bucket gets a bucket of its own."""
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    current_numel = 0
    for param in reversed(list(params)):
        if current and current_numel + param.numel() > bucket_size:
            buckets.append(current)
            current, current_numel = [], 0
        current.append(param)
        current_numel += param.numel()
    if current:
        buckets.append(current)
    return buckets


def unique_trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters in registration (forward) order, each once even when tied."""
    seen: set[int] = set()
    params = []
    for param in module.parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            params.append(param)
    return params


class BufferPool:
    """Flat scratch buffers of one size, allocated once and reused (ZeRO-R's constant-size buffers,
    C_B): reduce buckets and reduce-scatter outputs. A buffer is only ever created when every existing
    one is in use, which the bounded number of in-flight collectives keeps to a handful.

    They are created when first needed (the first reduction, late in the first iteration's backward), not at the
    build: `on_create`, where set, hears each new buffer's bytes (a dry run, planner/dry_run.py, reads there what
    the first iteration holds before and after they exist)."""

    on_create: Optional[Callable[[int], None]] = None

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.numel, self.dtype, self.device = numel, dtype, device
        self._free: list[torch.Tensor] = []
        self.buffers: list[torch.Tensor] = []

    @property
    def has_free(self) -> bool:
        return bool(self._free)

    def acquire(self) -> torch.Tensor:
        if not self._free:
            buffer = torch.empty(self.numel, dtype=self.dtype, device=self.device)
            self.buffers.append(buffer)
            if BufferPool.on_create is not None:
                BufferPool.on_create(buffer.numel() * buffer.element_size())
            return buffer
        return self._free.pop()

    def release(self, buffer: torch.Tensor) -> None:
        self._free.append(buffer)
