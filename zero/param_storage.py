"""Where the training-dtype parameters live (ReplicatedParameters: the whole TP shard, stages 0-2; ShardedParameters:
this rank's shard, stage 3), how they are first filled, and how the fp32 master is published back into them. The same
fp32 values fill the master, so both agree as if the fp32 model had been rounded."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from parallel.init import CHUNK_ELEMENTS, ParameterInitializer, replace_parameters
from zero.flat_buffer import FlatLayout, Unit
from zero.fp8_params import Fp8WeightBytes
from zero.gated_parameters import GatedParameter, UnitGate
from zero.placement import Placement
from zero.split_partition import copy_partition
from zero.stage3 import ParameterGatherer


class ValueSource(ABC):
    """The initial fp32 values of a parameter's flattened local elements."""

    @abstractmethod
    def read(self, param: nn.Parameter, start: int, count: int, device: torch.device) -> torch.Tensor:
        """fp32 values of `param`'s flattened elements [start, start + count)."""


class InitializerSource(ValueSource):
    """Values from the counter-based initializer, by parameter name (meta-built models)."""

    def __init__(self, initializer: ParameterInitializer, names: dict[int, str]) -> None:
        self.initializer, self.names = initializer, names

    def read(self, param: nn.Parameter, start: int, count: int, device: torch.device) -> torch.Tensor:
        return self.initializer.values(self.names[id(param)], param, start, count, device)


class TensorSource(ValueSource):
    """Values from a parameter's existing tensor."""

    def read(self, param: nn.Parameter, start: int, count: int, device: torch.device) -> torch.Tensor:
        return param.detach().reshape(-1)[start:start + count].to(device=device, dtype=torch.float32)


def _pieces(start: int, count: int) -> Iterator[tuple[int, int]]:
    """[start, start + count) in pieces of at most CHUNK_ELEMENTS."""
    for begin in range(start, start + count, CHUNK_ELEMENTS):
        yield begin, min(CHUNK_ELEMENTS, start + count - begin)


class ParameterStorage(ABC):
    def __init__(self, layout: FlatLayout, dtype: torch.dtype, device: torch.device) -> None:
        self.layout, self.dtype, self.device = layout, dtype, device

    @abstractmethod
    def fill(self, source: ValueSource, master: torch.Tensor) -> None:
        """Write the initial values of this rank's storage and master."""

    @abstractmethod
    def bind(self, model: nn.Module) -> FlatLayout:
        """Put this storage's parameters in place of the model's; returns the new layout."""

    @abstractmethod
    def publish(self, master: torch.Tensor) -> None:
        """Make the 16-bit parameters equal the master (every DP rank calls it)."""

    @abstractmethod
    def tensors(self) -> list[torch.Tensor]:
        """The live tensors holding parameters (for zero/memory.py)."""

    def gathered(self, unit: Unit):
        """A context in which `unit`'s parameters hold their full values."""
        return contextlib.nullcontext()

    def wait_all(self) -> None:
        """Wait for every gather still in flight."""

    def publish_working_bytes(self) -> int:
        """The most bytes `publish` allocates at once."""
        return 0

    def _fill_master(self, master: torch.Tensor, unit: Unit, slot, begin: int, values: torch.Tensor) -> None:
        """Copy the part of `values` that lies in this rank's shard into the master."""
        lo, hi = unit.shard_bounds(self.layout.part)
        first, last = max(slot.start + begin, lo), min(slot.start + begin + values.numel(), hi)
        if first < last:
            offset = unit.partition_offset - lo
            master[first + offset:last + offset] = values[first - slot.start - begin:last - slot.start - begin]


def _rebuilt_layout(layout: FlatLayout, replaced: dict[int, nn.Parameter]) -> FlatLayout:
    """The same layout (units, order, offsets) over the replacement parameters."""
    return FlatLayout([[replaced[id(slot.param)] for slot in unit.slots] for unit in layout.units],
                      layout.parts, layout.part, layout.alignment)


