"""Where every parameter element lives: a flat buffer cut into units (a reduce bucket, or a stage-3 block chunk), each
padded to split into equal aligned shards, one per DP rank. Rank r's partition is shard r of every unit end to end;
master, moments and reduced gradients are flat tensors in partition coordinates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from parallel.sharding import record_of

# Shard boundaries fall on multiples of this many elements, aligned for vector copies and NCCL.
DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True, order=True)
class ParamKind:
    weight_decay: bool      # biases and norms (fewer than 2 dims): False, unless marked
    tensor_parallel: bool   # TP ranks hold different slices

    @classmethod
    def of(cls, param: nn.Parameter) -> "ParamKind":
        """Megatron's rule: decay for 2 dims or more, unless marked `apply_weight_decay`."""
        return cls(weight_decay=getattr(param, "apply_weight_decay", param.dim() >= 2),
                   tensor_parallel=record_of(param).is_split)


def mark_weight_decay(params, decayed: bool = True) -> None:
    """Give `params` weight decay (or none) whatever their dims, before ZeRO lays them out."""
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
    """A run of one kind inside this rank's partition, in partition coordinates."""
    start: int
    end: int
    kind: ParamKind


@dataclass(frozen=True)
class Fragment:
    """A piece of a flattened parameter at an offset of a rank's partition; fragments describe a partition completely,
    so a checkpoint can be re-cut for another DP size."""
    slot: Slot
    param_offset: int
    partition_offset: int
    numel: int


class Unit:
    """A piece of the flat buffer, padded to split evenly into `parts` aligned shards."""

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
        self.buffer_offset = buffer_offset
        self.partition_offset = partition_offset

    @property
    def padding(self) -> int:
        return self.numel - self.used

    def in_buffer(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.buffer_offset:self.buffer_offset + self.numel]

    def in_partition(self, partition: torch.Tensor) -> torch.Tensor:
        """This unit's shard inside a rank's partition."""
        return partition[self.partition_offset:self.partition_offset + self.shard_numel]

    def shard_bounds(self, part: int) -> tuple[int, int]:
        return part * self.shard_numel, (part + 1) * self.shard_numel

    def fragments(self, part: int) -> list["Fragment"]:
        """The pieces of parameters inside shard `part`, in partition coordinates."""
        lo, hi = self.shard_bounds(part)
        offset = self.partition_offset - lo
        return [Fragment(slot, max(lo, slot.start) - slot.start, max(lo, slot.start) + offset,
                         min(hi, slot.end) - max(lo, slot.start))
                for slot in self.slots if slot.start < hi and slot.end > lo]

    def segments(self, part: int) -> list[Segment]:
        """The runs of one kind inside shard `part` (padding joins the last run)."""
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
    """Parameters in buckets of at most `bucket_size` elements, last layer first (backward's order)."""
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
    """Trainable parameters in forward order, each once even when tied."""
    seen: set[int] = set()
    params = []
    for param in module.parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            params.append(param)
    return params


class BufferPool:
    """Flat scratch buffers of one size, reused (ZeRO-R's C_B), created at first need; `on_create` hears each new
    buffer's bytes."""

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
