"""M_D (`--contiguous-checkpointing`): the one buffer every checkpointed block input is copied into, allocated once.

A checkpoint's slot is taken when its block group's forward keeps its input and given back when the recompute has
copied it out (or, should its backward never run, when autograd drops the forward's graph). Between the two the
slot must not be written again, so the buffer holds a slot set of `--number-checkpoints` slots (default: the
checkpoints one micro-batch's forward makes on this rank) for every micro-batch the schedule keeps in flight: one
without pipeline stages, where each micro-batch's backward comes before the next forward; under a pipeline
schedule, the most checkpoints its chunk forwards keep awaiting their backward, in whole slot sets (1F1B:
min(P - s, M) sets on stage s; interleaved: its warm-up's chunk forwards, rounded up to whole micro-batches;
training/build.py `checkpoint_slot_sets`). With one slot set, 1F1B's warm-up forwards overwrote the inputs of the
micro-batches awaiting their backward, and the recompute rebuilt blocks from another micro-batch's input (issue 77).

Slots are taken from a free list, lowest first, whichever micro-batch or model chunk asks: the count in use never
exceeds the checkpoints of the forwards awaiting their backward, which the slot sets bound.
"""

from __future__ import annotations

import heapq
from typing import Optional

import torch


class SlotLease:
    """One taken slot; giving it back twice (the recompute, then the graph's end) is a no-op."""

    __slots__ = ("buffer", "index")

    def __init__(self, buffer: "ContiguousCheckpoints", index: int) -> None:
        self.buffer: Optional[ContiguousCheckpoints] = buffer
        self.index = index

    def give_back(self) -> None:
        if self.buffer is not None:
            self.buffer._free_slot(self.index)
            self.buffer = None

    __del__ = give_back  # a forward whose backward never runs (its graph dropped) frees its slots too


class ContiguousCheckpoints:
    """`slot_sets` x `slots_per_set` slots of one checkpoint each, in one tensor on `device` (pinned host memory
    with `pin`), allocated at the first checkpoint and again only if the checkpoint's shape changes."""

    def __init__(self, slots_per_set: int, slot_sets: int, device: torch.device, pin: bool = False) -> None:
        self.slots_per_set, self.slot_sets = slots_per_set, slot_sets
        self.capacity = slots_per_set * slot_sets
        self.device, self.pin = device, pin
        self.buffer: Optional[torch.Tensor] = None
        self.allocations = 0  # how many times the buffer was allocated
        self._free: list[int] = []

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free) if self.buffer is not None else 0

    def take(self, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, SlotLease]:
        """A free slot for one checkpoint of `numel` elements: a tensor of its own over the slot's bytes (not a
        view: views share the buffer's version counter, and writing the next slot would make autograd reject
        this one as modified), and the lease that gives it back."""
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
