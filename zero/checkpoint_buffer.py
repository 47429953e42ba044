"""M_D (`--contiguous-checkpointing`): one buffer, allocated once, that every checkpointed block input is copied into.
It holds `--number-checkpoints` slots for every micro-batch the pipeline schedule keeps in flight, taken from a free
list and given back after the recompute."""

from __future__ import annotations

import heapq
from typing import Optional

import torch


class SlotLease:
    """One taken slot; giving it back twice is a no-op."""

    __slots__ = ("buffer", "index")

    def __init__(self, buffer: "ContiguousCheckpoints", index: int) -> None:
        self.buffer: Optional[ContiguousCheckpoints] = buffer
        self.index = index

    def give_back(self) -> None:
        if self.buffer is not None:
            self.buffer._free_slot(self.index)
            self.buffer = None

    __del__ = give_back  # a forward whose backward never runs frees its slots too


class ContiguousCheckpoints:
    """`slot_sets` x `slots_per_set` slots in one tensor, reallocated only on a new shape."""

    def __init__(self, slots_per_set: int, slot_sets: int, device: torch.device, pin: bool = False) -> None:
        self.slots_per_set, self.slot_sets = slots_per_set, slot_sets
        self.capacity = slots_per_set * slot_sets
        self.device, self.pin = device, pin
        self.buffer: Optional[torch.Tensor] = None
        self.allocations = 0
        self._free: list[int] = []

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free) if self.buffer is not None else 0

    def take(self, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, SlotLease]:
        """A free slot for `numel` elements and its lease. The slot is its own tensor, not a view: views share a version
        counter, so autograd would reject it once the next slot is written."""
        if self.buffer is None or self.buffer.numel() != self.capacity * numel or self.buffer.dtype != dtype:
            if self.in_use:
                raise RuntimeError(f"a checkpoint of {numel} elements while {self.in_use} of another shape await "
                                   "their backward: the contiguous buffer holds one shape")
            self.buffer = torch.empty(self.capacity * numel, dtype=dtype, device=self.device, pin_memory=self.pin)
            self.allocations += 1
            self._free = list(range(self.capacity))
        if not self._free:
            raise RuntimeError(f"more than the contiguous buffer's {self.capacity} checkpoints await their backward "
                               f"({self.slot_sets} micro-batch{'es' if self.slot_sets > 1 else ''} in flight x "
                               f"--number-checkpoints {self.slots_per_set}): raise --number-checkpoints")
        index = heapq.heappop(self._free)
        kept = torch.empty(0, dtype=dtype, device=self.device)
        return kept.set_(self.buffer.untyped_storage(), index * numel, (numel,)), SlotLease(self, index)

    def _free_slot(self, index: int) -> None:
        heapq.heappush(self._free, index)

    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()