class ReplicatedParameters(ParameterStorage):
    """Stages 0-2: the whole TP shard in one flat buffer. With `overlap_param_gather` publishing only starts each unit's
    all-gather, and the GatedParameters wait for it when read."""

    def __init__(self, layout: FlatLayout, dtype: torch.dtype, device: torch.device, comm, group,
                 allgather_bucket_numel: int, overlap_param_gather: bool = False,
                 fp8_states: Optional[dict] = None) -> None:
        super().__init__(layout, dtype, device)
        self.comm, self.group = comm, group
        self.allgather_bucket_numel = allgather_bucket_numel
        self.overlap = overlap_param_gather and group is not None  # with one part there is nothing to gather
        self.flat = torch.zeros(layout.numel, dtype=dtype, device=device)
        self._gates = [UnitGate() for _ in layout.units] if self.overlap else []
        self.fp8 = Fp8WeightBytes(layout, fp8_states, dtype, device, comm, group, released_between_uses=False) \
            if fp8_states else None
        self._units_in_dtype = [unit for unit in layout.units if self.fp8 is None or not self.fp8.holds(unit)]

    def fill(self, source: ValueSource, master: torch.Tensor) -> None:
        for unit in self.layout.units:
            unit_flat = unit.in_buffer(self.flat)
            for slot in unit.slots:
                for begin, count in _pieces(0, slot.numel):
                    values = source.read(slot.param, begin, count, self.device)
                    unit_flat[slot.start + begin:slot.start + begin + count] = values
                    self._fill_master(master, unit, slot, begin, values)
        self._publish_fp8(master)

    def _publish_fp8(self, master: torch.Tensor) -> None:
        """--fp8-param-gather: cast, gather and dequantize the FP8 weights into the buffer."""
        if self.fp8 is None:
            return
        self.fp8.quantize(master)
        for unit in self.fp8.units:
            self.fp8.start_gather(unit, async_op=False)
            self.fp8.dequantize(unit, unit.in_buffer(self.flat))

    def bind(self, model: nn.Module) -> FlatLayout:
        views = {}
        for unit in self.layout.units:
            unit_flat = unit.in_buffer(self.flat)
            for slot in unit.slots:
                views[id(slot.param)] = (slot.param, unit_flat[slot.start:slot.end].view(slot.shape))
        parameter_class = GatedParameter if self.overlap else nn.Parameter
        self.layout = _rebuilt_layout(self.layout, replace_parameters(model, views, parameter_class))
        for gate, unit in zip(self._gates, self.layout.units):
            for slot in unit.slots:
                slot.param.gate = gate
        return self.layout

    def wait_all(self) -> None:
        """Every gate open (also before the update: an fp32 gather reads the master in place)."""
        for gate in self._gates:
            gate.wait()

    @contextlib.contextmanager
    def gathered(self, unit: Unit) -> Iterator[None]:
        if self._gates:
            self._gates[unit.index].wait()
        yield

    def publish(self, master: torch.Tensor) -> None:
        """All-gather every unit from the ranks' shards, a bucket at a time."""
        self.wait_all()  # the previous publish's gathers write this same buffer
        self._publish_fp8(master)
        if self.overlap:
            for unit in reversed(self._units_in_dtype):  # forward order
                owned = unit.in_partition(master).to(self.device, self.dtype)
                work = self.comm.all_gather(unit.in_buffer(self.flat), owned, self.group, "dp", async_op=True)
                self._gates[unit.index].close(work, owned)
            return
        for bucket in self._gather_buckets():
            works, inputs = [], []
            for unit in bucket:
                owned = unit.in_partition(master).to(self.device, self.dtype)  # its own tensor: no collective reads what it writes
                works.append(self.comm.all_gather(unit.in_buffer(self.flat), owned, self.group, "dp", async_op=True))
                inputs.append(owned)
            for work in works:
                work.wait()

    def _gather_buckets(self) -> Iterator[list[Unit]]:
        """The units `publish` keeps in flight together."""
        bucket, in_flight = [], 0
        for unit in self._units_in_dtype:
            bucket.append(unit)
            in_flight += unit.numel
            if in_flight >= self.allgather_bucket_numel:
                yield bucket
                bucket, in_flight = [], 0
        if bucket:
            yield bucket

    def publish_working_bytes(self) -> int:
        """`publish`'s copies of this rank's pieces, alive until their gathers finish."""
        if self.dtype == torch.float32:
            return 0
        buckets = [self._units_in_dtype] if self.overlap else list(self._gather_buckets())
        return max((sum(unit.shard_numel for unit in bucket) for bucket in buckets), default=0) * self.dtype.itemsize

    def tensors(self) -> list[torch.Tensor]:
        return [slot.param.data for unit in self.layout.units for slot in unit.slots] + [self.flat]


class ShardedParameters(ParameterStorage):
    """Stage 3: this rank's 16-bit shard of every unit."""

    def __init__(self, layout: FlatLayout, dtype: torch.dtype, device: torch.device, comm, group, zero_config,
                 modules: Sequence[nn.Module], placement: Placement, fp8_states: Optional[dict] = None) -> None:
        super().__init__(layout, dtype, device)
        self.comm, self.group, self.zero_config, self.placement = comm, group, zero_config, placement
        self.modules = list(modules)
        # ZeRO-3 Offload: the shard in host memory
        on_host = placement.parameter_shard_on_host and device.type != "meta"
        pinned = on_host and placement.pins
        self.shard = torch.zeros(layout.partition_numel, dtype=dtype, device="cpu" if on_host else device,
                                 pin_memory=pinned)
        self.gatherer: Optional[ParameterGatherer] = None
        self.fp8 = Fp8WeightBytes(layout, fp8_states, dtype, device, comm, group, released_between_uses=True) \
            if fp8_states else None

    def fill(self, source: ValueSource, master: torch.Tensor) -> None:
        for unit in self.layout.units:
            for fragment in unit.fragments(self.layout.part):
                for begin, count in _pieces(fragment.param_offset, fragment.numel):
                    values = source.read(fragment.slot.param, begin, count, self.device)
                    at = fragment.partition_offset + begin - fragment.param_offset
                    self.shard[at:at + count] = values
                    master[at:at + count] = values
        if self.fp8 is not None:
            self.fp8.quantize(master)

    def bind(self, model: nn.Module) -> FlatLayout:
        """Each unit's chunk is allocated, viewed and freed before the next."""
        views, flats = {}, []
        for unit in self.layout.units:
            flat = torch.empty(unit.numel, dtype=self.dtype, device=self.device)
            for slot in unit.slots:  # views are taken while the storage has its size
                views[id(slot.param)] = (slot.param, flat[slot.start:slot.end].view(slot.shape))
            flat.untyped_storage().resize_(0)
            flats.append(flat)
        self.layout = _rebuilt_layout(self.layout, replace_parameters(model, views))
        self.gatherer = ParameterGatherer(self.layout, self.modules, model, flats, self.shard, self.comm,
                                          self.group, self.zero_config,
                                          shard_on_host=self.placement.parameter_shard_on_host, fp8=self.fp8)
        self.gatherer.refresh_persistent()  # persistent chunks stay whole: gather them once now
        return self.layout

    def publish(self, master: torch.Tensor) -> None:
        copy_partition(self.shard, master)  # the master may be split between host and device
        if self.fp8 is not None:
            self.fp8.quantize(master)
        self.gatherer.refresh_persistent()

    def gathered(self, unit: Unit):
        return self.gatherer.gathered(unit)

    def tensors(self) -> list[torch.Tensor]:
        return [slot.param.data for unit in self.layout.units for slot in unit.slots] + [self.shard]
